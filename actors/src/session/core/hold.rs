//! The session's hold: its connection lost, it keeps everything for its client for the
//! grace (a deadline of its own); a resume hands it a new line (`crate::session::resume` has the
//! rules and the tokens).

use std::time::{Duration, Instant};

use super::SessionCore;
use crate::edge::client::{ClientLine, ToClient};
use crate::edge::dialect::Emit;
use crate::observe::metrics;
use crate::protocol::{CloseReason, Outbound};
use crate::session::state::Phase;

/// How soon a session whose grace passed while a caller held its token looks again.
const TAKEN_RECHECK: Duration = Duration::from_secs(1);

impl SessionCore {
    /// A token that resumes this session, for its client only (its API key's); `None` for a
    /// session that is not resumed.
    pub(super) fn issue_token(&mut self) -> Option<String> {
        let session = self.links.resumable.clone()?;
        let (key_id, transport) = (self.links.client.key_id.clone(), self.links.client.transport);
        Some(self.links.registry.tokens().issue(self.links.conn, key_id, transport, session))
    }

    /// The connection was lost without a close: the session is held for the grace when
    /// resumption is on (and it is not already ending), else it ends.
    pub(super) fn lose(&mut self, reason: CloseReason, now: Instant) {
        let grace = self.settings.resume.grace;
        if grace.is_zero() || self.draining || self.state.phase() == Phase::Closed || self.replay.away() {
            log::debug!("session {}: its connection ended ({})", self.who(), reason.as_str());
            return self.end_untold(reason);
        }
        self.replay.lose(now);
        self.holds += 1;
        log::info!(
            "session {}: connection lost ({}); held {:?} for a resume ({}, worker {})",
            self.who(),
            reason.as_str(),
            grace,
            if self.worker.is_some() { "on its worker" } else { "in the queue" },
            self.worker_name()
        );
        self.away_reason = Some(reason);
        self.links.registry.set_away(self.links.conn, Some(now));
        metrics().sessions_held.inc();
        self.timers.hold = Some((now + grace, self.holds));
    }

    /// The grace of hold `hold` passed: the session ends, unless its client came back. A
    /// client that took its token is starting its connection: it hands the session its line
    /// or, failing, puts the token back; the session looks again a moment later.
    pub(super) fn hold_over(&mut self, hold: u64, now: Instant) {
        if hold != self.holds || !self.replay.away() || self.end.is_some() {
            return;
        }
        if !self.links.registry.tokens().revoke(self.links.conn) {
            self.timers.hold = Some((now + TAKEN_RECHECK, hold));
            return;
        }
        let reason = self.away_reason.take().unwrap_or(CloseReason::ClientGone);
        log::info!(
            "session {}: not resumed within {:?}; ended ({}) on worker {}",
            self.who(),
            self.settings.resume.grace,
            reason.as_str(),
            self.worker_name()
        );
        metrics().resumes.with_label_values(&["expired"]).inc();
        self.end_untold(reason);
    }

    /// A resumed connection's line (its number `line_no`, the client having received
    /// `received` messages when it says): the session speaks there from now on. Its client
    /// first gets `session.resumed` (the next token, what it missed), then the messages it did
    /// not receive, in order, then its place in the queue while it waits.
    pub fn resumed(&mut self, line: Box<dyn ClientLine>, line_no: u64, received: Option<u64>, now: Instant) {
        if self.end.is_some() {
            line.tell(ToClient::Close(CloseReason::ClientGone));
            return;
        }
        let old = std::mem::replace(&mut self.links.line, line);
        if !self.replay.away() {
            // The client came back before its old connection was noticed lost: that one closes.
            old.tell(ToClient::Close(CloseReason::Resumed));
        } else {
            self.links.registry.set_away(self.links.conn, None);
            metrics().sessions_held.dec();
        }
        self.timers.hold = None;
        self.line_no = line_no;
        self.away_reason = None;
        let catchup = self.replay.back(received, now);
        let token = self.issue_token().unwrap_or_default();
        let replayed = catchup.frames.len() as u64;
        log::info!(
            "session {}: resumed after {:.1} s away (worker {}): {replayed} messages sent again, {} lost, {} ms of the model's voice not sent",
            self.who(),
            catchup.away.as_secs_f64(),
            self.worker_name(),
            catchup.lost,
            catchup.voice_skipped_ms
        );
        metrics().resumes.with_label_values(&["resumed"]).inc();
        let session_id = self.session_id.clone();
        let resumed = Outbound::Resumed {
            session_id: session_id.as_deref(),
            token: &token,
            replayed,
            lost: catchup.lost,
            voice_skipped_ms: catchup.voice_skipped_ms,
            away_ms: catchup.away.as_millis() as u64,
        };
        // Told outside the line's numbering (a client counts the session's messages, not these).
        let mut out = self.take_outbox();
        self.dialect.encode(resumed, &mut out);
        for item in out.drain() {
            match item {
                Emit::Text(frame) => {
                    self.record_out(bytes::Bytes::from(frame.replace(&token, "(resume token)")));
                    self.links.line.tell(ToClient::Text(frame.into()));
                }
                Emit::Command(cmd) => self.work.push_back(cmd),
                Emit::Voiced(_) | Emit::Audio(_) => {}
            }
        }
        self.outbox = out;
        for frame in catchup.frames {
            self.links.line.tell(ToClient::Text(frame));
        }
        if self.state.phase() == Phase::Queued
            && self.worker.is_none()
            && let Some(info) = self.last_queue
        {
            self.emit(Outbound::QueueUpdate(info));
        }
        self.run_work();
    }
}
