//! The Twilio Media Streams edge: a phone call that Twilio streams over a WebSocket
//! (`<Connect><Stream url="wss://HOST/v1/telephony/twilio">`), one actor per stream between
//! Twilio's socket and the call's session. It carries the audio itself ([`wire`]): the caller's
//! μ-law frames are handed to the session as samples (at 8 kHz, which the dialect resamples),
//! and the model's voice comes back as μ-law `media` for the stream, a `mark` after each
//! answer's voice and a `clear` when the caller speaks over it. The session is an ordinary
//! session (the server opens it in the dialect of its choice, server VAD turning); the dialect's
//! own events have no place on Twilio's socket and are not written. `start`'s custom parameters
//! `instructions` and `voice` reach the session as the call's settings
//! ([`FromClient::Configure`]); `stop` ends it (`hangup`).
//!
//! A stream that drops is not resumed (Twilio does not resume a stream): its session ends at
//! once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_web_actors::ws;
use omni_actors::edge::client::{CallSettings, CallerAudio, ClientLine, FromClient, ModelAudio, ToClient};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation};
use serde_json::Value;

use omni_actors::audio::StreamResampler;

use super::incoming::Backlog;
use super::limits::{MessageRate, RateLimit};
use super::outgoing::OutgoingLimit;
use super::{SessionPort, StartSession};

pub mod config;
pub mod signature;
pub mod wire;

/// What a stream's connection may do, from `[server]`.
#[derive(Debug, Clone)]
pub struct TwilioSettings {
    /// How often the server pings.
    pub heartbeat_interval: Duration,
    /// Silence from Twilio (no message, no pong) after which the stream is considered gone.
    pub heartbeat_timeout: Duration,
    /// Messages per second Twilio may send (50 a second carry the caller's voice); `None`: no
    /// limit.
    pub rate: Option<RateLimit>,
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
    /// The last mark sent after the last voice: when Twilio sends it back, that voice has
    /// played.
    last_mark: Option<String>,
    /// The model's voice from 24 kHz to the stream's 8 kHz, one answer at a time (a stream
    /// resampler: no edge at each piece).
    downlink: Option<StreamResampler>,
    /// The bound on what waits for a Twilio socket that does not read; `None`: unbounded.
    outgoing: Option<Arc<OutgoingLimit>>,
    rate: Option<MessageRate>,
}

/// The session's line to a stream: Twilio's socket reads no text of the dialect's.
struct StreamLine(Recipient<ToClient>);

impl ClientLine for StreamLine {
    fn tell(&self, msg: ToClient) {
        self.0.do_send(msg);
    }

    fn wants_text(&self) -> bool {
        false
    }
}

impl TwilioEdge {
    pub fn new(
        settings: TwilioSettings,
        conn: u64,
        incoming: Arc<Backlog>,
        outgoing: Option<Arc<OutgoingLimit>>,
        start: StartSession,
    ) -> TwilioEdge {
        TwilioEdge {
            rate: settings.rate.map(|limit| MessageRate::new(limit, Instant::now())),
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
            downlink: None,
            outgoing,
        }
    }

    /// A message for Twilio, counted against the outgoing bound: a socket that does not read
    /// is cut, as a WebSocket client's is (`slow_consumer`).
    fn send(&mut self, ctx: &mut ws::WebsocketContext<Self>, frame: String) {
        if let Some(limit) = &self.outgoing
            && let Err(waiting) = limit.wrote(frame.len())
        {
            log::warn!(
                "session {}: Twilio does not read the stream ({waiting} bytes waiting); dropping it",
                self.label
            );
            limit.cut();
            return self.end(ctx, CloseReason::SlowConsumer);
        }
        metrics().bytes_sent.inc_by(frame.len() as u64);
        ctx.text(frame);
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
            Ok(wire::Incoming::Start { .. }) if self.stream_sid.is_some() => {
                log::debug!("session {}: a second start on one stream; ignored", self.label)
            }
            Ok(wire::Incoming::Start { stream_sid, call_sid, parameters }) => {
                log::info!("session {}: Twilio stream started (call {})", self.label, wire::clipped(&call_sid));
                self.stream_sid = Some(stream_sid);
                let unused: Vec<String> = parameters
                    .keys()
                    .filter(|k| !matches!(k.as_str(), "instructions" | "voice"))
                    .take(8)
                    .map(|k| wire::clipped(k))
                    .collect();
                if !unused.is_empty() {
                    log::info!(
                        "session {}: the stream's parameters {unused:?} are not applied (instructions and voice are)",
                        self.label
                    );
                }
                let settings = call_settings(&parameters);
                if !settings.is_empty() {
                    self.hand(FromClient::Configure(settings));
                }
            }
            Ok(wire::Incoming::Media { samples }) if samples.is_empty() => {}
            Ok(wire::Incoming::Media { samples }) => {
                self.hand(FromClient::Audio(CallerAudio { samples, rate: wire::RATE }));
            }
            Ok(wire::Incoming::Mark { name }) => {
                if self.last_mark.as_deref() == Some(name.as_str()) {
                    self.unplayed = false;
                }
            }
            // Never logged which (callers type PINs).
            Ok(wire::Incoming::Dtmf { key }) => self.hand(FromClient::Key(key)),
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

    /// The model's voice for the stream: μ-law at 8 kHz, a mark after each answer's, a clear
    /// when the caller speaks over voice Twilio may not have played.
    fn model_audio(&mut self, audio: ModelAudio, ctx: &mut ws::WebsocketContext<Self>) {
        // Before `start` there is no stream to play it on.
        let Some(sid) = self.stream_sid.clone() else { return };
        match audio {
            ModelAudio::Delta { samples, rate, .. } => {
                let mut narrow = Vec::with_capacity(samples.len() * wire::RATE as usize / rate.max(1) as usize + 1);
                if self.downlink.is_none() {
                    self.downlink = StreamResampler::new(rate, wire::RATE).ok();
                }
                if let Some(r) = self.downlink.as_mut() {
                    r.push(&samples, &mut narrow);
                }
                self.unplayed = true;
                // Only a mark sent after this voice says it played.
                self.last_mark = None;
                if !narrow.is_empty() {
                    self.send(ctx, wire::media(&sid, &narrow));
                }
            }
            // The answer's last piece, then its mark: Twilio sends the mark back once it played.
            ModelAudio::Done { response } => {
                let mut tail = Vec::new();
                if let Some(mut r) = self.downlink.take() {
                    r.flush(&mut tail);
                }
                if !tail.is_empty() {
                    self.send(ctx, wire::media(&sid, &tail));
                }
                self.send(ctx, wire::mark(&sid, &response));
                self.last_mark = Some(response);
            }
            // Only voice Twilio may still be playing is cut (the caller starting to speak
            // with none is no barge-in).
            ModelAudio::Clear => {
                self.downlink = None;
                if std::mem::take(&mut self.unplayed) {
                    self.send(ctx, wire::clear(&sid));
                }
            }
        }
    }
}

impl TwilioEdge {
    /// A message counts against the rate: dropped over it, the stream ended when it stays over.
    fn within_rate(&mut self, ctx: &mut ws::WebsocketContext<Self>) -> bool {
        MessageRate::passes(&mut self.rate, Instant::now()).unwrap_or_else(|| {
            log::warn!("session {}: Twilio over the message rate for too long; closing with 1008", self.label);
            self.end(ctx, CloseReason::ProtocolViolation(Violation::RateLimited));
            false
        })
    }
}

/// The call's settings `start`'s custom parameters carry (`instructions`, `voice`).
fn call_settings(parameters: &serde_json::Map<String, Value>) -> CallSettings {
    let text = |key: &str| parameters.get(key).and_then(Value::as_str).filter(|s| !s.is_empty()).map(String::from);
    CallSettings { instructions: text("instructions"), voice: text("voice"), ..CallSettings::default() }
}

impl Actor for TwilioEdge {
    type Context = ws::WebsocketContext<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(start) = self.start.take() {
            self.session = Some(start(Box::new(StreamLine(ctx.address().recipient()))));
        }
        ctx.run_interval(self.settings.heartbeat_interval, |act, ctx| {
            if act.session.as_ref().is_some_and(|s| !s.connected()) {
                return ctx.stop();
            }
            if act.incoming.waiting() > 0 {
                // The session is behind and the socket is not read meanwhile: not silent.
                act.last_heard = Instant::now();
            }
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
            ToClient::Audio(audio) => self.model_audio(audio, ctx),
            // The dialect's events have no place on Twilio's socket (none are written for it).
            ToClient::Text(_) => {}
            // Its errors are logged (a setting the call's parameters gave that it refused).
            ToClient::Notice(notice) => super::phone::log_refusal(&self.label, &notice),
            ToClient::Close(reason) => {
                log::info!("session {}: the session ended ({}); closing the stream", self.label, reason.as_str());
                self.done = true;
                ctx.close(Some(ws::CloseReason { code: ws::CloseCode::from(reason.close_code()), description: None }));
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
                if self.within_rate(ctx) {
                    self.on_text(&text, ctx);
                }
            }
            Ok(ws::Message::Ping(payload)) => ctx.pong(&payload),
            Ok(ws::Message::Pong(_)) | Ok(ws::Message::Nop) => {}
            Ok(ws::Message::Close(_)) => self.end(ctx, CloseReason::ClientGone),
            Ok(ws::Message::Binary(_)) | Ok(ws::Message::Continuation(_)) => {
                self.end(ctx, CloseReason::ProtocolViolation(Violation::BinaryFrame))
            }
            Err(ws::ProtocolError::Overflow) => self.end(ctx, CloseReason::ProtocolViolation(Violation::MessageTooBig)),
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
