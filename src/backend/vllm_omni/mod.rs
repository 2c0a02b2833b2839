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
//!   watchdog), chunks that pile up are dropped silently, and force-listen or an interrupt
//!   overtakes: it is seen within 20 ms mid-step and sends `response.cancel`, and the cancelled
//!   response's late pieces are dropped.
//! - Voice handed on counts as played (`playback.ack`): the gateway's clients do not report
//!   playback in vLLM-Omni's terms.
//! - Reset: `session.close`, and its `session.closed` awaited before the slot is offered again
//!   (a socket dropped without it would hold the server's slot for 30 to 35 s). A server that
//!   does not confirm fails the slot, which reopens with backoff.
//! - A connection lost mid-session ends that session with `backend_error`; the other slots find
//!   out from `/health` at their next check.

mod options;
mod server;
mod wire;

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use omni_actors::domain::{
    BackendInfo, DuplexChunk, SessionKind, SessionSetup, StepKind, StepOutcome, StepPiece, TurnInput, TurnPiece,
};
use omni_actors::edge::backend::{Backend, BackendControl, BackendError};
use omni_actors::observe::metrics::metrics;
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

use options::Options;
use server::Server;
use wire::Event;

/// The context size reported: the gateway counts no tokens against it (the KV length is 0).
const CONTEXT_TOKENS: u32 = 8192;
/// Errors of a server that cannot hold duplex sessions at all: the slot is out, not the client.
const SERVER_ERRORS: [&str; 3] = ["multi_api_duplex_unsupported", "unsupported", "config_timeout"];
/// The largest message taken from the server: an event carries a second or two of voice, and
/// `session.created` echoes the voice prompt (a WAV of up to 30 s).
const MAX_MESSAGE: usize = 4 << 20;
/// The server's journal is acknowledged every this many events.
const ACK_EVERY: u64 = 64;
/// A server that says nothing for this long while it is sent units is gone: longer than the 64
/// units a response may go on without a word (its model listening on, its own silence fed).
const SILENT_FOR: Duration = Duration::from_secs(150);
/// How often a step waiting for its decision looks for an interrupt.
const POLL: Duration = Duration::from_millis(20);
/// Cancelled responses remembered, to drop their late pieces.
const CANCELLED_KEPT: usize = 8;
/// Errors of the playback acknowledgements sent on the client's behalf, and of a cancel that
/// crossed the response's end: nothing the client asked for.
const OWN_ERRORS: [&str; 4] =
    ["response_not_active", "playback_ack_too_late", "playback_item_not_found", "playback_item_mismatch"];

type Socket = WebSocket<TcpStream>;

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

/// The response being spoken, and the voice of it handed on.
struct Speaking {
    id: String,
    sent_samples: u64,
}

/// A session whose connection was lost: what takes it back, to close it.
#[derive(Debug, Clone)]
struct Orphan {
    session_id: String,
    resume_token: String,
    /// The last event received.
    seq: u64,
}

/// One session on the server.
struct Link {
    socket: Socket,
    session_id: String,
    resume_token: String,
    /// The last `server_event_seq` received.
    seq: u64,
    /// The last `server_event_seq` acknowledged (`session.event_ack`).
    acked: u64,
    speaking: Option<Speaking>,
    cancelled: VecDeque<String>,
    /// A cancel went out with no response known: the response whose start is read before its
    /// answer (`response.done`, or the error that nothing was active) was cancelled.
    cancelling_unknown: bool,
    /// The last step ended before its unit's decision: the first decision the next step reads
    /// is that one, and the step goes on waiting for its own.
    owed: bool,
    /// When the server last said anything.
    heard_at: Instant,
    /// An error that came after a step's output: told with the next step.
    error: Option<BackendError>,
}

impl Link {
    fn send(&mut self, text: String) -> Result<(), tungstenite::Error> {
        self.socket.send(Message::text(text))
    }

    /// Cancels the response being spoken, or the one whose start is not read yet; its late
    /// pieces are dropped.
    fn cancel(&mut self) -> Result<(), tungstenite::Error> {
        match self.speaking.take() {
            Some(speaking) => {
                self.send(wire::cancel(Some(&speaking.id)))?;
                self.forget(speaking.id);
            }
            None => {
                self.send(wire::cancel(None))?;
                self.cancelling_unknown = true;
            }
        }
        Ok(())
    }

    /// Drops what comes of `response_id` from now on.
    fn forget(&mut self, response_id: String) {
        if self.cancelled.len() == CANCELLED_KEPT {
            self.cancelled.pop_front();
        }
        self.cancelled.push_back(response_id);
    }

    fn is_cancelled(&self, response_id: &str) -> bool {
        self.cancelled.iter().any(|id| id == response_id)
    }

    fn orphan(&self) -> Orphan {
        Orphan { session_id: self.session_id.clone(), resume_token: self.resume_token.clone(), seq: self.seq }
    }
}

/// What a step's collected events came to.
#[derive(Default)]
struct Collected {
    piece: StepPiece,
    /// The unit's decision arrived (a listen, or voice with its words, or a response's end).
    decided: bool,
    /// A piece of voice waits for its words.
    voice_without_words: bool,
    /// The response whose voice was handed on, and how much of it in all (24 kHz samples).
    played: Option<(String, u64)>,
    /// The step was cut short by an interrupt.
    interrupted: bool,
}

impl Collected {
    /// A unit's decision was read: this step's, unless the last step still owed one.
    fn decision(&mut self, link: &mut Link) {
        if std::mem::take(&mut link.owed) {
            return;
        }
        self.decided = true;
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
            // MiniCPM-o speaks in the voice of `ref_audio`; vLLM-Omni stores a voice name unread.
            voice_from_reference_only: true,
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
        let host = self.url.trim_start_matches("http://");
        let unreachable = |e: String| {
            self.server.suspect();
            BackendError::Unavailable(format!("{}{}: {e}", self.url, wire::PATH))
        };
        let addr = host
            .to_socket_addrs()
            .map_err(|e| unreachable(e.to_string()))?
            .next()
            .ok_or_else(|| unreachable("resolves to no address".into()))?;
        let tcp =
            TcpStream::connect_timeout(&addr, self.options.connect_timeout).map_err(|e| unreachable(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        tcp.set_read_timeout(Some(self.options.reply_timeout)).map_err(|e| unreachable(e.to_string()))?;
        // A server that stops reading fails the send instead of holding the thread.
        tcp.set_write_timeout(Some(self.options.reply_timeout)).map_err(|e| unreachable(e.to_string()))?;
        let request =
            format!("ws://{host}{}", wire::PATH).into_client_request().map_err(|e| unreachable(e.to_string()))?;
        // A server's message is an event: a second or two of voice at most. 16 MiB is
        // vLLM-Omni's own bound on what it reads.
        let config = tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let (socket, _) = tungstenite::client::client_with_config(request, tcp, Some(config))
            .map_err(|e| unreachable(e.to_string()))?;
        Ok(socket)
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

    fn open_session(&mut self, setup: &SessionSetup) -> Result<(), BackendError> {
        self.server.usable(&self.name, self.options.connect_timeout)?;
        let update = wire::session_update(setup, self.ref_audio(setup)?, self.options.model.as_deref());
        let mut socket = self.connect()?;
        let refused = |e: String| {
            self.server.suspect();
            BackendError::Unavailable(format!("{}: the session was not opened: {e}", self.url))
        };
        socket.send(Message::text(update)).map_err(|e| refused(e.to_string()))?;
        let deadline = Instant::now() + self.options.reply_timeout;
        loop {
            let text = next_text(&mut socket, deadline).map_err(|e| refused(format!("no session.created ({e})")))?;
            match wire::parse(&text).map_err(|e| self.lost("session.update", e))?.0 {
                Event::Created { session_id, resume_token } => {
                    self.server.had_room();
                    log::debug!("worker {}: vLLM-Omni session {session_id} open", self.name);
                    self.link = Some(Link {
                        socket,
                        session_id,
                        resume_token,
                        seq: 0,
                        acked: 0,
                        speaking: None,
                        cancelled: VecDeque::new(),
                        cancelling_unknown: false,
                        owed: false,
                        heard_at: Instant::now(),
                        error: None,
                    });
                    return Ok(());
                }
                Event::Error { code, message } if code == "resource_exhausted" => {
                    self.server.full();
                    metrics().remote_worker_health.with_label_values(&[&self.name, "full"]).inc();
                    let why = format!("{} has no free session slot ({code}: {message})", self.url);
                    return Err(BackendError::Unavailable(why));
                }
                Event::Error { code, message } if SERVER_ERRORS.contains(&code.as_str()) => {
                    self.server.suspect();
                    let why = format!("{} cannot hold a duplex session: {message} ({code})", self.url);
                    return Err(BackendError::Unavailable(why));
                }
                Event::Error { code, message } => {
                    let why = format!("vLLM-Omni refused the session: {message} ({code})");
                    return Err(BackendError::InvalidArgument(why));
                }
                _ => {}
            }
        }
    }

    /// Ends the session on the server and waits for its `session.closed`, so that its slot is
    /// free when this one is offered again. Unconfirmed, the session is taken back on a new
    /// connection to be closed ([`Self::close_orphan`]).
    fn close_session(&mut self) -> Result<(), BackendError> {
        let Some(mut link) = self.link.take() else { return Ok(()) };
        let session_id = link.session_id.clone();
        self.orphan = Some(link.orphan());
        let deadline = Instant::now() + self.options.close_timeout;
        let confirmed = link.send(wire::close()).map_err(|e| e.to_string()).and_then(|_| {
            loop {
                let text = next_text(&mut link.socket, deadline).map_err(|e| e.to_string())?;
                if let Ok((Event::Ended { kind, .. }, _)) = wire::parse(&text)
                    && kind == "session.closed"
                {
                    break Ok(());
                }
            }
        });
        if let Err(why) = confirmed {
            return Err(BackendError::Internal(format!(
                "{} did not confirm the end of session {session_id} ({why}): it is taken back to be closed",
                self.url
            )));
        }
        self.orphan = None;
        // A slot of that server is free: it is asked again at once, whatever refusal came before.
        self.server.had_room();
        // The server closes the socket next; the close handshake is not waited for.
        let _ = link.socket.close(None);
        let _ = link.socket.flush();
        log::debug!("worker {}: vLLM-Omni session {session_id} closed", self.name);
        Ok(())
    }

    /// Takes a session whose connection was lost back on a new one and closes it, so that the
    /// server does not hold its slot for 30 to 35 s. A server that cannot be reached holds
    /// nothing (it died, or its grace ends it); one that refuses the token has ended it.
    fn close_orphan(&mut self) {
        let Some(o) = self.orphan.take() else { return };
        let said = |what: &str| log::info!("worker {}: vLLM-Omni session {} {what}", self.name, o.session_id);
        let Ok(mut socket) = self.connect() else {
            return said("was lost with its connection, and the server cannot be reached to close it");
        };
        let deadline = Instant::now() + self.options.close_timeout;
        let mut closed =
            socket.send(Message::text(wire::resume(&o.session_id, &o.resume_token, o.seq))).map_err(|e| e.to_string());
        // Until it is taken back, an error is the refusal; after, the replay of old ones.
        let mut resumed = false;
        while closed.is_ok() {
            let event = next_text(&mut socket, deadline)
                .map_err(|e| e.to_string())
                .and_then(|text| wire::parse(&text).map(|(event, _)| event).map_err(|e| e.to_string()));
            match event {
                Ok(Event::Resumed) => {
                    resumed = true;
                    closed = socket.send(Message::text(wire::close())).map_err(|e| e.to_string());
                }
                Ok(Event::Error { code, message }) if !resumed => closed = Err(format!("{message} ({code})")),
                Ok(Event::Ended { kind, .. }) if kind == "session.closed" => break,
                Ok(Event::Ended { kind, .. }) => closed = Err(kind),
                Ok(_) => {}
                Err(e) => closed = Err(e),
            }
        }
        match closed {
            Ok(()) => said("was lost with its connection: taken back and closed"),
            Err(why) => said(&format!("was lost with its connection, and could not be taken back to close it ({why})")),
        }
        let _ = socket.close(None);
    }

    /// Reads the server's events into the step's piece until the unit's decision, for at most
    /// the decision wait; an interrupt seen meanwhile cancels the response.
    fn collect(&mut self) -> Result<StepPiece, BackendError> {
        let deadline = Instant::now() + self.options.decision_wait;
        let mut got = Collected::default();
        let mut link = self.link.take().ok_or_else(|| BackendError::BadState("no session is prepared".into()))?;
        let result = loop {
            if self.control.cancel.swap(false, Ordering::SeqCst) {
                got.interrupted = true;
                break link.cancel().map_err(|e| self.lost("response.cancel", e)).and(Err(BackendError::Interrupted));
            }
            let now = Instant::now();
            // After the decision, only what is already there: a read that does not wait (a
            // timeout of a millisecond would wait a scheduler tick, up to 10 ms).
            let settled = got.decided && !got.voice_without_words;
            // Never past the wait, nor more than a step hands on, however fast the server
            // sends: the rest is read by the next step.
            if now >= deadline
                || got.piece.audio.len() >= self.info.max_output_samples as usize
                || got.piece.text.len() >= self.info.max_output_text_bytes as usize
            {
                break Ok(());
            }
            let tcp = link.socket.get_ref();
            let _ = tcp.set_nonblocking(settled);
            if !settled {
                let _ = tcp.set_read_timeout(Some((deadline - now).min(POLL)));
            }
            match link.socket.read() {
                Ok(Message::Text(text)) => match wire::parse(&text) {
                    Ok((event, seq)) => {
                        link.seq = seq.unwrap_or(link.seq);
                        link.heard_at = Instant::now();
                        if let Err(e) = self.absorb(&mut link, &mut got, event) {
                            break Err(e);
                        }
                    }
                    Err(e) => break Err(self.lost("an event", e)),
                },
                Ok(Message::Close(frame)) => break Err(self.lost("step", format!("the server closed ({frame:?})"))),
                Ok(_) => {}
                Err(tungstenite::Error::Io(io)) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if settled {
                        break Ok(());
                    }
                }
                Err(e) => break Err(self.lost("step", e)),
            }
        };
        let _ = link.socket.get_ref().set_nonblocking(false);
        // A unit whose decision did not come is owed by the next step's first.
        link.owed = !got.decided && result.is_ok();
        let result = result.and_then(|()| self.after_step(&mut link, &mut got));
        match result {
            Err(e @ BackendError::Crashed(_)) => {
                self.orphan = Some(link.orphan());
                Err(e)
            }
            other => {
                let stashed = link.error.take();
                self.link = Some(link);
                other?;
                match stashed {
                    Some(e) if got.piece.audio.is_empty() && got.piece.text.is_empty() => Err(e),
                    Some(e) => {
                        self.link.as_mut().expect("just put back").error = Some(e);
                        Ok(got.piece)
                    }
                    None => Ok(got.piece),
                }
            }
        }
    }

    /// What a step sends back once it has its events: the voice it hands on counts as played,
    /// and the server's journal of the events received is trimmed now and then. A server that
    /// has said nothing for [`SILENT_FOR`] while units were sent is taken as gone.
    fn after_step(&self, link: &mut Link, got: &mut Collected) -> Result<(), BackendError> {
        if let Some((id, samples)) = got.played.take()
            && let Err(e) = link.send(wire::playback_ack(&id, samples / 24))
        {
            return Err(self.lost("playback.ack", e));
        }
        if link.seq >= link.acked + ACK_EVERY {
            link.send(wire::event_ack(link.seq)).map_err(|e| self.lost("session.event_ack", e))?;
            link.acked = link.seq;
        }
        let silent = link.heard_at.elapsed();
        if silent > SILENT_FOR {
            let why = format!("nothing from the server for {:.0} s while units were sent", silent.as_secs_f64());
            return Err(self.lost("step", why));
        }
        Ok(())
    }

    /// One server event into the step's piece.
    fn absorb(&self, link: &mut Link, got: &mut Collected, event: Event) -> Result<(), BackendError> {
        match event {
            // Begun before a cancel that named no response: that cancel is for it.
            Event::ResponseCreated { id } if link.cancelling_unknown => link.forget(id),
            Event::ResponseCreated { id } => link.speaking = Some(Speaking { id, sent_samples: 0 }),
            Event::Audio { response_id, samples, end_of_turn } if !link.is_cancelled(&response_id) => {
                if let Some(s) = link.speaking.as_mut().filter(|s| s.id == response_id) {
                    s.sent_samples += samples.len() as u64;
                    got.played = Some((s.id.clone(), s.sent_samples));
                }
                got.piece.kind = StepKind::Speak;
                got.piece.audio.extend_from_slice(&samples);
                got.piece.end_of_turn |= end_of_turn;
                got.voice_without_words = true;
            }
            Event::Text { response_id, text } if !link.is_cancelled(&response_id) => {
                if !text.is_empty() {
                    got.piece.kind = StepKind::Speak;
                    got.piece.text.push_str(&text);
                }
                got.voice_without_words = false;
                got.decision(link);
            }
            // A cancelled response's words: still the decision of their unit.
            Event::Audio { .. } => {}
            Event::Text { .. } => got.decision(link),
            Event::Listen { response_id } => {
                // With a response: its end (the model listens again).
                if let Some(id) = response_id
                    && !link.is_cancelled(&id)
                    && got.piece.kind == StepKind::Speak
                {
                    got.piece.end_of_turn = true;
                }
                got.decision(link);
            }
            Event::Done { id, status, reason } => {
                if link.speaking.as_ref().is_some_and(|s| s.id == id) {
                    link.speaking = None;
                }
                if status == "cancelled" {
                    link.cancelling_unknown = false;
                }
                match status.as_str() {
                    "failed" => {
                        let e = BackendError::Inference(format!("vLLM-Omni: the answer failed ({reason})"));
                        if got.piece.audio.is_empty() && got.piece.text.is_empty() {
                            return Err(e);
                        }
                        link.error = Some(e);
                    }
                    "cancelled" => {}
                    _ if !link.is_cancelled(&id) && got.piece.kind == StepKind::Speak => got.piece.end_of_turn = true,
                    _ => {}
                }
                // Not a unit's decision: it follows the last piece, or answers a cancel.
            }
            Event::Cleared => link.cancelling_unknown = false,
            Event::Error { code, message } if OWN_ERRORS.contains(&code.as_str()) => {
                if code == "response_not_active" {
                    link.cancelling_unknown = false;
                }
                log::debug!("worker {}: vLLM-Omni: {message} ({code})", self.name);
            }
            Event::Error { code, message } => {
                // Errors do not end a vLLM-Omni session: the step (or the next) tells it.
                let e = BackendError::Inference(format!("vLLM-Omni: {message} ({code})"));
                if got.piece.audio.is_empty() && got.piece.text.is_empty() {
                    return Err(e);
                }
                link.error = Some(e);
            }
            Event::Unjournaled { reason } => {
                // Only a lost connection's session can no longer be taken back to be closed.
                log::warn!(
                    "worker {}: vLLM-Omni keeps no more events of session {} for a resume ({reason})",
                    self.name,
                    link.session_id
                );
            }
            Event::Ended { kind, reason } => {
                return Err(
                    self.lost("session", format!("the server ended session {} ({kind}: {reason})", link.session_id))
                );
            }
            Event::Created { .. } | Event::Resumed | Event::Other => {}
        }
        Ok(())
    }
}

/// Why no text message came before a deadline.
#[derive(Debug, thiserror::Error)]
enum Silence {
    #[error("nothing in time")]
    Timeout,
    #[error("the server closed the connection ({0})")]
    Closed(String),
    #[error("{0}")]
    Failed(String),
}

/// The next text message on `socket` before `deadline` (other frames are skipped: however many
/// come, the deadline holds).
fn next_text(socket: &mut Socket, deadline: Instant) -> Result<String, Silence> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Silence::Timeout);
        }
        let _ = socket.get_ref().set_read_timeout(Some(left));
        match socket.read() {
            Ok(Message::Text(text)) => return Ok(text.to_string()),
            Ok(Message::Close(frame)) => return Err(Silence::Closed(format!("{frame:?}"))),
            Ok(_) => {}
            Err(tungstenite::Error::Io(io)) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Silence::Timeout);
            }
            Err(e) => return Err(Silence::Failed(e.to_string())),
        }
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
