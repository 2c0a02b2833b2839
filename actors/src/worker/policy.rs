//! The BackendActor's rules, as a plain struct tested without a runtime: which session a
//! worker serves, the work waiting for its backend thread, and what a message changes.
//!
//! - One job on the backend thread at a time. Queued work (prepare, reset, turn-mode
//!   answers, in order) goes before pending duplex chunks.
//! - Silent drop: at most `max_pending_chunks` seconds of unprocessed audio (that many
//!   one-second chunks, or four times as many of 250 ms); past it the oldest chunks are
//!   dropped, the newest always kept.
//! - A force-listen chunk overtakes the backlog: the backend is force-listened at once and
//!   an interruptible job in flight is cut short, without waiting behind pending chunks.
//! - The watchdog: every job has a deadline; progress of a turn-mode answer (a piece)
//!   renews it; a deadline that passes with the same job in flight fails the worker.
//! - Queued answers are bounded (`max_turns`); the session refuses more before they come.
//! - An idle worker's health check runs only while no session has the worker and its backend
//!   has nothing else to do; a session that takes the worker meanwhile waits behind the check in
//!   flight (the actor starts a check as soon as it is queued; one still queued would be
//!   dropped, the session's own calls telling the backend's health).
//!
//! [`crate::worker::BackendActor`] delivers messages here and carries out what the
//! answers say (telling the session, calling the backend's any-thread control, arming
//! timers).

use std::collections::VecDeque;
use std::time::Instant;

use super::pending::Pending;
use crate::domain::{DuplexChunk, SessionSetup, TurnInput};

/// Work for the backend thread.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Work {
    Prepare(SessionSetup),
    /// Reset, then prepare with new settings, keeping the session attached.
    Restart(SessionSetup),
    Step(u64, DuplexChunk),
    Turn(u64, TurnInput),
    Reset,
    /// An owner-thread call of an edge that drives the backend itself (a node's link), by
    /// the number the actor gave it.
    Run(u64),
    /// The idle backend's health check ([`crate::edge::backend::Backend::check_idle`]).
    Check,
}

impl Work {
    /// The metric label of a job of this kind.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Work::Prepare(_) | Work::Restart(_) => "prepare",
            Work::Step(..) => "step",
            Work::Turn(..) => "turn",
            Work::Reset => "reset",
            Work::Run(_) => "call",
            Work::Check => "check",
        }
    }
}

/// The job on the backend thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct InFlight {
    pub job: u64,
    pub kind: &'static str,
    pub started: Instant,
    /// An interrupt may cut it short (everything but a reset and a health check).
    pub interruptible: bool,
}

/// Why a session cannot have this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Failed, stopping, or its backend is not open.
    NotReady,
    /// Another session has it, or its last session's reset is not done.
    Busy,
}

/// The audio one pending "chunk" of `max_pending_chunks` stands for: a second at 16 kHz.
const PENDING_SAMPLES_PER_CHUNK: usize = 16000;

/// What a duplex chunk's arrival asks of the actor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct ChunkEffects {
    /// These older chunks were dropped unprocessed: the session is told.
    pub dropped: Vec<u64>,
    /// Force-listen the backend now (any-thread call).
    pub force_listen: bool,
    /// Interrupt the job in flight now (any-thread call).
    pub interrupt: bool,
}

/// What cutting the session's output short asks of the actor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Cut {
    /// Chunks dropped unprocessed.
    pub dropped: Vec<u64>,
    /// Answers that were waiting and end as interrupted.
    pub cancelled: Vec<u64>,
    /// Interrupt the job in flight now.
    pub interrupt: bool,
}

#[derive(Debug)]
pub(super) struct WorkerPolicy {
    session: Option<u64>,
    ready: bool,
    failed: bool,
    work: VecDeque<Work>,
    pending: Pending<(u64, DuplexChunk)>,
    in_flight: Option<InFlight>,
    next_job: u64,
    /// Tell the session once the job in flight is done (graceful shutdown).
    drain: bool,
}

impl WorkerPolicy {
    pub(super) fn new(max_pending_chunks: usize) -> WorkerPolicy {
        WorkerPolicy {
            session: None,
            ready: false,
            failed: false,
            work: VecDeque::new(),
            pending: Pending::new(max_pending_chunks * PENDING_SAMPLES_PER_CHUNK),
            in_flight: None,
            next_job: 1,
            drain: false,
        }
    }

    /// The backend is open: the worker can take sessions.
    pub(super) fn opened(&mut self) {
        self.ready = true;
    }

    /// The worker is unusable (failed, or stopping). Returns false when it already was.
    pub(super) fn fail(&mut self) -> bool {
        !std::mem::replace(&mut self.failed, true)
    }

    pub(super) fn failed(&self) -> bool {
        self.failed
    }

    pub(super) fn owns(&self, key: u64) -> bool {
        self.session == Some(key)
    }

    pub(super) fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    fn interruptible_in_flight(&self) -> bool {
        self.in_flight.is_some_and(|f| f.interruptible)
    }

    /// A session takes the worker. One whose last session's reset is still queued or running
    /// may: its work waits behind the reset (what the last session left was dropped when it
    /// detached, and what is in flight answers the last session).
    pub(super) fn attach(&mut self, key: u64) -> Result<(), Refusal> {
        if self.failed || !self.ready {
            return Err(Refusal::NotReady);
        }
        if self.session.is_some() {
            return Err(Refusal::Busy);
        }
        self.session = Some(key);
        self.work.retain(|w| !matches!(w, Work::Check));
        Ok(())
    }

    /// The idle backend's health check is due: queued when no session has the worker and its
    /// backend has nothing else to do. Returns whether it was queued.
    pub(super) fn check(&mut self) -> bool {
        let idle = self.session.is_none() && self.in_flight.is_none() && self.work.is_empty();
        if self.failed || !self.ready || !idle {
            return false;
        }
        self.work.push_back(Work::Check);
        true
    }

    /// The session's backend is to be prepared.
    pub(super) fn prepare(&mut self, setup: SessionSetup) {
        self.work.push_back(Work::Prepare(setup));
    }

    /// The session starts over with new settings: its backlog goes, the job in flight is
    /// cut short, and the backend is reset and prepared again.
    pub(super) fn restart(&mut self, setup: SessionSetup) -> Cut {
        let mut cut = self.drop_backlog();
        cut.interrupt = self.interruptible_in_flight();
        self.work.push_back(Work::Restart(setup));
        cut
    }

    /// A duplex chunk arrives.
    pub(super) fn chunk(&mut self, seq: u64, chunk: DuplexChunk) -> ChunkEffects {
        let force_listen = chunk.force_listen;
        let interrupt = force_listen && self.interruptible_in_flight();
        let weight = chunk.audio.len();
        let dropped = self.pending.push((seq, chunk), weight).into_iter().map(|(seq, _)| seq).collect();
        ChunkEffects { dropped, force_listen, interrupt }
    }

    /// A turn-mode answer is asked for; answered after those before it.
    pub(super) fn turn(&mut self, seq: u64, input: TurnInput) {
        self.work.push_back(Work::Turn(seq, input));
    }

    /// An owner-thread call of an edge that drives the backend itself: in order with the
    /// rest of the queued work.
    pub(super) fn run(&mut self, run: u64) {
        self.work.push_back(Work::Run(run));
    }

    #[cfg(test)]
    /// Answers still waiting (not the one in flight).
    pub(crate) fn queued_turns(&self) -> usize {
        self.work.iter().filter(|w| matches!(w, Work::Turn(..))).count()
    }

    /// The session cuts its output short: waiting answers end as interrupted, the job in
    /// flight is cut short; the backend is force-listened (by the actor).
    pub(super) fn interrupt(&mut self) -> Cut {
        let mut cancelled = Vec::new();
        self.work.retain(|w| match w {
            Work::Turn(seq, _) => {
                cancelled.push(*seq);
                false
            }
            _ => true,
        });
        Cut { dropped: Vec::new(), cancelled, interrupt: self.interruptible_in_flight() }
    }

    /// The session is ending (server shutdown): its backlog goes; it is told once the job
    /// in flight is done. Returns whether it can be told at once (nothing in flight).
    pub(super) fn drain(&mut self) -> (Cut, bool) {
        let cut = self.drop_backlog();
        let now = self.in_flight.is_none();
        self.drain = !now;
        (cut, now)
    }

    /// The session left: everything it queued goes, the job in flight is cut short, and
    /// the backend is reset before the worker is offered again. Returns whether to
    /// interrupt the job in flight.
    pub(super) fn detach(&mut self) -> bool {
        self.session = None;
        self.work.clear();
        self.pending.clear();
        self.drain = false;
        self.work.push_back(Work::Reset);
        self.interruptible_in_flight()
    }

    fn drop_backlog(&mut self) -> Cut {
        let dropped = self.pending.clear().into_iter().map(|(seq, _)| seq).collect();
        let mut cancelled = Vec::new();
        for work in std::mem::take(&mut self.work) {
            match work {
                Work::Turn(seq, _) => cancelled.push(seq),
                other => self.work.push_back(other),
            }
        }
        Cut { dropped, cancelled, interrupt: false }
    }

    /// The next job for the backend thread, when it is free: queued work first, then the
    /// oldest pending chunk. The job is in flight from `now`.
    pub(super) fn next(&mut self, now: Instant) -> Option<(u64, Work)> {
        if self.in_flight.is_some() || self.failed || !self.ready {
            return None;
        }
        let work = match self.work.pop_front() {
            Some(w) => w,
            None => self.pending.pop().map(|(seq, chunk)| Work::Step(seq, chunk))?,
        };
        let job = self.next_job;
        self.next_job += 1;
        let interruptible = !matches!(work, Work::Reset | Work::Check);
        self.in_flight = Some(InFlight { job, kind: work.kind(), started: now, interruptible });
        Some((job, work))
    }

    /// The backend thread finished `job`. Returns it, or `None` for a job that is not the
    /// one in flight (stale). The second value says to tell the session it is drained.
    pub(super) fn done(&mut self, job: u64) -> Option<(InFlight, bool)> {
        match self.in_flight {
            Some(f) if f.job == job => {
                self.in_flight = None;
                Some((f, std::mem::take(&mut self.drain)))
            }
            _ => None,
        }
    }

    /// Whether `job` is still the one in flight: a watchdog for it that fires fails the
    /// worker, and its progress renews the watchdog.
    pub(super) fn is_current(&self, job: u64) -> bool {
        self.in_flight.is_some_and(|f| f.job == job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SessionKind;

    /// One second of audio.
    fn chunk(force_listen: bool) -> DuplexChunk {
        DuplexChunk { audio: vec![0.0; 16000], force_listen, ..DuplexChunk::default() }
    }

    fn ready(max_pending: usize) -> WorkerPolicy {
        let mut p = WorkerPolicy::new(max_pending);
        p.opened();
        p.attach(7).unwrap();
        p
    }

    fn setup() -> SessionSetup {
        SessionSetup::new(SessionKind::Duplex)
    }

    #[test]
    fn a_worker_serves_one_session_at_a_time_and_the_next_waits_behind_the_reset() {
        let mut p = WorkerPolicy::new(2);
        assert_eq!(p.attach(1), Err(Refusal::NotReady), "not open yet");
        p.opened();
        p.attach(1).unwrap();
        assert!(p.owns(1) && !p.owns(2));
        assert_eq!(p.attach(2), Err(Refusal::Busy));
        p.prepare(SessionSetup::new(SessionKind::Duplex));
        assert!(!p.detach(), "nothing in flight to interrupt");
        // The next session may take it now; its work runs after the reset, never before.
        p.attach(2).unwrap();
        assert!(p.owns(2) && !p.owns(1));
        p.chunk(1, chunk(false));
        let (job, work) = p.next(Instant::now()).unwrap();
        assert_eq!(work, Work::Reset, "what session 1 left was dropped; its reset comes first");
        assert!(p.next(Instant::now()).is_none(), "one job at a time");
        p.done(job).unwrap();
        assert!(matches!(p.next(Instant::now()), Some((_, Work::Step(1, _)))));
        assert_eq!(p.attach(3), Err(Refusal::Busy));
        assert!(p.fail());
        assert!(!p.fail(), "failing twice is once");
        assert_eq!(WorkerPolicy::new(1).attach(3), Err(Refusal::NotReady));
    }

    #[test]
    fn pending_chunks_keep_the_newest_and_the_dropped_are_named() {
        let mut p = ready(2);
        let t = Instant::now();
        assert_eq!(p.chunk(1, chunk(false)), ChunkEffects::default());
        let (job, _) = p.next(t).unwrap(); // chunk 1 in flight
        assert_eq!(p.chunk(2, chunk(false)).dropped, Vec::<u64>::new());
        assert_eq!(p.chunk(3, chunk(false)).dropped, Vec::<u64>::new());
        assert_eq!(p.chunk(4, chunk(false)).dropped, vec![2], "the oldest pending goes");
        assert!(p.next(t).is_none(), "one job at a time");
        p.done(job).unwrap();
        assert!(matches!(p.next(t), Some((_, Work::Step(3, _)))));
    }

    #[test]
    fn the_backlog_is_seconds_of_audio_whatever_the_chunk_size() {
        // max_pending_chunks 2: two seconds; of 200 ms steps, ten wait.
        let mut p = ready(2);
        let t = Instant::now();
        let short = || DuplexChunk { audio: vec![0.0; 3200], ..DuplexChunk::default() };
        let _ = p.chunk(1, short());
        let _in_flight = p.next(t).unwrap();
        assert!((2..=11).all(|seq| p.chunk(seq, short()).dropped.is_empty()));
        assert_eq!(p.chunk(12, short()).dropped, vec![2]);
        assert_eq!(p.chunk(13, chunk(false)).dropped, vec![3, 4, 5, 6, 7]);
    }

    #[test]
    fn force_listen_overtakes_the_backlog_and_cuts_the_step_in_flight() {
        let mut p = ready(2);
        p.chunk(1, chunk(false));
        p.next(Instant::now()).unwrap();
        p.chunk(2, chunk(false));
        let fx = p.chunk(3, chunk(true));
        assert_eq!(fx, ChunkEffects { dropped: vec![], force_listen: true, interrupt: true });
        // Nothing in flight: the backend is force-listened, nothing to interrupt.
        let mut idle = ready(2);
        assert_eq!(idle.chunk(1, chunk(true)), ChunkEffects { dropped: vec![], force_listen: true, interrupt: false });
    }

    #[test]
    fn a_reset_in_flight_is_never_interrupted() {
        let mut p = ready(2);
        p.detach();
        p.next(Instant::now()).unwrap();
        assert!(!p.in_flight().unwrap().interruptible);
        // The next session, attached meanwhile, cannot cut it short either.
        p.attach(8).unwrap();
        assert_eq!(p.chunk(1, chunk(true)), ChunkEffects { dropped: vec![], force_listen: true, interrupt: false });
        assert!(!p.interrupt().interrupt);
    }

    #[test]
    fn queued_work_goes_before_pending_chunks_in_order() {
        let mut p = ready(2);
        let t = Instant::now();
        p.chunk(1, chunk(false));
        p.prepare(setup());
        p.turn(2, TurnInput::default());
        let order: Vec<&'static str> = std::iter::from_fn(|| {
            let (job, work) = p.next(t)?;
            p.done(job);
            Some(work.kind())
        })
        .collect();
        assert_eq!(order, ["prepare", "turn", "step"]);
    }

    #[test]
    fn an_interrupt_cancels_waiting_answers_and_cuts_the_one_in_flight() {
        let mut p = ready(2);
        p.turn(1, TurnInput::default());
        p.next(Instant::now()).unwrap();
        p.turn(2, TurnInput::default());
        p.turn(3, TurnInput::default());
        assert_eq!(p.queued_turns(), 2);
        assert_eq!(p.interrupt(), Cut { dropped: vec![], cancelled: vec![2, 3], interrupt: true });
        assert_eq!(p.queued_turns(), 0);
    }

    #[test]
    fn a_restart_drops_the_backlog_then_prepares_again() {
        let mut p = ready(2);
        p.chunk(1, chunk(false));
        p.next(Instant::now()).unwrap();
        p.chunk(2, chunk(false));
        p.turn(3, TurnInput::default());
        let cut = p.restart(setup());
        assert_eq!(cut, Cut { dropped: vec![2], cancelled: vec![3], interrupt: true });
    }

    #[test]
    fn a_drain_tells_the_session_once_the_job_in_flight_is_done() {
        let mut p = ready(2);
        let (cut, now) = p.drain();
        assert!(now && cut == Cut::default(), "nothing in flight: told at once");
        p.chunk(1, chunk(false));
        let (job, _) = p.next(Instant::now()).unwrap();
        p.chunk(2, chunk(false));
        let (cut, now) = p.drain();
        assert_eq!((cut.dropped, now), (vec![2], false));
        assert_eq!(p.done(job).map(|(_, drained)| drained), Some(true));
    }

    #[test]
    fn the_watchdog_concerns_only_the_job_it_was_armed_for() {
        let mut p = ready(2);
        p.chunk(1, chunk(false));
        let (job, _) = p.next(Instant::now()).unwrap();
        assert!(p.is_current(job));
        p.done(job).unwrap();
        assert!(!p.is_current(job), "a watchdog firing after its job is done does nothing");
        assert!(p.done(job).is_none(), "a stale completion is ignored");
        p.fail();
        p.chunk(2, chunk(false));
        assert!(p.next(Instant::now()).is_none(), "a failed worker runs nothing more");
    }

    #[test]
    fn a_health_check_runs_only_on_an_idle_worker_and_a_session_overtakes_one_not_begun() {
        let mut p = WorkerPolicy::new(2);
        assert!(!p.check(), "not open yet");
        p.opened();
        assert!(p.check());
        assert!(!p.check(), "one check at a time");
        let t = Instant::now();
        let (job, work) = p.next(t).unwrap();
        assert_eq!(work, Work::Check);
        assert!(!p.in_flight().unwrap().interruptible);
        // A session taken meanwhile waits behind the check in flight.
        p.attach(1).unwrap();
        p.prepare(setup());
        assert!(!p.check(), "a session has the worker");
        p.done(job).unwrap();
        assert!(matches!(p.next(t), Some((_, Work::Prepare(_)))));
        // A check not begun when a session takes the worker is dropped.
        let mut q = WorkerPolicy::new(2);
        q.opened();
        q.detach();
        let (reset, _) = q.next(t).unwrap();
        assert!(!q.check(), "the reset is in flight");
        q.done(reset).unwrap();
        assert!(q.check());
        q.attach(2).unwrap();
        q.prepare(setup());
        assert!(matches!(q.next(t), Some((_, Work::Prepare(_)))), "the session's work, not the check");
        // A failed worker is not checked.
        q.fail();
        assert!(!WorkerPolicy::new(2).check() && !q.check());
    }
}
