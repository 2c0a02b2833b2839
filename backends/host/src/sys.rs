//! The backend ABI's Rust mirror (the `omni-backend-abi` crate, `backends/abi/`), the
//! built-in reference backend's entry points, and the test that the mirror matches C's layout.

pub(super) use omni_backend_abi::*;

unsafe extern "C" {
    /// The built-in reference backend, linked statically (see build.rs).
    pub(super) fn omni_reference_abi_version() -> u32;
    pub(super) fn omni_reference_get_api(abi_version: u32) -> *const omni_backend_api;
    /// Sizes and offsets of the structs as C laid them out (backends/abi_layout.c).
    #[cfg(test)]
    pub(super) fn omni_abi_layout(i: usize) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_the_c_compiler() {
        let rust = [
            size_of::<omni_str>(),
            size_of::<omni_bytes>(),
            size_of::<omni_pcm>(),
            size_of::<omni_option>(),
            size_of::<omni_backend_info>(),
            offset_of!(omni_backend_info, name),
            size_of::<omni_session_config>(),
            offset_of!(omni_session_config, ref_audio),
            offset_of!(omni_session_config, temperature),
            size_of::<omni_duplex_input>(),
            offset_of!(omni_duplex_input, frames),
            offset_of!(omni_duplex_input, max_slice_nums),
            size_of::<omni_step_output>(),
            offset_of!(omni_step_output, kind),
            offset_of!(omni_step_output, kv_length),
            offset_of!(omni_step_output, generate_us),
            size_of::<omni_message>(),
            offset_of!(omni_message, audios),
            size_of::<omni_turn_input>(),
            offset_of!(omni_turn_input, max_new_tokens),
            offset_of!(omni_turn_input, tts_ref_audio),
            size_of::<omni_turn_output>(),
            offset_of!(omni_turn_output, done),
            offset_of!(omni_turn_output, kv_length),
            offset_of!(omni_turn_output, generate_us),
            size_of::<omni_backend_api>(),
            offset_of!(omni_backend_api, open),
            offset_of!(omni_backend_api, kv_length),
            offset_of!(omni_backend_info, abi_revision),
            offset_of!(omni_backend_info, settings),
            offset_of!(omni_session_config, settings),
            offset_of!(omni_step_output, transcript_buf),
            offset_of!(omni_step_output, output_audio_tokens),
            offset_of!(omni_turn_input, settings),
            offset_of!(omni_turn_output, transcript_buf),
            offset_of!(omni_turn_output, output_audio_tokens),
            offset_of!(omni_backend_info, step_samples),
            offset_of!(omni_session_config, tools),
            offset_of!(omni_session_config, tool_choice),
            offset_of!(omni_step_output, call),
            offset_of!(omni_step_output, call_name),
            offset_of!(omni_message, call_id),
            offset_of!(omni_message, name),
            offset_of!(omni_turn_input, tools),
            offset_of!(omni_turn_input, tool_choice),
            offset_of!(omni_turn_output, call),
            offset_of!(omni_turn_output, call_name),
        ];
        for (i, &r) in rust.iter().enumerate() {
            let c = unsafe { omni_abi_layout(i) };
            assert_eq!(r, c, "layout entry {i}: Rust {r}, C {c}");
        }
        assert_eq!(unsafe { omni_abi_layout(rust.len()) }, usize::MAX, "the C table has more entries than the test");
    }
}
