//! Speech recognition through `libomni_asr_whisper.so` (backends/asr-whisper), loaded with
//! dlopen: whisper.cpp's ggml lives in that library and never meets llama.cpp's (the CPU model
//! backend's), nor links into the gateway (its transcription actor). Used by both.

use std::ffi::c_void;
use std::os::raw::c_char;
use std::path::Path;

use libloading::Library;

type OpenFn = unsafe extern "C" fn(*const c_char, usize, i32, *mut c_char, usize) -> *mut c_void;
type TranscribeFn = unsafe extern "C" fn(*mut c_void, *const f32, usize, *mut c_char, usize, *mut usize) -> i32;
type HandleFn = unsafe extern "C" fn(*mut c_void);

pub struct Asr {
    handle: *mut c_void,
    transcribe: TranscribeFn,
    abort: HandleFn,
    close: HandleFn,
    _lib: Library,
}

// The handle is used from the owner thread; only `abort` (atomic inside) from others.
unsafe impl Send for Asr {}
unsafe impl Sync for Asr {}

pub enum Heard {
    Text(String),
    Aborted,
}

/// Why recognition could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum AsrError {
    /// The library did not load.
    #[error("asr_library {library}: {reason}")]
    Load { library: String, reason: String },
    /// The library lacks one of the ABI's functions: not asr-whisper, or another version.
    #[error("asr_library: {0}")]
    Symbol(String),
    /// The model did not open (what whisper.cpp said).
    #[error("asr model: {0}")]
    Open(String),
    /// Recognition failed (what whisper.cpp said).
    #[error("transcription: {0}")]
    Transcribe(String),
}

impl Asr {
    pub fn open(library: &Path, model: &Path, threads: i32) -> Result<Asr, AsrError> {
        // SAFETY: loading a library runs its initialisers; this one is ours (asr-whisper).
        let lib = unsafe { Library::new(library) }
            .map_err(|e| AsrError::Load { library: library.display().to_string(), reason: e.to_string() })?;
        // SAFETY: the symbols have the types asr-whisper exports (see its lib.rs).
        let (open, transcribe, abort, close) = unsafe {
            let open: OpenFn = *lib.get::<OpenFn>(b"omni_asr_open\0").map_err(|e| AsrError::Symbol(e.to_string()))?;
            let transcribe: TranscribeFn =
                *lib.get::<TranscribeFn>(b"omni_asr_transcribe\0").map_err(|e| AsrError::Symbol(e.to_string()))?;
            let abort: HandleFn =
                *lib.get::<HandleFn>(b"omni_asr_abort\0").map_err(|e| AsrError::Symbol(e.to_string()))?;
            let close: HandleFn =
                *lib.get::<HandleFn>(b"omni_asr_close\0").map_err(|e| AsrError::Symbol(e.to_string()))?;
            (open, transcribe, abort, close)
        };
        let path = model.to_string_lossy();
        let mut err = vec![0u8; 512];
        // SAFETY: path and err are valid for their lengths.
        let handle = unsafe {
            open(path.as_ptr() as *const c_char, path.len(), threads, err.as_mut_ptr() as *mut c_char, err.len())
        };
        if handle.is_null() {
            let end = err.iter().position(|b| *b == 0).unwrap_or(err.len());
            return Err(AsrError::Open(String::from_utf8_lossy(&err[..end]).into_owned()));
        }
        Ok(Asr { handle, transcribe, abort, close, _lib: lib })
    }

    /// The words in 16 kHz audio (English).
    pub fn transcribe(&self, audio: &[f32]) -> Result<Heard, AsrError> {
        let mut buf = vec![0u8; 4096];
        loop {
            let mut len = 0usize;
            // SAFETY: the handle is open; the buffers are valid for their lengths.
            let code = unsafe {
                (self.transcribe)(
                    self.handle,
                    audio.as_ptr(),
                    audio.len(),
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len(),
                    &mut len,
                )
            };
            match code {
                0 => return Ok(Heard::Text(String::from_utf8_lossy(&buf[..len.min(buf.len())]).into_owned())),
                2 if len > buf.len() => buf.resize(len, 0),
                3 => return Ok(Heard::Aborted),
                _ => {
                    return Err(AsrError::Transcribe(String::from_utf8_lossy(&buf[..len.min(buf.len())]).into_owned()));
                }
            }
        }
    }

    /// Cuts a transcription in flight short (any thread).
    pub fn abort(&self) {
        // SAFETY: the handle is open; abort only sets a flag.
        unsafe { (self.abort)(self.handle) }
    }
}

impl Drop for Asr {
    fn drop(&mut self) {
        // SAFETY: the handle is open and no call is in flight (we own it).
        unsafe { (self.close)(self.handle) }
    }
}
