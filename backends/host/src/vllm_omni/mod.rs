//! `backend = "vllm-omni"`: one session slot of a vLLM-Omni server serving MiniCPM-o full
//! duplex (`vllm-omni serve`, its `/v1/realtime?duplex=1` WebSocket), behind a BackendActor
//! like any other backend, so the gateway's queue, keys, dialects, limits and recording stand
//! in front of servers that have none of them. An entry's `count` is the server's
//! `duplex_session.max_sessions`.
//!
//! - Open: the server's `/health` says 200 (shared by its slots: [`server`]).
//! - Prepare: a WebSocket per session, `session.update` with the instructions, the voice prompt
//!   as a WAV data URL, the audio formats and model-owned turns; `session.created` awaited. A
//!   `resource_exhausted` (its slot taken by another gateway or a direct client) is
//!   [`BackendError::Unavailable`]: the session waits at the head of the queue and this slot is
//!   retried with backoff.
//! - Steps, and the clock. vLLM-Omni forms one-second units from the samples it is sent and
//!   answers each on its own time (and keeps speaking on a wall clock of its own while no input
//!   comes); the BackendActor steps one chunk at a time. A step sends its one-second unit
//!   (float32 as the client wrote it, with the unit's camera frames and force-listen) and hands
//!   on the events that arrive until that unit's decision (a listen, or a piece of voice with
//!   its words), for at most `decision_wait_ms` (500 ms, half a unit). A decision later than
//!   that, or voice the server made while the gateway sent nothing, comes with the next step:
//!   at most one unit late, and input never waits (the next unit arrives a second later). The
//!   BackendActor's rules hold as for any backend: a step takes at most the wait (the step
//!   watchdog), chunks that pile up are dropped silently, and an interrupt overtakes: it is
//!   seen within 20 ms mid-step (a force-listen goes with the next unit) and sends
//!   `response.cancel`, and the cancelled response's late pieces are dropped (docs/architecture.md,
//!   "A backend on a clock of its own").
//! - Voice handed on counts as played (`playback.ack`): the gateway's clients do not report
//!   playback in vLLM-Omni's terms.
//! - Reset: `session.close`, and its `session.closed` awaited before the slot is offered again
//!   (a socket dropped without it would hold the server's slot for 30 to 35 s). A session not
//!   confirmed closed, or whose connection broke, is taken back on a new connection with its
//!   resume token and closed there.
//! - A connection lost mid-session ends that session with `backend_error`; the other slots find
//!   out from `/health` at their next check.
//!
//! Here: the backend and its any-thread half; `session.rs` opens and closes a session on the
//! server (and takes back a lost one to close it); `step.rs` reads a step's events into its
//! piece; `link.rs` is one session's socket and state; `wire.rs` the protocol's messages;
//! `server.rs` what the slots of one server share; `options.rs` the `[workers.options]`.

mod link;
mod options;
mod server;
mod session;
mod step;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use omni_actors::domain::{
    BackendInfo, DuplexChunk, SessionKind, SessionSetup, SetupField, StepOutcome, StepPiece, TurnInput, TurnPiece,
};
use omni_actors::edge::backend::{Backend, BackendControl, BackendError};

use link::{Link, Orphan, Socket};
use options::Options;
use server::Server;

/// The context size reported: the gateway counts no tokens against it (the KV length is 0).
const CONTEXT_TOKENS: u32 = 8192;
/// What the dialects take as applied that vLLM-Omni does not apply.
const IGNORED: [SetupField; 3] = [SetupField::Voice, SetupField::LengthPenalty, SetupField::MaxSliceNums];
/// The largest message taken from the server: an event carries a second or two of voice, and
/// `session.created` echoes the voice prompt (a WAV of up to 30 s).
const MAX_MESSAGE: usize = 4 << 20;

/// The any-thread half: flags the owner thread reads between reads.
struct Control {
    force_listen: AtomicBool,
    cancel: AtomicBool,
    health_interval: Duration,
}

impl BackendControl for Control {
    fn interrupt(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }
    fn set_force_listen(&self, on: bool) {
        self.force_listen.store(on, Ordering::SeqCst);
    }
    fn kv_length(&self) -> u64 {
        0 // vLLM-Omni keeps its own context window and reports no length
    }
    fn never_blocks(&self) -> bool {
        true // flags only
    }
    fn idle_check_every(&self) -> Option<Duration> {
        Some(self.health_interval)
    }
}

pub struct VllmOmniBackend {
    name: String,
    /// `http://host:port`.
    url: String,
    options: Options,
    info: BackendInfo,
    control: Arc<Control>,
    server: Arc<Server>,
    link: Option<Link>,
    /// A session whose connection was lost, to be taken back and closed.
    orphan: Option<Orphan>,
}

impl VllmOmniBackend {
    /// A slot of the server at `url`, usable when the server answers its `/health` and has not
    /// just refused a session for want of a slot.
    pub fn open(name: &str, url: &str, options: &[(String, String)]) -> Result<VllmOmniBackend, BackendError> {
        let options = Options::parse(options)?;
        let server = server::of(url);
        server.usable(name, options.connect_timeout)?;
        let control = Arc::new(Control {
            force_listen: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            health_interval: options.health_interval,
        });
        let info = BackendInfo {
            name: "vllm-omni".into(),
            vision: true,
            speech_output: true,
            duplex: true,
            // Its MiniCPM-o duplex sessions take audio only: no text turns to answer.
            turn: false,
            input_sample_rate: 16000,
            output_sample_rate: 24000,
            // vLLM-Omni keeps its own context window and reports no KV length.
            context_size: CONTEXT_TOKENS,
            // A step hands on what came within a unit, or what piled up since the last.
            max_output_samples: 24000 * 16,
            max_output_text_bytes: 16384,
            abi_revision: 1,
            transcripts: false,
            token_details: false,
            // Temperature and the answer's length are the only generation settings it takes.
            settings: Vec::new(),
            step_samples: 16000,
            tools: false,
            // MiniCPM-o speaks in the voice of `ref_audio` (vLLM-Omni stores a voice name unread),
            // takes no length penalty, and a unit's frames whole.
            ignored: IGNORED.to_vec(),
        };
        log::info!("worker {name}: vLLM-Omni at {url} is healthy");
        let name = name.to_string();
        Ok(VllmOmniBackend { name, url: url.to_string(), options, info, control, server, link: None, orphan: None })
    }

    fn lost(&self, what: &str, e: impl std::fmt::Display) -> BackendError {
        self.server.suspect();
        BackendError::Crashed(format!("worker {} ({}): {what}: {e}", self.name, self.url))
    }

    /// A WebSocket to the server's duplex endpoint.
    fn connect(&self) -> Result<Socket, BackendError> {
        let dial = crate::ws_client::Dial {
            connect_timeout: self.options.connect_timeout,
            read_timeout: self.options.reply_timeout,
            // A server that stops reading fails the send instead of holding the thread.
            write_timeout: Some(self.options.reply_timeout),
            config: Some(
                tungstenite::protocol::WebSocketConfig::default()
                    .max_message_size(Some(MAX_MESSAGE))
                    .max_frame_size(Some(MAX_MESSAGE)),
            ),
        };
        crate::ws_client::connect(&self.url, wire::PATH, &dial).map_err(|e| {
            self.server.suspect();
            BackendError::Unavailable(format!("{}{}: {e}", self.url, wire::PATH))
        })
    }

    /// The voice prompt: the client's (the voice to speak in, else its reference audio), else
    /// the one the operator configured.
    fn ref_audio(&self, setup: &SessionSetup) -> Result<Option<String>, BackendError> {
        let samples = if setup.tts_ref_audio.is_empty() { &setup.ref_audio } else { &setup.tts_ref_audio };
        if !samples.is_empty() {
            return Ok(Some(wire::wav_data_url(&omni_actors::audio::encode_wav(samples, 16000))));
        }
        let Some(path) = &self.options.ref_audio else { return Ok(None) };
        let wav = std::fs::read(path)
            .map_err(|e| BackendError::Internal(format!("worker {}: ref_audio {}: {e}", self.name, path.display())))?;
        Ok(Some(wire::wav_data_url(&wav)))
    }
}

impl Backend for VllmOmniBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn prepare(&mut self, setup: &SessionSetup) -> Result<(), BackendError> {
        let closed = self.close_session();
        self.close_orphan();
        closed?;
        if setup.kind != SessionKind::Duplex {
            return Err(BackendError::Unsupported("vLLM-Omni's duplex sessions answer no text turns".into()));
        }
        self.control.force_listen.store(false, Ordering::SeqCst);
        self.control.cancel.store(false, Ordering::SeqCst);
        self.open_session(setup)
    }

    fn reset(&mut self) -> Result<(), BackendError> {
        self.control.cancel.store(false, Ordering::SeqCst);
        let closed = self.close_session();
        self.close_orphan();
        closed
    }

    fn duplex_prefill(&mut self, _: &DuplexChunk) -> Result<(), BackendError> {
        Err(BackendError::BadState("a vLLM-Omni step is one call (duplex_step)".into()))
    }

    fn duplex_generate(&mut self) -> Result<StepPiece, BackendError> {
        Err(BackendError::BadState("a vLLM-Omni step is one call (duplex_step)".into()))
    }

    fn duplex_drain(&mut self) -> Result<Option<StepPiece>, BackendError> {
        Ok(None)
    }

    fn duplex_finalize(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn duplex_step(&mut self, chunk: &DuplexChunk) -> Result<StepOutcome, BackendError> {
        let asked = self.control.force_listen.swap(false, Ordering::SeqCst);
        let force = chunk.force_listen || asked;
        // An interrupt that came between steps.
        let interrupted = self.control.cancel.swap(false, Ordering::SeqCst);
        let link = self.link.as_mut().ok_or_else(|| BackendError::BadState("no session is prepared".into()))?;
        // Force-listen ends the speech now too (the unit's flag alone would leave the server's
        // own silence units speaking on).
        let sent = if force || interrupted { link.cancel() } else { Ok(()) }
            .and_then(|_| link.send(wire::append(chunk, force)));
        if let Err(e) = sent {
            self.orphan = self.link.take().map(|l| l.orphan());
            return Err(self.lost("input_audio_buffer.append", e));
        }
        // Frames asked to be cut into slices go whole: said once a session, with this step.
        if let Some(n) = chunk.max_slice_nums.filter(|n| *n > 1 && !chunk.frames.is_empty())
            && !std::mem::replace(&mut link.told_slices, true)
        {
            let why = format!("max_slice_nums {n}: vLLM-Omni takes a unit's frames whole; they were sent so");
            link.error.get_or_insert(BackendError::Inference(why));
        }
        Ok(StepOutcome::from_first(self.collect()?))
    }

    fn turn_prefill(&mut self, _: &TurnInput) -> Result<(), BackendError> {
        Err(BackendError::Unsupported("vLLM-Omni's duplex sessions answer no text turns".into()))
    }

    fn turn_generate(&mut self) -> Result<TurnPiece, BackendError> {
        Err(BackendError::Unsupported("vLLM-Omni's duplex sessions answer no text turns".into()))
    }

    /// Asked only while no session runs; the slots of a server share the answer.
    fn check_idle(&mut self) -> Result<(), BackendError> {
        self.server.healthy(&self.name, self.options.connect_timeout)
    }

    fn control(&self) -> Arc<dyn BackendControl> {
        self.control.clone()
    }
}

impl Drop for VllmOmniBackend {
    fn drop(&mut self) {
        if let Err(e) = self.close_session() {
            log::warn!("worker {}: {e}", self.name);
        }
        self.close_orphan();
    }
}
