//! A duplex chunk written into a JSON message as text, for the backends that forward chunks to a
//! model server (`minicpmo.rs`, `vllm_omni/`): base64 needs no JSON escaping (serde_json would
//! look at each of its 85,000 bytes a second for one), and the client's own base64 of the audio
//! is forwarded when it has it (it was checked when the chunk was decoded), else encoded once.

use omni_actors::domain::DuplexChunk;

/// The room `audio` and `frames` take as base64 (to size the message once).
pub(crate) fn encoded_len(c: &DuplexChunk, frames: &[Vec<u8>]) -> usize {
    let simd = base64_simd::STANDARD;
    let audio = c.audio_base64.as_ref().map_or_else(|| simd.encoded_length(c.audio.len() * 4), |b| b.len());
    audio + frames.iter().map(|f| simd.encoded_length(f.len()) + 3).sum::<usize>()
}

/// `,"KEY":["B64","B64"]` of the frames, nothing when there are none.
pub(crate) fn push_frames(key: &str, frames: &[Vec<u8>], m: &mut String) {
    if frames.is_empty() {
        return;
    }
    m.push_str(",\"");
    m.push_str(key);
    m.push_str("\":[");
    for (i, frame) in frames.iter().enumerate() {
        m.push_str(if i == 0 { "\"" } else { ",\"" });
        base64_simd::STANDARD.encode_append(frame, m);
        m.push('"');
    }
    m.push(']');
}

/// `,"KEY":"B64"` of the chunk's audio, float32 little-endian at 16 kHz.
pub(crate) fn push_audio(key: &str, c: &DuplexChunk, m: &mut String) {
    m.push_str(",\"");
    m.push_str(key);
    m.push_str("\":\"");
    match c.audio_base64.as_deref().map(std::str::from_utf8) {
        Some(Ok(b64)) => m.push_str(b64),
        _ => omni_actors::audio::pcm::encode_pcm_f32(&c.audio, m),
    }
    m.push('"');
}
