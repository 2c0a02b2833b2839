//! Raw mirror of `include/omni_backend.h`, shared by the gateway (which calls backends) and
//! the backends written in Rust (which implement it). Field order and types follow the header
//! one to one; the backend host's unit test (backends/host/src/sys.rs) compares every size and offset
//! with what the C compiler computed.
#![allow(non_camel_case_types)]

use std::os::raw::c_char;

pub const ABI_VERSION: u32 = 1;
pub const ABI_VERSION_SYMBOL: &[u8] = b"omni_backend_abi_version\0";
pub const GET_API_SYMBOL: &[u8] = b"omni_backend_get_api\0";

pub type omni_status = i32;
pub const OK: omni_status = 0;
pub const ERR_INVALID_ARGUMENT: omni_status = 1;
pub const ERR_BAD_STATE: omni_status = 2;
pub const ERR_INFERENCE: omni_status = 3;
pub const ERR_CONTEXT_FULL: omni_status = 4;
pub const ERR_INTERRUPTED: omni_status = 5;
pub const ERR_UNSUPPORTED: omni_status = 6;
pub const ERR_BUFFER_TOO_SMALL: omni_status = 7;
pub const ERR_OPEN_FAILED: omni_status = 8;
pub const ERR_INTERNAL: omni_status = 9;

pub const CAP_VISION: u32 = 1 << 0;
pub const CAP_SPEECH_OUTPUT: u32 = 1 << 1;
pub const CAP_DUPLEX: u32 = 1 << 2;
pub const CAP_TURN: u32 = 1 << 3;
pub const CAP_TRANSCRIPTS: u32 = 1 << 4;
pub const CAP_TOKEN_DETAILS: u32 = 1 << 5;
pub const CAP_TOOLS: u32 = 1 << 6;

pub const SESSION_DUPLEX: u32 = 1;
pub const SESSION_TURN: u32 = 2;

pub const STEP_FORCE_LISTEN: u32 = 1 << 0;

pub const OUTPUT_NONE: u32 = 0;
pub const OUTPUT_LISTEN: u32 = 1;
pub const OUTPUT_SPEAK: u32 = 2;

pub const ROLE_SYSTEM: u32 = 0;
pub const ROLE_USER: u32 = 1;
pub const ROLE_ASSISTANT: u32 = 2;
pub const ROLE_TOOL_CALL: u32 = 3;
pub const ROLE_TOOL_RESULT: u32 = 4;

pub const TURN_SPEECH: u32 = 1 << 0;
pub const TURN_THINKING: u32 = 1 << 1;
pub const TURN_TTS_TEMPLATE: u32 = 1 << 2;
pub const TURN_OMNI: u32 = 1 << 3;
pub const TURN_CONTINUE: u32 = 1 << 4;
pub const TURN_PREFILL_ONLY: u32 = 1 << 5;
/// The revision of ABI version 1 this server speaks (1.2).
pub const ABI_REVISION: u32 = 3;

#[repr(C)]
pub struct omni_backend {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct omni_str {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct omni_bytes {
    pub ptr: *const u8,
    pub len: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct omni_pcm {
    pub ptr: *const f32,
    pub len: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct omni_option {
    pub key: omni_str,
    pub value: omni_str,
}

#[repr(C)]
pub struct omni_backend_info {
    pub struct_size: u32,
    pub capabilities: u32,
    pub input_sample_rate: u32,
    pub output_sample_rate: u32,
    pub context_size: u32,
    pub max_output_samples: u32,
    pub max_output_text_bytes: u32,
    pub name_len: u32,
    pub name: [c_char; 64],
    // since 1.1
    pub abi_revision: u32,
    pub settings_len: u32,
    pub settings: [c_char; 512],
    // since 1.2
    pub step_samples: u32,
}

#[repr(C)]
pub struct omni_session_config {
    pub struct_size: u32,
    pub kind: u32,
    pub system_prompt: omni_str,
    pub voice: omni_str,
    pub ref_audio: omni_pcm,
    pub tts_ref_audio: omni_pcm,
    pub max_new_tokens: u32,
    pub max_slice_nums: u32,
    pub force_listen_count: u32,
    pub length_penalty: f32,
    pub temperature: f32,
    // since 1.1
    pub settings: *const omni_option,
    pub n_settings: usize,
    // since 1.3
    pub tools: omni_str,
    pub tool_choice: omni_str,
}

#[repr(C)]
pub struct omni_duplex_input {
    pub struct_size: u32,
    pub flags: u32,
    pub audio: omni_pcm,
    pub frames: *const omni_bytes,
    pub n_frames: usize,
    pub max_slice_nums: u32,
}

#[repr(C)]
pub struct omni_step_output {
    pub struct_size: u32,
    pub text_buf: *mut c_char,
    pub text_cap: usize,
    pub audio_buf: *mut f32,
    pub audio_cap: usize,
    pub kind: u32,
    pub end_of_turn: u32,
    pub text_len: usize,
    pub audio_len: usize,
    pub kv_length: u64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub prefill_us: u32,
    pub generate_us: u32,
    // since 1.1
    pub transcript_buf: *mut c_char,
    pub transcript_cap: usize,
    pub transcript_len: usize,
    pub input_audio_tokens: u32,
    pub output_audio_tokens: u32,
    // since 1.3
    pub call: u32,
    pub call_name_len: u32,
    pub call_name: [c_char; 64],
}

#[repr(C)]
pub struct omni_message {
    pub struct_size: u32,
    pub role: u32,
    pub text: omni_str,
    pub images: *const omni_bytes,
    pub n_images: usize,
    pub audios: *const omni_pcm,
    pub n_audios: usize,
    // since 1.3
    pub call_id: omni_str,
    pub name: omni_str,
}

#[repr(C)]
pub struct omni_turn_input {
    pub struct_size: u32,
    pub flags: u32,
    pub messages: *const omni_message,
    pub n_messages: usize,
    pub max_new_tokens: u32,
    pub max_slice_nums: u32,
    pub length_penalty: f32,
    pub temperature: f32,
    pub tts_ref_audio: omni_pcm,
    // since 1.1
    pub settings: *const omni_option,
    pub n_settings: usize,
    // since 1.3
    pub tools: omni_str,
    pub tool_choice: omni_str,
}

#[repr(C)]
pub struct omni_turn_output {
    pub struct_size: u32,
    pub text_buf: *mut c_char,
    pub text_cap: usize,
    pub audio_buf: *mut f32,
    pub audio_cap: usize,
    pub done: u32,
    pub output_tokens: u32,
    pub text_len: usize,
    pub audio_len: usize,
    pub kv_length: u64,
    pub input_tokens: u32,
    pub generate_us: u32,
    // since 1.1
    pub transcript_buf: *mut c_char,
    pub transcript_cap: usize,
    pub transcript_len: usize,
    pub input_audio_tokens: u32,
    pub output_audio_tokens: u32,
    // since 1.3
    pub call: u32,
    pub call_name_len: u32,
    pub call_name: [c_char; 64],
}

pub type B = *mut omni_backend;

#[repr(C)]
pub struct omni_backend_api {
    pub struct_size: u32,
    pub abi_version: u32,
    pub open: Option<unsafe extern "C" fn(*const omni_option, usize, *mut B, *mut c_char, usize) -> omni_status>,
    pub close: Option<unsafe extern "C" fn(B)>,
    pub info: Option<unsafe extern "C" fn(B, *mut omni_backend_info) -> omni_status>,
    pub last_error: Option<unsafe extern "C" fn(B, *mut c_char, usize) -> usize>,
    pub prepare: Option<unsafe extern "C" fn(B, *const omni_session_config) -> omni_status>,
    pub reset: Option<unsafe extern "C" fn(B) -> omni_status>,
    pub duplex_prefill: Option<unsafe extern "C" fn(B, *const omni_duplex_input) -> omni_status>,
    pub duplex_generate: Option<unsafe extern "C" fn(B, *mut omni_step_output) -> omni_status>,
    pub duplex_drain: Option<unsafe extern "C" fn(B, *mut omni_step_output) -> omni_status>,
    pub duplex_finalize: Option<unsafe extern "C" fn(B) -> omni_status>,
    pub turn_prefill: Option<unsafe extern "C" fn(B, *const omni_turn_input) -> omni_status>,
    pub turn_generate: Option<unsafe extern "C" fn(B, *mut omni_turn_output) -> omni_status>,
    pub interrupt: Option<unsafe extern "C" fn(B) -> omni_status>,
    pub set_force_listen: Option<unsafe extern "C" fn(B, i32) -> omni_status>,
    pub kv_length: Option<unsafe extern "C" fn(B) -> u64>,
}

pub type AbiVersionFn = unsafe extern "C" fn() -> u32;
pub type GetApiFn = unsafe extern "C" fn(u32) -> *const omni_backend_api;
