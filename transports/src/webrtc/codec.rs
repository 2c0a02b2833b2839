//! Opus both ways, through libopus, on float samples as the session takes and gives them. The
//! model's voice is 24 kHz and the model hears 16 kHz, both rates libopus encodes from and
//! decodes to natively, so no resampler stands on either way (the caller's voice was decoded at
//! 24 kHz and resampled to 16 kHz by the session until 2026-11-29: about 45 % of the server's
//! CPU at 200 calls); RTP still counts Opus at 48 kHz (RFC 7587), whatever the rate of the PCM.

use std::time::Instant;

use opus::{Application, Bitrate, Channels, Decoder, Encoder};

/// The model's voice's sample rate, as it is encoded.
pub const RATE: u32 = 24_000;
/// One 20 ms frame at [`RATE`].
pub const FRAME_SAMPLES: usize = (RATE / 50) as usize;
/// The caller's voice's sample rate, as it is decoded: the rate the model hears.
pub const UPLINK_RATE: u32 = 16_000;
/// One 20 ms frame at [`UPLINK_RATE`].
pub const UPLINK_FRAME_SAMPLES: usize = (UPLINK_RATE / 50) as usize;
/// One frame on the RTP clock (48 kHz).
pub const RTP_TICKS_PER_FRAME: u64 = 960;
/// The longest Opus packet, 120 ms, at [`RATE`].
const MAX_PACKET_SAMPLES: usize = FRAME_SAMPLES * 6;
/// The bit rate of the model's voice: wideband speech needs no more.
const BITRATE: i32 = 32_000;
/// The encoder's effort (0 to 10, libopus defaults to 10).
const COMPLEXITY: i32 = 5;
/// Bytes of an encoded frame at most (RFC 6716 allows 1275 per frame).
const MAX_FRAME_BYTES: usize = 1275;

/// How much faster than real time a client's voice may arrive, and the slack at the start:
/// a peer cannot make the gateway decode (or the model hear) more than this.
const UPLINK_PACE: f64 = 1.5;
const UPLINK_SLACK_S: f64 = 1.0;

/// Why a packet of the client's voice was not decoded.
#[derive(Debug, PartialEq)]
pub enum PacketRefused {
    /// Empty, or not Opus.
    Malformed(String),
    /// Over real time and a half since the first packet: dropped undecoded.
    TooFast,
}

/// The client's voice: Opus packets in, PCM at [`UPLINK_RATE`] out, at most [`UPLINK_PACE`]
/// times real time.
pub struct Uplink {
    decoder: Decoder,
    scratch: Vec<f32>,
    first: Option<Instant>,
    samples: u64,
}

impl Uplink {
    pub fn new() -> Result<Uplink, opus::Error> {
        Ok(Uplink {
            decoder: Decoder::new(UPLINK_RATE, Channels::Mono)?,
            scratch: vec![0.0; MAX_PACKET_SAMPLES],
            first: None,
            samples: 0,
        })
    }

    /// Decodes one packet that arrived at `now`, appending its samples to `out`.
    pub fn decode(&mut self, now: Instant, packet: &[u8], out: &mut Vec<f32>) -> Result<usize, PacketRefused> {
        let malformed = |e: opus::Error| PacketRefused::Malformed(e.to_string());
        // An empty packet would make libopus conceal a lost one: nothing was sent, nothing is heard.
        if packet.is_empty() {
            return Err(PacketRefused::Malformed("an empty packet".into()));
        }
        let n = opus::packet::get_nb_samples(packet, UPLINK_RATE).map_err(malformed)?;
        let first = *self.first.get_or_insert(now);
        let allowed =
            (now.saturating_duration_since(first).as_secs_f64() * UPLINK_PACE + UPLINK_SLACK_S) * UPLINK_RATE as f64;
        if (self.samples + n as u64) as f64 > allowed {
            return Err(PacketRefused::TooFast);
        }
        let n = self.decoder.decode_float(packet, &mut self.scratch, false).map_err(malformed)?;
        self.samples += n as u64;
        out.extend_from_slice(&self.scratch[..n]);
        Ok(n)
    }
}

/// The model's voice: PCM at [`RATE`] in, 20 ms Opus frames out.
pub struct Downlink {
    encoder: Encoder,
    pending: Vec<f32>,
}

impl Downlink {
    pub fn new() -> Result<Downlink, opus::Error> {
        // CELT only (restricted low delay): at this rate it costs a fraction of SILK's CPU.
        let mut encoder = Encoder::new(RATE, Channels::Mono, Application::LowDelay)?;
        encoder.set_bitrate(Bitrate::Bits(BITRATE))?;
        encoder.set_complexity(COMPLEXITY)?;
        Ok(Downlink { encoder, pending: Vec::with_capacity(FRAME_SAMPLES) })
    }

    /// Encodes what makes whole frames; the rest waits for more (or [`Downlink::flush`]).
    pub fn encode(&mut self, pcm: &[f32]) -> Vec<Vec<u8>> {
        self.pending.extend_from_slice(pcm);
        let whole = self.pending.len() / FRAME_SAMPLES * FRAME_SAMPLES;
        let pending = std::mem::take(&mut self.pending);
        let frames = pending[..whole].chunks_exact(FRAME_SAMPLES).filter_map(|f| self.frame(f)).collect();
        self.pending = pending;
        self.pending.drain(..whole);
        frames
    }

    /// The rest, padded with silence to a frame.
    pub fn flush(&mut self) -> Option<Vec<u8>> {
        if self.pending.is_empty() {
            return None;
        }
        let mut last = std::mem::take(&mut self.pending);
        last.resize(FRAME_SAMPLES, 0.0);
        self.frame(&last)
    }

    /// Forgets a partial frame (the audio was cleared).
    pub fn drop_pending(&mut self) {
        self.pending.clear();
    }

    fn frame(&mut self, pcm: &[f32]) -> Option<Vec<u8>> {
        match self.encoder.encode_vec_float(pcm, MAX_FRAME_BYTES) {
            Ok(frame) => Some(frame),
            Err(e) => {
                log::error!("opus: cannot encode a frame: {e}");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(ms: usize) -> Vec<f32> {
        let n = RATE as usize * ms / 1000;
        (0..n).map(|i| (i as f32 * 440.0 * std::f32::consts::TAU / RATE as f32).sin() * 0.25).collect()
    }

    #[test]
    fn the_models_voice_leaves_in_20_ms_frames_and_decodes_back() {
        let mut down = Downlink::new().unwrap();
        let frames = down.encode(&tone(50));
        assert_eq!(frames.len(), 2, "two whole frames; 10 ms wait");
        let last = down.flush().expect("the rest, padded");
        let mut up = Uplink::new().unwrap();
        let mut pcm = Vec::new();
        for f in frames.iter().chain([&last]) {
            assert_eq!(up.decode(Instant::now(), f, &mut pcm).unwrap(), UPLINK_FRAME_SAMPLES);
        }
        let energy =
            pcm[UPLINK_FRAME_SAMPLES..2 * UPLINK_FRAME_SAMPLES].iter().map(|s| (*s as f64).powi(2)).sum::<f64>();
        // A sine of amplitude 0.25 over a frame at 16 kHz: 320 x 0.25^2 / 2 = 10.
        assert!(energy > 5.0, "the tone survives the round trip (energy {energy})");
        assert!(down.flush().is_none());
    }

    #[test]
    fn a_corrupt_or_empty_packet_is_an_error_not_a_panic() {
        let mut up = Uplink::new().unwrap();
        let mut pcm = Vec::new();
        assert!(matches!(up.decode(Instant::now(), &[0xff; 3], &mut pcm), Err(PacketRefused::Malformed(_))));
        assert!(matches!(up.decode(Instant::now(), &[], &mut pcm), Err(PacketRefused::Malformed(_))));
        assert!(pcm.is_empty());
    }

    #[test]
    fn voice_faster_than_real_time_and_a_half_is_dropped_undecoded() {
        let frame = Downlink::new().unwrap().encode(&tone(20)).remove(0);
        let mut up = Uplink::new().unwrap();
        let mut pcm = Vec::new();
        let t0 = Instant::now();
        // A second's slack at once: 50 frames; the 51st is too early.
        for _ in 0..50 {
            up.decode(t0, &frame, &mut pcm).unwrap();
        }
        assert_eq!(up.decode(t0, &frame, &mut pcm), Err(PacketRefused::TooFast));
        // Two seconds on, 1.5 x 2 s more are allowed: 150 frames, not 151.
        let later = t0 + std::time::Duration::from_secs(2);
        for _ in 0..150 {
            up.decode(later, &frame, &mut pcm).unwrap();
        }
        assert_eq!(up.decode(later, &frame, &mut pcm), Err(PacketRefused::TooFast));
        assert_eq!(pcm.len(), 200 * UPLINK_FRAME_SAMPLES);
    }
}
