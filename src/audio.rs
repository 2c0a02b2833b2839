//! Audio conversions at the edge: WAV files in any PCM format, resampling with a proper
//! band-limited resampler (rubato), and float32 / pcm16 sample formats.

use std::io::Cursor;

use audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler};

/// Decodes a WAV file (integer or float PCM, any rate and channel count) into mono
/// float32 samples (channels averaged) and its sample rate.
pub fn decode_wav(bytes: &[u8]) -> Result<(Vec<f32>, u32), String> {
    let reader = hound::WavReader::new(Cursor::new(bytes)).map_err(|e| format!("not a PCM WAV file ({e})"))?;
    let spec = reader.spec();
    let channels = spec.channels.max(1) as usize;
    let interleaved: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader.into_samples::<f32>().collect::<Result<_, _>>(),
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            reader.into_samples::<i32>().map(|s| s.map(|v| v as f32 * scale)).collect::<Result<_, _>>()
        }
    }
    .map_err(|e| format!("cannot read the WAV samples ({e})"))?;
    let mono = if channels == 1 {
        interleaved
    } else {
        interleaved.chunks_exact(channels).map(|frame| frame.iter().sum::<f32>() / channels as f32).collect()
    };
    Ok((mono, spec.sample_rate))
}

/// Resamples a whole mono clip from `from` Hz to `to` Hz.
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, String> {
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    if from == 0 || to == 0 {
        return Err(format!("cannot resample from {from} Hz to {to} Hz"));
    }
    let input = InterleavedSlice::new(samples, 1, samples.len()).map_err(|e| e.to_string())?;
    let mut resampler =
        Fft::<f32>::new(from as usize, to as usize, 1024, 1, FixedSync::Input).map_err(|e| e.to_string())?;
    let out = resampler.process_all(&input, samples.len(), None).map_err(|e| e.to_string())?;
    Ok(out.take_data())
}

/// Resamples a stream that arrives in pieces of any size (mono, float32). Holds less than
/// one internal chunk of input; `flush` pads it out.
pub struct StreamResampler {
    inner: Option<Fft<f32>>,
    pending: Vec<f32>,
    scratch: Vec<f32>,
}

impl StreamResampler {
    pub fn new(from: u32, to: u32) -> Result<StreamResampler, String> {
        if from == 0 || to == 0 {
            return Err(format!("cannot resample from {from} Hz to {to} Hz"));
        }
        let inner = if from == to {
            None
        } else {
            Some(Fft::<f32>::new(from as usize, to as usize, 480, 1, FixedSync::Input).map_err(|e| e.to_string())?)
        };
        let scratch = vec![0.0; inner.as_ref().map_or(0, |r| r.output_frames_max())];
        Ok(StreamResampler { inner, pending: Vec::new(), scratch })
    }

    /// Resamples `input`, appending what is ready to `out`.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        let Some(r) = self.inner.as_mut() else {
            out.extend_from_slice(input);
            return;
        };
        self.pending.extend_from_slice(input);
        let need = r.input_frames_next();
        let mut used = 0;
        while self.pending.len() - used >= need {
            let chunk = &self.pending[used..used + need];
            let (Ok(src), Ok(mut dst)) = (
                InterleavedSlice::new(chunk, 1, need),
                InterleavedSlice::new_mut(&mut self.scratch[..], 1, r.output_frames_max()),
            ) else {
                break;
            };
            match r.process_into_buffer(&src, &mut dst, None) {
                Ok((consumed, produced)) => {
                    out.extend_from_slice(&self.scratch[..produced]);
                    used += consumed.max(1);
                }
                Err(e) => {
                    log::error!("resampler: {e}");
                    break;
                }
            }
        }
        self.pending.drain(..used);
    }

    /// Pads what is held with silence to a whole chunk and resamples it.
    pub fn flush(&mut self, out: &mut Vec<f32>) {
        let Some(r) = self.inner.as_ref() else { return };
        if self.pending.is_empty() {
            return;
        }
        let pad = r.input_frames_next() - self.pending.len();
        self.push(&vec![0.0; pad], out);
    }
}

/// A WAV file as 16 kHz mono float32, the backend's input format.
pub fn wav_to_16k_mono(bytes: &[u8]) -> Result<Vec<f32>, String> {
    let (mono, rate) = decode_wav(bytes)?;
    resample(&mono, rate, 16000)
}

/// Writes mono float32 samples as a 32-bit float WAV file.
pub fn encode_wav_f32(samples: &[f32], rate: u32) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut cursor = Cursor::new(Vec::with_capacity(44 + samples.len() * 4));
    {
        let mut w = hound::WavWriter::new(&mut cursor, spec).expect("writing a WAV header to memory cannot fail");
        for &s in samples {
            w.write_sample(s).expect("writing to memory cannot fail");
        }
        w.finalize().expect("writing to memory cannot fail");
    }
    cursor.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, secs: f32, hz: f32) -> Vec<f32> {
        (0..(rate as f32 * secs) as usize)
            .map(|i| 0.5 * (2.0 * std::f32::consts::PI * hz * i as f32 / rate as f32).sin())
            .collect()
    }

    fn rms(x: &[f32]) -> f32 {
        (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
    }

    #[test]
    fn resampling_keeps_length_ratio_and_level() {
        let input = tone(24000, 1.0, 440.0);
        let out = resample(&input, 24000, 16000).unwrap();
        assert_eq!(out.len(), 16000);
        let (a, b) = (rms(&input[2000..22000]), rms(&out[2000..14000]));
        assert!((a - b).abs() < 0.01, "level kept: {a} vs {b}");
        let up = resample(&out, 16000, 24000).unwrap();
        assert_eq!(up.len(), 24000);
    }

    #[test]
    fn an_8k_stereo_int16_wav_becomes_16k_mono() {
        let spec = hound::WavSpec {
            channels: 2,
            sample_rate: 8000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut cursor = Cursor::new(Vec::new());
        {
            let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
            for s in tone(8000, 2.0, 300.0) {
                let v = (s * 32767.0) as i16;
                w.write_sample(v).unwrap();
                w.write_sample(v).unwrap();
            }
            w.finalize().unwrap();
        }
        let mono = wav_to_16k_mono(&cursor.into_inner()).unwrap();
        assert_eq!(mono.len(), 32000);
        assert!((rms(&mono[4000..28000]) - 0.3535).abs() < 0.01);
    }

    #[test]
    fn streaming_resampling_in_small_pieces_keeps_the_length() {
        let input = tone(24000, 2.0, 300.0);
        let mut r = StreamResampler::new(24000, 16000).unwrap();
        let mut out = Vec::new();
        for piece in input.chunks(437) {
            r.push(piece, &mut out);
        }
        r.flush(&mut out);
        assert!((out.len() as i64 - 32000).abs() <= 320, "{}", out.len());
        assert!((rms(&out[4000..28000]) - rms(&input[6000..42000])).abs() < 0.01);
        let mut same = StreamResampler::new(16000, 16000).unwrap();
        let mut copy = Vec::new();
        same.push(&[0.5; 10], &mut copy);
        assert_eq!(copy, vec![0.5; 10]);
    }

    #[test]
    fn float_wav_round_trip_and_garbage() {
        let input = tone(16000, 0.5, 200.0);
        let (back, rate) = decode_wav(&encode_wav_f32(&input, 16000)).unwrap();
        assert_eq!((back, rate), (input, 16000));
        assert!(decode_wav(b"RIFF....WAVEnope").unwrap_err().starts_with("not a PCM WAV file"));
    }
}
