//! The conversation driver of the OpenAI-shaped dialects (OpenAI GA and beta, Qwen): what a
//! session of the OpenAI conversation model does between its codec and the backend's duplex
//! steps and turn-mode answers. It keeps the conversation ([`items::Conversation`]), decides
//! the user's turns (server VAD), opens and closes responses, paces the backend while the
//! client is silent, and holds what the client sends while its session is being created. It
//! knows no wire format: its codec (`crate::openai`) hands it typed [`Command`]s and
//! renders the [`Event`]s it emits.
//!
//! Its state is grouped by concern, each a named sub-state in a file of its own:
//!
//! | sub-state | file | what it holds |
//! |---|---|---|
//! | [`Lifecycle`] | here | the phase (waiting, preparing, active), the session id, what the backend can do |
//! | [`setup::Setup`] | `setup.rs` | the configuration: asked, in force, the reconfigures in flight, settings reported |
//! | [`items::Conversation`] | `items.rs` | the items in order, with their ids (the client's edits: `edits.rs`) |
//! | [`sync::Sync`] | `sync.rs` | whether the backend's context follows the conversation; replays |
//! | [`intake::Intake`] | `intake.rs` | the caller's audio on its way: resampled, gathered into steps or buffered; images |
//! | [`turns::TurnDetection`] | `turns.rs` | server VAD: the speech edges, the user's turn in progress, what the model heard |
//! | [`responses::Responses`] | `responses.rs` | the response in progress, turn-mode answers outstanding, items not yet answered |
//! | [`pacing::Pacer`] | `pacing.rs` | stepping the backend with silence while the client says nothing |
//! | [`delegation::Delegation`] | `delegation.rs` | the decider beside a voice that calls no tools, its decision in flight |
//! | [`Held`] | here | events and commands held until the session is created |
//!
//! # Calling contract
//!
//! - Each client command goes to [`Driver::command`]; a codec that must decode a large payload
//!   first asks [`Driver::admit`] whether the session may hold it.
//! - Each of the session's events goes to the method of its name ([`Driver::queue_done`],
//!   [`Driver::created`], [`Driver::step`], [`Driver::turn_delta`]...), and time to
//!   [`Driver::tick`].
//! - After every call the caller takes [`Driver::take_events`] (in the order the client is to
//!   hear them) and [`Driver::take_commands`] (in the order the session is to carry them out).
//!   Before the session is created, events are held and released with `session.created`;
//!   commands likewise, but for the session's own start.
//!
//! No call blocks, allocates without a bound the client controls, or panics on any input.

use std::time::{Duration, Instant};

use omni_actors::domain::{BackendInfo, Mode};
use omni_actors::edge::redact::RecordedMedia;
use omni_actors::edge::vad::SharedDetectors;
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Inbound, ProtocolError, QueueInfo};

use super::Limits;

pub mod calls;
pub mod config;
pub mod delegation;
mod edits;
pub mod events;
pub mod held;
pub mod intake;
pub mod items;
pub mod pacing;
pub mod responses;
pub mod setup;
pub mod sync;
#[cfg(test)]
mod tests;
pub mod turns;

pub use config::{Coding, Conf, Truncation, Vad};
pub use events::{Command, Event, NewItem, Output, ResponseRequest, ResponseStatus, ResponseView, SessionView, Usage};
use held::Counted;
use intake::Intake;
use items::Conversation;
use pacing::Pacer;
use responses::Responses;
use setup::Setup;
use sync::Sync;
use turns::TurnDetection;

/// Samples per duplex step until the backend names its own (`BackendInfo::step_samples`): one
/// second at 16 kHz.
pub const DEFAULT_STEP: usize = 16000;
/// Audio held while the session is being created: at most this many steps.
const MAX_HELD_STEPS: usize = 30;
/// Model output rate (the backend's 24 kHz).
pub const OUTPUT_RATE: u32 = 24000;

/// Where the session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Queued: nothing reaches the client but queue events.
    Waiting,
    /// A worker is assigned; the backend is being prepared.
    Preparing,
    Active,
}

/// The session's life: its phase, its id, and what its backend can do once created.
#[derive(Debug)]
pub struct Lifecycle {
    pub phase: Phase,
    pub session_id: Option<String>,
    pub backend: Option<BackendInfo>,
}

/// What is held for the client until the session is created: events it is to hear, and
/// its input for the backend.
#[derive(Default)]
pub struct Held {
    events: Counted<Event>,
    commands: Counted<Inbound>,
}

pub struct Driver {
    life: Lifecycle,
    setup: Setup,
    conversation: Conversation,
    intake: Intake,
    turns: TurnDetection,
    responses: Responses,
    sync: Sync,
    pacer: Pacer,
    delegation: delegation::Delegation,
    held: Held,
    limits: Limits,
    /// Events for the client, in order, not yet taken.
    events: Vec<Event>,
    /// Commands for the session, in order, not yet taken.
    commands: Vec<Inbound>,
    /// The audio (16 kHz) and images the last command carried, for the recording.
    recorded: Option<RecordedMedia>,
    /// What it holds, as a part of what every session's conversation holds together.
    share: held::Share,
}

impl Driver {
    /// A driver starting from `conf` (the flavor's defaults).
    pub fn new(conf: Conf, limits: Limits, voice: &SharedDetectors) -> Driver {
        Driver {
            life: Lifecycle { phase: Phase::Waiting, session_id: None, backend: None },
            intake: Intake::new(conf.input_rate),
            setup: Setup::new(conf),
            conversation: Conversation::default(),
            turns: TurnDetection::new(voice),
            responses: Responses::default(),
            sync: Sync::default(),
            pacer: Pacer::default(),
            delegation: delegation::Delegation::default(),
            held: Held::default(),
            limits,
            events: Vec::new(),
            commands: Vec::new(),
            recorded: None,
            share: held::Share::default(),
        }
    }

    /// The gateway transcribes user turns for backends that do not (`[transcription]` is on).
    pub fn with_gateway_transcription(mut self, on: bool) -> Driver {
        self.turns.gateway_asr = on;
        self
    }

    /// The public mode sessions of these dialects queue for.
    pub fn mode() -> Mode {
        Mode::Audio
    }

    /// The configuration asked for last (what a client's update applies to).
    pub fn conf(&self) -> &Conf {
        &self.setup.conf
    }

    pub fn phase(&self) -> Phase {
        self.life.phase
    }

    /// Events for the client, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        self.account();
        std::mem::take(&mut self.events)
    }

    /// Commands for the session, in order.
    pub fn take_commands(&mut self) -> Vec<Inbound> {
        self.account();
        std::mem::take(&mut self.commands)
    }

    /// Tells the process's budget what this conversation holds now.
    fn account(&mut self) {
        let held = self.held_bytes();
        self.share.report(held);
    }

    /// The audio and images the last command carried, for the recording.
    pub fn take_recorded(&mut self) -> Option<RecordedMedia> {
        self.recorded.take()
    }

    /// Carries out one client command.
    pub fn command(&mut self, cmd: Command, now: Instant) -> Result<(), ProtocolError> {
        self.recorded = None;
        let done = self.carry_out(cmd, now);
        self.account();
        done
    }

    fn carry_out(&mut self, cmd: Command, now: Instant) -> Result<(), ProtocolError> {
        match cmd {
            Command::Update(conf) => self.update(*conf),
            Command::Audio { samples, rate } => self.audio(&samples, rate, now),
            Command::Commit => self.commit(now),
            Command::Clear => {
                self.intake.clear();
                self.say(Event::Cleared);
                Ok(())
            }
            Command::Image(jpeg) => self.image(jpeg),
            Command::CreateItem(item) => self.create_item(*item),
            Command::Retrieve { item_id } => self.retrieve(&item_id),
            Command::Delete { item_id } => self.delete(&item_id),
            Command::Truncate { item_id, content_index, audio_end_ms } => {
                self.truncate(&item_id, content_index, audio_end_ms)
            }
            Command::CreateResponse(request) => self.create_response(*request, now),
            Command::Cancel => self.cancel(),
            Command::Key(key) => self.key(key),
        }
    }

    /// The queue's news for a waiting client: heard at once.
    pub fn queued(&mut self, info: QueueInfo, first: bool) {
        self.events.push(if first { Event::Queued(info) } else { Event::QueueUpdate(info) });
    }

    /// An error the session tells the client.
    pub fn error(&mut self, e: &ProtocolError) {
        self.events.push(Event::Error(e.clone()));
    }

    /// The oldest turn-mode answer in flight failed: its response fails, and the client hears why.
    pub fn turn_failed(&mut self, e: &ProtocolError) {
        let owner = self.responses.turns.pop_front().and_then(|t| t.response);
        if self.turn_is_current(owner) {
            self.finish_response(ResponseStatus::Failed, Some("inference_error"));
        }
        self.events.push(Event::Error(e.clone()));
    }

    /// The session ended: the client hears why (unless it asked).
    pub fn ended(&mut self, reason: &CloseReason) {
        match reason {
            CloseReason::Client(r) if r == "finished" => self.events.push(Event::Finished),
            CloseReason::Client(_) => {}
            other => self.events.push(Event::Ended(other.clone())),
        }
    }

    /// An event for the client: now once the session is created, else held until then.
    fn say(&mut self, event: Event) {
        if self.life.phase == Phase::Active {
            self.events.push(event);
        } else {
            self.held.events.push(event);
        }
    }

    /// A command for the session: now once the session is created, else held until then
    /// (audio: the newest [`MAX_HELD_STEPS`] steps).
    fn send(&mut self, cmd: Inbound) {
        if self.life.phase == Phase::Active {
            self.commands.push(cmd);
        } else {
            if matches!(cmd, Inbound::Chunk(_)) && self.held.commands.len() >= MAX_HELD_STEPS {
                self.held.commands.pop_front();
            }
            self.held.commands.push(cmd);
        }
    }

    /// Everything held for the client, in bytes.
    fn held_bytes(&self) -> usize {
        self.held.events.bytes()
            + self.held.commands.bytes()
            + self.sync.pending.bytes()
            + self.intake.bytes()
            + self.responses.deferred.len() * 64
    }

    /// Refuses an event that would take what is held for the client past
    /// `limits.max_buffered_bytes` (`max_waiting_bytes` while it waits for a worker), or what
    /// every session holds together past `max_total_bytes`; `buffer` names what would grow
    /// (and labels the metric).
    pub fn admit(&self, event: &str, buffer: &'static str, extra: usize) -> Result<(), ProtocolError> {
        let held = self.held_bytes();
        let l = &self.limits;
        let (max, key) = if self.life.phase != Phase::Active && l.max_waiting_bytes < l.max_buffered_bytes {
            (l.max_waiting_bytes, "limits.max_buffered_waiting_mb, while it waits for a worker")
        } else {
            (l.max_buffered_bytes, "limits.max_buffered_mb")
        };
        let others = self.share.others();
        let refusal = if held.saturating_add(extra) > max {
            format!(
                "{event}: refused: the server already holds {held} bytes for this session (audio not yet \
                 committed, items and images not yet answered, replies not yet sent) and holds at most \
                 {max} ({key}); commit, clear or wait for the session to start"
            )
        } else if others.saturating_add(held).saturating_add(extra) > l.max_total_bytes {
            format!(
                "{event}: refused: the server holds {} bytes for all its sessions together and holds at \
                 most {} (limits.max_buffered_total_mb); try again later",
                others + held,
                l.max_total_bytes
            )
        } else {
            return Ok(());
        };
        metrics().buffer_refusals.with_label_values(&[buffer]).inc();
        Err(ProtocolError::BufferFull(refusal))
    }

    /// Samples per duplex step: the backend's preferred chunk once the session is created.
    fn step_len(&self) -> usize {
        self.life.backend.as_ref().map_or(DEFAULT_STEP, BackendInfo::duplex_chunk_samples)
    }

    /// One step's length of audio: how often the backend is stepped with silence.
    fn step_duration(&self) -> Duration {
        Duration::from_millis(self.step_len() as u64 * 1000 / 16000)
    }
}
