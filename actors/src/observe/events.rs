//! Typed events about sessions and workers, for the actors that extend the gateway
//! (docs/extending.md).
//!
//! A [`Subscriber`] is registered once, at start. When a connection opens it may give the
//! session a [`SessionSink`]: the session then hands that sink the events the subscriber's
//! [`Interest`] names, as they happen, in order, on the session's own thread. A sink must
//! not block: it keeps counters, or passes what it needs to its actor with [`forward`],
//! which never waits (a full mailbox drops the event and counts it). Audio and frames (the
//! [`Interest::WIRE`] events) are handed only to subscribers that ask for them, and nothing
//! is built for an event no sink wants.
//!
//! Events speak the domain's terms, not a wire dialect's: the recorder, which keeps the
//! wire frames, is the one subscriber of [`Interest::WIRE`] events in this crate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use bytes::Bytes;

use crate::domain::{Mode, StepKind};
use crate::edge::redact::RecordedMedia;
use crate::edge::redact::Redact;
use crate::observe::meta::SessionMeta;
use crate::observe::metrics::metrics;

/// Which events a subscriber wants: a set of the constants below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interest(u32);

impl Interest {
    /// No events.
    pub const NONE: Interest = Interest(0);
    /// Queued, assigned, started (initialised), closed.
    pub const LIFECYCLE: Interest = Interest(1);
    /// Duplex chunks received and dropped, turn-mode inputs received.
    pub const INPUT: Interest = Interest(1 << 1);
    /// What the model produced: listens, speech, answers, transcripts of the user.
    pub const OUTPUT: Interest = Interest(1 << 2);
    /// `error` events sent to the client.
    pub const ERRORS: Interest = Interest(1 << 3);
    /// The frames as they crossed the socket, with the audio and images they carried.
    pub const WIRE: Interest = Interest(1 << 4);
    /// Workers' state changes.
    pub const WORKERS: Interest = Interest(1 << 5);

    /// Both sets together (as `|`).
    pub const fn union(self, other: Interest) -> Interest {
        Interest(self.0 | other.0)
    }
    /// Whether every event of `other` is in this set; never for an empty `other`.
    pub const fn contains(self, other: Interest) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }
    /// Whether this set and `other` share any event.
    pub const fn intersects(self, other: Interest) -> bool {
        self.0 & other.0 != 0
    }
}

impl std::ops::BitOr for Interest {
    type Output = Interest;
    fn bitor(self, other: Interest) -> Interest {
        self.union(other)
    }
}

/// A connection, as its subscribers first see it.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// The connection's number (`c12` in logs) until the session has an id.
    pub conn: u64,
    /// The mode the client asked for.
    pub mode: Mode,
    /// The client's address and port (`unknown` when the transport does not say).
    pub client_addr: String,
    /// The client's `User-Agent` header, when it sent one.
    pub user_agent: Option<String>,
    /// Which API key it presented, as an id that is not the key (none: no keys configured).
    pub key_id: Option<String>,
    /// When the connection was upgraded (for durations).
    pub upgraded: Instant,
    /// When the connection was upgraded (wall clock, for timestamps).
    pub upgraded_at: SystemTime,
}

/// One thing the model produced for a session.
#[derive(Debug, Clone, Copy)]
pub enum Output<'a> {
    /// A duplex step answered input `seq`: a listen, or speech.
    Step {
        /// The input's number (`input_N`).
        seq: u64,
        /// Whether the model listened or spoke.
        kind: StepKind,
        /// The text the step produced; empty for a listen.
        text: &'a str,
        /// How much speech the step produced, in 24 kHz samples.
        audio_samples: usize,
        /// The step ended the model's turn.
        end_of_turn: bool,
        /// The backend's KV cache length after the step, in tokens.
        kv_length: u64,
    },
    /// A piece of a turn-mode answer to input `seq`.
    TurnPiece {
        /// The input's number (`input_N`).
        seq: u64,
        /// The piece's text.
        text: &'a str,
        /// How much speech the piece carries, in 24 kHz samples.
        audio_samples: usize,
    },
    /// A turn-mode answer is done.
    TurnDone {
        /// The input's number (`input_N`).
        seq: u64,
        /// The whole text of the answer.
        text: &'a str,
        /// Tokens of the prefilled conversation; 0 for a cancelled answer.
        input_tokens: u32,
        /// Text tokens of the answer; 0 for a cancelled answer.
        output_tokens: u32,
        /// The answer was interrupted before its end.
        cancelled: bool,
    },
    /// What the user said, as the model heard it.
    Transcript {
        /// The input (`input_N`) whose step or answer reported it.
        seq: u64,
        /// The words.
        text: &'a str,
    },
}

/// Something that happened to a session. Borrowed: a sink copies what it keeps.
#[derive(Clone, Copy)]
pub enum SessionEvent<'a> {
    /// The client must wait for a worker.
    Queued {
        /// Its place in the queue, 1-based.
        position: usize,
    },
    /// A worker took it, after `waited` since the upgrade.
    Assigned {
        /// The worker's name.
        worker: &'a str,
        /// Time from the connection's upgrade to the assignment.
        waited: Duration,
    },
    /// The client initialised: the session has an id and a dialect (its backend is being
    /// prepared; `session.created` follows).
    Started {
        /// The session's id, as the dialect made it.
        session_id: &'a str,
        /// The dialect's name.
        dialect: &'static str,
        /// How the dialect's frames are redacted for the recording.
        redactor: &'a Arc<dyn Redact>,
    },
    /// A duplex input chunk arrived and went to the worker.
    ChunkReceived {
        /// The input's number (`input_N`).
        seq: u64,
        /// The chunk's audio, in 16 kHz samples.
        samples: usize,
        /// How many camera frames it carried.
        frames: usize,
    },
    /// A duplex input chunk was dropped unanswered: the client ran ahead of the worker.
    ChunkDropped {
        /// The input's number (`input_N`).
        seq: u64,
    },
    /// A turn-mode input `seq` (a chat `input.append`, an OpenAI `response.create`): its
    /// messages, and the 16 kHz samples and images they carry.
    TurnReceived {
        /// The input's number (`input_N`).
        seq: u64,
        /// How many messages the conversation has.
        messages: usize,
        /// The audio of all its messages, in 16 kHz samples.
        samples: usize,
        /// How many images all its messages carry.
        images: usize,
    },
    /// Something the model produced.
    Output(Output<'a>),
    /// An `error` event was sent to the client.
    Error {
        /// The error's wire code ([`ProtocolError::code`](crate::protocol::ProtocolError::code)).
        code: &'static str,
        /// The error's message, as the client got it.
        message: &'a str,
    },
    /// A frame from the client, with what the dialect decoded of it.
    WireIn {
        /// The frame as received; a refused frame over
        /// [`MAX_REFUSED_RECORDED`](crate::session::MAX_REFUSED_RECORDED) bytes is replaced by a
        /// stub, and audio from an edge that carries it by a `caller.audio` frame.
        frame: &'a Bytes,
        /// The audio segments (16 kHz) and images the frame carried, decoded.
        media: &'a RecordedMedia,
    },
    /// A frame to the client, as sent; or the model's voice sent as samples to an edge that
    /// carries audio (`audio`, at 24 kHz, with a `model.audio` frame naming its response).
    WireOut {
        /// The frame as sent.
        frame: &'a Bytes,
        /// The model's voice, 24 kHz mono, when the event stands for audio sent to an edge that
        /// carries it; `None` for a frame.
        audio: Option<&'a [f32]>,
    },
    /// The last event of every connection: how it ended and its totals.
    Closed {
        /// Everything recorded about the session, with its close reason and totals.
        meta: &'a SessionMeta,
    },
}

impl SessionEvent<'_> {
    /// The event's name (`queued`, `assigned`, `started`, `chunk_received`,
    /// `chunk_dropped`, `output`, `error`, `wire_in`, `wire_out`, `closed`).
    pub fn name(&self) -> &'static str {
        match self {
            SessionEvent::Queued { .. } => "queued",
            SessionEvent::Assigned { .. } => "assigned",
            SessionEvent::Started { .. } => "started",
            SessionEvent::ChunkReceived { .. } => "chunk_received",
            SessionEvent::ChunkDropped { .. } => "chunk_dropped",
            SessionEvent::TurnReceived { .. } => "turn_received",
            SessionEvent::Output(_) => "output",
            SessionEvent::Error { .. } => "error",
            SessionEvent::WireIn { .. } => "wire_in",
            SessionEvent::WireOut { .. } => "wire_out",
            SessionEvent::Closed { .. } => "closed",
        }
    }

    /// The interest an event belongs to.
    pub fn interest(&self) -> Interest {
        match self {
            SessionEvent::Queued { .. }
            | SessionEvent::Assigned { .. }
            | SessionEvent::Started { .. }
            | SessionEvent::Closed { .. } => Interest::LIFECYCLE,
            SessionEvent::ChunkReceived { .. }
            | SessionEvent::ChunkDropped { .. }
            | SessionEvent::TurnReceived { .. } => Interest::INPUT,
            SessionEvent::Output(_) => Interest::OUTPUT,
            SessionEvent::Error { .. } => Interest::ERRORS,
            SessionEvent::WireIn { .. } | SessionEvent::WireOut { .. } => Interest::WIRE,
        }
    }
}

/// A worker's state changed.
#[derive(Debug, Clone)]
pub struct WorkerChange {
    /// The worker's name.
    pub worker: String,
    /// The node it runs on; `None` for the gateway's own.
    pub node: Option<String>,
    /// "starting", "idle", "busy", "resetting" or "failed".
    pub from: &'static str,
    /// The state it is in now (one of those of `from`).
    pub to: &'static str,
    /// Why it failed.
    pub reason: Option<String>,
}

/// A subscriber's handle on one session. Called on the session's thread: it must return at
/// once (no I/O, no waiting on anything).
pub trait SessionSink: Send {
    /// Takes one event the subscriber's [`Interest`] names; must return at once.
    fn event(&mut self, event: &SessionEvent<'_>);
}

/// An actor (or anything) that observes sessions and workers.
pub trait Subscriber: Send + Sync {
    /// For logs and metrics.
    fn name(&self) -> &str;
    /// The events it wants; [`Interest::NONE`] for none.
    fn interest(&self) -> Interest;
    /// A connection opened: this subscriber's sink for it, or none.
    fn session(&self, info: &SessionInfo) -> Option<Box<dyn SessionSink>>;
    /// A worker changed state (with [`Interest::WORKERS`]). Must return at once.
    fn worker(&self, _change: &WorkerChange) {}
}

/// Every subscriber, registered once at start; cheap to clone.
#[derive(Clone, Default)]
pub struct Subscribers(Arc<Vec<Arc<dyn Subscriber>>>);

impl Subscribers {
    /// Registers `list` (each is logged).
    pub fn new(list: Vec<Arc<dyn Subscriber>>) -> Subscribers {
        for s in &list {
            log::info!("subscriber {} registered", s.name());
        }
        Subscribers(Arc::new(list))
    }

    /// The sinks of a connection that opened.
    pub fn session(&self, info: &SessionInfo) -> SessionSinks {
        let mut sinks = SessionSinks::default();
        for s in self.0.iter() {
            let interest = s.interest();
            if interest == Interest::NONE || interest == Interest::WORKERS {
                continue;
            }
            if let Some(sink) = s.session(info) {
                sinks.wants = sinks.wants | interest;
                sinks.sinks.push((interest, sink));
            }
        }
        sinks
    }

    /// Tells every subscriber of [`Interest::WORKERS`].
    pub fn worker(&self, change: &WorkerChange) {
        for s in self.0.iter().filter(|s| s.interest().contains(Interest::WORKERS)) {
            s.worker(change);
        }
    }
}

/// A session's sinks.
#[derive(Default)]
pub struct SessionSinks {
    sinks: Vec<(Interest, Box<dyn SessionSink>)>,
    wants: Interest,
}

impl SessionSinks {
    /// Whether any sink wants events of `interest` (check before building a costly event).
    pub fn wants(&self, interest: Interest) -> bool {
        self.wants.intersects(interest)
    }

    /// Hands `event` to every sink that wants it.
    pub fn publish(&mut self, event: SessionEvent<'_>) {
        let interest = event.interest();
        if !self.wants.intersects(interest) {
            return;
        }
        for (wants, sink) in &mut self.sinks {
            if wants.intersects(interest) {
                sink.event(&event);
            }
        }
    }
}

/// Counts what one subscriber's actor could not take.
pub struct Dropped {
    name: String,
    count: AtomicU64,
}

impl Dropped {
    /// A counter for the subscriber `name` (its metric label).
    pub fn new(name: &str) -> Arc<Dropped> {
        Arc::new(Dropped { name: name.to_string(), count: AtomicU64::new(0) })
    }

    /// One more event missed; logged at the first and every 1,000th.
    pub fn one(&self) {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        metrics().subscriber_dropped.with_label_values(&[self.name.as_str()]).inc();
        if n == 1 || n.is_multiple_of(1000) {
            log::warn!("subscriber {}: its mailbox is full; {n} event(s) missed so far", self.name);
        }
    }

    /// How many events were missed so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Hands `message` to a subscriber's actor without ever waiting: when its mailbox is full
/// (its capacity is the bound on its backlog) the message is dropped and counted.
pub fn forward<M>(to: &Recipient<M>, message: M, dropped: &Dropped)
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    if to.try_send(message).is_err() {
        dropped.one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Counting(Arc<Mutex<Vec<String>>>);
    impl SessionSink for Counting {
        fn event(&mut self, event: &SessionEvent<'_>) {
            self.0.lock().unwrap().push(event.name().to_string());
        }
    }
    struct Sub(Interest, Arc<Mutex<Vec<String>>>);
    impl Subscriber for Sub {
        fn name(&self) -> &str {
            "test"
        }
        fn interest(&self) -> Interest {
            self.0
        }
        fn session(&self, _: &SessionInfo) -> Option<Box<dyn SessionSink>> {
            Some(Box::new(Counting(self.1.clone())))
        }
    }

    fn info() -> SessionInfo {
        SessionInfo {
            conn: 1,
            mode: Mode::Audio,
            client_addr: "127.0.0.1".into(),
            user_agent: None,
            key_id: None,
            upgraded: Instant::now(),
            upgraded_at: SystemTime::now(),
        }
    }

    #[test]
    fn each_sink_gets_what_it_asked_for_and_nothing_else() {
        let (a, b) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let subs = Subscribers::new(vec![
            Arc::new(Sub(Interest::LIFECYCLE, a.clone())),
            Arc::new(Sub(Interest::INPUT | Interest::ERRORS, b.clone())),
        ]);
        let mut sinks = subs.session(&info());
        assert!(sinks.wants(Interest::INPUT) && !sinks.wants(Interest::WIRE));
        sinks.publish(SessionEvent::Queued { position: 1 });
        sinks.publish(SessionEvent::ChunkReceived { seq: 1, samples: 16000, frames: 0 });
        sinks.publish(SessionEvent::Error { code: "not_ready", message: "x" });
        sinks.publish(SessionEvent::WireOut { frame: &Bytes::from_static(b"{}"), audio: None });
        assert_eq!(*a.lock().unwrap(), ["queued"]);
        assert_eq!(*b.lock().unwrap(), ["chunk_received", "error"]);
    }

    #[test]
    fn interests_combine() {
        let i = Interest::LIFECYCLE | Interest::WIRE;
        assert!(i.contains(Interest::WIRE) && i.intersects(Interest::LIFECYCLE) && !i.intersects(Interest::OUTPUT));
        assert!(!Interest::NONE.contains(Interest::NONE));
    }
}
