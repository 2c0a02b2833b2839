//! The domain's audio at the edges (16 kHz mono in, 24 kHz out, float32): WAV files in any PCM
//! format, resampling with a proper
//! band-limited resampler (rubato), and float32 / pcm16 sample formats.
//!
//! Everything here takes audio from clients, so every size a client declares (sample rate,
//! channel count, length) is checked against [`AudioLimits`] before anything proportional
//! to it is allocated: a WAV header is 44 bytes, and what it declares must not decide how
//! much memory the server spends.

pub mod g711;
pub mod pcm;

use std::io::Cursor;

use audioadapter_buffers::direct::InterleavedSlice;
use rubato::{
    Async, Fft, FixedAsync, FixedSync, Resampler, SincInterpolationParameters, SincInterpolationType, WindowFunction,
};

/// Sample rates a client may declare (Hz). Outside this range no real client sends audio;
/// the resampler's buffers grow with the rate, so nothing outside it is ever accepted.
pub const MIN_RATE: u32 = 8_000;
/// The highest sample rate a client may declare (Hz).
pub const MAX_RATE: u32 = 192_000;
/// Most channels a client's WAV may have.
pub const MAX_CHANNELS: u16 = 8;

/// The bounds a client's audio is checked against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AudioLimits {
    /// The longest clip accepted, in seconds (reference voices).
    pub max_seconds: f64,
}

impl AudioLimits {
    /// The most samples a clip of `max_seconds` has at `rate`.
    pub fn max_samples(&self, rate: u32) -> usize {
        (self.max_seconds * rate as f64).ceil() as usize
    }
}

/// Why a client's audio is refused (the text goes into an `invalid_payload` naming the field).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AudioError {
    /// A sample rate outside [`MIN_RATE`]..[`MAX_RATE`] Hz: the rate declared.
    #[error("sample rate {0} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")]
    Rate(u64),
    /// The bytes are not a WAV file `hound` reads: its reason.
    #[error("not a PCM WAV file ({0})")]
    NotWav(String),
    /// More channels than [`MAX_CHANNELS`]: the count declared.
    #[error("{0} channels; at most {MAX_CHANNELS} are accepted")]
    Channels(u16),
    /// The clip is longer than [`AudioLimits::max_seconds`].
    #[error("{seconds:.1} s of audio; at most {max} s are accepted")]
    TooLong {
        /// How long the clip is, in seconds.
        seconds: f64,
        /// The longest accepted ([`AudioLimits::max_seconds`]), in seconds.
        max: f64,
    },
    /// The WAV's samples could not be read (a truncated or corrupt file): the reason.
    #[error("cannot read the WAV samples ({0})")]
    Samples(String),
    /// A float sample that is NaN or infinite: its index among the interleaved samples.
    #[error("sample {0} is not a finite number")]
    NotFinite(usize),
    /// The resampler could not be built or failed: its reason.
    #[error("resampler: {0}")]
    Resampler(String),
}

/// Checks a client's sample rate.
pub fn check_rate(rate: u64) -> Result<u32, AudioError> {
    if (MIN_RATE as u64..=MAX_RATE as u64).contains(&rate) { Ok(rate as u32) } else { Err(AudioError::Rate(rate)) }
}

/// Decodes a WAV file (integer or float PCM, 8 to 192 kHz, at most 8 channels, at most
/// `limits.max_seconds` long) into mono float32 samples (channels averaged) and its rate.
/// The header is checked before any sample is read; the samples are read into a buffer
/// sized by the data actually present, never by what the header claims.
pub fn decode_wav(bytes: &[u8], limits: AudioLimits) -> Result<(Vec<f32>, u32), AudioError> {
    let reader = hound::WavReader::new(Cursor::new(bytes)).map_err(|e| AudioError::NotWav(e.to_string()))?;
    let spec = reader.spec();
    let rate = check_rate(spec.sample_rate as u64)?;
    if spec.channels > MAX_CHANNELS {
        return Err(AudioError::Channels(spec.channels));
    }
    let channels = spec.channels.max(1) as usize;
    let frames = reader.duration() as usize;
    let limit = limits.max_samples(rate);
    if frames > limit {
        return Err(AudioError::TooLong { seconds: frames as f64 / rate as f64, max: limits.max_seconds });
    }
    // What the header declares may exceed what the file holds: size by the bytes present.
    let bytes_per_sample = (spec.bits_per_sample as usize).div_ceil(8).max(1);
    let present = bytes.len() / bytes_per_sample;
    let mut interleaved = Vec::with_capacity((frames * channels).min(present));
    match spec.sample_format {
        hound::SampleFormat::Float => {
            for s in reader.into_samples::<f32>() {
                let v = s.map_err(|e| AudioError::Samples(e.to_string()))?;
                if !v.is_finite() {
                    return Err(AudioError::NotFinite(interleaved.len()));
                }
                interleaved.push(v);
            }
        }
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            for s in reader.into_samples::<i32>() {
                interleaved.push(s.map_err(|e| AudioError::Samples(e.to_string()))? as f32 * scale);
            }
        }
    }
    let mono = if channels == 1 {
        interleaved
    } else {
        interleaved.chunks_exact(channels).map(|frame| frame.iter().sum::<f32>() / channels as f32).collect()
    };
    Ok((mono, rate))
}

fn resampler_error(e: impl std::fmt::Display) -> AudioError {
    AudioError::Resampler(e.to_string())
}

/// The largest input block (`from / gcd(from, to)`) the FFT resampler is used for. Every
/// rate a real client sends reduces to far less (44.1 kHz to 16 kHz: 441); a rate pair
/// that does not (191,999 Hz is prime) would make the FFT resampler plan a transform of
/// that many points, 90 ms of CPU for each, so it gets the sinc resampler, whose cost
/// does not depend on the rates.
const MAX_FFT_BLOCK: u32 = 4096;

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A mono resampler from `from` to `to` Hz taking `chunk` input frames at a time.
fn resampler(from: u32, to: u32, chunk: usize) -> Result<Box<dyn Resampler<f32>>, AudioError> {
    check_rate(from as u64)?;
    check_rate(to as u64)?;
    let g = gcd(from, to);
    if from / g <= MAX_FFT_BLOCK && to / g <= MAX_FFT_BLOCK {
        let fft = Fft::<f32>::new(from as usize, to as usize, chunk, 1, FixedSync::Input).map_err(resampler_error)?;
        return Ok(Box::new(fft));
    }
    let sinc = SincInterpolationParameters {
        sinc_len: 128,
        f_cutoff: Some(0.95),
        interpolation: SincInterpolationType::Linear,
        oversampling_factor: 128,
        window: WindowFunction::BlackmanHarris2,
    };
    let ratio = to as f64 / from as f64;
    let r = Async::<f32>::new_sinc(ratio, 1.0, &sinc, chunk, 1, FixedAsync::Input).map_err(resampler_error)?;
    Ok(Box::new(r))
}

/// A sample as the resampler takes it: within full scale, and silence for what is not a
/// number. The FFT resampler panics inside rubato on a transform that overflowed (a finite
/// float WAV of 3e38 overflows it to NaN), so nothing else reaches it; audio beyond full
/// scale clips at every encoder anyway.
fn full_scale(s: f32) -> f32 {
    if s.is_finite() { s.clamp(-1.0, 1.0) } else { 0.0 }
}

/// Resamples a whole mono clip from `from` Hz to `to` Hz (both within the accepted range).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, AudioError> {
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    let samples: Vec<f32> = samples.iter().copied().map(full_scale).collect();
    let input = InterleavedSlice::new(&samples[..], 1, samples.len()).map_err(resampler_error)?;
    let mut resampler = resampler(from, to, 1024)?;
    let out = resampler.process_all(&input, samples.len(), None).map_err(resampler_error)?;
    Ok(out.take_data())
}

/// Resamples a stream that arrives in pieces of any size (mono, float32). Holds less than
/// one internal chunk of input; `flush` pads it out.
pub struct StreamResampler {
    inner: Option<Box<dyn Resampler<f32>>>,
    pending: Vec<f32>,
    scratch: Vec<f32>,
}

impl StreamResampler {
    /// A resampler from `from` to `to` Hz (both within [`MIN_RATE`]..[`MAX_RATE`]); it passes
    /// the audio through unchanged when they are equal.
    pub fn new(from: u32, to: u32) -> Result<StreamResampler, AudioError> {
        check_rate(from as u64)?;
        check_rate(to as u64)?;
        let inner = if from == to { None } else { Some(resampler(from, to, 480)?) };
        let scratch = vec![0.0; inner.as_ref().map_or(0, |r| r.output_frames_max())];
        Ok(StreamResampler { inner, pending: Vec::new(), scratch })
    }

    /// Resamples `input`, appending what is ready to `out`.
    pub fn push(&mut self, input: &[f32], out: &mut Vec<f32>) {
        let Some(r) = self.inner.as_mut() else {
            out.extend_from_slice(input);
            return;
        };
        self.pending.extend(input.iter().copied().map(full_scale));
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
pub fn wav_to_16k_mono(bytes: &[u8], limits: AudioLimits) -> Result<Vec<f32>, AudioError> {
    let (mono, rate) = decode_wav(bytes, limits)?;
    resample(&mono, rate, 16000)
}

/// The WAV format of recordings (and of every WAV the gateway writes): mono 24-bit
/// integer PCM. It keeps float32's precision for audio within [-1, 1] (24 bits, 144 dB),
/// takes a quarter less room than float, and every common tool reads it without a warning
/// (sox warns on a float WAV whose header lacks its extension size, which is how float
/// WAVs are usually written).
pub fn wav_spec(rate: u32) -> hound::WavSpec {
    hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 24, sample_format: hound::SampleFormat::Int }
}

/// One float sample as 24-bit PCM (clipped to [-1, 1]).
pub fn to_i24(s: f32) -> i32 {
    (s.clamp(-1.0, 1.0) * 8_388_607.0).round() as i32
}

/// Writes mono float32 samples as a 24-bit PCM WAV file.
pub fn encode_wav(samples: &[f32], rate: u32) -> Vec<u8> {
    let mut cursor = Cursor::new(Vec::with_capacity(68 + samples.len() * 3));
    {
        let mut w =
            hound::WavWriter::new(&mut cursor, wav_spec(rate)).expect("writing a WAV header to memory cannot fail");
        for &s in samples {
            w.write_sample(to_i24(s)).expect("writing to memory cannot fail");
        }
        w.finalize().expect("writing to memory cannot fail");
    }
    cursor.into_inner()
}

/// Writes mono float32 samples as a 32-bit float WAV file (for tests that need the exact
/// samples back).
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

    const LIMITS: AudioLimits = AudioLimits { max_seconds: 30.0 };

    fn tone(rate: u32, secs: f32, hz: f32) -> Vec<f32> {
        (0..(rate as f32 * secs) as usize)
            .map(|i| 0.5 * (2.0 * std::f32::consts::PI * hz * i as f32 / rate as f32).sin())
            .collect()
    }

    fn rms(x: &[f32]) -> f32 {
        (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
    }

    /// A WAV header with the given fields followed by `data` (declared length = data length
    /// unless `declared` is given).
    pub(crate) fn crafted_wav(rate: u32, channels: u16, bits: u16, data: &[u8], declared: Option<u32>) -> Vec<u8> {
        let block = channels as u32 * (bits as u32 / 8);
        let data_len = declared.unwrap_or(data.len() as u32);
        let mut w = Vec::new();
        w.extend_from_slice(b"RIFF");
        w.extend_from_slice(&(36 + data_len).to_le_bytes());
        w.extend_from_slice(b"WAVEfmt ");
        w.extend_from_slice(&16u32.to_le_bytes());
        w.extend_from_slice(&1u16.to_le_bytes());
        w.extend_from_slice(&channels.to_le_bytes());
        w.extend_from_slice(&rate.to_le_bytes());
        w.extend_from_slice(&rate.wrapping_mul(block).to_le_bytes());
        w.extend_from_slice(&(block as u16).to_le_bytes());
        w.extend_from_slice(&bits.to_le_bytes());
        w.extend_from_slice(b"data");
        w.extend_from_slice(&data_len.to_le_bytes());
        w.extend_from_slice(data);
        w
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
        let mono = wav_to_16k_mono(&cursor.into_inner(), LIMITS).unwrap();
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
        let (back, rate) = decode_wav(&encode_wav_f32(&input, 16000), LIMITS).unwrap();
        assert_eq!((back, rate), (input, 16000));
        assert!(decode_wav(b"RIFF....WAVEnope", LIMITS).unwrap_err().to_string().starts_with("not a PCM WAV file"));
    }

    #[test]
    fn the_wavs_the_gateway_writes_are_24_bit_pcm_and_round_trip() {
        let input = tone(24000, 0.5, 300.0);
        let wav = encode_wav(&input, 24000);
        let reader = hound::WavReader::new(Cursor::new(&wav)).unwrap();
        let spec = reader.spec();
        assert_eq!((spec.sample_format, spec.bits_per_sample, spec.channels), (hound::SampleFormat::Int, 24, 1));
        let (back, rate) = decode_wav(&wav, LIMITS).unwrap();
        assert_eq!(rate, 24000);
        let worst = input.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "24 bits keep the float's precision: {worst}");
        // The fmt chunk: EXTENSIBLE with the PCM sub-format (what sox reads without a warning).
        assert_eq!(&wav[20..22], &[0xFE, 0xFF]);
        assert_eq!(&wav[44..46], &[1, 0], "PCM sub-format");
    }

    #[test]
    fn a_crafted_rate_is_refused_before_anything_is_allocated() {
        // The 300-byte frame that once took the server down: 8-bit PCM at 4,294,967,291 Hz.
        let wav = crafted_wav(4_294_967_291, 1, 8, &[128; 100], None);
        assert_eq!(
            decode_wav(&wav, LIMITS).unwrap_err().to_string(),
            "sample rate 4294967291 Hz is outside 8000..192000 Hz"
        );
        let e = decode_wav(&crafted_wav(7999, 1, 8, &[128; 100], None), LIMITS).unwrap_err();
        assert!(e.to_string().starts_with("sample rate 7999 Hz"), "{e}");
        assert!(decode_wav(&crafted_wav(192_000, 1, 8, &[128; 100], None), LIMITS).is_ok());
        for rate in [0u32, 1, 192_001, u32::MAX] {
            assert!(resample(&[0.0; 10], rate, 16000).is_err(), "{rate}");
            assert!(StreamResampler::new(rate, 16000).is_err(), "{rate}");
        }
    }

    #[test]
    fn an_odd_rate_pair_gets_the_sinc_resampler_and_keeps_the_length() {
        // 191,999 Hz is prime: the FFT resampler would plan a 191,999-point transform.
        let input = tone(191_999, 0.5, 440.0);
        let out = resample(&input, 191_999, 16000).unwrap();
        assert!((out.len() as i64 - 8000).abs() <= 160, "{}", out.len());
        assert!((rms(&out[1000..7000]) - 0.3535).abs() < 0.02, "{}", rms(&out[1000..7000]));
        let mut stream = StreamResampler::new(8191, 16000).unwrap();
        let mut streamed = Vec::new();
        stream.push(&tone(8191, 1.0, 300.0), &mut streamed);
        stream.flush(&mut streamed);
        assert!((streamed.len() as i64 - 16000).abs() <= 1100, "{}", streamed.len());
    }

    #[test]
    fn samples_beyond_full_scale_or_not_numbers_resample_without_a_panic() {
        // A float WAV of finite but huge samples once overflowed the FFT to NaN, and rubato
        // panicked on it.
        let mut loud = vec![3e38f32; 4410];
        loud[7] = f32::NAN;
        loud[9] = f32::NEG_INFINITY;
        for (from, to) in [(44100, 16000), (16000, 24000), (191_999, 16000)] {
            let out = resample(&loud, from, to).unwrap();
            assert!(!out.is_empty() && out.iter().all(|s| s.is_finite() && s.abs() <= 2.0), "{from} -> {to}");
            let mut stream = StreamResampler::new(from, to).unwrap();
            let mut got = Vec::new();
            stream.push(&loud, &mut got);
            stream.flush(&mut got);
            assert!(!got.is_empty() && got.iter().all(|s| s.is_finite()), "stream {from} -> {to}");
        }
    }

    #[test]
    fn channels_and_length_are_bounded() {
        let e = decode_wav(&crafted_wav(16000, 9, 8, &[128; 90], None), LIMITS).unwrap_err();
        assert_eq!(e.to_string(), "9 channels; at most 8 are accepted");
        // 31 s declared (the data need not be there for the header to be refused)
        let e = decode_wav(&crafted_wav(16000, 1, 16, &[0; 64], Some(31 * 16000 * 2)), LIMITS).unwrap_err();
        assert_eq!(e.to_string(), "31.0 s of audio; at most 30 s are accepted");
        // A header that declares more data than the file holds is an error, not an allocation.
        let e = decode_wav(&crafted_wav(16000, 1, 16, &[0; 64], Some(20 * 16000 * 2)), LIMITS).unwrap_err();
        assert!(e.to_string().starts_with("cannot read the WAV samples"), "{e}");
    }
}
