//! A new actor that logs every session's transcript when the session ends: the worked
//! example of docs/extending.md. Run it with `cargo run -p omni-actors --example transcript_log`.

use std::sync::Arc;

use actix::prelude::*;
use omni_actors::observe::events::*;

/// One session's transcript, for the actor.
#[derive(Message)]
#[rtype(result = "()")]
struct Transcript {
    session: String,
    lines: Vec<String>,
}

/// The actor: it runs on a thread of its own and never holds a session up.
struct TranscriptLog;

impl Actor for TranscriptLog {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1000); // the bound on its backlog
    }
}

impl Handler<Transcript> for TranscriptLog {
    type Result = ();
    fn handle(&mut self, t: Transcript, _: &mut Context<Self>) {
        log::info!("transcript of {}:\n  {}", t.session, t.lines.join("\n  "));
    }
}

/// The subscriber: which events it wants, and its sink for each session.
struct TranscriptSubscriber {
    actor: Recipient<Transcript>,
    dropped: Arc<Dropped>,
}

impl Subscriber for TranscriptSubscriber {
    fn name(&self) -> &str {
        "transcript-log"
    }
    fn interest(&self) -> Interest {
        Interest::LIFECYCLE | Interest::OUTPUT
    }
    fn session(&self, info: &SessionInfo) -> Option<Box<dyn SessionSink>> {
        let sink = TranscriptSink {
            actor: self.actor.clone(),
            dropped: self.dropped.clone(),
            session: format!("c{}", info.conn),
            lines: Vec::new(),
        };
        Some(Box::new(sink))
    }
}

/// Runs on the session's thread: it only collects, and hands over once, at the end.
struct TranscriptSink {
    actor: Recipient<Transcript>,
    dropped: Arc<Dropped>,
    session: String,
    lines: Vec<String>,
}

impl SessionSink for TranscriptSink {
    fn event(&mut self, event: &SessionEvent<'_>) {
        match *event {
            SessionEvent::Started { session_id, .. } => self.session = session_id.to_string(),
            SessionEvent::Output(Output::Transcript { text, .. }) => self.lines.push(format!("user: {text}")),
            SessionEvent::Output(Output::TurnDone { text, .. }) => self.lines.push(format!("model: {text}")),
            SessionEvent::Closed { .. } => {
                let lines = std::mem::take(&mut self.lines);
                forward(&self.actor, Transcript { session: self.session.clone(), lines }, &self.dropped);
            }
            _ => {}
        }
    }
}

/// Registering it is one line in the gateway's `src/observe/mod.rs`:
/// `list.push(Arc::new(transcript_log()));`
fn transcript_log() -> TranscriptSubscriber {
    let actor = TranscriptLog.start().recipient();
    TranscriptSubscriber { actor, dropped: Dropped::new("transcript-log") }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    System::new().block_on(async {
        // What a session does with it, in short.
        let subscribers = Subscribers::new(vec![Arc::new(transcript_log())]);
        let info = SessionInfo {
            conn: 1,
            mode: omni_actors::domain::Mode::Chat,
            client_addr: "127.0.0.1:50000".into(),
            user_agent: None,
            key_id: None,
            upgraded: std::time::Instant::now(),
            upgraded_at: std::time::SystemTime::now(),
        };
        let mut sinks = subscribers.session(&info);
        sinks.publish(SessionEvent::Output(Output::Transcript { seq: 1, text: "(1.5 seconds of speech)" }));
        let (text, input_tokens, output_tokens, cancelled) = ("Hello!", 12, 2, false);
        sinks.publish(SessionEvent::Output(Output::TurnDone { seq: 1, text, input_tokens, output_tokens, cancelled }));
        let meta = omni_actors::observe::meta::SessionMeta { close_reason: "user_stop".into(), ..Default::default() };
        sinks.publish(SessionEvent::Closed { meta: &meta });
        actix::clock::sleep(std::time::Duration::from_millis(100)).await;
    });
}
