//! The session's hold: its connection lost, it keeps everything for its client for the
//! grace; a resume hands it a new line ([`super::resume`] has the rules and the tokens).

use std::time::Instant;

use actix::prelude::*;

use super::SessionActor;
use super::messages::ToClient;
use super::resume::{Resumable, Resume};
use super::state::Phase;
use crate::observe::metrics;
use crate::protocol::{CloseReason, Outbound};

impl SessionActor {
    /// A token that resumes this session, for its client only (its API key's).
    pub(super) fn issue_token(&mut self, ctx: &mut Context<Self>) -> String {
        let key_id = self.links.client.key_id.clone();
        let session = Resumable { resume: ctx.address().recipient(), port: ctx.address().recipient() };
        self.links.registry.tokens().issue(self.conn, key_id, session)
    }

    /// The connection was lost without a close: the session is held for the grace when
    /// resumption is on (and it is not already ending), else it ends.
    pub(super) fn lose(&mut self, reason: CloseReason, ctx: &mut Context<Self>) {
        let grace = self.settings.resume.grace;
        if grace.is_zero() || self.draining || self.state.phase() == Phase::Closed || self.line.away() {
            log::debug!("session {}: its connection ended ({})", self.who(), reason.as_str());
            self.end = Some(reason);
            self.ended_at = Some(Instant::now());
            self.state.close();
            return ctx.stop();
        }
        let now = Instant::now();
        self.line.lose(now);
        self.holds += 1;
        let hold = self.holds;
        log::info!(
            "session {}: connection lost ({}); held {:?} for a resume ({}, worker {})",
            self.who(),
            reason.as_str(),
            grace,
            if self.worker.is_some() { "on its worker" } else { "in the queue" },
            self.worker_name()
        );
        self.lost = Some(reason);
        self.links.registry.set_away(self.conn, Some(now));
        metrics().sessions_held.inc();
        ctx.run_later(grace, move |act, ctx| act.hold_over(hold, ctx));
    }

    /// The grace of hold `hold` passed: the session ends, unless its client came back, or
    /// took its token and is on its way (the resume is in the mailbox).
    fn hold_over(&mut self, hold: u64, ctx: &mut Context<Self>) {
        if hold != self.holds || !self.line.away() || self.end.is_some() {
            return;
        }
        if !self.links.registry.tokens().revoke(self.conn) {
            return;
        }
        let reason = self.lost.take().unwrap_or(CloseReason::ClientGone);
        log::info!(
            "session {}: not resumed within {:?}; ended ({}) on worker {}",
            self.who(),
            self.settings.resume.grace,
            reason.as_str(),
            self.worker_name()
        );
        metrics().resumes.with_label_values(&["expired"]).inc();
        self.end = Some(reason);
        self.ended_at = Some(Instant::now());
        self.state.close();
        ctx.stop();
    }

    /// A resumed connection's line: the session speaks there from now on. Its client first
    /// gets `session.resumed` (the next token, what it missed), then the messages it did not
    /// receive, in order, then its place in the queue while it waits.
    pub(super) fn resume(&mut self, msg: Resume, ctx: &mut Context<Self>) {
        let Resume { line, line_no, received } = msg;
        if self.end.is_some() {
            line.tell(ToClient::Close(CloseReason::ClientGone));
            return;
        }
        let old = std::mem::replace(&mut self.links.edge, line);
        let was_away = self.line.away();
        if !was_away {
            // The client came back before its old connection was noticed lost: that one closes.
            old.tell(ToClient::Close(CloseReason::Resumed));
        } else {
            self.links.registry.set_away(self.conn, None);
            metrics().sessions_held.dec();
        }
        self.line_no = line_no;
        self.lost = None;
        let catchup = self.line.back(received, Instant::now());
        let token = self.issue_token(ctx);
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
        let mut out = std::mem::take(&mut self.outbox);
        self.dialect.encode(resumed, &mut out);
        for item in out.drain() {
            if let crate::edge::dialect::Emit::Text(frame) = item {
                if self.links.sinks.wants(crate::observe::Interest::WIRE) {
                    let recorded = bytes::Bytes::from(frame.replace(&token, "(resume token)"));
                    self.links.sinks.publish(crate::observe::SessionEvent::WireOut { frame: &recorded, audio: None });
                }
                self.links.edge.tell(ToClient::Text(frame.into()));
            }
        }
        self.outbox = out;
        for frame in catchup.frames {
            self.links.edge.tell(ToClient::Text(frame));
        }
        if self.state.phase() == Phase::Queued
            && self.worker.is_none()
            && let Some(info) = self.last_queue
        {
            self.emit(Outbound::QueueUpdate(info));
        }
    }
}
