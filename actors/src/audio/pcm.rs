//! The model's and the caller's voice as little-endian float32 PCM in base64: how the MiniCPM-o
//! dialects carry it, and how the model servers take it.

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
