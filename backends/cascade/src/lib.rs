//! omni-cascade: a real speech-in, speech-out backend on CPU, behind `include/omni_backend.h`
//! and nothing else. Voice activity detection (`vad.rs`), speech recognition with Whisper
//! (`omni-asr-client`, through its own library), a small instruction-tuned LLM (`llm.rs`, llama.cpp)
//! and Piper speech synthesis (`tts.rs`, ONNX Runtime), driven by `engine.rs`. This file is
//! the C ABI: the function table, the handle, and the copying into the caller's buffers. No
//! panic crosses it.

mod early;
mod engine;
mod heard;
mod llm;
mod options;
mod tools;
pub mod tts;
mod vad;

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::os::raw::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use omni_backend_abi::*;

use engine::{Engine, Error, Kind, Message, Piece, Shared, Turn};
use tools::Tools;

/// Whether a struct the caller filled in (`struct_size` bytes) reaches the end of `field`.
macro_rules! covers {
    ($value:expr, $type:ty, $field:ident) => {{
        let end = std::mem::offset_of!($type, $field) + size_of_field(|t: &$type| &t.$field);
        $value.struct_size as usize >= end
    }};
}

/// The size of a struct's field, from a function that borrows it.
const fn size_of_field<T, F>(_: fn(&T) -> &F) -> usize {
    std::mem::size_of::<F>()
}

const NAME: &str = "omni-cascade";
const SETTINGS: &str = "top_k,top_p,seed";
const MAX_TEXT: usize = 4096;
const MAX_SAMPLES: usize = 24000 * 30;

/// What a handle pointer points to: the part any thread may use, and the engine the owner
/// thread drives (never touched from another thread).
struct Handle {
    shared: Arc<Shared>,
    engine: UnsafeCell<Engine>,
    error: UnsafeCell<String>,
}

/// # Safety
/// `b` is a handle from `open`, used by its owner thread (the ABI's rule).
unsafe fn owner<'a>(b: B) -> Option<(&'a mut Engine, &'a mut String)> {
    let h = unsafe { (b as *const Handle).as_ref()? };
    Some(unsafe { (&mut *h.engine.get(), &mut *h.error.get()) })
}

fn status(e: Error, error: &mut String) -> omni_status {
    let (code, text) = match e {
        Error::BadState(m) => (ERR_BAD_STATE, m),
        Error::Unsupported(m) => (ERR_UNSUPPORTED, m),
        Error::ContextFull(m) => (ERR_CONTEXT_FULL, m),
        Error::Interrupted => (ERR_INTERRUPTED, "interrupted".to_string()),
        Error::Inference(m) => (ERR_INFERENCE, m),
    };
    *error = text;
    code
}

/// Runs `f` on the owner's engine; a panic becomes OMNI_ERR_INTERNAL.
fn with_engine(b: B, f: impl FnOnce(&mut Engine, &mut String) -> omni_status) -> omni_status {
    // SAFETY: the ABI's threading rule.
    let Some((engine, error)) = (unsafe { owner(b) }) else { return ERR_INVALID_ARGUMENT };
    let error_ptr: *mut String = error;
    match catch_unwind(AssertUnwindSafe(|| f(engine, error))) {
        Ok(code) => code,
        Err(_) => {
            // SAFETY: the same String; the closure has returned (by unwinding).
            unsafe { *error_ptr = "internal error (a panic in the backend)".into() };
            ERR_INTERNAL
        }
    }
}

fn str_of(s: &omni_str) -> String {
    if s.ptr.is_null() || s.len == 0 {
        return String::new();
    }
    // SAFETY: the caller's buffer of `len` bytes, valid during the call.
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) }).into_owned()
}

fn pcm_of(p: &omni_pcm) -> Vec<f32> {
    if p.ptr.is_null() || p.len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's buffer of `len` samples.
    unsafe { std::slice::from_raw_parts(p.ptr, p.len) }.to_vec()
}

fn options_of(list: *const omni_option, n: usize) -> Vec<(String, String)> {
    if list.is_null() {
        return Vec::new();
    }
    // SAFETY: `n` options from the caller.
    unsafe { std::slice::from_raw_parts(list, n) }.iter().map(|o| (str_of(&o.key), str_of(&o.value))).collect()
}

fn write_text(text: &str, buf: *mut c_char, cap: usize) {
    if !buf.is_null() && text.len() <= cap {
        // SAFETY: the caller gave `cap` bytes.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, text.len()) };
    }
}

/// Where this library is (the ASR library is expected beside it).
fn this_library() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address of one of our functions.
    let found = unsafe { libc::dladdr(omni_backend_get_api as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path from the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

unsafe extern "C" fn open(
    options: *const omni_option,
    n: usize,
    out: *mut B,
    err: *mut c_char,
    cap: usize,
) -> omni_status {
    let write_err = |text: &str| {
        if !err.is_null() && cap > 0 {
            let n = text.len().min(cap - 1);
            // SAFETY: `cap` bytes at err.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), err as *mut u8, n);
                *err.add(n) = 0;
            }
        }
    };
    if out.is_null() || (options.is_null() && n > 0) {
        write_err("open: NULL argument");
        return ERR_INVALID_ARGUMENT;
    }
    let opened = catch_unwind(|| {
        let map: HashMap<String, String> = options_of(options, n).into_iter().collect();
        let opt = options::Options::parse(&map, this_library().as_deref()).map_err(|e| (ERR_INVALID_ARGUMENT, e))?;
        Engine::open(opt).map_err(|e| (ERR_OPEN_FAILED, e))
    });
    match opened {
        Ok(Ok(engine)) => {
            let shared = engine.shared.clone();
            let h = Box::new(Handle { shared, engine: UnsafeCell::new(engine), error: UnsafeCell::new(String::new()) });
            // SAFETY: checked non-null.
            unsafe { *out = Box::into_raw(h) as B };
            OK
        }
        Ok(Err((code, reason))) => {
            write_err(&reason);
            code
        }
        Err(_) => {
            write_err("open: internal error (a panic in the backend)");
            ERR_OPEN_FAILED
        }
    }
}

unsafe extern "C" fn close(b: B) {
    if !b.is_null() {
        // SAFETY: the owner frees its handle once.
        drop(unsafe { Box::from_raw(b as *mut Handle) });
    }
}

unsafe extern "C" fn info(b: B, out: *mut omni_backend_info) -> omni_status {
    if out.is_null() {
        return ERR_INVALID_ARGUMENT;
    }
    with_engine(b, |engine, _| {
        // SAFETY: the caller's struct.
        let out = unsafe { &mut *out };
        if (out.struct_size as usize) < std::mem::offset_of!(omni_backend_info, abi_revision) {
            return ERR_INVALID_ARGUMENT;
        }
        out.capabilities = CAP_SPEECH_OUTPUT | CAP_DUPLEX | CAP_TURN | CAP_TRANSCRIPTS | CAP_TOOLS;
        out.input_sample_rate = 16000;
        out.output_sample_rate = tts::OUT_RATE;
        out.context_size = engine.n_ctx();
        out.max_output_samples = MAX_SAMPLES as u32;
        out.max_output_text_bytes = MAX_TEXT as u32;
        out.name_len = NAME.len() as u32;
        for (i, c) in NAME.bytes().enumerate() {
            out.name[i] = c as c_char;
        }
        if out.struct_size as usize >= std::mem::offset_of!(omni_backend_info, step_samples) {
            // The revision it implements (the header's rule), whatever the caller's size.
            out.abi_revision = 3;
            out.settings_len = SETTINGS.len() as u32;
            for (i, c) in SETTINGS.bytes().enumerate() {
                out.settings[i] = c as c_char;
            }
        }
        if covers!(out, omni_backend_info, step_samples) {
            // It decides on every chunk (its own voice activity detection): small chunks
            // let it hear the end of speech within one of them.
            out.step_samples = engine.opt.chunk_ms * 16;
        }
        OK
    })
}

unsafe extern "C" fn last_error(b: B, buf: *mut c_char, cap: usize) -> usize {
    // SAFETY: the ABI's threading rule.
    let Some((_, error)) = (unsafe { owner(b) }) else { return 0 };
    let n = error.len().min(cap);
    if !buf.is_null() {
        // SAFETY: `cap` bytes at buf.
        unsafe { std::ptr::copy_nonoverlapping(error.as_ptr(), buf as *mut u8, n) };
    }
    error.len()
}

unsafe extern "C" fn prepare(b: B, config: *const omni_session_config) -> omni_status {
    // SAFETY: the caller's struct, valid during the call.
    let Some(config) = (unsafe { config.as_ref() }) else { return ERR_INVALID_ARGUMENT };
    with_engine(b, |engine, error| {
        let kind = match config.kind {
            SESSION_DUPLEX => Kind::Duplex,
            SESSION_TURN => Kind::Turn,
            other => {
                *error = format!("prepare: unknown session kind {other}");
                return ERR_INVALID_ARGUMENT;
            }
        };
        let settings = if covers!(config, omni_session_config, n_settings) {
            options_of(config.settings, config.n_settings)
        } else {
            Vec::new()
        };
        let tools = if covers!(config, omni_session_config, tool_choice) {
            match Tools::parse(&str_of(&config.tools), &str_of(&config.tool_choice)) {
                Ok(t) => t,
                Err(why) => {
                    *error = format!("prepare: {why}");
                    return ERR_INVALID_ARGUMENT;
                }
            }
        } else {
            Tools::default()
        };
        let prompt = str_of(&config.system_prompt);
        match engine.prepare(kind, &prompt, config.max_new_tokens, config.temperature, &settings, tools) {
            Ok(()) => OK,
            Err(e) => status(e, error),
        }
    })
}

unsafe extern "C" fn reset(b: B) -> omni_status {
    with_engine(b, |engine, _| {
        engine.reset();
        OK
    })
}

/// The caller's buffers of one output (step or turn): text, audio, and the transcript when
/// the caller asked for one.
struct Buffers {
    text: (*mut c_char, usize),
    audio: (*mut f32, usize),
    transcript: Option<(*mut c_char, usize)>,
}

/// Copies a piece into the caller's buffers; a piece that does not fit is held for the retry
/// (OMNI_ERR_BUFFER_TOO_SMALL, with the lengths already set by the caller of this).
fn deliver(engine: &mut Engine, piece: Piece, to: Buffers) -> omni_status {
    let fits = piece.text.len() <= to.text.1
        && piece.audio.len() <= to.audio.1
        && to.transcript.is_none_or(|(_, cap)| piece.transcript.len() <= cap);
    if !fits {
        engine.held = Some(piece);
        return ERR_BUFFER_TOO_SMALL;
    }
    write_text(&piece.text, to.text.0, to.text.1);
    if !piece.audio.is_empty() && !to.audio.0.is_null() {
        // SAFETY: audio_cap samples at audio_buf, checked above.
        unsafe { std::ptr::copy_nonoverlapping(piece.audio.as_ptr(), to.audio.0, piece.audio.len()) };
    }
    if let Some((buf, cap)) = to.transcript {
        write_text(&piece.transcript, buf, cap);
    }
    OK
}

/// Fills a step output with a piece.
fn step_out(engine: &mut Engine, piece: Piece, out: &mut omni_step_output) -> omni_status {
    out.kind = if piece.listen { OUTPUT_LISTEN } else { OUTPUT_SPEAK };
    out.end_of_turn = piece.last as u32;
    out.text_len = piece.text.len();
    out.audio_len = piece.audio.len();
    out.kv_length = engine.shared.kv.load(Ordering::SeqCst);
    out.input_tokens = piece.input_tokens;
    out.output_tokens = piece.tokens;
    out.prefill_us = piece.prefill_us;
    out.generate_us = piece.generate_us;
    let wants_transcript = covers!(out, omni_step_output, output_audio_tokens) && !out.transcript_buf.is_null();
    if wants_transcript {
        out.transcript_len = piece.transcript.len();
        out.input_audio_tokens = 0;
        out.output_audio_tokens = 0;
    }
    if covers!(out, omni_step_output, call_name) {
        (out.call, out.call_name_len) = call_fields(&piece, &mut out.call_name);
    }
    let piece = as_text(piece, &mut out.text_len);
    let transcript = wants_transcript.then_some((out.transcript_buf, out.transcript_cap));
    deliver(
        engine,
        piece,
        Buffers { text: (out.text_buf, out.text_cap), audio: (out.audio_buf, out.audio_cap), transcript },
    )
}

unsafe extern "C" fn duplex_prefill(b: B, input: *const omni_duplex_input) -> omni_status {
    // SAFETY: the caller's struct.
    let Some(input) = (unsafe { input.as_ref() }) else { return ERR_INVALID_ARGUMENT };
    with_engine(b, |engine, error| {
        if input.audio.ptr.is_null() || input.audio.len == 0 {
            *error = "duplex_prefill: audio is empty".into();
            return ERR_INVALID_ARGUMENT;
        }
        // SAFETY: the caller's samples, valid during the call.
        let audio = unsafe { std::slice::from_raw_parts(input.audio.ptr, input.audio.len) };
        // Frames are accepted and ignored: this backend has no vision (info says so).
        match engine.duplex_prefill(audio, input.flags & STEP_FORCE_LISTEN != 0) {
            Ok(()) => OK,
            Err(e) => status(e, error),
        }
    })
}

unsafe extern "C" fn duplex_generate(b: B, out: *mut omni_step_output) -> omni_status {
    // SAFETY: the caller's struct.
    let Some(out) = (unsafe { out.as_mut() }) else { return ERR_INVALID_ARGUMENT };
    with_engine(b, |engine, error| {
        let piece = match engine.held.take() {
            Some(p) => Ok(p),
            None => engine.duplex_generate(),
        };
        match piece {
            Ok(p) => step_out(engine, p, out),
            Err(e) => status(e, error),
        }
    })
}

unsafe extern "C" fn duplex_drain(b: B, out: *mut omni_step_output) -> omni_status {
    // SAFETY: the caller's struct.
    let Some(out) = (unsafe { out.as_mut() }) else { return ERR_INVALID_ARGUMENT };
    with_engine(b, |engine, error| {
        let piece = match engine.held.take() {
            Some(p) => Ok(Some(p)),
            None => engine.duplex_drain(),
        };
        match piece {
            Ok(Some(p)) => step_out(engine, p, out),
            Ok(None) => {
                out.kind = OUTPUT_NONE;
                out.end_of_turn = 0;
                out.text_len = 0;
                out.audio_len = 0;
                out.kv_length = engine.shared.kv.load(Ordering::SeqCst);
                OK
            }
            Err(e) => status(e, error),
        }
    })
}

unsafe extern "C" fn duplex_finalize(b: B) -> omni_status {
    with_engine(b, |engine, _| {
        engine.held = None;
        OK
    })
}

unsafe extern "C" fn turn_prefill(b: B, input: *const omni_turn_input) -> omni_status {
    // SAFETY: the caller's struct.
    let Some(input) = (unsafe { input.as_ref() }) else { return ERR_INVALID_ARGUMENT };
    with_engine(b, |engine, error| {
        let v13 = covers!(input, omni_turn_input, tool_choice);
        if input.messages.is_null() && (input.n_messages > 0 || !v13) {
            *error = "turn_prefill: no messages".into();
            return ERR_INVALID_ARGUMENT;
        }
        let list = if input.n_messages == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's messages, valid during the call.
            unsafe { std::slice::from_raw_parts(input.messages, input.n_messages) }
        };
        let messages: Vec<Message> = list
            .iter()
            .map(|m| {
                let clips = if m.audios.is_null() {
                    Vec::new()
                } else {
                    // SAFETY: the caller's clips.
                    unsafe { std::slice::from_raw_parts(m.audios, m.n_audios) }.iter().map(pcm_of).collect()
                };
                let name = if covers!(m, omni_message, name) { str_of(&m.name) } else { String::new() };
                Message { role: m.role, text: str_of(&m.text), clips, images: m.n_images, name }
            })
            .collect();
        let continues = covers!(input, omni_turn_input, n_settings) && input.flags & TURN_CONTINUE != 0;
        let tools = if v13 && (input.tools.len > 0 || input.tool_choice.len > 0) {
            let json = if input.tools.len > 0 { str_of(&input.tools) } else { String::new() };
            match Tools::parse(&json, &str_of(&input.tool_choice)) {
                // A choice alone chooses among the session's tools: kept as the session's.
                Ok(t) if input.tools.len > 0 => Some(t),
                Ok(_) => None,
                Err(why) => {
                    *error = format!("turn_prefill: {why}");
                    return ERR_INVALID_ARGUMENT;
                }
            }
        } else {
            None
        };
        engine.held = None;
        let turn = Turn {
            messages,
            continues,
            speech: input.flags & TURN_SPEECH != 0,
            max_tokens: input.max_new_tokens,
            prefill_only: v13 && input.flags & TURN_PREFILL_ONLY != 0,
            tools,
        };
        match engine.turn_prefill(turn) {
            Ok(()) => OK,
            Err(e) => status(e, error),
        }
    })
}

unsafe extern "C" fn turn_generate(b: B, out: *mut omni_turn_output) -> omni_status {
    // SAFETY: the caller's struct.
    let Some(out) = (unsafe { out.as_mut() }) else { return ERR_INVALID_ARGUMENT };
    with_engine(b, |engine, error| {
        let piece = match engine.held.take() {
            Some(p) => p,
            None => match engine.turn_generate() {
                Ok(p) => p,
                Err(e) => return status(e, error),
            },
        };
        out.done = piece.last as u32;
        out.output_tokens = piece.tokens;
        out.text_len = piece.text.len();
        out.audio_len = piece.audio.len();
        out.kv_length = engine.shared.kv.load(Ordering::SeqCst);
        out.input_tokens = piece.input_tokens;
        out.generate_us = piece.generate_us;
        let wants_transcript = covers!(out, omni_turn_output, output_audio_tokens) && !out.transcript_buf.is_null();
        if wants_transcript {
            out.transcript_len = piece.transcript.len();
        }
        if covers!(out, omni_turn_output, call_name) {
            (out.call, out.call_name_len) = call_fields(&piece, &mut out.call_name);
        }
        let piece = as_text(piece, &mut out.text_len);
        let transcript = wants_transcript.then_some((out.transcript_buf, out.transcript_cap));
        let to = Buffers { text: (out.text_buf, out.text_cap), audio: (out.audio_buf, out.audio_cap), transcript };
        deliver(engine, piece, to)
    })
}

/// The 1.3 fields of a piece that is a function call: `call` and the tool's name.
fn call_fields(piece: &Piece, name: &mut [c_char; 64]) -> (u32, u32) {
    let Some((tool, _)) = &piece.call else { return (0, 0) };
    let n = tool.len().min(name.len());
    for (i, c) in tool.bytes().take(n).enumerate() {
        name[i] = c as c_char;
    }
    (1, n as u32)
}

/// A call's arguments go out as the piece's text (the ABI's rule); `text_len` follows.
fn as_text(mut piece: Piece, text_len: &mut usize) -> Piece {
    if let Some((_, arguments)) = piece.call.take() {
        piece.text = arguments;
        *text_len = piece.text.len();
    }
    piece
}

/// ANY THREAD: touches only the shared part.
unsafe fn shared<'a>(b: B) -> Option<&'a Shared> {
    // SAFETY: a live handle; `shared` is never mutated after open.
    unsafe { (b as *const Handle).as_ref().map(|h| &*h.shared) }
}

unsafe extern "C" fn interrupt(b: B) -> omni_status {
    match unsafe { shared(b) } {
        Some(s) => {
            s.interrupt();
            OK
        }
        None => ERR_INVALID_ARGUMENT,
    }
}

unsafe extern "C" fn set_force_listen(b: B, on: i32) -> omni_status {
    match unsafe { shared(b) } {
        Some(s) => {
            s.force_listen.store(on != 0, Ordering::SeqCst);
            OK
        }
        None => ERR_INVALID_ARGUMENT,
    }
}

unsafe extern "C" fn kv_length(b: B) -> u64 {
    unsafe { shared(b) }.map(|s| s.kv.load(Ordering::SeqCst)).unwrap_or(0)
}

static API: omni_backend_api = omni_backend_api {
    struct_size: std::mem::size_of::<omni_backend_api>() as u32,
    abi_version: ABI_VERSION,
    open: Some(open),
    close: Some(close),
    info: Some(info),
    last_error: Some(last_error),
    prepare: Some(prepare),
    reset: Some(reset),
    duplex_prefill: Some(duplex_prefill),
    duplex_generate: Some(duplex_generate),
    duplex_drain: Some(duplex_drain),
    duplex_finalize: Some(duplex_finalize),
    turn_prefill: Some(turn_prefill),
    turn_generate: Some(turn_generate),
    interrupt: Some(interrupt),
    set_force_listen: Some(set_force_listen),
    kv_length: Some(kv_length),
};

#[unsafe(no_mangle)]
pub extern "C" fn omni_backend_abi_version() -> u32 {
    ABI_VERSION
}

#[unsafe(no_mangle)]
pub extern "C" fn omni_backend_get_api(abi_version: u32) -> *const omni_backend_api {
    if abi_version == ABI_VERSION { &API } else { std::ptr::null() }
}
