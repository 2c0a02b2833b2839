//! What is kept of a session when it ends: its facts ([`SessionMeta`], `meta.json`), what its
//! recording wrote ([`RecordingSummary`]), the recording's audio rates, and a record's share of
//! the recorder's bounds while it waits to be written ([`Reservation`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use serde::Serialize;

use super::metrics::metrics;

/// The sample rate of the recording's input audio (`input.wav`), in Hz.
pub const INPUT_RATE: u32 = 16000;
/// The sample rate of the recording's model audio (`output.wav`), in Hz.
pub const OUTPUT_RATE: u32 = 24000;

/// A record's share of the bounds; given back when the record is written or dropped.
pub struct Reservation {
    pub(super) session: Arc<AtomicUsize>,
    pub(super) total: Arc<AtomicUsize>,
    pub(super) size: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.session.fetch_sub(self.size, Ordering::Relaxed);
        self.total.fetch_sub(self.size, Ordering::Relaxed);
        metrics().recording_lag_bytes.sub(self.size as i64);
    }
}

/// A recorded session's facts, written to `meta.json` when it ends.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionMeta {
    /// The session's id; empty when it never got one.
    pub session_id: String,
    /// The mode the client asked for (`chat`, `video` or `audio`).
    pub mode: String,
    /// The dialect's name.
    pub dialect: String,
    /// `websocket` or `webrtc` (empty in recordings made before it was kept).
    #[serde(default)]
    pub transport: String,
    /// The name of the worker it had; `None` when it never got one.
    pub worker: Option<String>,
    /// The client's address and port.
    pub client_addr: String,
    /// The client's `User-Agent` header, when it sent one.
    pub user_agent: Option<String>,
    /// When the connection was upgraded, RFC 3339 in UTC.
    pub start: String,
    /// When the session ended, RFC 3339 in UTC.
    pub end: String,
    /// Seconds from the upgrade to the end.
    pub duration_s: f64,
    /// Why it ended ([`CloseReason::as_str`](crate::protocol::CloseReason::as_str)).
    pub close_reason: String,
    /// Duplex input chunks received.
    pub chunks_received: u64,
    /// Duplex input chunks dropped unprocessed (the client ran ahead of its worker).
    pub chunks_dropped: u64,
    /// Duplex input chunks answered (a listen or speech sent; speech voided by a force-listen is
    /// not counted).
    pub chunks_answered: u64,
    /// Model answers: spoken turns in duplex modes, answers in chat.
    pub turns: u64,
    /// Filled in by the recorder.
    pub recording: RecordingSummary,
}

/// What the recorder wrote for a session, in its `meta.json`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecordingSummary {
    /// Lines written to `events.jsonl`.
    pub events: u64,
    /// Samples written to `input.wav` (16 kHz).
    pub input_samples: u64,
    /// Samples written to `output.wav` (24 kHz).
    pub output_samples: u64,
    /// Images written under `frames/`.
    pub frames: u64,
    /// Large text values written under `attachments/`.
    pub attachments: u64,
    /// Records the session dropped because a recorder was too far behind (or, before the
    /// session had an id, because it held too much).
    pub dropped_records: u64,
    /// Some records were dropped (`dropped_records` is not 0).
    pub lagged: bool,
    /// The recording reached `recording.max_session_mb` and took nothing more.
    pub truncated: bool,
    /// The first error creating or writing the recording's files; `None` when there was none.
    pub error: Option<String>,
}

/// RFC 3339 in UTC, and the `YYYY-MM-DD` of a moment.
pub fn timestamp(t: SystemTime) -> (String, String) {
    let t = time::OffsetDateTime::from(t);
    let full = t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    let date = format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day());
    (full, date)
}
