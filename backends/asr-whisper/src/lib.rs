//! Speech recognition for the cascade backend, in a shared library of its own.
//!
//! whisper.cpp and llama.cpp each vendor their own copy of ggml (different versions); linked
//! into one library they clash. A Rust cdylib exports only its `#[no_mangle]` functions and
//! keeps every C symbol local, so this library's ggml stays private and the cascade backend
//! loads it with `dlopen` next to its own. The interface is four C functions:
//!
//! ```c
//! void *omni_asr_open(const char *path, size_t path_len, int32_t threads, char *err, size_t err_cap);
//! int32_t omni_asr_transcribe(void *h, const float *pcm16k, size_t n, char *out, size_t cap, size_t *out_len);
//! void omni_asr_abort(void *h);   /* any thread: cuts a transcription short */
//! void omni_asr_close(void *h);
//! ```
//! `omni_asr_transcribe` returns 0 (text in `out`), 1 (error text in `out`), 2 (`out` too
//! small: `*out_len` is the size needed) or 3 (aborted).

use std::cell::UnsafeCell;
use std::os::raw::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use whisper_rs::{FullParams, SamplingStrategy, WhisperContext, WhisperContextParameters, WhisperState};

pub const OK: i32 = 0;
pub const ERROR: i32 = 1;
pub const TOO_SMALL: i32 = 2;
pub const ABORTED: i32 = 3;

struct Asr {
    state: WhisperState,
    _ctx: WhisperContext,
    threads: i32,
    abort: Arc<AtomicBool>,
    /// A multilingual model (Whisper base): it is told the context (`PROMPT`).
    multilingual: bool,
}

/// Audio context beyond the utterance's own (50 per second): less makes the decoder repeat
/// itself and mishear (`scripts/asr_wer.py`: tiny.en at 74 % word errors with 64, 24 % with
/// 256, 19 % with 512 at 1.7 times the time; docs/cpu-backend.md).
const AUDIO_CTX_MARGIN: i32 = 256;
/// The most tokens a second of speech may give (about twice what English speech does), plus
/// a few: a decoder that repeats itself stops there.
const TOKENS_PER_SECOND: f32 = 6.0;
/// What a multilingual model is told the audio is: it hears questions better (Whisper base on
/// espeak-ng's voices: 18.5 % word errors without, 13.9 % with). English-only models (tiny.en)
/// do worse with it, and get none.
const PROMPT: &str = "A person asks a voice assistant a short question.";

/// What the C side holds: the flag any thread may set, and the model the owner thread uses.
struct Handle {
    abort: Arc<AtomicBool>,
    asr: UnsafeCell<Asr>,
}

fn write(text: &str, out: *mut c_char, cap: usize) -> usize {
    if !out.is_null() && cap > 0 {
        let n = text.len().min(cap);
        // SAFETY: the caller gave `cap` writable bytes at `out`.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), out as *mut u8, n) };
        if n < cap {
            // SAFETY: n < cap.
            unsafe { *out.add(n) = 0 };
        }
    }
    text.len()
}

/// Opens a whisper.cpp model (ggml format).
///
/// # Safety
/// `path` points to `path_len` bytes of UTF-8; `err` to `err_cap` writable bytes (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omni_asr_open(
    path: *const c_char,
    path_len: usize,
    threads: i32,
    err: *mut c_char,
    err_cap: usize,
) -> *mut std::ffi::c_void {
    let opened = catch_unwind(|| {
        if path.is_null() {
            return Err("no model path".to_string());
        }
        // SAFETY: the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(path as *const u8, path_len) };
        let path = std::str::from_utf8(bytes).map_err(|_| "the model path is not UTF-8".to_string())?;
        whisper_rs::install_logging_hooks();
        let ctx = WhisperContext::new_with_params(path, WhisperContextParameters::default())
            .map_err(|e| format!("whisper.cpp could not load {path}: {e}"))?;
        let state = ctx.create_state().map_err(|e| format!("whisper.cpp: {e}"))?;
        let abort = Arc::new(AtomicBool::new(false));
        let multilingual = ctx.is_multilingual();
        let asr = Asr { state, _ctx: ctx, threads: threads.max(1), abort: abort.clone(), multilingual };
        Ok(Box::new(Handle { abort, asr: UnsafeCell::new(asr) }))
    });
    match opened {
        Ok(Ok(asr)) => Box::into_raw(asr) as *mut _,
        Ok(Err(reason)) => {
            write(&reason, err, err_cap);
            std::ptr::null_mut()
        }
        Err(_) => {
            write("whisper.cpp panicked while loading", err, err_cap);
            std::ptr::null_mut()
        }
    }
}

/// Transcribes 16 kHz mono float PCM (English).
///
/// # Safety
/// `h` came from `omni_asr_open`; `pcm` holds `n` samples; `out` has `cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omni_asr_transcribe(
    h: *mut std::ffi::c_void,
    pcm: *const f32,
    n: usize,
    out: *mut c_char,
    cap: usize,
    out_len: *mut usize,
) -> i32 {
    if h.is_null() || (pcm.is_null() && n > 0) || out_len.is_null() {
        return ERROR;
    }
    // SAFETY: the caller's contract: the owner thread, one call at a time; other threads
    // touch only `abort`, outside the cell.
    let handle = unsafe { &*(h as *const Handle) };
    let asr = unsafe { &mut *handle.asr.get() };
    let samples = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(pcm, n) } };
    asr.abort.store(false, Ordering::SeqCst);
    let result = catch_unwind(AssertUnwindSafe(|| transcribe(asr, samples)));
    let (code, text) = match result {
        Ok(Ok(text)) => (OK, text),
        Ok(Err(e)) if asr.abort.load(Ordering::SeqCst) => (ABORTED, e),
        Ok(Err(e)) => (ERROR, e),
        Err(_) => (ERROR, "whisper.cpp panicked".to_string()),
    };
    // SAFETY: checked non-null above.
    unsafe { *out_len = text.len() };
    if code == OK && text.len() > cap {
        return TOO_SMALL;
    }
    write(&text, out, cap);
    code
}

fn transcribe(asr: &mut Asr, samples: &[f32]) -> Result<String, String> {
    // Whisper reads 30 s windows; a shorter audio context (50 per second of audio, plus a
    // margin) makes short utterances several times faster with nearly the same words.
    let seconds = samples.len() as f32 / 16000.0;
    let audio_ctx = ((seconds * 50.0) as i32 + AUDIO_CTX_MARGIN).min(1500);
    let mut params = FullParams::new(SamplingStrategy::Greedy { best_of: 1 });
    params.set_n_threads(asr.threads);
    params.set_language(Some("en"));
    params.set_audio_ctx(audio_ctx);
    params.set_max_tokens((seconds.max(1.0) * TOKENS_PER_SECOND) as i32 + 8);
    if asr.multilingual {
        params.set_initial_prompt(PROMPT);
    }
    params.set_no_context(true);
    params.set_single_segment(true);
    params.set_no_timestamps(true);
    params.set_suppress_blank(true);
    params.set_print_progress(false);
    params.set_print_realtime(false);
    params.set_print_special(false);
    params.set_print_timestamps(false);
    // whisper-rs 0.16's set_abort_callback_safe hands whisper.cpp a pointer of the wrong type
    // (it reads garbage and aborts at random): a plain C callback on the flag instead.
    unsafe extern "C" fn aborted(flag: *mut std::ffi::c_void) -> bool {
        // SAFETY: `flag` is the AtomicBool of the handle, alive for the whole call.
        unsafe { (*(flag as *const AtomicBool)).load(Ordering::SeqCst) }
    }
    // SAFETY: the flag outlives `full` (the handle owns it).
    unsafe {
        params.set_abort_callback(Some(aborted));
        params.set_abort_callback_user_data(Arc::as_ptr(&asr.abort) as *mut std::ffi::c_void);
    }
    // Whisper needs at least a second of audio: pad short clips with silence.
    let mut padded;
    let mut input = samples;
    if samples.len() < 16000 + 1600 {
        padded = samples.to_vec();
        padded.resize(16000 + 1600, 0.0);
        input = &padded;
    }
    asr.state.full(params, input).map_err(|e| format!("whisper.cpp: {e}"))?;
    let mut text = String::new();
    for segment in asr.state.as_iter() {
        if let Ok(s) = segment.to_str_lossy() {
            text.push_str(&s);
        }
    }
    Ok(text.trim().to_string())
}

/// Cuts a transcription in flight short (any thread).
///
/// # Safety
/// `h` came from `omni_asr_open` and is not closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omni_asr_abort(h: *mut std::ffi::c_void) {
    if !h.is_null() {
        // SAFETY: only the atomic is touched, which any thread may do.
        let handle = unsafe { &*(h as *const Handle) };
        handle.abort.store(true, Ordering::SeqCst);
    }
}

/// Frees the handle; NULL is ignored.
///
/// # Safety
/// `h` came from `omni_asr_open`; no call is in flight on it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn omni_asr_close(h: *mut std::ffi::c_void) {
    if !h.is_null() {
        // SAFETY: the caller's contract.
        drop(unsafe { Box::from_raw(h as *mut Handle) });
    }
}
