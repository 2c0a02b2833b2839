//! Usage accounting (`[usage]`): per API key and per mode, the sessions that ended, the
//! seconds they were connected, the seconds of audio received and sent, and the model's
//! steps (duplex steps answered and turn-mode answers given). As Prometheus counters
//! (`omni_usage_*`), and as one JSON line per session in `DIR/YYYY-MM-DD.jsonl`.
//!
//! A session's sink only adds numbers as events go by; when the session closes it updates
//! the counters and hands one record to the [`UsageActor`], which writes the line on a
//! thread of its own.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use actix::prelude::*;

use crate::domain::{Mode, StepKind};
use crate::observe::events::{Dropped, Interest, Output, SessionEvent, SessionInfo, SessionSink, Subscriber, forward};
use crate::observe::messages::UsageRecord;
use crate::observe::meta::{INPUT_RATE, OUTPUT_RATE, timestamp};
use crate::observe::metrics::metrics;

/// Records the writer may have waiting; beyond it they are dropped and counted.
const MAILBOX: usize = 10_000;

/// Writes the day files: one line per session's usage.
pub(super) struct UsageActor {
    dir: PathBuf,
    open: Option<(String, File)>,
}

impl Actor for UsageActor {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX);
    }
}

impl UsageActor {
    fn file(&mut self, date: &str) -> std::io::Result<&mut File> {
        if self.open.as_ref().is_none_or(|(d, _)| d != date) {
            std::fs::create_dir_all(&self.dir)?;
            let path = self.dir.join(format!("{date}.jsonl"));
            let mut options = OpenOptions::new();
            options.create(true).append(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            self.open = Some((date.to_string(), options.open(path)?));
        }
        Ok(&mut self.open.as_mut().expect("opened above").1)
    }
}

impl Handler<UsageRecord> for UsageActor {
    type Result = ();
    fn handle(&mut self, record: UsageRecord, _: &mut Context<Self>) {
        let mut line = serde_json::to_vec(&record).unwrap_or_default();
        line.push(b'\n');
        if let Err(e) = self.file(&record.date).and_then(|f| f.write_all(&line)) {
            log::error!("usage: cannot write {}: {e}", self.dir.join(format!("{}.jsonl", record.date)).display());
        }
    }
}

/// The usage subscriber.
pub struct Usage {
    writer: Recipient<UsageRecord>,
    dropped: Arc<Dropped>,
}

impl Usage {
    /// Starts the writer on a thread of its own. Must run inside an actix system.
    pub fn start(dir: PathBuf) -> Usage {
        let arbiter = Arbiter::new();
        let writer = UsageActor::start_in_arbiter(&arbiter.handle(), move |_| UsageActor { dir, open: None });
        Usage { writer: writer.recipient(), dropped: Dropped::new("usage") }
    }
}

impl Subscriber for Usage {
    fn name(&self) -> &str {
        "usage"
    }

    fn interest(&self) -> Interest {
        Interest::LIFECYCLE | Interest::INPUT | Interest::OUTPUT
    }

    fn session(&self, info: &SessionInfo) -> Option<Box<dyn SessionSink>> {
        Some(Box::new(UsageSink {
            writer: self.writer.clone(),
            dropped: self.dropped.clone(),
            key: info.key_id.clone().unwrap_or_else(|| "anonymous".into()),
            mode: info.mode,
            upgraded_at: info.upgraded_at,
            session_id: None,
            dialect: None,
            samples_in: 0,
            samples_out: 0,
            steps: 0,
        }))
    }
}

struct UsageSink {
    writer: Recipient<UsageRecord>,
    dropped: Arc<Dropped>,
    key: String,
    mode: Mode,
    upgraded_at: SystemTime,
    session_id: Option<String>,
    dialect: Option<&'static str>,
    samples_in: u64,
    samples_out: u64,
    steps: u64,
}

impl SessionSink for UsageSink {
    fn event(&mut self, event: &SessionEvent<'_>) {
        match *event {
            SessionEvent::Started { session_id, dialect, .. } => {
                self.session_id = Some(session_id.to_string());
                self.dialect = Some(dialect);
            }
            SessionEvent::ChunkReceived { samples, .. } | SessionEvent::TurnReceived { samples, .. } => {
                self.samples_in += samples as u64
            }
            SessionEvent::Output(Output::Step { kind, audio_samples, .. }) => {
                self.steps += 1;
                if kind == StepKind::Speak {
                    self.samples_out += audio_samples as u64;
                }
            }
            SessionEvent::Output(Output::TurnPiece { audio_samples, .. }) => self.samples_out += audio_samples as u64,
            SessionEvent::Output(Output::TurnDone { .. }) => self.steps += 1,
            SessionEvent::Closed { meta } => self.closed(meta.duration_s, &meta.close_reason),
            _ => {}
        }
    }
}

impl UsageSink {
    fn closed(&mut self, connected_s: f64, close_reason: &str) {
        let labels = [self.key.as_str(), self.mode.as_str()];
        let m = metrics();
        let audio_in_s = self.samples_in as f64 / INPUT_RATE as f64;
        let audio_out_s = self.samples_out as f64 / OUTPUT_RATE as f64;
        m.usage_sessions.with_label_values(&labels).inc();
        m.usage_connected_seconds.with_label_values(&labels).inc_by(connected_s);
        m.usage_audio_in_seconds.with_label_values(&labels).inc_by(audio_in_s);
        m.usage_audio_out_seconds.with_label_values(&labels).inc_by(audio_out_s);
        m.usage_steps.with_label_values(&labels).inc_by(self.steps);
        let (start, date) = timestamp(self.upgraded_at);
        let record = UsageRecord {
            key: self.key.clone(),
            mode: self.mode.as_str(),
            session_id: self.session_id.take(),
            dialect: self.dialect,
            start,
            connected_s: (connected_s * 1000.0).round() / 1000.0,
            audio_in_s: (audio_in_s * 1000.0).round() / 1000.0,
            audio_out_s: (audio_out_s * 1000.0).round() / 1000.0,
            steps: self.steps,
            close_reason: close_reason.to_string(),
            date,
        };
        forward(&self.writer, record, &self.dropped);
    }
}
