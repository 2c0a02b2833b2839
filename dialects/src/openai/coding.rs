//! How the client's audio is coded in its events, each way: 16-bit PCM (at the session's input
//! rate in, 24 kHz out), or G.711 at 8 kHz, μ-law (`g711_ulaw`, GA `audio/pcmu`) or A-law
//! (`g711_alaw`, `audio/pcma`), the telephone's: the gateway's one G.711 codec
//! (`omni_actors::audio::g711`); the model's 24 kHz voice is resampled to 8 kHz first.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::audio::g711::{self, Law};
use omni_actors::audio::pcm;
use omni_actors::protocol::ProtocolError;

use super::Flavor;
use crate::conversation::Coding;

/// The rate of G.711 audio, both ways.
pub(super) const G711_RATE: u32 = g711::RATE;

/// The coding a format names (`pcm16`, `g711_ulaw`, `audio/pcmu`...); `None` for a name that is
/// not a format here.
pub(super) fn coding_of(kind: &str, flavor: Flavor) -> Option<Coding> {
    match kind {
        "pcm16" | "pcm" | "audio/pcm" => Some(Coding::Pcm16),
        // Qwen-Omni's realtime API takes 16-bit PCM only.
        _ if flavor == Flavor::Qwen => None,
        "g711_ulaw" | "audio/pcmu" => Some(Coding::G711(Law::Mu)),
        "g711_alaw" | "audio/pcma" => Some(Coding::G711(Law::A)),
        _ => None,
    }
}

/// The formats a flavor takes, for an error.
pub(super) fn formats(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Qwen => "16-bit PCM only: pcm16, pcm, audio/pcm",
        _ => "pcm16 (audio/pcm), g711_ulaw (audio/pcmu), g711_alaw (audio/pcma)",
    }
}

/// A format's name as the flavor echoes it: beta's strings, GA's `type`.
pub(super) fn name(coding: Coding, flavor: Flavor) -> &'static str {
    match (coding, flavor) {
        (Coding::Pcm16, Flavor::Qwen) => "pcm",
        (Coding::Pcm16, Flavor::Beta) => "pcm16",
        (Coding::Pcm16, Flavor::Ga) => "audio/pcm",
        (Coding::G711(Law::Mu), Flavor::Ga) => "audio/pcmu",
        (Coding::G711(Law::A), Flavor::Ga) => "audio/pcma",
        (Coding::G711(Law::Mu), _) => "g711_ulaw",
        (Coding::G711(Law::A), _) => "g711_alaw",
    }
}

/// The bytes of one sample on the wire.
pub(super) fn sample_bytes(coding: Coding) -> usize {
    match coding {
        Coding::Pcm16 => 2,
        Coding::G711(_) => 1,
    }
}

/// Base64 audio of `coding` into float samples (at the coding's rate).
pub(super) fn decode(coding: Coding, b64: &str, param: &str) -> Result<Vec<f32>, ProtocolError> {
    let bytes =
        STANDARD.decode(b64).map_err(|e| ProtocolError::InvalidPayload(format!("{param}: not valid base64 ({e})")))?;
    let mut samples = Vec::with_capacity(bytes.len());
    match coding {
        Coding::Pcm16 => {
            if bytes.len() % 2 != 0 {
                return Err(ProtocolError::InvalidPayload(format!(
                    "{param}: {} bytes is not a whole number of 16-bit samples",
                    bytes.len()
                )));
            }
            pcm::decode_i16_le(&bytes, &mut samples);
        }
        Coding::G711(law) => law.expand(&bytes, &mut samples),
    }
    Ok(samples)
}

/// The model's voice (at `rate`) as base64 audio of `coding`, resampled as one clip (a
/// stream's pieces go through [`G711Downlink`] instead).
pub(super) fn encode(coding: Coding, samples: &[f32], rate: u32) -> String {
    match coding {
        Coding::Pcm16 => {
            let mut bytes = Vec::with_capacity(samples.len() * 2);
            pcm::encode_i16_le(samples, &mut bytes);
            STANDARD.encode(bytes)
        }
        Coding::G711(_) => compand(coding, &omni_actors::audio::resample(samples, rate, G711_RATE).unwrap_or_default()),
    }
}

/// 8 kHz samples as base64 G.711 of `coding` (16-bit PCM for `Pcm16`).
pub(super) fn compand(coding: Coding, narrow: &[f32]) -> String {
    let law = match coding {
        Coding::Pcm16 => return encode(Coding::Pcm16, narrow, G711_RATE),
        Coding::G711(law) => law,
    };
    let mut bytes = Vec::with_capacity(narrow.len());
    law.compand(narrow, &mut bytes);
    STANDARD.encode(bytes)
}

/// The model's voice of one response, from its rate down to G.711's, piece by piece: one
/// stream resampler, so that no piece has an edge of its own; its tail is flushed when the
/// response's voice is done.
pub(super) struct G711Downlink {
    response: String,
    resampler: omni_actors::audio::StreamResampler,
}

impl G711Downlink {
    /// The 8 kHz samples of a piece of `response`'s voice (a new response starts anew).
    pub(super) fn push(this: &mut Option<G711Downlink>, response: &str, samples: &[f32], rate: u32) -> Vec<f32> {
        if this.as_ref().is_none_or(|d| d.response != response) {
            *this = omni_actors::audio::StreamResampler::new(rate, G711_RATE)
                .ok()
                .map(|resampler| G711Downlink { response: response.to_string(), resampler });
        }
        let mut narrow = Vec::with_capacity(samples.len() / 3 + 1);
        if let Some(d) = this.as_mut() {
            d.resampler.push(samples, &mut narrow);
        }
        narrow
    }

    /// What is held of `response`'s voice, now that it is done.
    pub(super) fn tail(this: &mut Option<G711Downlink>, response: &str) -> Vec<f32> {
        let mut narrow = Vec::new();
        if let Some(mut d) = this.take_if(|d| d.response == response) {
            d.resampler.flush(&mut narrow);
        }
        narrow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g711_round_trips_a_tone_at_8_khz_and_the_voice_is_narrowed_to_it() {
        let tone: Vec<f32> =
            (0..24000).map(|i| 0.5 * (i as f32 * 440.0 * std::f32::consts::TAU / 24000.0).sin()).collect();
        for coding in [Coding::G711(Law::Mu), Coding::G711(Law::A)] {
            let b64 = encode(coding, &tone, 24000);
            let back = decode(coding, &b64, "audio").unwrap();
            assert_eq!(back.len(), 8000, "one second at 8 kHz, a byte a sample");
            let peak = back.iter().fold(0f32, |m, s| m.max(s.abs()));
            assert!((0.45..0.55).contains(&peak), "{coding:?}: peak {peak}");
        }
        assert_eq!(decode(Coding::Pcm16, &encode(Coding::Pcm16, &[0.25], 24000), "a").unwrap(), vec![0.25]);
    }

    #[test]
    fn qwen_takes_pcm_only_and_every_name_echoes() {
        assert_eq!(coding_of("g711_ulaw", Flavor::Qwen), None);
        assert_eq!(coding_of("audio/pcma", Flavor::Ga), Some(Coding::G711(Law::A)));
        assert_eq!(name(Coding::G711(Law::Mu), Flavor::Beta), "g711_ulaw");
        assert_eq!(coding_of("opus", Flavor::Ga), None);
    }
}
