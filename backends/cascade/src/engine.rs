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
use crate::heard::words;
use crate::llm::{Llm, LlmError, Sampling};
use crate::options::Options;
use crate::options::VadEngine;
use crate::tools::{self, CALL_CLOSE, CALL_OPEN, Opening, ROOT_BARE, ROOT_FORCED, ROOT_TAGGED, Tools};
use crate::tts::{OUT_RATE, Voice};
use crate::vad::{Detector, RATE, Vad, VadConfig};
use omni_asr_client::{Asr, Heard};

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
        let asr = Arc::new(Asr::open(&opt.asr_library, &opt.asr_model, opt.threads)?);
        let llm = Llm::open(&opt.llm_model, opt.n_ctx, opt.threads, &sampling(&opt, None))?;
        let voice = Voice::open(&opt.onnxruntime_library, &opt.voice, opt.threads as usize, &opt.espeak)?;
        let detector = match opt.vad {
            VadEngine::Energy => Detector::Energy { threshold: opt.vad_threshold },
            VadEngine::Silero => {
                let model = omni_vad_silero::Model {
                    path: opt.vad_model.clone(),
                    onnxruntime_library: opt.onnxruntime_library.clone(),
                };
                model.check()?;
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
    /// [`tools`]): from the first token when it must call, else from the call's first token.
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

    pub(crate) fn duplex_prefill(&mut self, audio: &[f32], force: bool) -> Result<(), Error> {
        self.session(Kind::Duplex)?;
        let t0 = Instant::now();
        self.held = None;
        let pending = self.shared.force_listen.swap(false, Ordering::SeqCst);
        self.step = Step { epoch: self.shared.interrupts.load(Ordering::SeqCst), ..Step::default() };
        self.ahead = (self.ahead - audio.len() as f32 / RATE as f32).max(0.0);
        if force || pending {
            self.step.forced = true;
            self.take_back_ahead()?;
            self.cut_answer();
            self.vad.clear();
            self.utterance.clear();
            return Ok(());
        }
        let config = self.vad_config();
        let was_speaking = self.vad.in_speech();
        let endpoint = self.vad.push(&config, audio).map_err(Error::Inference)?;
        if self.fed_ahead.as_ref().is_some_and(|a| a.at != (self.utterances, self.vad.speech_ms)) {
            // The user went on: the turn fed ahead was not the whole of it.
            self.take_back_ahead()?;
        }
        if self.answer.is_some() && self.vad.recent_voiced_ms() >= self.opt.barge_in_ms {
            // Barge-in: the user talks over the answer; it stops here.
            self.cut_answer();
        }
        if self.vad.in_speech() || endpoint {
            if !was_speaking && self.utterance.is_empty() {
                self.utterances += 1;
                self.utterance.extend(self.preroll.drain(..));
            }
            self.utterance.extend_from_slice(audio);
        } else {
            self.preroll.extend(audio.iter().copied());
            let excess = self.preroll.len().saturating_sub(PREROLL);
            self.preroll.drain(..excess);
        }
        if endpoint || self.utterance.len() >= MAX_UTTERANCE {
            self.step.endpoint = true;
            self.step.heard_at = (self.utterances, self.vad.speech_ms);
            self.vad.clear();
        } else if self.opt.early_asr_ms > 0
            && self.answer.is_none()
            && self.vad.speech_ms >= self.opt.speech_min_ms
            && self.vad.silence_ms >= self.opt.early_asr_ms
        {
            // (A turn fed ahead is of this very utterance: one of another was taken back above.)
            let at = (self.utterances, self.vad.speech_ms);
            if self.fed_ahead.is_some() {
                // Fed: nothing more to do before the endpoint.
            } else if self.early.finished(at) {
                self.feed_ahead(at)?;
            } else {
                self.early.start(&self.shared.asr, &self.utterance, at);
                if self.opt.answer_ahead {
                    // This step waits for Whisper and begins the answer: the chunks that
                    // arrive meanwhile wait in the worker's backlog, and the hang-over goes on.
                    self.feed_ahead(at)?;
                }
            }
        }
        self.step.prefill_us = t0.elapsed().as_micros() as u32;
        Ok(())
    }

    pub(crate) fn duplex_generate(&mut self) -> Result<Piece, Error> {
        self.session(Kind::Duplex)?;
        let t0 = Instant::now();
        let mut piece = if self.step.forced {
            Piece { listen: true, ..Piece::default() }
        } else if self.answer.is_some() {
            self.next_piece()?
        } else if self.step.endpoint {
            self.step.endpoint = false;
            let audio = std::mem::take(&mut self.utterance);
            let ta = Instant::now();
            if self.fed_ahead.as_ref().is_some_and(|a| a.at != self.step.heard_at) {
                self.take_back_ahead()?;
            }
            let mut ahead = self.fed_ahead.take();
            if let Some((mut p, answer)) = ahead.as_mut().and_then(|a| a.begun.take()) {
                // The answer was begun during the hang-over: its first piece goes out now.
                let a = ahead.take().expect("begun ahead");
                self.answer = answer;
                self.ahead = p.audio.len() as f32 / OUT_RATE as f32;
                self.step.began = true;
                if timing() {
                    eprintln!(
                        "TIMING audio {:.2}s begun ahead: {} tokens, first piece ({} bytes, {:.2}s audio) ready {} ms before the endpoint",
                        audio.len() as f32 / 16000.0,
                        a.tokens,
                        p.text.len(),
                        p.audio.len() as f32 / 24000.0,
                        a.ready.elapsed().as_millis()
                    );
                }
                p.transcript = a.heard;
                p.input_tokens = a.tokens;
                p.prefill_us = self.step.prefill_us;
                p.generate_us = t0.elapsed().as_micros() as u32;
                self.step.outputs += 1;
                return Ok(p);
            }
            let (heard, when) = match &ahead {
                Some(a) => {
                    self.early.discard();
                    (a.heard.clone(), "early, fed ahead")
                }
                None => match self.early.take(self.step.heard_at) {
                    Some(text) => (words(&text), "early"),
                    None => (self.hear(&audio)?, "at the endpoint"),
                },
            };
            let asr_ms = ta.elapsed().as_millis();
            if heard.is_empty() {
                Piece { listen: true, ..Piece::default() }
            } else {
                let max = self.session(Kind::Duplex)?.max_tokens;
                let tf = Instant::now();
                let tokens = match &ahead {
                    Some(a) => a.tokens,
                    None => self.feed_cancellable(&user_turn(&heard), max)?,
                };
                let feed_ms = tf.elapsed().as_millis();
                self.begin(self.new_answer(max, true))?;
                self.step.began = true;
                let tp = Instant::now();
                let mut p = self.next_piece()?;
                // The terms of the first audio's delay (docs/performance.md), on stderr (the
                // gateway's log) when asked: OMNI_BACKEND_TIMING=1 (kept for a worker's process).
                if timing() {
                    eprintln!(
                        "TIMING audio {:.2}s asr {asr_ms} ms ({when}), feed {tokens} tokens {feed_ms} ms, first piece {} ms (voice {} ms; {} bytes, {:.2}s audio)",
                        audio.len() as f32 / 16000.0,
                        tp.elapsed().as_millis(),
                        p.voice_us / 1000,
                        p.text.len(),
                        p.audio.len() as f32 / 24000.0
                    );
                }
                p.transcript = heard;
                p.input_tokens = tokens;
                p
            }
        } else {
            Piece { listen: true, ..Piece::default() }
        };
        piece.prefill_us = self.step.prefill_us;
        piece.generate_us = t0.elapsed().as_micros() as u32;
        self.step.outputs += 1;
        Ok(piece)
    }

    /// More of the answer in this step, while the speech sent is less than `lead_ms` ahead.
    pub(crate) fn duplex_drain(&mut self) -> Result<Option<Piece>, Error> {
        self.session(Kind::Duplex)?;
        if self.answer.is_none()
            || self.step.forced
            || self.step.began
            || self.ahead * 1000.0 >= self.opt.lead_ms as f32
            || self.step.outputs >= 8
        {
            return Ok(None);
        }
        let t0 = Instant::now();
        let mut p = self.next_piece()?;
        p.generate_us = t0.elapsed().as_micros() as u32;
        self.step.outputs += 1;
        Ok(Some(p))
    }

    fn cancelled(&self) -> bool {
        self.shared.interrupts.load(Ordering::SeqCst) != self.step.epoch
    }

    /// The early transcription has the utterance: its turn goes into the LLM now, during the
    /// rest of the hang-over, so that the endpoint's step starts on the answer at once.
    fn feed_ahead(&mut self, at: Point) -> Result<(), Error> {
        let tw = Instant::now();
        let Some(text) = self.early.take(at) else { return Ok(()) };
        let waited = tw.elapsed();
        let heard = words(&text);
        let before = self.llm.n_past();
        let t0 = Instant::now();
        let tokens = if heard.is_empty() {
            0
        } else {
            let max = self.session(Kind::Duplex)?.max_tokens;
            match self.feed_cancellable(&user_turn(&heard), max) {
                Ok(tokens) => tokens,
                Err(e) => return self.abandon_ahead(before, e),
            }
        };
        if timing() {
            eprintln!(
                "TIMING fed ahead: waited {} ms for the early words, {tokens} tokens in {} ms",
                waited.as_millis(),
                t0.elapsed().as_millis()
            );
        }
        let begun = if self.opt.answer_ahead && tokens > 0 && heard.trim_end().ends_with(['.', '?', '!']) {
            // Its first piece too, kept for the endpoint, when the words heard end a sentence
            // (Whisper marks the end of one it heard whole; a pause mid-question rarely has
            // it); the whole of it is taken back (`before`) if the user goes on.
            let max = self.session(Kind::Duplex)?.max_tokens;
            self.begin(self.new_answer(max, true))?;
            let tp = Instant::now();
            let piece = self.next_piece();
            let answer = self.answer.take();
            self.ahead = 0.0;
            match piece {
                Ok(piece) => {
                    if timing() {
                        eprintln!(
                            "TIMING begun ahead: first piece {} ms (voice {} ms)",
                            tp.elapsed().as_millis(),
                            piece.voice_us / 1000
                        );
                    }
                    Some((piece, answer))
                }
                Err(e) => return self.abandon_ahead(before, e),
            }
        } else {
            None
        };
        self.fed_ahead = Some(FedAhead { at, heard, before, tokens, begun, ready: Instant::now() });
        Ok(())
    }

    /// Takes the turn fed ahead back out of the LLM.
    fn take_back_ahead(&mut self) -> Result<(), Error> {
        let Some(a) = self.fed_ahead.take() else { return Ok(()) };
        if timing() {
            eprintln!("TIMING the turn fed ahead was taken back: the user went on");
        }
        self.rewind_to(a.before)
    }

    /// What was fed or begun ahead failed with `e`: all of it is taken back out of the LLM
    /// (nothing else knows it is there). Interrupted or out of room, it was only not done ahead:
    /// the endpoint's step feeds it, or tells what is wrong; any other error is the step's.
    fn abandon_ahead(&mut self, before: u32, e: Error) -> Result<(), Error> {
        self.rewind_to(before)?;
        match e {
            Error::Interrupted | Error::ContextFull(_) => Ok(()),
            e => Err(e),
        }
    }

    /// The LLM back to its first `before` tokens; should llama.cpp refuse, the conversation
    /// starts over from its system prompt (what was fed must not stay half in).
    fn rewind_to(&mut self, before: u32) -> Result<(), Error> {
        if !self.llm.rewind(before) {
            eprintln!("omni-cascade: a turn fed ahead could not be taken back; the conversation starts over");
            return self.start_conversation();
        }
        self.sync_kv();
        Ok(())
    }

    fn feed_cancellable(&mut self, text: &str, reserve: u32) -> Result<u32, Error> {
        let epoch = self.step.epoch;
        let shared = self.shared.clone();
        let r = self.llm.feed(text, reserve, &move || shared.interrupts.load(Ordering::SeqCst) != epoch);
        self.sync_kv();
        r.map_err(Error::from)
    }

    /// The words of an utterance (see [`words`]).
    fn hear(&mut self, audio: &[f32]) -> Result<String, Error> {
        self.early.discard();
        // (checked after the early job ended: an interrupt meanwhile only cut that job short)
        if self.cancelled() {
            return Err(Error::Interrupted);
        }
        match self.shared.asr.transcribe(audio).map_err(Error::Inference)? {
            Heard::Aborted => Err(Error::Interrupted),
            Heard::Text(t) => Ok(words(&t)),
        }
    }

    /// The answer in progress.
    fn answer(&mut self) -> Result<&mut Answer, Error> {
        self.answer.as_mut().ok_or_else(|| Error::BadState("no answer in progress".into()))
    }

    /// One more token of the answer (or its end: the model's end of turn or the token limit).
    fn pull(&mut self) -> Result<(), Error> {
        let answer = self.answer()?;
        if answer.tokens >= answer.limit {
            answer.done = true;
            return Ok(());
        }
        let next = self.llm.next();
        self.sync_kv();
        let answer = self.answer()?;
        match next? {
            None => answer.done = true,
            Some(piece) => {
                answer.text.push_str(&piece);
                answer.tokens += 1;
            }
        }
        Ok(())
    }

    /// The next clause of the answer in progress, with its speech.
    ///
    /// The answer's first piece is its first clause, or its first `first_piece_words` words when
    /// the clause is longer ([`words_end`]). A first clause goes out as soon as its sentence has
    /// ended, without waiting for the next token to show whether more follows: that costs a
    /// token's time (some 40 ms on 2 cores) before the first sound; the end of the answer then
    /// comes as a piece of its own.
    fn next_piece(&mut self) -> Result<Piece, Error> {
        let first = self.answer()?.tokens == 0;
        let clause;
        loop {
            let words = if first { self.opt.first_piece_words } else { 0 };
            let answer = self.answer()?;
            let calls = answer.tools.active();
            match tools::opening(answer.text.trim_start()) {
                Opening::Tagged if calls => return self.next_call(),
                Opening::Bare if calls => {
                    self.hold_bare()?;
                    return self.next_call();
                }
                Opening::Perhaps if calls && !answer.done => {
                    // Perhaps a call begins: not a word of it is spoken.
                    self.pull()?;
                    continue;
                }
                _ => {}
            }
            let answer = self.answer()?;
            // Words before a call end at it.
            let call_at = answer.text.find(CALL_OPEN).filter(|&at| calls && at > 0);
            if let Some(end) =
                [clause_end(&answer.text), words_end(&answer.text, words), call_at].into_iter().flatten().min()
            {
                clause = answer.text[..end].to_string();
                answer.text.drain(..end);
                break;
            }
            if first && answer.tokens > 0 && sentence_ended(&answer.text) {
                clause = std::mem::take(&mut answer.text);
                break;
            }
            if answer.done {
                clause = std::mem::take(&mut answer.text);
                break;
            }
            if self.cancelled() {
                self.cut_answer();
                return Err(Error::Interrupted);
            }
            self.pull()?;
        }
        // Look ahead to the next word: whether this clause ends the answer (not for the first).
        loop {
            let answer = self.answer()?;
            if first || answer.done || !answer.text.trim().is_empty() {
                break;
            }
            self.pull()?;
        }
        self.sync_kv();
        let answer = self.answer.as_mut().ok_or_else(|| Error::BadState("no answer in progress".into()))?;
        answer.spoke |= !clause.trim().is_empty();
        let last = answer.done && answer.text.trim().is_empty();
        let speech = answer.speech;
        let tokens = answer.tokens - answer.reported;
        answer.reported = answer.tokens;
        let text = clause;
        let tv = Instant::now();
        let audio = if speech {
            let epoch = self.step.epoch;
            let shared = self.shared.clone();
            self.voice
                .speak(&text, &move || shared.interrupts.load(Ordering::SeqCst) != epoch)
                .map_err(Error::Inference)?
        } else {
            Vec::new()
        };
        let voice_us = tv.elapsed().as_micros() as u32;
        if self.cancelled() {
            self.cut_answer();
            return Err(Error::Interrupted);
        }
        self.ahead += audio.len() as f32 / OUT_RATE as f32;
        if last {
            self.answer = None;
            let _ = self.llm.feed("<|im_end|>\n", 0, &|| false);
            self.sync_kv();
        }
        Ok(Piece { text, audio, last, tokens, voice_us, ..Piece::default() })
    }

    /// The function call the answer goes on with: written whole (up to its closing tag or the
    /// end of the answer), checked against its tool, and handed out as one piece.
    fn next_call(&mut self) -> Result<Piece, Error> {
        loop {
            let answer = self.answer()?;
            if answer.done || answer.text.contains(CALL_CLOSE) {
                break;
            }
            if self.cancelled() {
                self.cut_answer();
                return Err(Error::Interrupted);
            }
            self.pull()?;
        }
        let answer = self.answer()?;
        let from = answer.text.find(CALL_OPEN).map_or(0, |at| at + CALL_OPEN.len());
        let to = answer.text.find(CALL_CLOSE).unwrap_or(answer.text.len());
        let written = answer.text[from..to.max(from)].to_string();
        let rest = to.saturating_add(CALL_CLOSE.len()).min(answer.text.len());
        answer.text.drain(..rest);
        let checked = answer.tools.check(&written);
        let (name, arguments) = match checked {
            Ok(call) => call,
            Err(why) => {
                self.cut_answer();
                return Err(Error::Inference(format!("the model's function call was refused: {why}")));
            }
        };
        // Whether anything follows the call (another call, or words).
        loop {
            let answer = self.answer()?;
            if answer.done || !answer.text.trim().is_empty() {
                break;
            }
            self.pull()?;
        }
        let answer = self.answer()?;
        let last = answer.done && answer.text.trim().is_empty();
        let tokens = answer.tokens - answer.reported;
        answer.reported = answer.tokens;
        answer.calls.push((name.clone(), arguments.clone()));
        if last {
            let answer = self.answer.take();
            self.end_calls(answer);
        }
        self.sync_kv();
        Ok(Piece { last, tokens, call: Some((name, arguments)), ..Piece::default() })
    }

    /// An answer that was calls only ends. The conversation keeps them in the template's own
    /// form (each in `<tool_call>` tags) however the model wrote them: a small model that wrote
    /// a bare call reads its calls back as the template shows them, and answers with the result
    /// rather than calling again.
    fn end_calls(&mut self, answer: Option<Answer>) {
        let Some(answer) = answer else { return };
        let canonical: Vec<String> = answer
            .calls
            .iter()
            .map(|(name, arguments)| {
                format!(
                    "{CALL_OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{CALL_CLOSE}",
                    serde_json::Value::String(name.clone())
                )
            })
            .collect();
        let rewritten = !answer.calls.is_empty()
            && !answer.spoke
            && self.llm.rewind(answer.start)
            && self.llm.feed(&format!("{}<|im_end|>\n", canonical.join("\n")), 0, &|| false).is_ok();
        if !rewritten {
            let _ = self.llm.feed("<|im_end|>\n", 0, &|| false);
        }
    }

    // ---- turn mode ----

    /// A conversation to answer: `continues` appends it to the one held, otherwise it
    /// replaces it; `prefill_only` takes it in and answers nothing; `tools`, the turn's own.
    /// In a duplex session too (ABI 1.3): the answer joins its conversation.
    pub(crate) fn turn_prefill(&mut self, turn: Turn) -> Result<(), Error> {
        let Turn { messages, continues, speech, max_tokens, prefill_only, tools } = turn;
        let limit = if max_tokens == 0 { self.any_session()?.max_tokens } else { max_tokens };
        if messages.iter().any(|m| m.images > 0) {
            return Err(Error::Unsupported("this backend has no vision: it cannot read images".into()));
        }
        self.step = Step { epoch: self.shared.interrupts.load(Ordering::SeqCst), ..Step::default() };
        self.take_back_ahead()?;
        self.cut_answer();
        if !continues {
            self.start_conversation()?;
        }
        let mut text = String::new();
        let tools = match tools {
            Some(t) => {
                // The turn's own tools, told to the model before its messages.
                let prompt = t.prompt();
                if !prompt.is_empty() {
                    text.push_str(&format!("<|im_start|>system\n{}<|im_end|>\n", prompt.trim_start()));
                }
                Arc::new(t)
            }
            None => self.any_session()?.tools.clone(),
        };
        let mut transcript = String::new();
        for (i, m) in messages.iter().enumerate() {
            let (role, words, clips) = (m.role, &m.text, &m.clips);
            if role == ROLE_CALL {
                text.push_str(&format!(
                    "<|im_start|>assistant\n{CALL_OPEN}\n{{\"name\": {}, \"arguments\": {}}}\n{CALL_CLOSE}<|im_end|>\n",
                    serde_json::Value::String(m.name.clone()),
                    if words.trim().is_empty() { "{}" } else { words.trim() }
                ));
                continue;
            }
            if role == ROLE_RESULT {
                text.push_str(&format!(
                    "<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n",
                    words.trim()
                ));
                continue;
            }
            let role = match role {
                0 => "system",
                2 => "assistant",
                _ => "user",
            };
            let mut content = words.trim().to_string();
            for clip in clips {
                let heard = self.hear(clip)?;
                if i + 1 == messages.len() || role == "user" {
                    transcript = heard.clone();
                }
                if !heard.is_empty() {
                    if !content.is_empty() {
                        content.push(' ');
                    }
                    content.push_str(&heard);
                }
            }
            text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        self.prefilled_only = prefill_only;
        if prefill_only {
            let tokens = if text.is_empty() { 0 } else { self.feed_cancellable(&text, 0)? };
            self.turn_first = Some((tokens, transcript));
            return Ok(());
        }
        text.push_str("<|im_start|>assistant\n");
        let tokens = self.feed_cancellable(&text, limit)?;
        let mut answer = self.new_answer(limit, speech);
        answer.tools = tools;
        answer.after_results = messages.last().is_some_and(|m| m.role == ROLE_RESULT);
        self.begin(answer)?;
        self.turn_first = Some((tokens, transcript));
        Ok(())
    }

    pub(crate) fn turn_generate(&mut self) -> Result<Piece, Error> {
        self.any_session()?;
        if std::mem::take(&mut self.prefilled_only) {
            let (tokens, _) = self.turn_first.take().unwrap_or_default();
            return Ok(Piece { last: true, input_tokens: tokens, ..Piece::default() });
        }
        if self.answer.is_none() {
            return Err(Error::BadState("no answer in progress: turn_prefill first".into()));
        }
        let t0 = Instant::now();
        let mut p = self.next_piece()?;
        if let Some((tokens, transcript)) = self.turn_first.take() {
            p.input_tokens = tokens;
            p.transcript = transcript;
        }
        p.generate_us = t0.elapsed().as_micros() as u32;
        Ok(p)
    }
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

/// Where the first clause of `text` ends (after its punctuation and the space that follows),
/// if it is complete: a sentence end or a line break, or a comma-like pause after 40 bytes.
pub(crate) fn clause_end(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|(_, n)| *n);
        let strong = matches!(c, '.' | '!' | '?' | '\n');
        let weak = matches!(c, ',' | ';' | ':') && i >= 40;
        if (strong || weak) && next.is_some_and(char::is_whitespace) && text[..i].chars().any(char::is_alphanumeric) {
            let (j, n) = chars.next()?;
            return Some(j + n.len_utf8());
        }
    }
    None
}

/// Where the answer's first piece of about `n` words ends in `text`: before the word that
/// follows its `n`th word, once that word has begun (the space stays with the piece), or `None`
/// before that, or when `n` is 0. A piece does not end on a short function word ("The capital
/// of" goes on to "France"), for at most `n` more words. A word holds a letter or a digit ("-"
/// is not one); text without spaces is never cut.
pub(crate) fn words_end(text: &str, n: u32) -> Option<usize> {
    const FUNCTION: &[&str] = &[
        "a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "and", "or", "but", "from", "by", "as", "into",
        "than", "that", "my", "your", "its", "their", "our", "his", "her",
    ];
    let n = n as usize;
    if n == 0 {
        return None;
    }
    let (mut count, mut last) = (0, "");
    for word in text.split_whitespace().filter(|w| w.chars().any(char::is_alphanumeric)) {
        if count >= n && (!FUNCTION.iter().any(|f| f.eq_ignore_ascii_case(last)) || count >= 2 * n) {
            return Some(word.as_ptr() as usize - text.as_ptr() as usize);
        }
        count += 1;
        last = word.trim_matches(|c: char| !c.is_alphanumeric());
    }
    None
}

/// Whether `text` ends a sentence as it stands: a full stop, question or exclamation mark right
/// after a word of two letters or more ("Paris.", not "3." of "3.5" nor "Dr." or "e.g.").
pub(crate) fn sentence_ended(text: &str) -> bool {
    let text = text.trim_end_matches(['"', '\'', ')']);
    let Some(body) = text.strip_suffix(['.', '!', '?']) else { return false };
    let word: String = body.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '.').collect();
    let word: String = word.chars().rev().collect();
    let letters = word.chars().filter(|c| c.is_alphabetic()).count();
    let abbreviation = ["Mr", "Mrs", "Ms", "Dr", "St", "vs", "etc", "Prof", "Jr", "Sr", "No"].contains(&word.as_str());
    letters >= 2 && word.chars().all(char::is_alphabetic) && !abbreviation
}

#[cfg(test)]
mod tests {
    use super::{clause_end, sentence_ended, words_end};

    #[test]
    fn the_first_words_end_once_the_next_word_begins() {
        assert_eq!(words_end("The capital of France is", 4), Some(22));
        assert_eq!(&"The capital of France is"[..22], "The capital of France ");
        assert_eq!(words_end("The capital of France", 4), None, "France may go on");
        assert_eq!(words_end("The capital of France ", 4), None);
        assert_eq!(words_end("One - two three four five", 4), Some(21), "a dash is not a word");
        assert_eq!(words_end("One two three four five", 0), None);
        assert_eq!(words_end("", 4), None);
        assert_eq!(words_end(" Paris is", 1), Some(7), "leading space");
        assert_eq!(words_end("... It is 3.5 km", 3), Some(14), "numbers are words");
        assert_eq!(words_end("Été est chaud ici", 3), Some(16), "letters beyond ASCII");
        assert_eq!(words_end("巴黎是法国的首都", 1), None, "no spaces: never cut");
    }

    #[test]
    fn the_first_piece_does_not_end_on_a_function_word() {
        let t = "Yes, the capital of France is Paris.";
        assert_eq!(&t[..words_end(t, 4).unwrap()], "Yes, the capital of France ");
        assert_eq!(words_end("Yes, the capital of", 4), None);
        // At most n more words: "of the" twice, then cut anyway.
        let t = "one two of the of the of the";
        assert_eq!(&t[..words_end(t, 3).unwrap()], "one two of the of the ");
    }

    #[test]
    fn a_sentence_ends_at_its_mark_after_a_word() {
        assert!(sentence_ended("The capital of France is Paris."));
        assert!(sentence_ended("Is it hot?"));
        assert!(sentence_ended("He said \"yes.\""));
        assert!(!sentence_ended("It costs 3."), "3.5 may follow");
        assert!(!sentence_ended("Ask Dr."));
        assert!(!sentence_ended("Fruit, e.g."));
        assert!(!sentence_ended("Paris"));
        assert!(!sentence_ended("The letter A."), "one letter: an initial, perhaps");
    }

    #[test]
    fn clauses_end_at_sentence_ends_and_long_pauses() {
        assert_eq!(clause_end("Hello there. How"), Some(13));
        assert_eq!(clause_end("Hello there."), None, "not sure yet: more may follow");
        assert_eq!(clause_end("It costs 3.5 euros"), None);
        assert_eq!(clause_end("Short, then"), None);
        let long = "In spring, Paris is usually mild and pleasant, with";
        assert_eq!(clause_end(long), Some(47), "after the comma and its space");
        assert_eq!(clause_end("... and"), None);
    }
}
