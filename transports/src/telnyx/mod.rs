//! Telnyx Media Streaming: a phone call that Telnyx streams over a WebSocket (Call Control's
//! `streaming_start`, or TeXML's `<Stream>`, with `stream_bidirectional_mode: "rtp"` and the
//! bidirectional codec the stream's own), carried by the one WebSocket edge
//! (`crate::websocket`) between Telnyx's socket and the call's session. The stream carries the
//! audio itself ([`wire`]): the caller's G.711 (PCMU or PCMA at 8 kHz) is handed to the session as
//! samples, and the model's voice goes back in the stream's codec, 20 ms at least a message, a
//! `mark` after each answer's voice and a `clear` when the caller speaks over it. The session is
//! an ordinary session (the server opens it in the dialect of its choice); the dialect's events
//! have no place on Telnyx's socket and are not written. `start`'s `custom_parameters`
//! `instructions` and `voice` reach the session as the call's settings; `stop` ends it.
//!
//! A stream that drops is not resumed: its session ends at once.

use std::sync::Arc;

use actix::prelude::*;
use actix_web_actors::ws;
use bytestring::ByteString;
use omni_actors::audio::g711::Law;
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
pub mod wire;

/// One stream, as its edge carries it; see the module's documentation.
pub struct TelnyxStream {
    start: Option<StartSession>,
    /// The stream's codec, from `start`.
    law: Option<Law>,
    /// The model's voice on its way to the stream.
    voice: StreamVoice,
    /// Voice at 8 kHz not sent yet: Telnyx takes 20 ms at least a message.
    pending: Vec<f32>,
}

/// A Telnyx stream's edge.
pub type TelnyxEdge = SocketEdge<TelnyxStream>;

impl SocketEdge<TelnyxStream> {
    /// The edge of stream `conn`, whose session `start` starts.
    pub fn new(
        settings: EdgeSettings,
        conn: u64,
        fragments: Arc<FragmentBudget>,
        incoming: Arc<Backlog>,
        outgoing: Option<Arc<OutgoingLimit>>,
        start: StartSession,
    ) -> TelnyxEdge {
        let parts = SocketParts { label: format!("c{conn}"), settings, fragments, incoming, outgoing };
        let stream = TelnyxStream { start: Some(start), law: None, voice: StreamVoice::default(), pending: Vec::new() };
        SocketEdge::with(parts, stream)
    }
}

/// The session's line to a stream: Telnyx's socket reads no text of the dialect's.
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

impl TelnyxStream {
    /// The model's voice for the stream: in its codec, 20 ms at least a message, a mark after
    /// each answer's, a clear when the caller speaks over voice Telnyx may not have played.
    fn model_audio(&mut self, audio: ModelAudio, edge: &mut Io<'_, Self>) {
        // Before `start` there is no stream (nor codec) to play it on.
        let Some(law) = self.law else { return };
        match audio {
            ModelAudio::Delta { samples, rate, .. } => {
                self.pending.extend(self.voice.delta(&samples, rate));
                if self.pending.len() >= wire::MIN_SAMPLES {
                    edge.send(wire::media(law, &self.pending));
                    self.pending.clear();
                }
            }
            // The answer's last piece (made up to 20 ms), then its mark.
            ModelAudio::Done { response } => {
                let (tail, mark) = self.voice.done(response);
                self.pending.extend(tail);
                if !self.pending.is_empty() {
                    self.pending.resize(self.pending.len().max(wire::MIN_SAMPLES), 0.0);
                    edge.send(wire::media(law, &self.pending));
                    self.pending.clear();
                }
                edge.send(wire::mark(&mark));
            }
            ModelAudio::Clear => {
                self.pending.clear();
                if self.voice.clear() {
                    edge.send(wire::clear());
                }
            }
        }
    }
}

impl Carried for TelnyxStream {
    /// A phone line hears nothing of its messages dropped over the rate.
    const TELLS_RATE: bool = false;

    fn started(&mut self, edge: &mut Io<'_, Self>) {
        if let Some(start) = self.start.take() {
            let line = StreamLine(edge.ctx().address().recipient());
            edge.attached(start(Box::new(line)));
        }
    }

    fn text(&mut self, text: ByteString, edge: &mut Io<'_, Self>) {
        match wire::parse(&text, self.law) {
            Ok(wire::TelnyxMessage::Connected) => {}
            Ok(wire::TelnyxMessage::Start { .. }) if self.law.is_some() => {
                log::debug!("session {}: a second start on one stream; ignored", edge.label())
            }
            Ok(wire::TelnyxMessage::Start { stream_id, call_control_id, law, parameters }) => {
                log::info!(
                    "session {}: Telnyx stream {} started (call {}, {})",
                    edge.label(),
                    wire::clipped(&stream_id),
                    wire::clipped(&call_control_id),
                    law.sdp_name()
                );
                self.law = Some(law);
                let settings = call_settings(&parameters);
                if !settings.is_empty() {
                    edge.hand(FromClient::Configure(settings));
                }
            }
            Ok(wire::TelnyxMessage::Media { samples }) if samples.is_empty() => {}
            Ok(wire::TelnyxMessage::Media { samples }) => {
                edge.hand(FromClient::Audio(CallerAudio { samples, rate: wire::RATE }));
            }
            Ok(wire::TelnyxMessage::Mark { name }) => self.voice.marked(&name),
            // Never logged which (callers type PINs).
            Ok(wire::TelnyxMessage::Dtmf { key }) => edge.hand(FromClient::Key(key)),
            Ok(wire::TelnyxMessage::Error { code, title }) => {
                log::warn!("session {}: Telnyx refused what it was sent: {code} {title}", edge.label())
            }
            Ok(wire::TelnyxMessage::Stop) => {
                log::info!("session {}: Telnyx stopped the stream", edge.label());
                edge.end(CloseReason::Client("hangup".into()));
            }
            Err(wire::TelnyxRefused::Unknown(what)) => {
                log::debug!("session {}: Telnyx sent {what}; not used", edge.label())
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
            // The dialect's events have no place on Telnyx's socket (none are written for it).
            ToClient::Text(_) => {}
            ToClient::Notice(notice) => crate::phone::log_refusal(edge.label(), &notice),
            ToClient::Close(reason) => {
                log::info!("session {}: the session ended ({}); closing the stream", edge.label(), reason.as_str());
                edge.close(ws::CloseCode::from(reason.close_code()), None);
            }
        }
    }

    /// Telnyx's socket closes with the ending's code and no words.
    fn close_frame(reason: &CloseReason) -> ws::CloseReason {
        ws::CloseReason { code: ws::CloseCode::from(reason.close_code()), description: None }
    }

    /// A stream is never resumed: its session ends, however the socket went.
    fn farewell(&mut self, reason: CloseReason, _lost: bool) -> Option<FromClient> {
        Some(FromClient::Ended(reason))
    }
}
