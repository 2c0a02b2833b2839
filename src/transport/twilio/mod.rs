//! The Twilio Media Streams edge: a phone call that Twilio streams over a WebSocket
//! (`<Connect><Stream url="wss://HOST/v1/telephony/twilio">`), one actor per stream between
//! Twilio's socket and the call's session. It carries the audio itself ([`wire`]): the caller's
//! μ-law frames are handed to the session as samples (at 8 kHz, which the dialect resamples),
//! and the model's voice comes back as μ-law `media` for the stream, a `mark` after each
//! answer's voice and a `clear` when the caller speaks over it. The session is an ordinary
//! session of the OpenAI dialect, server VAD turning; the dialect's own events have no place on
//! Twilio's socket and are not sent. `start`'s custom parameters `instructions` and `voice`
//! reach the session as its first `session.update`; `stop` ends it (`hangup`).
//!
//! A stream that drops is not resumed (Twilio does not resume a stream): its session ends at
//! once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation};
use omni_actors::session::messages::{CallerAudio, FromClient, ModelAudio, ToClient};
use serde_json::{Value, json};

use super::incoming::Backlog;
use super::{SessionPort, StartSession};

pub mod wire;

/// What a stream's connection may do, from `[server]`.
#[derive(Debug, Clone)]
pub struct TwilioSettings {
    /// How often the server pings.
    pub heartbeat_interval: Duration,
    /// Silence from Twilio (no message, no pong) after which the stream is considered gone.
    pub heartbeat_timeout: Duration,
}

/// One stream's edge; see the module's documentation.
pub struct TwilioEdge {
    settings: TwilioSettings,
    /// Names the stream in logs (`c12`).
    label: String,
    start: Option<StartSession>,
    session: Option<SessionPort>,
    /// What the session has been handed and not handled yet (the socket waits on it).
    incoming: Arc<Backlog>,
    /// The stream's id, from `start`: every message back names it.
    stream_sid: Option<String>,
    last_heard: Instant,
    /// The session has been told the stream ended, or asked for the end itself.
    done: bool,
    /// The model's voice sent that Twilio may not have played yet (no mark of it back): what a
    /// `clear` would cut.
    unplayed: bool,
    /// The last mark sent: when Twilio sends it back, everything before it has played.
    last_mark: Option<String>,
}

impl TwilioEdge {
    pub fn new(settings: TwilioSettings, conn: u64, incoming: Arc<Backlog>, start: StartSession) -> TwilioEdge {
        TwilioEdge {
            settings,
            label: format!("c{conn}"),
            start: Some(start),
            session: None,
            incoming,
            stream_sid: None,
            last_heard: Instant::now(),
            done: false,
            unplayed: false,
            last_mark: None,
        }
    }

    fn hand(&self, msg: FromClient) {
        if let Some(s) = &self.session {
            self.incoming.hand(s, msg);
        }
    }

    /// The stream ends: the session hears why (once), and the socket closes.
    fn end(&mut self, ctx: &mut ws::WebsocketContext<Self>, reason: CloseReason) {
        if !self.done {
            self.done = true;
            if let Some(s) = &self.session {
                s.do_send(FromClient::Ended(reason.clone()));
            }
        }
        ctx.close(Some(ws::CloseReason { code: ws::CloseCode::from(reason.close_code()), description: None }));
        ctx.stop();
    }

    fn on_text(&mut self, text: &str, ctx: &mut ws::WebsocketContext<Self>) {
        match wire::parse(text) {
            Ok(wire::Incoming::Connected) => {}
            Ok(wire::Incoming::Start { stream_sid, call_sid, parameters }) => {
                log::info!("session {}: Twilio stream started (call {call_sid})", self.label);
                self.stream_sid = Some(stream_sid);
                if let Some(update) = session_update(&parameters) {
                    self.hand(FromClient::Text(ByteString::from(update)));
                }
            }
            Ok(wire::Incoming::Media { samples }) => {
                self.hand(FromClient::Audio(CallerAudio { samples, rate: wire::RATE }));
            }
            Ok(wire::Incoming::Mark { name }) => {
                if self.last_mark.as_deref() == Some(name.as_str()) {
                    self.unplayed = false;
                }
            }
            Ok(wire::Incoming::Dtmf { digit }) => {
                log::info!("session {}: the caller pressed {}", self.label, digit.chars().take(1).collect::<String>())
            }
            Ok(wire::Incoming::Stop) => {
                log::info!("session {}: Twilio stopped the stream", self.label);
                self.end(ctx, CloseReason::Client("hangup".into()));
            }
            Err(wire::Refused::Unknown(what)) => log::debug!("session {}: Twilio sent {what}; not used", self.label),
            Err(e) => {
                log::info!("session {}: {e}; closing with 1003", self.label);
                self.end(ctx, CloseReason::ProtocolViolation(Violation::InvalidJson));
            }
        }
    }

    /// The model's voice for the stream, at 8 kHz.
    fn voice(&mut self, audio: ModelAudio, ctx: &mut ws::WebsocketContext<Self>) {
        let Some(sid) = self.stream_sid.clone() else { return };
        match audio {
            ModelAudio::Delta { samples, rate, .. } => {
                let narrow = omni_actors::audio::resample(&samples, rate, wire::RATE).unwrap_or_default();
                let frame = wire::media(&sid, &narrow);
                metrics().bytes_sent.inc_by(frame.len() as u64);
                self.unplayed = true;
                ctx.text(frame);
            }
            // Twilio sends the mark back once what came before it has played.
            ModelAudio::Done { response } => {
                ctx.text(wire::mark(&sid, &response));
                self.last_mark = Some(response);
            }
            // Only voice Twilio may still be playing is cut (the caller starting to speak
            // with none is no barge-in).
            ModelAudio::Clear if self.unplayed => {
                self.unplayed = false;
                ctx.text(wire::clear(&sid));
            }
            ModelAudio::Clear => {}
        }
    }
}

/// The session settings `start`'s custom parameters carry (`instructions`, `voice`), as the
/// session's first `session.update`.
fn session_update(parameters: &serde_json::Map<String, Value>) -> Option<String> {
    let text = |key: &str| parameters.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
    let (instructions, voice) = (text("instructions"), text("voice"));
    if instructions.is_none() && voice.is_none() {
        return None;
    }
    let mut session = json!({"type": "realtime"});
    if let Some(i) = instructions {
        session["instructions"] = json!(i);
    }
    if let Some(v) = voice {
        session["audio"] = json!({"output": {"voice": v}});
    }
    Some(json!({"type": "session.update", "session": session}).to_string())
}

impl Actor for TwilioEdge {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(start) = self.start.take() {
            self.session = Some(start(Box::new(ctx.address().recipient::<ToClient>())));
        }
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            if Instant::now().saturating_duration_since(act.last_heard) > act.settings.heartbeat_timeout {
                log::info!("session {}: nothing heard from Twilio for {:?}", act.label, act.settings.heartbeat_timeout);
                return act.end(ctx, CloseReason::HeartbeatTimeout);
            }
            ctx.ping(b"");
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if !self.done
            && let Some(s) = &self.session
        {
            s.do_send(FromClient::Ended(CloseReason::ClientGone));
        }
    }
}

impl Handler<ToClient> for TwilioEdge {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        match msg {
            ToClient::Audio(audio) => self.voice(audio, ctx),
            // The dialect's events have no place on Twilio's socket.
            ToClient::Text(_) => {}
            ToClient::Close(reason) => {
                log::info!("session {}: the session ended ({}); closing the stream", self.label, reason.as_str());
                self.done = true;
                ctx.close(Some(ws::CloseReason { code: ws::CloseCode::Normal, description: None }));
                ctx.stop();
            }
        }
    }
}

impl StreamHandler<Result<ws::Message, ws::ProtocolError>> for TwilioEdge {
    fn handle(&mut self, msg: Result<ws::Message, ws::ProtocolError>, ctx: &mut Self::Context) {
        if self.done {
            return;
        }
        self.last_heard = Instant::now();
        match msg {
            Ok(ws::Message::Text(text)) => {
                metrics().bytes_received.inc_by(text.len() as u64);
                self.on_text(&text, ctx);
            }
            Ok(ws::Message::Ping(payload)) => ctx.pong(&payload),
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Close(_)) => self.end(ctx, CloseReason::ClientGone),
            Ok(ws::Message::Binary(_)) | Ok(ws::Message::Continuation(_)) => {
                self.end(ctx, CloseReason::ProtocolViolation(Violation::BinaryFrame))
            }
            Err(e) => {
                log::info!("session {}: Twilio's socket: {e}", self.label);
                self.end(ctx, CloseReason::ClientGone);
            }
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        self.end(ctx, CloseReason::ClientGone);
    }
}
