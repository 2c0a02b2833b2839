//! What the observers' actors handle: the recorder's [`Record`]s and usage accounting's
//! [`UsageRecord`]s. Sessions reach them through their subscribers' sinks
//! ([`super::events`]), which never wait on them.

use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use serde::Serialize;

use super::recording::{Direction, Reservation, SessionMeta};
use crate::edge::dialect::RecordedMedia;

/// What a session hands its recorder.
#[derive(Message)]
#[rtype(result = "()")]
pub enum Record {
    Event {
        at: Duration,
        dir: Direction,
        text: Bytes,
        /// Inbound media the dialect decoded, in the order the frame carries it.
        media: RecordedMedia,
        /// Held until the record is written (or dropped).
        reservation: Reservation,
    },
    Finish(Box<SessionMeta>),
}

/// One connection's usage, a line of the day's file.
#[derive(Debug, Clone, Serialize, Message)]
#[rtype(result = "()")]
pub struct UsageRecord {
    pub key: String,
    pub mode: &'static str,
    pub session_id: Option<String>,
    pub dialect: Option<&'static str>,
    /// When it connected, RFC 3339.
    pub start: String,
    pub connected_s: f64,
    pub audio_in_s: f64,
    pub audio_out_s: f64,
    pub steps: u64,
    pub close_reason: String,
    #[serde(skip)]
    pub date: String,
}
