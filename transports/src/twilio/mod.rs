//! Twilio Media Streams: a phone call that Twilio streams over a WebSocket
//! (`<Connect><Stream url="wss://HOST/v1/telephony/twilio">`), carried by the one WebSocket edge
//! (`crate::websocket`) between Twilio's socket and the call's session. The stream carries the
//! audio itself ([`wire`]): the caller's μ-law frames are handed to the session as samples (at
//! 8 kHz, which the dialect resamples), and the model's voice comes back as μ-law `media` for the
//! stream, a `mark` after each answer's voice and a `clear` when the caller speaks over it. The
//! session is an ordinary session (the server opens it in the dialect of its choice, server VAD
//! turning); the dialect's own events have no place on Twilio's socket and are not written.
//! `start`'s custom parameters `instructions` and `voice` reach the session as the call's
//! settings ([`FromClient::Configure`]); `stop` ends it (`hangup`).
//!
//! A stream that drops is not resumed (Twilio does not resume a stream): its session ends at
//! once.

use std::sync::Arc;

use actix::prelude::*;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::edge::client::{CallSettings, CallerAudio, ClientLine, FromClient, ModelAudio, ToClient};
use omni_actors::protocol::{CloseReason, Violation};
use serde_json::Value;

use crate::StartSession;
use crate::incoming::Backlog;
use crate::limits::FragmentBudget;
use crate::outgoing::OutgoingLimit;
use crate::phone::StreamVoice;
use crate::websocket::{Carried, EdgeSettings, Io, SocketEdge, SocketParts};

pub mod config;
pub mod signature;
pub mod wire;

/// One stream, as its edge carries it; see the module's documentation.
pub struct TwilioStream {
    start: Option<StartSession>,
    /// The stream's id, from `start`: every message back names it.
    stream_sid: Option<String>,
    /// The model's voice on its way to the stream.
    voice: StreamVoice,
}

/// A Twilio stream's edge.
pub type TwilioEdge = SocketEdge<TwilioStream>;

impl SocketEdge<TwilioStream> {
    /// The edge of stream `conn`, whose session `start` starts.
    pub fn new(
        settings: EdgeSettings,
        conn: u64,
        fragments: Arc<FragmentBudget>,
        incoming: Arc<Backlog>,
        outgoing: Option<Arc<OutgoingLimit>>,
        start: StartSession,
    ) -> TwilioEdge {
        let parts = SocketParts { label: format!("c{conn}"), settings, fragments, incoming, outgoing };
        let stream = TwilioStream { start: Some(start), stream_sid: None, voice: StreamVoice::default() };
        SocketEdge::with(parts, stream)
    }
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

/// The call's settings `start`'s custom parameters carry (`instructions`, `voice`).
fn call_settings(parameters: &serde_json::Map<String, Value>) -> CallSettings {
    let text = |key: &str| parameters.get(key).and_then(Value::as_str).filter(|s| !s.is_empty()).map(String::from);
    CallSettings { instructions: text("instructions"), voice: text("voice"), ..CallSettings::default() }
}

impl TwilioStream {
    /// The model's voice for the stream: μ-law at 8 kHz, a mark after each answer's, a clear
    /// when the caller speaks over voice Twilio may not have played.
    fn model_audio(&mut self, audio: ModelAudio, edge: &mut Io<'_, Self>) {
        // Before `start` there is no stream to play it on.
        let Some(sid) = self.stream_sid.clone() else { return };
        match audio {
            ModelAudio::Delta { samples, rate, .. } => {
                let narrow = self.voice.delta(&samples, rate);
                if !narrow.is_empty() {
                    edge.send(wire::media(&sid, &narrow));
                }
            }
            // The answer's last piece, then its mark: Twilio sends the mark back once it played.
            ModelAudio::Done { response } => {
                let (tail, mark) = self.voice.done(response);
                if !tail.is_empty() {
                    edge.send(wire::media(&sid, &tail));
                }
                edge.send(wire::mark(&sid, &mark));
            }
            ModelAudio::Clear => {
                if self.voice.clear() {
                    edge.send(wire::clear(&sid));
                }
            }
        }
    }
}

impl Carried for TwilioStream {
    /// A phone line hears nothing of its messages dropped over the rate.
    const TELLS_RATE: bool = false;

    fn started(&mut self, edge: &mut Io<'_, Self>) {
        if let Some(start) = self.start.take() {
            let line = StreamLine(edge.ctx().address().recipient());
            edge.attached(start(Box::new(line)));
        }
    }

    fn text(&mut self, text: ByteString, edge: &mut Io<'_, Self>) {
        match wire::parse(&text) {
            Ok(wire::TwilioMessage::Connected) => {}
            Ok(wire::TwilioMessage::Start { .. }) if self.stream_sid.is_some() => {
                log::debug!("session {}: a second start on one stream; ignored", edge.label())
            }
            Ok(wire::TwilioMessage::Start { stream_sid, call_sid, parameters }) => {
                log::info!("session {}: Twilio stream started (call {})", edge.label(), wire::clipped(&call_sid));
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
                        edge.label()
                    );
                }
                let settings = call_settings(&parameters);
                if !settings.is_empty() {
                    edge.hand(FromClient::Configure(settings));
                }
            }
            Ok(wire::TwilioMessage::Media { samples }) if samples.is_empty() => {}
            Ok(wire::TwilioMessage::Media { samples }) => {
                edge.hand(FromClient::Audio(CallerAudio { samples, rate: wire::RATE }));
            }
            Ok(wire::TwilioMessage::Mark { name }) => self.voice.marked(&name),
            // Never logged which (callers type PINs).
            Ok(wire::TwilioMessage::Dtmf { key }) => edge.hand(FromClient::Key(key)),
            Ok(wire::TwilioMessage::Stop) => {
                log::info!("session {}: Twilio stopped the stream", edge.label());
                edge.end(CloseReason::Client("hangup".into()));
            }
            Err(wire::TwilioRefused::Unknown(what)) => {
                log::debug!("session {}: Twilio sent {what}; not used", edge.label())
            }
            Err(e) => {
                log::info!("session {}: {e}; closing with 1003", edge.label());
                edge.violation(Violation::InvalidJson);
            }
        }
    }

    fn told(&mut self, msg: ToClient, edge: &mut Io<'_, Self>) {
        match msg {
            ToClient::Audio(audio) => self.model_audio(audio, edge),
            // The dialect's events have no place on Twilio's socket (none are written for it).
            ToClient::Text(_) => {}
            // Its errors are logged (a setting the call's parameters gave that it refused).
            ToClient::Notice(notice) => crate::phone::log_refusal(edge.label(), &notice),
            ToClient::Close(reason) => {
                log::info!("session {}: the session ended ({}); closing the stream", edge.label(), reason.as_str());
                let code = ws::CloseCode::from(reason.close_code());
                edge.close(code, None);
            }
        }
    }

    /// Twilio's socket closes with the ending's code and no words.
    fn close_frame(reason: &CloseReason) -> ws::CloseReason {
        ws::CloseReason { code: ws::CloseCode::from(reason.close_code()), description: None }
    }

    /// A stream is never resumed: its session ends, however the socket went.
    fn farewell(&mut self, reason: CloseReason, _lost: bool) -> Option<FromClient> {
        Some(FromClient::Ended(reason))
    }
}
