//! Samples as integers and bytes: 16-bit PCM's scaling (one rule for every edge, dialect and
//! backend that reads or writes it), and the voice as little-endian float32 PCM in base64 (how
//! the MiniCPM-o dialects carry it, and how the model servers take it).

/// A sample in -1..1 (clipped) as 16-bit PCM, rounded.
pub fn to_i16(sample: f32) -> i16 {
    (sample.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// A 16-bit PCM sample in -1..1.
pub fn from_i16(sample: i16) -> f32 {
    f32::from(sample) / 32768.0
}

/// Little-endian 16-bit PCM bytes as samples in -1..1, appended to `out` (an odd last byte is
/// not a sample).
pub fn decode_i16_le(bytes: &[u8], out: &mut Vec<f32>) {
    out.extend(bytes.chunks_exact(2).map(|b| from_i16(i16::from_le_bytes([b[0], b[1]]))));
}

/// Samples as little-endian 16-bit PCM bytes, appended to `out`.
pub fn encode_i16_le(samples: &[f32], out: &mut Vec<u8>) {
    out.extend(samples.iter().flat_map(|&s| to_i16(s).to_le_bytes()));
}

/// Appends the base64 of `samples` as little-endian float32 to `out`.
pub fn encode_pcm_f32(samples: &[f32], out: &mut String) {
    let simd = base64_simd::STANDARD;
    if cfg!(target_endian = "little") {
        simd.encode_append(bytemuck::cast_slice::<f32, u8>(samples), out);
    } else {
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        simd.encode_append(bytes, out);
    }
}

/// Length of the base64 of `samples` float32 samples (with padding).
pub fn pcm_b64_len(samples: usize) -> usize {
    (samples * 4).div_ceil(3) * 4
}
