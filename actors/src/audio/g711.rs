//! G.711, the telephone's codec: 8 kHz samples companded to a byte each, by μ-law (PCMU: North
//! America and Japan) or A-law (PCMA: elsewhere). The one codec every phone edge (a Twilio
//! stream, a SIP call) and every dialect that takes it (OpenAI's `g711_ulaw`, `audio/pcma`...)
//! uses; the companding itself is the `audio-codec-algorithms` crate's.

use super::pcm::{from_i16, to_i16};

/// G.711's sample rate.
pub const RATE: u32 = 8000;

/// G.711's two laws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Law {
    /// μ-law (PCMU).
    Mu,
    /// A-law (PCMA).
    A,
}

impl Law {
    /// The law as SDP names it (`PCMU`, `PCMA`).
    pub fn sdp_name(self) -> &'static str {
        match self {
            Law::Mu => "PCMU",
            Law::A => "PCMA",
        }
    }

    /// The byte that codes silence.
    pub fn silence(self) -> u8 {
        match self {
            Law::Mu => 0xff,
            Law::A => 0xd5,
        }
    }

    /// One byte's sample, in -1..1.
    pub fn expand_one(self, byte: u8) -> f32 {
        from_i16(match self {
            Law::Mu => audio_codec_algorithms::decode_ulaw(byte),
            Law::A => audio_codec_algorithms::decode_alaw(byte),
        })
    }

    /// One sample (-1..1, clipped) as its byte.
    pub fn compand_one(self, sample: f32) -> u8 {
        let s = to_i16(sample);
        match self {
            Law::Mu => audio_codec_algorithms::encode_ulaw(s),
            Law::A => audio_codec_algorithms::encode_alaw(s),
        }
    }

    /// Bytes as samples in -1..1, appended to `out`.
    pub fn expand(self, bytes: &[u8], out: &mut Vec<f32>) {
        out.extend(bytes.iter().map(|&b| self.expand_one(b)));
    }

    /// Bytes as samples in -1..1.
    pub fn expand_vec(self, bytes: &[u8]) -> Vec<f32> {
        let mut out = Vec::with_capacity(bytes.len());
        self.expand(bytes, &mut out);
        out
    }

    /// Samples (-1..1, clipped) as bytes, appended to `out`.
    pub fn compand(self, samples: &[f32], out: &mut Vec<u8>) {
        out.extend(samples.iter().map(|&s| self.compand_one(s)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_law_keeps_a_tone_within_its_step_and_codes_silence_as_its_own_byte() {
        let tone: Vec<f32> =
            (0..800).map(|i| (i as f32 * 440.0 * std::f32::consts::TAU / 8000.0).sin() * 0.5).collect();
        for law in [Law::Mu, Law::A] {
            let mut bytes = Vec::new();
            law.compand(&tone, &mut bytes);
            assert_eq!(bytes.len(), tone.len());
            let mut back = Vec::new();
            law.expand(&bytes, &mut back);
            let worst = tone.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst < 0.02, "{law:?}: off by {worst}");
            assert_eq!(law.compand_one(0.0), law.silence(), "{law:?}");
            assert!(law.expand_one(law.silence()).abs() < 1e-3);
        }
        assert_eq!(Law::Mu.compand_one(2.0), Law::Mu.compand_one(1.0), "clipped");
    }
}
