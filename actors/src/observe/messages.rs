//! What the observers' actors handle: the recorder's [`Record`]s and usage accounting's
//! [`UsageRecord`]s. Sessions reach them through their subscribers' sinks
//! ([`super::events`]), which never wait on them.

use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use serde::Serialize;

use super::meta::{Reservation, SessionMeta};
use crate::edge::redact::Direction;
use crate::edge::redact::RecordedMedia;

/// What a session hands its recorder.
#[derive(Message)]
#[rtype(result = "()")]
pub enum Record {
    /// A frame received or sent, to write as a line of `events.jsonl`.
    Event {
        /// When, counted from the connection's upgrade.
        at: Duration,
        /// Whether the client sent the frame or was sent it.
        dir: Direction,
        /// The frame's text as it crossed the socket.
        text: Bytes,
        /// Inbound media the dialect decoded, in the order the frame carries it.
        media: RecordedMedia,
        /// Held until the record is written (or dropped).
        reservation: Reservation,
    },
    /// The session ended: the recorder finalizes its files and writes this as `meta.json`.
    Finish(Box<SessionMeta>),
}

/// One connection's usage, a line of the day's file.
#[derive(Debug, Clone, Serialize, Message)]
#[rtype(result = "()")]
pub struct UsageRecord {
    /// The API key's id (`anonymous` when no keys are configured).
    pub key: String,
    /// The mode the client asked for (`chat`, `video` or `audio`).
    pub mode: &'static str,
    /// The session's id; `None` when it never got one.
    pub session_id: Option<String>,
    /// The dialect's name; `None` when the session never started.
    pub dialect: Option<&'static str>,
    /// When it connected, RFC 3339.
    pub start: String,
    /// Seconds from the upgrade to the end of the session (to the millisecond).
    pub connected_s: f64,
    /// Seconds of audio received (16 kHz input, duplex chunks and turn messages alike).
    pub audio_in_s: f64,
    /// Seconds of model speech sent (24 kHz output).
    pub audio_out_s: f64,
    /// Duplex steps answered plus turn-mode answers given.
    pub steps: u64,
    /// Why the session ended ([`CloseReason::as_str`](crate::protocol::CloseReason::as_str)).
    pub close_reason: String,
    /// The `YYYY-MM-DD` of `start`: the day file the line goes into (not written in the line).
    #[serde(skip)]
    pub date: String,
}
