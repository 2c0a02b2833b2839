//! The safe side of the C ABI: finding a backend's function table (linked in, or in a
//! shared library), and driving one handle through the [`Backend`] trait.
//!
//! Ownership follows the header's thread rules. [`FfiBackend`] holds the handle and is
//! neither `Send` nor `Sync`: it stays on the thread that opened it. [`FfiControl`] is
//! the any-thread half; it shares the handle behind a read-write lock that `close`
//! takes for writing, so an interrupt can never reach a freed handle.

use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;

use libloading::Library;
use omni_actors::domain::{
    BackendInfo, CallPiece, ChatMessage, DuplexChunk, Role, SessionKind, SessionSetup, StepKind, StepPiece, TurnInput,
    TurnPiece,
};
use omni_actors::edge::backend::{Backend, BackendControl, BackendError};
use parking_lot::RwLock;
use thiserror::Error;

use super::sys::{self, omni_backend, omni_backend_api};

/// Why a backend library could not be used. Every message names the path.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("{path}: cannot load the library: {reason}")]
    Library { path: PathBuf, reason: String },
    #[error("{path}: missing symbol {symbol} (is this an omni-gateway backend?)")]
    MissingSymbol { path: PathBuf, symbol: String },
    #[error("{path}: built for backend ABI version {found}, this server speaks version {expected}")]
    Version { path: PathBuf, found: u32, expected: u32 },
    #[error("{path}: returned no function table for ABI version {expected}")]
    NoTable { path: PathBuf, expected: u32 },
    #[error("{path}: its function table is incomplete: {missing}")]
    Incomplete { path: PathBuf, missing: String },
}

/// A backend's function table and whatever keeps it valid (the loaded library).
#[derive(Clone)]
pub struct BackendApi {
    table: *const omni_backend_api,
    _library: Option<Arc<Library>>,
    origin: Arc<str>,
}

// SAFETY: the table is immutable data owned by the backend (static, or alive as long as
// the library, which `_library` keeps loaded); reading it from any thread is sound.
unsafe impl Send for BackendApi {}
unsafe impl Sync for BackendApi {}

impl BackendApi {
    /// The reference backend linked into this binary.
    pub fn builtin() -> BackendApi {
        // SAFETY: plain calls into the statically linked reference backend.
        let (version, table) =
            unsafe { (sys::omni_reference_abi_version(), sys::omni_reference_get_api(sys::ABI_VERSION)) };
        Self::validate(Path::new("builtin"), version, table, None)
            .expect("the built-in reference backend matches this server's ABI")
    }

    /// A backend from a shared library implementing `include/omni_backend.h`.
    pub fn load(path: &Path) -> Result<BackendApi, LoadError> {
        // SAFETY: loading runs the library's initialisers; loading a backend library is
        // exactly what the operator configured.
        let library = unsafe { Library::new(path) }
            .map_err(|e| LoadError::Library { path: path.to_owned(), reason: error_chain(&e) })?;
        let symbol = |name: &[u8]| LoadError::MissingSymbol {
            path: path.to_owned(),
            symbol: String::from_utf8_lossy(&name[..name.len() - 1]).into_owned(),
        };
        // SAFETY: the symbols have the types the header declares for them.
        let (version, table) = unsafe {
            let version = library
                .get::<sys::AbiVersionFn>(sys::ABI_VERSION_SYMBOL)
                .map_err(|_| symbol(sys::ABI_VERSION_SYMBOL))?;
            let get_api = library.get::<sys::GetApiFn>(sys::GET_API_SYMBOL).map_err(|_| symbol(sys::GET_API_SYMBOL))?;
            let v = version();
            (v, if v == sys::ABI_VERSION { get_api(sys::ABI_VERSION) } else { ptr::null() })
        };
        Self::validate(path, version, table, Some(Arc::new(library)))
    }

    fn validate(
        path: &Path,
        version: u32,
        table: *const omni_backend_api,
        library: Option<Arc<Library>>,
    ) -> Result<BackendApi, LoadError> {
        let path = path.to_owned();
        if version != sys::ABI_VERSION {
            return Err(LoadError::Version { path, found: version, expected: sys::ABI_VERSION });
        }
        // SAFETY: a non-null table points at the backend's static function table.
        let Some(t) = (unsafe { table.as_ref() }) else {
            return Err(LoadError::NoTable { path, expected: sys::ABI_VERSION });
        };
        if (t.struct_size as usize) < size_of::<omni_backend_api>() || t.abi_version != sys::ABI_VERSION {
            return Err(LoadError::Incomplete {
                path,
                missing: format!("struct_size {} / abi_version {}", t.struct_size, t.abi_version),
            });
        }
        let present = [
            ("open", t.open.is_some()),
            ("close", t.close.is_some()),
            ("info", t.info.is_some()),
            ("last_error", t.last_error.is_some()),
            ("prepare", t.prepare.is_some()),
            ("reset", t.reset.is_some()),
            ("duplex_prefill", t.duplex_prefill.is_some()),
            ("duplex_generate", t.duplex_generate.is_some()),
            ("duplex_drain", t.duplex_drain.is_some()),
            ("duplex_finalize", t.duplex_finalize.is_some()),
            ("turn_prefill", t.turn_prefill.is_some()),
            ("turn_generate", t.turn_generate.is_some()),
            ("interrupt", t.interrupt.is_some()),
            ("set_force_listen", t.set_force_listen.is_some()),
            ("kv_length", t.kv_length.is_some()),
        ];
        let missing: Vec<&str> = present.iter().filter(|(_, ok)| !ok).map(|(name, _)| *name).collect();
        if !missing.is_empty() {
            return Err(LoadError::Incomplete { path, missing: format!("no {}", missing.join(", ")) });
        }
        Ok(BackendApi { table, _library: library, origin: path.display().to_string().into() })
    }

    fn t(&self) -> &omni_backend_api {
        // SAFETY: validated non-null in `validate`, and kept alive by `_library`.
        unsafe { &*self.table }
    }

    /// Where this table came from ("builtin" or the library path).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Opens a handle owned by the calling thread.
    pub fn open(&self, options: &[(String, String)]) -> Result<FfiBackend, BackendError> {
        let opts = self::options(options);
        let mut handle: *mut omni_backend = ptr::null_mut();
        let mut err = [0 as c_char; 512];
        // SAFETY: every pointer is valid for the call; `err` has the capacity we state.
        let st = unsafe { fn_of(self.t().open)(opts.as_ptr(), opts.len(), &mut handle, err.as_mut_ptr(), err.len()) };
        if st != sys::OK || handle.is_null() {
            let reason = c_text(&err);
            return Err(BackendError::Open(format!(
                "{}: {}",
                self.origin,
                if reason.is_empty() { format!("open returned status {st}") } else { reason }
            )));
        }
        let shared = Arc::new(Shared { api: self.clone(), handle: RwLock::new(handle) });
        let mut backend = FfiBackend {
            api: self.clone(),
            shared,
            handle,
            info: BackendInfo::default(),
            buffers: Buffers { text: Vec::new(), audio: Vec::new(), audio_cap: 0, transcript: Vec::new() },
            replay: None,
        };
        backend.info = backend.query_info()?;
        backend.buffers = Buffers {
            text: vec![0; backend.info.max_output_text_bytes.max(256) as usize],
            audio: Vec::new(),
            audio_cap: backend.info.max_output_samples.max(4096) as usize,
            transcript: if backend.info.transcripts { vec![0; TRANSCRIPT_BYTES] } else { Vec::new() },
        };
        Ok(backend)
    }
}

/// An error with its causes: the loader's own words (missing dependency, wrong
/// architecture...) are in the source of libloading's "dlopen failed".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Every table entry was checked to be present in `BackendApi::validate`.
fn fn_of<F>(f: Option<F>) -> F {
    f.expect("function table validated on load")
}

fn ostr(s: &str) -> sys::omni_str {
    sys::omni_str { ptr: s.as_ptr().cast(), len: s.len() }
}

fn opcm(p: &[f32]) -> sys::omni_pcm {
    sys::omni_pcm { ptr: if p.is_empty() { ptr::null() } else { p.as_ptr() }, len: p.len() }
}

fn obytes(b: &[u8]) -> sys::omni_bytes {
    sys::omni_bytes { ptr: b.as_ptr(), len: b.len() }
}

fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The settings as the ABI's key/value list; the strings are borrowed from `settings`.
fn options(settings: &[(String, String)]) -> Vec<sys::omni_option> {
    settings.iter().map(|(k, v)| sys::omni_option { key: ostr(k), value: ostr(v) }).collect()
}

/// A comma-separated list of names, as `info` reports the settings a backend applies.
fn names(raw: &[c_char], len: u32) -> Vec<String> {
    let len = (len as usize).min(raw.len());
    let bytes: Vec<u8> = raw[..len].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect()
}

/// The output buffers handed to generate and drain calls, grown on BUFFER_TOO_SMALL.
struct Buffers {
    text: Vec<u8>,
    /// The audio a call writes: a fresh vector of `audio_cap` samples' capacity for each call,
    /// handed on as it is (the backend's samples are not copied out).
    audio: Vec<f32>,
    audio_cap: usize,
    transcript: Vec<u8>,
}

/// What one call wrote into [`Buffers`] (or, with BUFFER_TOO_SMALL, what it needs).
#[derive(Clone, Copy)]
struct Written {
    text: usize,
    audio: usize,
    transcript: usize,
}

/// Points an output struct (step or turn: the same buffer fields) at the buffers.
macro_rules! point_at {
    ($out:ident, $b:ident) => {
        $out.text_buf = $b.text.as_mut_ptr().cast();
        $out.text_cap = $b.text.len();
        $out.audio_buf = $b.audio.as_mut_ptr();
        $out.audio_cap = $b.audio.capacity();
        $out.transcript_buf =
            if $b.transcript.is_empty() { ptr::null_mut() } else { $b.transcript.as_mut_ptr().cast() };
        $out.transcript_cap = $b.transcript.len();
    };
}

/// What one call yielded, copied out of [`Buffers`].
struct Yielded {
    text: String,
    audio: Vec<f32>,
    /// None when the backend reported no transcript.
    transcript: Option<String>,
}

/// The first size of the transcript buffer; a backend asks for more with BUFFER_TOO_SMALL.
const TRANSCRIPT_BYTES: usize = 4096;

/// The handle as the any-thread calls see it: null once closed.
struct Shared {
    api: BackendApi,
    handle: RwLock<*mut omni_backend>,
}

// SAFETY: the header allows interrupt, set_force_listen and kv_length from any thread;
// those are the only calls made through `Shared`, always under the read lock, and the
// owner thread nulls the pointer under the write lock before closing the handle.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// The any-thread half of an [`FfiBackend`].
pub struct FfiControl(Arc<Shared>);

impl BackendControl for FfiControl {
    fn interrupt(&self) {
        let h = self.0.handle.read();
        if !h.is_null() {
            // SAFETY: an any-thread call on a live handle (see `Shared`).
            unsafe { fn_of(self.0.api.t().interrupt)(*h) };
        }
    }

    fn set_force_listen(&self, on: bool) {
        let h = self.0.handle.read();
        if !h.is_null() {
            // SAFETY: as above.
            unsafe { fn_of(self.0.api.t().set_force_listen)(*h, on as i32) };
        }
    }

    fn kv_length(&self) -> u64 {
        let h = self.0.handle.read();
        if h.is_null() {
            return 0;
        }
        // SAFETY: as above.
        unsafe { fn_of(self.0.api.t().kv_length)(*h) }
    }
}

/// One open backend handle, driven from its owner thread.
pub struct FfiBackend {
    api: BackendApi,
    shared: Arc<Shared>,
    handle: *mut omni_backend,
    info: BackendInfo,
    buffers: Buffers,
    /// For a 1.0 backend, which always appends a turn's messages: the session to prepare
    /// again before a turn that replaces the conversation, and whether a turn ran since.
    replay: Option<(SessionSetup, bool)>,
}

impl Drop for FfiBackend {
    fn drop(&mut self) {
        *self.shared.handle.write() = ptr::null_mut();
        // SAFETY: we are the owner thread and no any-thread call can start any more.
        unsafe { fn_of(self.api.t().close)(self.handle) };
    }
}

impl FfiBackend {
    fn t(&self) -> &omni_backend_api {
        self.api.t()
    }

    /// Maps a status to a result, with the backend's last error text.
    fn check(&self, st: sys::omni_status, call: &str) -> Result<(), BackendError> {
        if st == sys::OK {
            return Ok(());
        }
        let mut buf = [0 as c_char; 1024];
        // SAFETY: owner-thread call with a buffer of the stated capacity.
        unsafe { fn_of(self.t().last_error)(self.handle, buf.as_mut_ptr(), buf.len()) };
        let text = c_text(&buf);
        let text = if text.is_empty() { format!("{call} failed") } else { text };
        Err(match st {
            sys::ERR_INVALID_ARGUMENT => BackendError::InvalidArgument(text),
            sys::ERR_BAD_STATE => BackendError::BadState(text),
            sys::ERR_INFERENCE => BackendError::Inference(text),
            sys::ERR_CONTEXT_FULL => BackendError::ContextFull(text),
            sys::ERR_INTERRUPTED => BackendError::Interrupted,
            sys::ERR_UNSUPPORTED => BackendError::Unsupported(text),
            sys::ERR_OPEN_FAILED => BackendError::Open(text),
            other => BackendError::Internal(format!("{call}: status {other}: {text}")),
        })
    }

    fn query_info(&self) -> Result<BackendInfo, BackendError> {
        // SAFETY: all-zero is a valid bit pattern for this plain-data struct.
        let mut raw: sys::omni_backend_info = unsafe { std::mem::zeroed() };
        raw.struct_size = size_of::<sys::omni_backend_info>() as u32;
        // SAFETY: owner-thread call with a struct of the size we state.
        let st = unsafe { fn_of(self.t().info)(self.handle, &mut raw) };
        self.check(st, "info")?;
        let name_len = (raw.name_len as usize).min(raw.name.len());
        let name: Vec<u8> = raw.name[..name_len].iter().map(|&c| c as u8).collect();
        let cap = raw.capabilities;
        Ok(BackendInfo {
            name: String::from_utf8_lossy(&name).into_owned(),
            vision: cap & sys::CAP_VISION != 0,
            speech_output: cap & sys::CAP_SPEECH_OUTPUT != 0,
            duplex: cap & sys::CAP_DUPLEX != 0,
            turn: cap & sys::CAP_TURN != 0,
            input_sample_rate: raw.input_sample_rate,
            output_sample_rate: raw.output_sample_rate,
            context_size: raw.context_size,
            max_output_samples: raw.max_output_samples,
            max_output_text_bytes: raw.max_output_text_bytes,
            abi_revision: raw.abi_revision,
            transcripts: cap & sys::CAP_TRANSCRIPTS != 0,
            token_details: cap & sys::CAP_TOKEN_DETAILS != 0,
            settings: names(&raw.settings, raw.settings_len),
            step_samples: if raw.abi_revision >= 2 { raw.step_samples } else { 0 },
            tools: raw.abi_revision >= 3 && cap & sys::CAP_TOOLS != 0,
            ignored: Vec::new(),
        })
    }

    /// Calls `f` with the output buffers; on BUFFER_TOO_SMALL grows them to the sizes the
    /// backend asked for and calls once more.
    fn with_buffers<O>(
        &mut self,
        call: &str,
        mut f: impl FnMut(*mut omni_backend, &mut Buffers) -> (sys::omni_status, O, Written),
    ) -> Result<(O, Yielded), BackendError> {
        for attempt in 0..2 {
            self.buffers.audio = Vec::with_capacity(self.buffers.audio_cap);
            let (st, out, n) = f(self.handle, &mut self.buffers);
            let b = &mut self.buffers;
            if st == sys::ERR_BUFFER_TOO_SMALL && attempt == 0 {
                b.text.resize(n.text.max(b.text.len()), 0);
                b.audio_cap = n.audio.max(b.audio_cap);
                b.transcript.resize(n.transcript.max(b.transcript.len()), 0);
                continue;
            }
            self.check(st, call)?;
            let b = &mut self.buffers;
            if n.text > b.text.len() || n.audio > b.audio.capacity() || n.transcript > b.transcript.len() {
                return Err(BackendError::Internal(format!(
                    "{call}: the backend reported more output than the buffer holds"
                )));
            }
            let transcript =
                (n.transcript > 0).then(|| String::from_utf8_lossy(&b.transcript[..n.transcript]).into_owned());
            let text = String::from_utf8_lossy(&b.text[..n.text]).into_owned();
            let mut audio = std::mem::take(&mut b.audio);
            // SAFETY: the backend wrote `n.audio` samples from the start of the vector's buffer,
            // which holds that many (checked above): the ABI's contract for `audio_len`.
            unsafe { audio.set_len(n.audio) };
            return Ok((out, Yielded { text, audio, transcript }));
        }
        Err(BackendError::Internal(format!("{call}: still BUFFER_TOO_SMALL after growing the buffers")))
    }

    fn step_output(&mut self, call: &str, drain: bool) -> Result<Option<StepPiece>, BackendError> {
        let t = self.api.clone();
        let f = if drain { fn_of(t.t().duplex_drain) } else { fn_of(t.t().duplex_generate) };
        let (raw, y) = self.with_buffers(call, |h, b| {
            // SAFETY: all-zero is valid for this struct; the buffers outlive the call.
            let mut out: sys::omni_step_output = unsafe { std::mem::zeroed() };
            out.struct_size = size_of::<sys::omni_step_output>() as u32;
            point_at!(out, b);
            // SAFETY: owner-thread call on our handle.
            let st = unsafe { f(h, &mut out) };
            let n = Written { text: out.text_len, audio: out.audio_len, transcript: out.transcript_len };
            (st, out, n)
        })?;
        let kind = match raw.kind {
            sys::OUTPUT_NONE if drain => return Ok(None),
            sys::OUTPUT_LISTEN => StepKind::Listen,
            sys::OUTPUT_SPEAK => StepKind::Speak,
            other => {
                return Err(BackendError::Internal(format!("{call}: unknown output kind {other}")));
            }
        };
        let call = call_piece(raw.call, &raw.call_name, raw.call_name_len, &y.text);
        Ok(Some(StepPiece {
            kind,
            text: if call.is_some() { String::new() } else { y.text },
            audio: y.audio,
            end_of_turn: raw.end_of_turn != 0,
            kv_length: raw.kv_length,
            input_tokens: raw.input_tokens,
            output_tokens: raw.output_tokens,
            prefill_us: raw.prefill_us,
            generate_us: raw.generate_us,
            transcript: y.transcript,
            input_audio_tokens: raw.input_audio_tokens,
            output_audio_tokens: raw.output_audio_tokens,
            call,
        }))
    }
}

/// The role of a message as a backend of `revision` takes it: before 1.3 a call is the
/// assistant's words and a tool's result the user's.
fn role(m: &ChatMessage, revision: u32) -> u32 {
    match (m.role, m.call.is_some() && revision >= 3) {
        (Role::System, _) => sys::ROLE_SYSTEM,
        (Role::User, _) | (Role::Tool, false) => sys::ROLE_USER,
        (Role::Assistant, false) => sys::ROLE_ASSISTANT,
        (Role::Assistant, true) => sys::ROLE_TOOL_CALL,
        (Role::Tool, true) => sys::ROLE_TOOL_RESULT,
    }
}

/// A piece of a function call from an output's 1.3 fields: `call` set, the name on a call's
/// first piece, the arguments in the output's text.
fn call_piece(call: u32, name: &[c_char; 64], name_len: u32, arguments: &str) -> Option<CallPiece> {
    (call != 0).then(|| {
        let n = (name_len as usize).min(name.len());
        let name: Vec<u8> = name[..n].iter().map(|&c| c as u8).collect();
        CallPiece {
            name: (n > 0).then(|| String::from_utf8_lossy(&name).into_owned()),
            arguments: arguments.to_string(),
        }
    })
}

impl Backend for FfiBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn prepare(&mut self, s: &SessionSetup) -> Result<(), BackendError> {
        let g = &s.generation;
        let settings = options(&g.settings);
        let offered = self.info.tools && !s.tools.functions.is_empty();
        let tools = if offered { s.tools.to_json() } else { String::new() };
        let tool_choice = if offered { s.tools.choice.as_str() } else { "" };
        let config = sys::omni_session_config {
            struct_size: size_of::<sys::omni_session_config>() as u32,
            kind: match s.kind {
                SessionKind::Duplex => sys::SESSION_DUPLEX,
                SessionKind::Turn => sys::SESSION_TURN,
            },
            system_prompt: ostr(&s.system_prompt),
            voice: ostr(&s.voice),
            ref_audio: opcm(&s.ref_audio),
            tts_ref_audio: opcm(&s.tts_ref_audio),
            max_new_tokens: g.max_new_tokens.unwrap_or(0),
            max_slice_nums: g.max_slice_nums.unwrap_or(0),
            force_listen_count: g.force_listen_count.unwrap_or(0),
            length_penalty: g.length_penalty.unwrap_or(0.0),
            temperature: g.temperature.unwrap_or(-1.0),
            settings: if settings.is_empty() { ptr::null() } else { settings.as_ptr() },
            n_settings: settings.len(),
            tools: ostr(&tools),
            tool_choice: ostr(tool_choice),
        };
        // SAFETY: owner-thread call; `config` and what it points to outlive the call.
        let st = unsafe { fn_of(self.t().prepare)(self.handle, &config) };
        self.check(st, "prepare")?;
        // Before 1.1 every turn appends to the conversation.
        let turns_append = self.info.abi_revision < 1 && s.kind == SessionKind::Turn;
        self.replay = turns_append.then(|| (s.clone(), false));
        Ok(())
    }

    fn reset(&mut self) -> Result<(), BackendError> {
        self.replay = None;
        // SAFETY: owner-thread call.
        let st = unsafe { fn_of(self.t().reset)(self.handle) };
        self.check(st, "reset")
    }

    fn duplex_prefill(&mut self, c: &DuplexChunk) -> Result<(), BackendError> {
        let frames: Vec<sys::omni_bytes> = c.frames.iter().map(|f| obytes(f)).collect();
        let input = sys::omni_duplex_input {
            struct_size: size_of::<sys::omni_duplex_input>() as u32,
            flags: if c.force_listen { sys::STEP_FORCE_LISTEN } else { 0 },
            audio: opcm(&c.audio),
            frames: if frames.is_empty() { ptr::null() } else { frames.as_ptr() },
            n_frames: frames.len(),
            max_slice_nums: c.max_slice_nums.unwrap_or(0),
        };
        // SAFETY: owner-thread call; `input`, `frames` and the chunk outlive the call.
        let st = unsafe { fn_of(self.t().duplex_prefill)(self.handle, &input) };
        self.check(st, "duplex_prefill")
    }

    fn duplex_generate(&mut self) -> Result<StepPiece, BackendError> {
        self.step_output("duplex_generate", false)?
            .ok_or_else(|| BackendError::Internal("duplex_generate returned no output".into()))
    }

    fn duplex_drain(&mut self) -> Result<Option<StepPiece>, BackendError> {
        self.step_output("duplex_drain", true)
    }

    fn duplex_finalize(&mut self) -> Result<(), BackendError> {
        // SAFETY: owner-thread call.
        let st = unsafe { fn_of(self.t().duplex_finalize)(self.handle) };
        self.check(st, "duplex_finalize")
    }

    fn turn_prefill(&mut self, input: &TurnInput) -> Result<(), BackendError> {
        // A 1.0 backend appends whatever it is given: a turn that replaces the conversation
        // starts from a freshly prepared session instead.
        if !input.continues
            && matches!(self.replay, Some((_, true)))
            && let Some((setup, _)) = self.replay.take()
        {
            self.reset()?;
            self.prepare(&setup)?;
        }
        let images: Vec<Vec<sys::omni_bytes>> =
            input.messages.iter().map(|m| m.images.iter().map(|i| obytes(i)).collect()).collect();
        let audios: Vec<Vec<sys::omni_pcm>> =
            input.messages.iter().map(|m| m.audios.iter().map(|a| opcm(a)).collect()).collect();
        let revision = self.info.abi_revision;
        let messages: Vec<sys::omni_message> = input
            .messages
            .iter()
            .zip(images.iter().zip(&audios))
            .map(|(m, (imgs, auds))| sys::omni_message {
                struct_size: size_of::<sys::omni_message>() as u32,
                role: role(m, revision),
                text: ostr(&m.text),
                images: if imgs.is_empty() { ptr::null() } else { imgs.as_ptr() },
                n_images: imgs.len(),
                audios: if auds.is_empty() { ptr::null() } else { auds.as_ptr() },
                n_audios: auds.len(),
                call_id: m.call.as_ref().map_or(ostr(""), |c| ostr(&c.id)),
                name: m.call.as_ref().map_or(ostr(""), |c| ostr(&c.name)),
            })
            .collect();
        let g = &input.generation;
        let settings = options(&g.settings);
        let own_tools = input.tools.as_ref().filter(|_| self.info.tools);
        let tools = own_tools.filter(|t| !t.functions.is_empty()).map_or_else(String::new, |t| t.to_json());
        let tool_choice = own_tools.map_or("", |t| t.choice.as_str());
        let flags = [
            (input.speech, sys::TURN_SPEECH),
            (input.thinking, sys::TURN_THINKING),
            (input.tts_template, sys::TURN_TTS_TEMPLATE),
            (input.omni, sys::TURN_OMNI),
            (input.continues, sys::TURN_CONTINUE),
            (input.prefill_only && revision >= 3, sys::TURN_PREFILL_ONLY),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |acc, (_, bit)| acc | bit);
        let raw = sys::omni_turn_input {
            struct_size: size_of::<sys::omni_turn_input>() as u32,
            flags,
            messages: if messages.is_empty() { ptr::null() } else { messages.as_ptr() },
            n_messages: messages.len(),
            max_new_tokens: g.max_new_tokens.unwrap_or(0),
            max_slice_nums: g.max_slice_nums.unwrap_or(0),
            length_penalty: g.length_penalty.unwrap_or(0.0),
            temperature: g.temperature.unwrap_or(-1.0),
            tts_ref_audio: opcm(&input.tts_ref_audio),
            settings: if settings.is_empty() { ptr::null() } else { settings.as_ptr() },
            n_settings: settings.len(),
            tools: ostr(&tools),
            tool_choice: ostr(tool_choice),
        };
        // SAFETY: owner-thread call; every array referenced lives until after the call.
        let st = unsafe { fn_of(self.t().turn_prefill)(self.handle, &raw) };
        self.check(st, "turn_prefill")?;
        if let Some((_, turned)) = &mut self.replay {
            *turned = true;
        }
        Ok(())
    }

    fn turn_generate(&mut self) -> Result<TurnPiece, BackendError> {
        let f = fn_of(self.t().turn_generate);
        let (raw, y) = self.with_buffers("turn_generate", |h, b| {
            // SAFETY: all-zero is valid for this struct; the buffers outlive the call.
            let mut out: sys::omni_turn_output = unsafe { std::mem::zeroed() };
            out.struct_size = size_of::<sys::omni_turn_output>() as u32;
            point_at!(out, b);
            // SAFETY: owner-thread call on our handle.
            let st = unsafe { f(h, &mut out) };
            let n = Written { text: out.text_len, audio: out.audio_len, transcript: out.transcript_len };
            (st, out, n)
        })?;
        let call = call_piece(raw.call, &raw.call_name, raw.call_name_len, &y.text);
        Ok(TurnPiece {
            text: if call.is_some() { String::new() } else { y.text },
            audio: y.audio,
            transcript: y.transcript,
            input_audio_tokens: raw.input_audio_tokens,
            output_audio_tokens: raw.output_audio_tokens,
            done: raw.done != 0,
            kv_length: raw.kv_length,
            input_tokens: raw.input_tokens,
            output_tokens: raw.output_tokens,
            generate_us: raw.generate_us,
            call,
        })
    }

    fn control(&self) -> Arc<dyn BackendControl> {
        Arc::new(FfiControl(self.shared.clone()))
    }
}
