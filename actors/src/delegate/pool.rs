//! `decider = "pool"`: the decider is a chat-mode worker of this gateway's own pool whose backend
//! calls tools (the CPU model, the reference backend's rule, any ABI 1.3 library). Each decision
//! is a short session of its own ([`DecisionSession`]): it joins the queue for a `chat` worker like any
//! chat session, takes the worker, prepares it with the decider's instructions and the session's
//! tools, asks one turn of the conversation, keeps the first call it writes (or its words), and
//! gives the worker back. Voices queue for `audio` and `video` workers: a decider waits only for
//! the chat workers, never in front of a voice for its worker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::domain::{DecideRequest, DeciderError, Decision, Generation, Mode, SessionKind, SessionSetup, TurnInput};
use crate::ids;
use crate::messages::delegate::{Decide, Decided, DelegationPort};
use crate::messages::queue::{Claim, Join, Leave, QueueNotice, QueuePort};
use crate::messages::transcribe::Backlog;
use crate::messages::worker::{Attach, BackendEvent, Delivery, Detach, Lost, Prepare, SubmitTurn, WorkerLink};

/// What the decider's model is told before the session's instructions.
pub const PREFACE: &str = "You choose the tool calls of a voice assistant. When one of the tools can answer or carry out \
                           the user's newest message, call it with the arguments the user gave. Only when no tool fits, \
                           answer in one short sentence. The voice speaks to the user; you do not.";

/// What a decider's model is told first: its part beside the voice and the session's
/// instructions; for an answer of its own ([`DecideRequest::answer`]), the instructions alone.
pub fn system_prompt(request: &DecideRequest) -> String {
    if request.answer {
        return request.instructions.clone();
    }
    let mut prompt = PREFACE.to_string();
    if !request.instructions.trim().is_empty() {
        prompt.push_str("\n\nThe assistant's instructions:\n");
        prompt.push_str(&request.instructions);
    }
    prompt
}

/// The most tokens the decider's model writes for one decision.
const MAX_NEW_TOKENS: u32 = 256;

impl DelegationPort {
    /// Deciders on the pool's chat workers, reached through `queue`: at most `max_waiting`
    /// decisions wait or run; each has `timeout` and at most `max_answer` bytes of words.
    pub fn pool(queue: QueuePort, max_waiting: usize, timeout: Duration, max_answer: usize) -> DelegationPort {
        let backlog = Arc::new(Backlog::new(max_waiting.max(1)));
        let shared = backlog.clone();
        let addr = PoolDecider { queue, backlog: shared, timeout, max_answer }.start();
        DelegationPort::new(addr.recipient(), backlog)
    }
}

/// Starts a [`DecisionSession`] for each request.
pub struct PoolDecider {
    queue: QueuePort,
    backlog: Arc<Backlog>,
    timeout: Duration,
    max_answer: usize,
}

impl Actor for PoolDecider {
    type Context = Context<Self>;
}

impl Handler<Decide> for PoolDecider {
    type Result = ();

    fn handle(&mut self, job: Decide, _: &mut Context<Self>) {
        DecisionSession {
            conn: ids::connection(),
            job: Some(job),
            queue: self.queue.clone(),
            backlog: self.backlog.clone(),
            timeout: self.timeout,
            max_answer: self.max_answer,
            worker: None,
            step: Step::Waiting,
            call: None,
            words: String::new(),
            input: None,
            started: Instant::now(),
        }
        .start();
    }
}

/// Where a decision is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// In the queue for a chat worker.
    Waiting,
    /// Taking the worker it was assigned.
    Attaching,
    /// Its worker is being prepared.
    Preparing,
    /// Its turn is being answered.
    Answering,
    /// Answered (or failed): the worker is given back.
    Over,
}

/// One decision on a chat worker: a session of its own, from the queue to the worker's return.
pub struct DecisionSession {
    /// Its connection number, as the queue and the worker know it.
    conn: u64,
    job: Option<Decide>,
    queue: QueuePort,
    backlog: Arc<Backlog>,
    timeout: Duration,
    max_answer: usize,
    worker: Option<WorkerLink>,
    step: Step,
    /// The first call the model writes: its tool and its arguments so far.
    call: Option<(String, String)>,
    words: String,
    /// The turn it asks, once its worker is prepared.
    input: Option<TurnInput>,
    started: Instant,
}

impl Actor for DecisionSession {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let notify = ctx.address().recipient();
        self.queue.join.do_send(Join { conn: self.conn, mode: Mode::Chat, notify, front: false });
        ctx.run_later(self.timeout, |d, ctx| {
            let why = format!(
                "the pool's decider did not answer within {} s ([delegation] timeout_s)",
                d.timeout.as_secs_f64()
            );
            d.finish(Err(DeciderError::Timeout(why)), ctx);
        });
    }
}

impl DecisionSession {
    /// The decision is made (or failed): told to the session, the worker (or the place in the
    /// queue) given back, the actor stopped.
    fn finish(&mut self, result: Result<Decision, DeciderError>, ctx: &mut Context<Self>) {
        let Some(job) = self.job.take() else { return };
        self.backlog.done();
        match (self.step, &self.worker) {
            (Step::Waiting, _) => self.queue.leave.do_send(Leave { conn: self.conn }),
            (_, Some(w)) => w.port.session.detach.do_send(Detach { key: self.conn, ended: Instant::now() }),
            (_, None) => {}
        }
        self.step = Step::Over;
        let worker = self.worker.as_ref().map_or("-", |w| w.name.as_str());
        let ms = self.started.elapsed().as_millis();
        match &result {
            Ok(Decision::Call { name, .. }) => {
                log::info!("session {}: decision {} on worker {worker}: call {name} ({ms} ms)", job.session, job.id)
            }
            Ok(Decision::NoCall(words)) => log::info!(
                "session {}: decision {} on worker {worker}: no call ({} bytes of words, {ms} ms)",
                job.session,
                job.id,
                words.len()
            ),
            Err(e) => {
                log::warn!("session {}: decision {} on worker {worker} failed: {} ({e})", job.session, job.id, e.code())
            }
        }
        super::count(&result, self.started.elapsed());
        job.reply.do_send(Decided { id: job.id, result });
        ctx.stop();
    }

    fn unavailable(&mut self, why: String, ctx: &mut Context<Self>) {
        self.finish(Err(DeciderError::Unavailable(why)), ctx);
    }

    /// The turn the decider's model answers: the session's conversation, its tools.
    fn turn(request: &DecideRequest) -> (SessionSetup, TurnInput) {
        let mut setup = SessionSetup::new(SessionKind::Turn);
        setup.system_prompt = system_prompt(request);
        setup.tools = request.tools.clone();
        let input = TurnInput {
            messages: request.messages.clone(),
            generation: Generation { max_new_tokens: Some(MAX_NEW_TOKENS), ..Generation::default() },
            speech: false,
            continues: false,
            tools: Some(request.tools.clone()),
            ..TurnInput::default()
        };
        (setup, input)
    }
}

impl Handler<QueueNotice> for DecisionSession {
    type Result = ();

    fn handle(&mut self, notice: QueueNotice, ctx: &mut Context<Self>) {
        if self.step != Step::Waiting {
            return;
        }
        match notice {
            QueueNotice::Queued(_) | QueueNotice::Update(_) => {}
            QueueNotice::Assigned { worker, .. } => {
                self.queue.claim.do_send(Claim { conn: self.conn });
                let reply = Delivery::new(ctx.address().recipient(), Lost::Attach);
                let label = format!("d{}", self.conn);
                worker.port.session.attach.do_send(Attach { key: self.conn, label, mode: Mode::Chat, reply });
                self.worker = Some(worker);
                self.step = Step::Attaching;
            }
            QueueNotice::Rejected(e) => {
                self.step = Step::Over;
                self.unavailable(format!("no chat worker of the pool can decide: {e}"), ctx);
            }
            QueueNotice::Cancelled => {
                self.step = Step::Over;
                self.unavailable("the decision's place in the queue was cancelled".into(), ctx);
            }
        }
    }
}

impl Handler<BackendEvent> for DecisionSession {
    type Result = ();

    fn handle(&mut self, event: BackendEvent, ctx: &mut Context<Self>) {
        let Some(worker) = self.worker.clone() else { return };
        if self.job.is_none() {
            return;
        }
        match event {
            BackendEvent::Attached(Ok(())) if self.step == Step::Attaching => {
                if !worker.info.tools {
                    let why = format!("the chat worker {} calls no tools: it cannot decide", worker.name);
                    return self.unavailable(why, ctx);
                }
                let Some(request) = self.job.as_ref().map(|j| &j.request) else { return };
                let (setup, input) = DecisionSession::turn(request);
                self.input = Some(input);
                let reply = Delivery::new(ctx.address().recipient(), Lost::Work);
                worker.port.session.prepare.do_send(Prepare { key: self.conn, setup, reply });
                self.step = Step::Preparing;
            }
            BackendEvent::Attached(Err(e)) => {
                // Never taken: nothing to give back.
                self.worker = None;
                self.unavailable(format!("the chat worker {} could not be taken: {e}", worker.name), ctx);
            }
            BackendEvent::Prepared { .. } if self.step == Step::Preparing => {
                let Some(input) = self.input.take() else { return };
                let reply = Delivery::new(ctx.address().recipient(), Lost::Work);
                worker.port.session.turn.do_send(SubmitTurn { key: self.conn, seq: 1, input, reply });
                self.step = Step::Answering;
            }
            BackendEvent::PrepareFailed(e) => {
                self.unavailable(format!("the chat worker {} refused: {e}", worker.name), ctx)
            }
            BackendEvent::NoRoom { reason } => {
                self.unavailable(format!("the chat worker {} had no room: {reason}", worker.name), ctx)
            }
            BackendEvent::TurnPiece { piece, .. } if self.step == Step::Answering => {
                match piece.call {
                    Some(c) => match (&mut self.call, c.name) {
                        // A second call: the first is the decision.
                        (Some(_), Some(_)) => {}
                        (Some((_, arguments)), None) => arguments.push_str(&c.arguments),
                        (None, name) => self.call = Some((name.unwrap_or_default(), c.arguments)),
                    },
                    None => self.words.push_str(&piece.text),
                }
                let held = self.words.len() + self.call.as_ref().map_or(0, |(n, a)| n.len() + a.len());
                if held > self.max_answer {
                    let why = format!(
                        "the decider's answer is longer than {} KiB ([delegation] max_answer_kb)",
                        self.max_answer >> 10
                    );
                    self.finish(Err(DeciderError::InvalidOutput(why)), ctx);
                }
            }
            BackendEvent::TurnDone { result, .. } if self.step == Step::Answering => match result {
                Ok(_) => {
                    let decision = match self.call.take() {
                        Some((name, arguments)) => Decision::Call { name, arguments },
                        None => Decision::NoCall(std::mem::take(&mut self.words)),
                    };
                    self.finish(Ok(decision), ctx);
                }
                Err(e) => self.unavailable(format!("the chat worker {} failed the turn: {e}", worker.name), ctx),
            },
            BackendEvent::Failed { reason } => {
                self.unavailable(format!("the chat worker {} failed: {reason}", worker.name), ctx)
            }
            _ => {}
        }
    }
}
