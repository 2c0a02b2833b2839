//! A session's side of its recording: what it hands to its `RecorderActor`, and the
//! bounds that keep recording from ever delaying a session or growing without limit.
//!
//! Frames are handed over as they are sent and received, with the media the dialect
//! already decoded; the dialect's [`Redact`] turns each into the line of `events.jsonl`
//! on the recorder's thread, so nothing here (and nothing on the session's thread) parses
//! wire JSON. Before the session has an id its frames are held (the prelude).
//!
//! Every record holds a [`Reservation`] of its size against three bounds, released when
//! the record is written or dropped, whichever way: the session's own lag
//! (`recording.max_lag_mb`, which also bounds the prelude), the lag of all recorders
//! together (`recording.max_total_lag_mb`), and the session's whole recording
//! (`recording.max_session_mb`, past which it notes the truncation and takes nothing more).
//! Two more keep a client from turning junk into disk writes: a session records at most
//! `recording.max_rate_mb_s` (a bucket of four seconds' worth), and nothing is recorded
//! while the recordings' disk has less than `recording.min_free_gb` free (checked every
//! second). A record over a bound is dropped at once, counted in the log, `meta.json` and
//! metrics.
//!

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::time::{Instant, SystemTime};
use tokio::sync::watch;

use actix::prelude::*;
use bytes::Bytes;

use crate::edge::redact::RecordedMedia;
use crate::edge::redact::{Direction, Redact};
use crate::observe::events::{Interest, SessionEvent, SessionInfo, SessionSink, Subscriber};
use crate::observe::messages::Record;
use crate::observe::meta::{Reservation, SessionMeta, timestamp};
use crate::observe::metrics::metrics;
use crate::observe::recorder::RecorderActor;

/// The bounds of recording, from `[recording]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordingLimits {
    /// Bytes one session may have waiting for its recorder (and hold before it has an id).
    pub max_lag: usize,
    /// Bytes all sessions together may have waiting for recorders.
    pub max_total_lag: usize,
    /// Bytes one session's recording may take in all.
    pub max_session: u64,
    /// Bytes per second one session may record, on average over [`RATE_BURST`] (0: no limit).
    pub max_rate: usize,
    /// Free bytes the recordings' disk keeps: below, nothing is recorded (0: no floor).
    pub min_free: u64,
}

impl RecordingLimits {
    /// Bounds with no rate limit and no disk floor.
    pub const fn new(max_lag: usize, max_total_lag: usize, max_session: u64) -> RecordingLimits {
        RecordingLimits { max_lag, max_total_lag, max_session, max_rate: 0, min_free: 0 }
    }
}

/// The seconds of `max_rate` a session may record at once.
pub const RATE_BURST: f64 = 4.0;
/// How often the recordings' free space is checked.
pub const DISK_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts recorders on the recording thread; counts those not finished yet and what all of
/// them have still to write.
#[derive(Clone)]
pub struct RecorderSpawner {
    root: PathBuf,
    arbiter: ArbiterHandle,
    limits: RecordingLimits,
    /// Recordings started and not yet finalized, watched by those that wait for them.
    unfinished: Arc<watch::Sender<usize>>,
    total_lag: Arc<AtomicUsize>,
    /// The recordings' disk has less than `min_free` free.
    disk_low: Arc<AtomicBool>,
}

impl RecorderSpawner {
    /// Starts the recording thread (and, with a disk floor, its check of the free space).
    /// Must run inside an actix system.
    pub fn new(root: PathBuf, limits: RecordingLimits) -> RecorderSpawner {
        let arbiter = Arbiter::new().handle();
        let disk_low = Arc::new(AtomicBool::new(false));
        if limits.min_free > 0 {
            let (low, at) = (disk_low.clone(), root.clone());
            arbiter.spawn(async move {
                loop {
                    check_disk(&at, limits.min_free, &low);
                    actix::clock::sleep(DISK_CHECK).await;
                }
            });
        }
        RecorderSpawner {
            root,
            arbiter,
            limits,
            unfinished: Arc::new(watch::Sender::new(0)),
            total_lag: Arc::new(AtomicUsize::new(0)),
            disk_low,
        }
    }

    /// Recordings started and not yet finalized.
    pub fn unfinished(&self) -> usize {
        *self.unfinished.borrow()
    }

    /// Waits until every recording started is finalized.
    pub async fn finalized(&self) {
        let mut changes = self.unfinished.subscribe();
        let _ = changes.wait_for(|n| *n == 0).await;
    }

    /// Bytes handed to recordings and not yet written, across every session.
    pub fn total_lag(&self) -> usize {
        self.total_lag.load(Ordering::SeqCst)
    }

    /// The directory recordings are written under (`DIR/YYYY-MM-DD/SESSION_ID/`).
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// Sets `low` when the disk under `root` (or its closest existing parent) has less than
/// `min_free` bytes free; says so when that changes.
fn check_disk(root: &Path, min_free: u64, low: &AtomicBool) {
    let existing = root.ancestors().find(|p| p.exists()).unwrap_or(root);
    let free = match fs4::available_space(existing) {
        Ok(free) => free,
        Err(e) => {
            // Said once; recording goes on as the last check found it.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| log::warn!("recording: cannot read the free space under {}: {e}", existing.display()));
            return;
        }
    };
    let now_low = free < min_free;
    if low.swap(now_low, Ordering::Relaxed) != now_low {
        if now_low {
            log::warn!(
                "recording: {} MB free under {} (recording.min_free_gb: {} MB): recording paused",
                free >> 20,
                root.display(),
                min_free >> 20
            );
        } else {
            log::info!("recording: {} MB free under {} again: recording resumes", free >> 20, root.display());
        }
    }
}

enum State {
    Off,
    /// Records before the session has an id.
    Prelude(RecorderSpawner, Vec<Record>),
    Live(RecorderSpawner, Addr<RecorderActor>),
    Done,
}

/// The session's side of its recording.
pub struct Recording {
    state: State,
    started: Instant,
    /// What this session has waiting (prelude, or queued for its recorder).
    lag: Arc<AtomicUsize>,
    /// Bytes taken so far (for `max_session`).
    taken: u64,
    dropped: u64,
    truncated: bool,
    /// Bytes the session may record now under `max_rate`, as of `rate_at`.
    rate_left: f64,
    rate_at: Instant,
}

impl Recording {
    /// A recording that records nothing (recording is off).
    pub fn off() -> Recording {
        Recording {
            state: State::Off,
            started: Instant::now(),
            lag: Arc::default(),
            taken: 0,
            dropped: 0,
            truncated: false,
            rate_left: f64::MAX,
            rate_at: Instant::now(),
        }
    }

    /// Records from `started` (the upgrade); nothing is written before `start`.
    pub fn new(spawner: RecorderSpawner, started: Instant) -> Recording {
        Recording { state: State::Prelude(spawner, Vec::new()), started, ..Recording::off() }
    }

    /// Records dropped so far (over a lag bound or, before the id, the prelude's).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether anything is recorded (it is not off, nor finished).
    pub fn is_on(&self) -> bool {
        matches!(self.state, State::Prelude(..) | State::Live(..))
    }

    /// A frame from the client, with the audio and images the dialect decoded from it.
    pub fn inbound(&mut self, text: Bytes, media: RecordedMedia) {
        let size = text.len()
            + media.0.iter().map(|a| a.len() * 4).sum::<usize>()
            + media.1.iter().map(Vec::len).sum::<usize>();
        self.push(Direction::In, text, media, size);
    }

    /// A frame to the client, as sent, with the model's voice it stands for when that went to
    /// the edge as samples.
    pub fn outbound(&mut self, text: Bytes, audio: Option<Vec<f32>>) {
        let size = text.len() + audio.as_ref().map_or(0, |a| a.len() * 4);
        self.push(Direction::Out, text, (audio.into_iter().collect(), Vec::new()), size);
    }

    /// Takes a share of every bound, or says which one is reached.
    fn reserve(&mut self, spawner: &RecorderSpawner, size: usize) -> Result<Reservation, &'static str> {
        let limits = spawner.limits;
        if self.truncated || self.taken + size as u64 > limits.max_session {
            return Err("session_cap");
        }
        if self.lag.load(Ordering::Relaxed) + size > limits.max_lag {
            return Err(if matches!(self.state, State::Prelude(..)) { "prelude" } else { "session_lag" });
        }
        if spawner.disk_low.load(Ordering::Relaxed) {
            return Err("disk_floor");
        }
        // Last: a record another bound refuses spends none of the rate. A record is taken while
        // the bucket is not empty, and may overdraw it (a frame larger than the bucket is
        // recorded when the session has been quiet long enough).
        if limits.max_rate > 0 {
            let (now, rate) = (Instant::now(), limits.max_rate as f64);
            let burst = rate * RATE_BURST;
            let refill = now.saturating_duration_since(self.rate_at).as_secs_f64() * rate;
            self.rate_left = (self.rate_left.min(burst) + refill).min(burst);
            self.rate_at = now;
            if self.rate_left <= 0.0 {
                return Err("rate");
            }
        }
        let total = spawner.total_lag.fetch_add(size, Ordering::Relaxed) + size;
        if total > limits.max_total_lag {
            spawner.total_lag.fetch_sub(size, Ordering::Relaxed);
            return Err("total_lag");
        }
        self.lag.fetch_add(size, Ordering::Relaxed);
        self.taken += size as u64;
        if limits.max_rate > 0 {
            self.rate_left -= size as f64;
        }
        metrics().recording_lag_bytes.add(size as i64);
        Ok(Reservation { session: self.lag.clone(), total: spawner.total_lag.clone(), size })
    }

    fn push(&mut self, dir: Direction, text: Bytes, media: RecordedMedia, size: usize) {
        let spawner = match &self.state {
            State::Prelude(s, _) | State::Live(s, _) => s.clone(),
            State::Off | State::Done => return,
        };
        let reservation = match self.reserve(&spawner, size) {
            Ok(r) => r,
            Err(reason) => return self.refused(reason, &spawner),
        };
        let record = Record::Event { at: self.started.elapsed(), dir, text, media, reservation };
        match &mut self.state {
            State::Prelude(_, held) => held.push(record),
            State::Live(_, addr) => addr.do_send(record),
            State::Off | State::Done => {}
        }
    }

    fn refused(&mut self, reason: &'static str, spawner: &RecorderSpawner) {
        metrics().recording_dropped.with_label_values(&[reason]).inc();
        if reason == "session_cap" {
            if !self.truncated {
                log::warn!(
                    "recording: the session reached recording.max_session_mb ({} MB); its recording is truncated",
                    spawner.limits.max_session >> 20
                );
            }
            self.truncated = true;
            return;
        }
        if self.dropped == 0 {
            let why = match reason {
                "rate" => "the session sends more than recording.max_rate_mb_s",
                "disk_floor" => "the recordings' disk is under recording.min_free_gb",
                _ => "the recorder is behind or the session holds too much",
            };
            log::warn!("recording: dropping records ({reason}): {why}");
        }
        self.dropped += 1;
    }

    /// The session has its id: the recorder starts and gets every event so far.
    pub fn start(&mut self, session_id: &str, redactor: Arc<dyn Redact>, upgraded: SystemTime) {
        let State::Prelude(spawner, held) = std::mem::replace(&mut self.state, State::Off) else {
            return;
        };
        let (_, date) = timestamp(upgraded);
        let dir = spawner.root.join(date).join(session_id);
        let addr = RecorderActor::start_on(&spawner.arbiter, dir, redactor, spawner.root.clone(), &spawner.unfinished);
        for record in held {
            addr.do_send(record);
        }
        self.state = State::Live(spawner, addr);
    }

    /// The session ended: the recorder finalizes every file and writes `meta.json`.
    /// Without an id (it never initialised) nothing was recorded; the prelude is dropped.
    pub fn finish(&mut self, mut meta: SessionMeta) {
        if let State::Live(_, addr) = std::mem::replace(&mut self.state, State::Done) {
            meta.recording.dropped_records = self.dropped;
            meta.recording.lagged = self.dropped > 0;
            meta.recording.truncated = self.truncated;
            addr.do_send(Record::Finish(Box::new(meta)));
        }
    }
}

/// The recorder as a subscriber: each session's frames (with their media) and its ending,
/// written by a RecorderActor of its own on the recording thread.
pub struct Recorder {
    spawner: RecorderSpawner,
}

impl Recorder {
    /// The recorder, starting each session's recording with `spawner`.
    pub fn new(spawner: RecorderSpawner) -> Recorder {
        Recorder { spawner }
    }
}

impl Subscriber for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn interest(&self) -> Interest {
        Interest::LIFECYCLE | Interest::WIRE
    }

    fn session(&self, info: &SessionInfo) -> Option<Box<dyn SessionSink>> {
        let recording = Recording::new(self.spawner.clone(), info.upgraded);
        Some(Box::new(RecordingSink { recording, upgraded_at: info.upgraded_at }))
    }
}

/// A session's recording, fed by its events.
struct RecordingSink {
    recording: Recording,
    upgraded_at: SystemTime,
}

impl SessionSink for RecordingSink {
    fn event(&mut self, event: &SessionEvent<'_>) {
        match *event {
            SessionEvent::Started { session_id, redactor, .. } => {
                self.recording.start(session_id, redactor.clone(), self.upgraded_at)
            }
            SessionEvent::WireIn { frame, media } => self.recording.inbound(frame.clone(), media.clone()),
            SessionEvent::WireOut { frame, audio } => {
                self.recording.outbound(frame.clone(), audio.map(<[f32]>::to_vec))
            }
            SessionEvent::Closed { meta } => self.recording.finish(meta.clone()),
            _ => {}
        }
    }
}
