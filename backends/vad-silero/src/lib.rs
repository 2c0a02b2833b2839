//! Silero VAD: the probability that a 32 ms window of 16 kHz audio is speech.
//!
//! The model is Silero's ONNX export (`silero_vad.onnx`, MIT, fetched by
//! `scripts/fetch-models.py` from the `silero-vad` package), run by ONNX Runtime loaded from
//! the library the fetch script extracted (crate `ort`, `load-dynamic`: nothing is linked or
//! downloaded at build time). Used by the gateway's voice activity detection and by the CPU
//! model backend's endpointing.
//!
//! The model is recurrent: each stream ([`Silero`]) keeps its own state (two 128-wide layers)
//! and the last 64 samples of the previous window, which the model reads before each new
//! window. The loaded network itself is shared: one ONNX Runtime session per thread and model,
//! created on the thread's first window (running a session needs it exclusively; a thread
//! runs one window at a time), single-threaded so a window never wakes a pool.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;
use ort::session::Session;
use ort::value::Tensor;

/// Samples per window (32 ms at 16 kHz), as the model was trained.
pub const WINDOW: usize = 512;
/// Samples of the previous window the model reads before each window.
const CONTEXT: usize = 64;
const STATE: usize = 2 * 128;
/// Windows quieter than this (RMS, -60 dBFS: a quiet room's noise floor, far below speech) are
/// silence: probability 0, no model run.
const SILENT_RMS: f32 = 1e-3;

static ORT: OnceLock<Result<Environment, VadError>> = OnceLock::new();

/// Why a window got no probability.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VadError {
    /// ONNX Runtime did not load from this library.
    #[error("onnxruntime_library {library}: {reason}")]
    Runtime { library: String, reason: String },
    /// The model did not load, or its outputs are not Silero VAD's.
    #[error("vad model {model}: {reason}")]
    Model { model: String, reason: String },
    /// A run failed.
    #[error("vad: {0}")]
    Run(String),
}

/// Loads ONNX Runtime from `library` once per process; every model shares it. A second call
/// with another path gets the first library.
pub fn runtime(library: &Path) -> Result<&'static Environment, VadError> {
    ORT.get_or_init(|| {
        let fail = |e: &dyn std::fmt::Display| VadError::Runtime {
            library: library.display().to_string(),
            reason: e.to_string(),
        };
        ort::init_from(library).map_err(|e| fail(&e))?.with_name("omni-gateway").build().map_err(|e| fail(&e))
    })
    .as_ref()
    .map_err(|e| e.clone())
}

thread_local! {
    /// This thread's sessions, by model path.
    static SESSIONS: RefCell<Vec<(PathBuf, Session)>> = const { RefCell::new(Vec::new()) };
}

/// Where the model and ONNX Runtime are; cheap to clone, shared by every stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub onnxruntime_library: PathBuf,
    pub path: PathBuf,
}

impl Model {
    /// Loads the runtime and the model on this thread and runs one window: the errors a
    /// configuration check reports (a missing file, a library that is not ONNX Runtime, a
    /// model that is not Silero's).
    pub fn check(&self) -> Result<(), VadError> {
        let mut s = Silero::new(self.clone());
        let mut noise = [0f32; WINDOW];
        for (i, x) in noise.iter_mut().enumerate() {
            *x = ((i * 7919 % 256) as f32 / 128.0 - 1.0) * 0.1;
        }
        s.probability(&noise).map(|_| ())
    }

    fn session(&self) -> Result<Session, VadError> {
        let env = runtime(&self.onnxruntime_library)?;
        let fail = |e: ort::Error| VadError::Model { model: self.path.display().to_string(), reason: e.to_string() };
        Session::builder(env)
            .map_err(fail)?
            .with_intra_threads(1)
            .map_err(|e| fail(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| fail(e.into()))?
            .commit_from_file(&self.path)
            .map_err(fail)
    }
}

/// One audio stream's detector.
pub struct Silero {
    model: Model,
    state: Vec<f32>,
    input: Vec<f32>,
}

impl Silero {
    pub fn new(model: Model) -> Silero {
        Silero { model, state: vec![0.0; STATE], input: vec![0.0; CONTEXT + WINDOW] }
    }

    /// Forgets the stream so far (a new utterance, a cleared buffer).
    pub fn reset(&mut self) {
        self.state.iter_mut().for_each(|x| *x = 0.0);
        self.input.iter_mut().for_each(|x| *x = 0.0);
    }

    /// The speech probability of the next window (`WINDOW` samples; a shorter one is padded
    /// with silence).
    pub fn probability(&mut self, window: &[f32]) -> Result<f32, VadError> {
        let n = window.len().min(WINDOW);
        self.input.copy_within(WINDOW.., 0);
        self.input[CONTEXT..CONTEXT + n].copy_from_slice(&window[..n]);
        self.input[CONTEXT + n..].iter_mut().for_each(|x| *x = 0.0);
        let energy = window[..n].iter().map(|x| x * x).sum::<f32>() / n.max(1) as f32;
        if energy.sqrt() < SILENT_RMS {
            return Ok(0.0);
        }
        // The runtime first: making a tensor needs it.
        runtime(&self.model.onnxruntime_library)?;
        let input = Tensor::from_array(([1usize, CONTEXT + WINDOW], self.input.clone()))
            .map_err(|e| VadError::Run(e.to_string()))?;
        let state =
            Tensor::from_array(([2usize, 1, 128], self.state.clone())).map_err(|e| VadError::Run(e.to_string()))?;
        let rate = Tensor::from_array(((), vec![16000i64])).map_err(|e| VadError::Run(e.to_string()))?;
        SESSIONS.with(|sessions| {
            let mut sessions = sessions.borrow_mut();
            let at = match sessions.iter().position(|(p, _)| *p == self.model.path) {
                Some(at) => at,
                None => {
                    sessions.push((self.model.path.clone(), self.model.session()?));
                    sessions.len() - 1
                }
            };
            let session = &mut sessions[at].1;
            let outputs = session
                .run(ort::inputs!["input" => input, "state" => state, "sr" => rate])
                .map_err(|e| VadError::Run(e.to_string()))?;
            let (_, p) = outputs["output"].try_extract_tensor::<f32>().map_err(|e| VadError::Run(e.to_string()))?;
            let (_, next) = outputs["stateN"].try_extract_tensor::<f32>().map_err(|e| VadError::Run(e.to_string()))?;
            if next.len() != STATE || p.is_empty() {
                return Err(VadError::Model {
                    model: self.model.path.display().to_string(),
                    reason: "not Silero VAD's outputs".into(),
                });
            }
            self.state.copy_from_slice(next);
            Ok(p[0])
        })
    }
}
