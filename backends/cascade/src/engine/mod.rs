//! The cascade: what one handle does with a session. Duplex steps listen (voice activity)
//! until the user stops speaking, then transcribe the utterance, let the LLM answer in the
//! conversation's context, and speak the answer clause by clause as the LLM writes it, so that
//! audio starts before the answer is complete. Turn mode answers a conversation with text
//! and, when asked, speech. Speech from the user during an answer (barge-in), a force-listen
//! and an interrupt cut the answer at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use crate::early::{EarlyAsr, Point};
use crate::llm::{Llm, LlmError, Sampling};
use crate::options::Options;
use crate::options::VadEngine;
use crate::tools::{ROOT_BARE, ROOT_FORCED, ROOT_TAGGED, Tools};
use crate::tts::Voice;
use crate::vad::{Detector, RATE, Vad, VadConfig};
use omni_asr_client::Asr;

mod answer;
mod duplex;
mod text;
mod turn;

pub(crate) use text::{clause_end, sentence_ended, words_end};

/// What every thread may touch: the interrupt epoch, a pending force-listen, the KV length.
pub(crate) struct Shared {
    pub interrupts: AtomicU64,
    pub force_listen: AtomicBool,
    pub kv: AtomicU64,
    pub asr: Arc<Asr>,
}

impl Shared {
    pub(crate) fn interrupt(&self) {
        self.interrupts.fetch_add(1, Ordering::SeqCst);
        self.asr.abort();
    }
}

#[derive(Debug)]
pub(crate) enum Error {
    BadState(String),
    Unsupported(String),
    ContextFull(String),
    Interrupted,
    Inference(String),
}

impl From<LlmError> for Error {
    fn from(e: LlmError) -> Error {
        match e {
            LlmError::ContextFull(m) => Error::ContextFull(m),
            LlmError::Interrupted => Error::Interrupted,
            LlmError::Failed(m) => Error::Inference(m),
        }
    }
}

/// One output: a clause of the answer and its speech.
#[derive(Default)]
pub(crate) struct Piece {
    pub listen: bool,
    pub text: String,
    pub audio: Vec<f32>,
    pub last: bool,
    pub tokens: u32,
    pub input_tokens: u32,
    pub transcript: String,
    pub prefill_us: u32,
    pub generate_us: u32,
    /// Of `generate_us`, the voice's part (the rest is the LLM's).
    pub voice_us: u32,
    /// A function call instead of words: the tool's name and its arguments (JSON).
    pub call: Option<(String, String)>,
}

struct Answer {
    text: String,
    done: bool,
    /// Tokens generated so far, and those already reported with a piece.
    tokens: u32,
    reported: u32,
    limit: u32,
    speech: bool,
    /// The tools this answer may call (the session's, or the turn's own).
    tools: Arc<Tools>,
    /// Whether sampling is held to a call from the first token on, or from a bare call's `{`.
    held: bool,
    /// Whether it follows the results of calls (and so is words: see [`Engine::begin`]).
    after_results: bool,
    /// Where it begins in the conversation, the calls it made, and whether it said words.
    start: u32,
    calls: Vec<(String, String)>,
    spoke: bool,
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Duplex,
    Turn,
}

struct Session {
    kind: Kind,
    prompt: String,
    max_tokens: u32,
    tools: Arc<Tools>,
}

/// The step in progress (duplex).
#[derive(Default)]
struct Step {
    forced: bool,
    endpoint: bool,
    epoch: u64,
    outputs: u32,
    prefill_us: u32,
    /// This step began the answer: its first piece goes out alone, at once (the gateway
    /// sends a step's outputs when the step ends).
    began: bool,
    /// At the endpoint: the utterance and its voiced milliseconds.
    heard_at: (u64, u32),
}

/// Whether to print the terms of the first audio's delay (`OMNI_BACKEND_TIMING=1`).
fn timing() -> bool {
    std::env::var_os("OMNI_BACKEND_TIMING").is_some()
}

/// A user turn in ChatML, with the start of the assistant's.
fn user_turn(heard: &str) -> String {
    format!("<|im_start|>user\n{heard}<|im_end|>\n<|im_start|>assistant\n")
}

/// Appended to the system prompt: the answer is heard, not read. The one before asked the model,
/// when it could not tell what was meant, to "ask the user politely to repeat it"; the 0.5B model
/// recited that (and "answer what was most likely asked") instead of answering questions it had
/// heard right. Thirty spoken questions (`scripts/cascade_bench.py --facts`, then `--held-out`):
/// 6 + 12 right with that one, 4 + 16 with this; worked examples after it (3 + 14, 3 + 16), a set
/// phrase for asking again (4 + 13) and "one or two sentences" (4 + 16, with longer first
/// sentences) did no better (docs/performance.md).
const SPOKEN: &str = "Your answers are spoken aloud: answer the question directly and correctly in the first \
                      sentence, in one to three short, plain sentences, without lists, markdown or emoji. \
                      The question comes from speech recognition and a word may be misheard: answer the \
                      question most likely meant.";
const PREROLL: usize = RATE * 3 / 10;
const MAX_UTTERANCE: usize = RATE * 30;

/// A user turn in the LLM before its endpoint.
struct FedAhead {
    /// The utterance, and its voiced milliseconds, that was heard.
    at: Point,
    heard: String,
    /// The LLM's length before it, and the turn's tokens.
    before: u32,
    tokens: u32,
    /// The answer begun ahead (`answer_ahead`): its first piece, spoken at the endpoint, and
    /// the rest of it (none when that piece ended it).
    begun: Option<(Piece, Option<Answer>)>,
    /// When it was fed (and begun).
    ready: Instant,
}

pub(crate) struct Engine {
    pub opt: Options,
    pub shared: Arc<Shared>,
    llm: Llm,
    voice: Voice,
    vad: Vad,
    session: Option<Session>,
    utterance: Vec<f32>,
    /// Utterances begun (names the one an early transcription heard).
    utterances: u64,
    preroll: VecDeque<f32>,
    answer: Option<Answer>,
    /// Seconds of speech sent ahead of real time in the current answer.
    ahead: f32,
    step: Step,
    /// Whisper on the utterance so far, started during the endpoint's hang-over.
    early: EarlyAsr,
    /// The user's turn, fed to the LLM ahead of the endpoint once the early transcription had
    /// it (the rest of the hang-over): taken back if the user goes on.
    fed_ahead: Option<FedAhead>,
    /// An output that did not fit the caller's buffers, handed out again.
    pub held: Option<Piece>,
    turn_first: Option<(u32, String)>,
    /// The last turn only prefilled: its answer is empty.
    prefilled_only: bool,
}

impl Engine {
    pub(crate) fn open(opt: Options) -> Result<Engine, String> {
        let asr = Arc::new(Asr::open(&opt.asr_library, &opt.asr_model, opt.threads).map_err(|e| e.to_string())?);
        let llm = Llm::open(&opt.llm_model, opt.n_ctx, opt.threads, &sampling(&opt, None))?;
        let voice = Voice::open(&opt.onnxruntime_library, &opt.voice, opt.threads as usize, &opt.espeak)
            .map_err(|e| e.to_string())?;
        let detector = match opt.vad {
            VadEngine::Energy => Detector::Energy { threshold: opt.vad_threshold },
            VadEngine::Silero => {
                let model = omni_vad_silero::Model {
                    path: opt.vad_model.clone(),
                    onnxruntime_library: opt.onnxruntime_library.clone(),
                };
                model.check().map_err(|e| e.to_string())?;
                Detector::Silero {
                    silero: Box::new(omni_vad_silero::Silero::new(model)),
                    probability: opt.vad_probability,
                }
            }
        };
        let shared = Arc::new(Shared {
            interrupts: AtomicU64::new(0),
            force_listen: AtomicBool::new(false),
            kv: AtomicU64::new(0),
            asr,
        });
        let mut engine = Engine {
            opt,
            shared,
            llm,
            voice,
            vad: Vad::new(detector),
            session: None,
            utterance: Vec::new(),
            utterances: 0,
            preroll: VecDeque::new(),
            answer: None,
            ahead: 0.0,
            step: Step::default(),
            early: EarlyAsr::default(),
            fed_ahead: None,
            held: None,
            turn_first: None,
            prefilled_only: false,
        };
        // The default system block, computed once here: a session with the default prompt
        // starts from it (`Llm::start`) instead of computing it.
        engine.start_conversation().map_err(|e| format!("the LLM could not start a conversation: {e:?}"))?;
        engine.reset();
        Ok(engine)
    }

    pub(crate) fn n_ctx(&self) -> u32 {
        self.llm.n_ctx()
    }

    fn vad_config(&self) -> VadConfig {
        VadConfig { min_speech_ms: self.opt.speech_min_ms, silence_ms: self.opt.silence_ms }
    }

    fn sync_kv(&self) {
        self.shared.kv.store(self.llm.n_past() as u64, Ordering::SeqCst);
    }

    pub(crate) fn reset(&mut self) {
        self.early.discard();
        self.fed_ahead = None;
        self.llm.clear();
        self.vad.clear();
        self.session = None;
        self.utterance.clear();
        self.preroll.clear();
        self.answer = None;
        self.ahead = 0.0;
        self.held = None;
        self.turn_first = None;
        self.prefilled_only = false;
        self.shared.force_listen.store(false, Ordering::SeqCst);
        self.sync_kv();
    }

    /// Starts a session; `settings` are the client's generation settings by name, `tools` the
    /// functions its model may call.
    pub(crate) fn prepare(
        &mut self,
        kind: Kind,
        prompt: &str,
        max_tokens: u32,
        temperature: f32,
        settings: &[(String, String)],
        tools: Tools,
    ) -> Result<(), Error> {
        self.reset();
        let t = if temperature >= 0.0 { Some(temperature) } else { None };
        let mut s = sampling(&self.opt, t);
        for (k, v) in settings {
            match k.as_str() {
                "top_k" => s.top_k = v.parse().unwrap_or(s.top_k),
                "top_p" => s.top_p = v.parse().unwrap_or(s.top_p),
                "seed" => s.seed = v.parse().unwrap_or(s.seed),
                _ => {}
            }
        }
        self.llm.set_sampling(&s);
        let limit =
            if max_tokens == 0 { self.opt.max_answer_tokens } else { max_tokens.min(self.opt.max_answer_tokens * 8) };
        self.session = Some(Session { kind, prompt: prompt.to_string(), max_tokens: limit, tools: Arc::new(tools) });
        self.start_conversation()?;
        Ok(())
    }

    fn start_conversation(&mut self) -> Result<(), Error> {
        self.llm.clear();
        let prompt = self.session.as_ref().map(|s| s.prompt.trim().to_string()).unwrap_or_default();
        let tools = self.session.as_ref().map(|s| s.tools.prompt()).unwrap_or_default();
        let system = if prompt.is_empty() {
            format!("You are a helpful voice assistant. {SPOKEN}{tools}")
        } else {
            format!("{prompt} {SPOKEN}{tools}")
        };
        let r = self.llm.start(&format!("<|im_start|>system\n{system}<|im_end|>\n"), &|| false);
        self.sync_kv();
        r.map(|_| ()).map_err(Error::from)
    }

    fn session(&self, kind: Kind) -> Result<&Session, Error> {
        match &self.session {
            Some(s) if s.kind == kind => Ok(s),
            Some(_) => Err(Error::BadState("the session is of the other kind".into())),
            None => Err(Error::BadState("no session: prepare first".into())),
        }
    }

    /// The session, of either kind (a duplex session answers turns too: ABI 1.3).
    fn any_session(&self) -> Result<&Session, Error> {
        self.session.as_ref().ok_or_else(|| Error::BadState("no session: prepare first".into()))
    }

    /// A new answer of at most `limit` tokens, calling the session's tools.
    fn new_answer(&self, limit: u32, speech: bool) -> Answer {
        let tools = self.session.as_ref().map(|s| s.tools.clone()).unwrap_or_default();
        let start = self.llm.n_past();
        Answer {
            text: String::new(),
            done: false,
            tokens: 0,
            reported: 0,
            limit,
            speech,
            tools,
            held: false,
            after_results: false,
            start,
            calls: Vec::new(),
            spoke: false,
        }
    }

    /// `answer` is the one in progress; its sampling is held to its tools' call format (see
    /// [`crate::tools`]): from the first token when it must call, else from the call's first token.
    ///
    /// An answer to the results of calls is words (unless a call is required): one round of
    /// calls per user message. A small model, given a result, readily calls the same tool
    /// again and again.
    fn begin(&mut self, mut answer: Answer) -> Result<(), Error> {
        let forced = answer.tools.forced();
        if answer.after_results && !forced {
            answer.tools = Arc::new(Tools::default());
            self.llm.hold_to_words();
            self.answer = Some(answer);
            return Ok(());
        }
        let grammar = answer.tools.grammar();
        self.llm
            .hold(grammar.as_deref(), if forced { ROOT_FORCED } else { ROOT_TAGGED }, !forced)
            .map_err(Error::Inference)?;
        answer.held = forced;
        self.answer = Some(answer);
        Ok(())
    }

    /// The answer opened with `{`: the rest of it is held to a bare call.
    fn hold_bare(&mut self) -> Result<(), Error> {
        let answer = self.answer()?;
        if std::mem::replace(&mut answer.held, true) {
            return Ok(());
        }
        if let Some(grammar) = answer.tools.grammar() {
            self.llm.hold_from_last(&grammar, ROOT_BARE).map_err(Error::Inference)?;
        }
        Ok(())
    }

    /// Ends the answer in progress (what was said of it stays in the conversation).
    fn cut_answer(&mut self) {
        if self.answer.take().is_some() {
            let _ = self.llm.feed("<|im_end|>\n", 0, &|| false);
            self.sync_kv();
        }
        self.ahead = 0.0;
    }

    // ---- duplex ----
}

/// A message of a turn's conversation, as the ABI gave it.
pub(crate) struct Message {
    pub role: u32,
    pub text: String,
    pub clips: Vec<Vec<f32>>,
    pub images: usize,
    /// The tool a call calls (role 3).
    pub name: String,
}

/// The ABI's roles of a call and of its result (1.3).
pub(crate) const ROLE_CALL: u32 = 3;
pub(crate) const ROLE_RESULT: u32 = 4;

/// One turn asked of the engine.
pub(crate) struct Turn {
    pub messages: Vec<Message>,
    pub continues: bool,
    pub speech: bool,
    pub max_tokens: u32,
    pub prefill_only: bool,
    /// The turn's own tools; `None`: the session's.
    pub tools: Option<Tools>,
}

fn sampling(opt: &Options, temperature: Option<f32>) -> Sampling {
    Sampling { temperature: temperature.unwrap_or(opt.temperature), top_k: opt.top_k, top_p: opt.top_p, seed: opt.seed }
}
