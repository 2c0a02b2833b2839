//! A SIP call's voice in the codec its SDP agreed ([`super::sdp::Codec`]), both ways: the
//! caller's frames to samples at the rate the session takes them, and the model's voice to the
//! 20 ms frames the pacer sends. G.711 is companded at 8 kHz (the model's voice resampled to
//! 8 kHz as one stream per answer); Opus is libopus through the WebRTC calls' own codec
//! (`crate::webrtc::codec`: the caller decoded at 16 kHz, the model encoded at 24
//! kHz, and a caller sending faster than real time and a half dropped undecoded).

use std::time::Instant;

use omni_actors::audio::StreamResampler;
use omni_actors::edge::client::CallerAudio;

use super::rtp::FRAME;
use super::sdp::{Codec, Law};
use crate::webrtc::codec::{self as opus, Downlink, UPLINK_FRAME_SAMPLES, UPLINK_RATE, Uplink};

/// Why a codec did not start, or a frame was not heard.
#[derive(Debug, thiserror::Error)]
pub enum VoiceError {
    #[error("libopus: {0}")]
    Codec(#[from] ::opus::Error),
    #[error("a frame not decoded: {0:?}")]
    NotHeard(opus::PacketRefused),
}

/// G.711's rate, both ways.
pub const G711_RATE: u32 = 8000;

/// One call's coding and its state between frames.
pub enum Voice {
    G711 {
        law: Law,
        /// The model's voice from its rate to 8 kHz, one answer at a time.
        resampler: Option<StreamResampler>,
        /// Bytes of the answer not yet a whole frame.
        partial: Vec<u8>,
    },
    Opus {
        uplink: Box<Uplink>,
        downlink: Box<Downlink>,
        /// The model's voice from its rate to the encoder's, when they differ.
        resampler: Option<StreamResampler>,
    },
}

impl Voice {
    pub fn new(codec: Codec) -> Result<Voice, VoiceError> {
        Ok(match codec {
            Codec::G711(law) => Voice::G711 { law, resampler: None, partial: Vec::with_capacity(FRAME) },
            Codec::Opus => {
                Voice::Opus { uplink: Box::new(Uplink::new()?), downlink: Box::new(Downlink::new()?), resampler: None }
            }
        })
    }

    pub fn codec(&self) -> Codec {
        match self {
            Voice::G711 { law, .. } => Codec::G711(*law),
            Voice::Opus { .. } => Codec::Opus,
        }
    }

    /// One frame of the caller's voice, as the session takes it; an error when it does not
    /// decode (or comes too fast).
    pub fn heard(&mut self, frame: &[u8], now: Instant) -> Result<CallerAudio, VoiceError> {
        match self {
            Voice::G711 { law, .. } => Ok(CallerAudio { samples: law.expand_vec(frame), rate: G711_RATE }),
            Voice::Opus { uplink, .. } => {
                let mut samples = Vec::with_capacity(UPLINK_FRAME_SAMPLES);
                uplink.decode(now, frame, &mut samples).map_err(VoiceError::NotHeard)?;
                Ok(CallerAudio { samples, rate: UPLINK_RATE })
            }
        }
    }

    /// A frame that never came: 20 ms of silence.
    pub fn lost(&self) -> CallerAudio {
        match self {
            Voice::G711 { .. } => CallerAudio { samples: vec![0.0; FRAME], rate: G711_RATE },
            Voice::Opus { .. } => CallerAudio { samples: vec![0.0; UPLINK_FRAME_SAMPLES], rate: UPLINK_RATE },
        }
    }

    /// The model's voice (`samples` at `rate`): the whole frames it makes; the rest waits for
    /// more of the answer, or its end.
    pub fn speak(&mut self, samples: &[f32], rate: u32) -> Vec<Vec<u8>> {
        match self {
            Voice::G711 { law, resampler, partial } => {
                let r = resampler.get_or_insert_with(|| stream(rate, G711_RATE));
                let mut narrow = Vec::with_capacity(samples.len() * G711_RATE as usize / rate.max(1) as usize + 1);
                r.push(samples, &mut narrow);
                law.compand(&narrow, partial);
                let whole = partial.len() / FRAME * FRAME;
                partial.drain(..whole).collect::<Vec<u8>>().chunks(FRAME).map(<[u8]>::to_vec).collect()
            }
            Voice::Opus { downlink, resampler, .. } => {
                if rate == opus::RATE {
                    return downlink.encode(samples);
                }
                let r = resampler.get_or_insert_with(|| stream(rate, opus::RATE));
                let mut wide = Vec::with_capacity(samples.len() * opus::RATE as usize / rate.max(1) as usize + 1);
                r.push(samples, &mut wide);
                downlink.encode(&wide)
            }
        }
    }

    /// The answer's end: the rest of its voice, padded with silence to a frame.
    pub fn finish(&mut self) -> Vec<Vec<u8>> {
        match self {
            Voice::G711 { law, resampler, partial } => {
                let mut tail = Vec::new();
                if let Some(mut r) = resampler.take() {
                    r.flush(&mut tail);
                }
                law.compand(&tail, partial);
                let mut frames: Vec<Vec<u8>> = partial.chunks(FRAME).map(<[u8]>::to_vec).collect();
                partial.clear();
                if let Some(last) = frames.last_mut() {
                    last.resize(FRAME, law.silence());
                }
                frames
            }
            Voice::Opus { downlink, resampler, .. } => {
                let mut frames = Vec::new();
                if let Some(mut r) = resampler.take() {
                    let mut tail = Vec::new();
                    r.flush(&mut tail);
                    frames = downlink.encode(&tail);
                }
                frames.extend(downlink.flush());
                frames
            }
        }
    }

    /// The caller spoke over the answer: what of it was not a whole frame yet is forgotten.
    pub fn clear(&mut self) {
        match self {
            Voice::G711 { resampler, partial, .. } => {
                *resampler = None;
                partial.clear();
            }
            Voice::Opus { downlink, resampler, .. } => {
                *resampler = None;
                downlink.drop_pending();
            }
        }
    }
}

/// A resampler of one answer's voice (the rates are the model's and a codec's: both known good).
fn stream(from: u32, to: u32) -> StreamResampler {
    StreamResampler::new(from, to).unwrap_or_else(|_| StreamResampler::new(to, to).expect("a resampler at one rate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, ms: usize) -> Vec<f32> {
        let n = rate as usize * ms / 1000;
        (0..n).map(|i| (i as f32 * 440.0 * std::f32::consts::TAU / rate as f32).sin() * 0.25).collect()
    }

    fn energy(samples: &[f32]) -> f32 {
        samples.iter().map(|s| s * s).sum::<f32>() / samples.len().max(1) as f32
    }

    #[test]
    fn each_codec_carries_an_answer_both_ways_in_20_ms_frames() {
        for codec in [Codec::G711(Law::Mu), Codec::G711(Law::A), Codec::Opus] {
            let mut speaker = Voice::new(codec).unwrap();
            let mut frames = speaker.speak(&tone(24_000, 110), 24_000);
            frames.extend(speaker.finish());
            // 110 ms makes five whole frames and a padded sixth (the resampler's delay aside).
            assert!((5..=7).contains(&frames.len()), "{codec:?}: {} frames", frames.len());
            let mut listener = Voice::new(codec).unwrap();
            let heard: Vec<f32> =
                frames.iter().flat_map(|f| listener.heard(f, Instant::now()).unwrap().samples).collect();
            let rate = listener.lost().rate;
            assert_eq!(heard.len(), frames.len() * rate as usize / 50, "{codec:?}: 20 ms a frame");
            // A sine of amplitude 0.25 has a mean square of 0.031.
            assert!(energy(&heard[heard.len() / 3..2 * heard.len() / 3]) > 0.01, "{codec:?} lost the tone");
        }
    }

    #[test]
    fn a_cleared_answer_leaves_nothing_behind_and_a_lost_frame_is_silence() {
        for codec in [Codec::G711(Law::Mu), Codec::Opus] {
            let mut v = Voice::new(codec).unwrap();
            v.speak(&tone(24_000, 10), 24_000);
            v.clear();
            assert!(v.finish().is_empty(), "{codec:?}");
            let lost = v.lost();
            assert!(lost.samples.iter().all(|s| *s == 0.0) && lost.samples.len() == lost.rate as usize / 50);
        }
        assert!(Voice::new(Codec::Opus).unwrap().heard(&[0xff; 3], Instant::now()).is_err());
    }
}
