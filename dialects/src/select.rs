//! Which dialect a connection speaks. On `/v1/realtime?mode=video|audio` both MiniCPM-o
//! dialects are served without a flag: the first `session.init` (current) or
//! `session.update` (earlier) after `session.queue_done` fixes the connection's dialect.
//! Until then each event is decoded by the dialect that knows its type.

use std::sync::Arc;

use omni_actors::domain::Mode;
use omni_actors::edge::dialect::{DecodeError, Dialect, Outbox};
use omni_actors::edge::redact::Redact;
use omni_actors::edge::vad::SharedDetectors;
use omni_actors::protocol::{Inbound, Outbound};

use super::Limits;
use super::legacy::Legacy;
use super::minicpm::Current;
use super::wire;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Chosen {
    Current,
    Legacy,
}

/// The MiniCPM-o endpoint: current and earlier dialect, chosen by the client.
pub struct MiniCpmEndpoint {
    current: Current,
    /// The earlier dialect has no chat mode.
    legacy: Option<Legacy>,
    chosen: Option<Chosen>,
    queue_done: bool,
}

impl MiniCpmEndpoint {
    pub fn new(mode: Mode, limits: Limits, voice: &SharedDetectors) -> MiniCpmEndpoint {
        MiniCpmEndpoint {
            current: Current::new(mode, limits, voice),
            legacy: (mode != Mode::Chat).then(|| Legacy::new(mode, limits)),
            chosen: if mode == Mode::Chat { Some(Chosen::Current) } else { None },
            queue_done: false,
        }
    }

    /// The current dialect's transcripts come from the gateway for backends that report none
    /// (`[transcription]` is on).
    pub fn with_gateway_transcription(mut self, on: bool) -> MiniCpmEndpoint {
        self.current = self.current.with_gateway_transcription(on);
        self
    }

    fn active(&mut self) -> &mut dyn Dialect {
        match (self.chosen, self.legacy.as_mut()) {
            (Some(Chosen::Legacy), Some(legacy)) => legacy,
            _ => &mut self.current,
        }
    }
}

impl Dialect for MiniCpmEndpoint {
    fn name(&self) -> &'static str {
        match (self.chosen, &self.legacy) {
            (Some(Chosen::Legacy), Some(legacy)) => legacy.name(),
            _ => self.current.name(),
        }
    }

    fn decode(&mut self, text: &bytestring::ByteString, replies: &mut Outbox) -> Result<Vec<Inbound>, DecodeError> {
        if self.chosen.is_some() {
            return self.active().decode(text, replies);
        }
        let kind = wire::event_type(text)?;
        let legacy_kind = matches!(kind.as_ref(), "session.update" | "input_audio_buffer.append");
        match (legacy_kind, self.legacy.as_mut()) {
            // A dialect is chosen by a first event it accepts: one it refuses chooses nothing.
            (true, Some(legacy)) => {
                let inbound = legacy.decode(text, replies)?;
                if kind == "session.update" && self.queue_done {
                    self.chosen = Some(Chosen::Legacy);
                }
                Ok(inbound)
            }
            _ => {
                let inbound = self.current.decode(text, replies)?;
                if kind == "session.init" && self.queue_done {
                    self.chosen = Some(Chosen::Current);
                }
                Ok(inbound)
            }
        }
    }

    fn encode(&mut self, event: Outbound<'_>, out: &mut Outbox) {
        if let Outbound::QueueDone = event {
            self.queue_done = true;
        }
        self.active().encode(event, out);
    }

    fn new_session_id(&mut self) -> String {
        self.active().new_session_id()
    }

    fn redactor(&self) -> Arc<dyn Redact> {
        match (self.chosen, &self.legacy) {
            (Some(Chosen::Legacy), Some(legacy)) => legacy.redactor(),
            _ => self.current.redactor(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(d: &mut MiniCpmEndpoint, v: serde_json::Value) -> Result<Vec<Inbound>, DecodeError> {
        d.decode(&bytestring::ByteString::from(String::from(&v.to_string())), &mut Outbox::default())
    }

    #[test]
    fn session_update_after_queue_done_chooses_the_earlier_dialect() {
        let mut d = MiniCpmEndpoint::new(Mode::Video, Limits::default(), &crate::vad::energy());
        assert_eq!(d.name(), "minicpm");
        // before queue_done nothing is fixed
        assert!(decode(&mut d, json!({"type": "session.update", "session": {"instructions": "x"}})).is_ok());
        assert_eq!(d.name(), "minicpm");
        d.encode(Outbound::QueueDone, &mut Outbox::default());
        decode(&mut d, json!({"type": "session.update", "session": {"instructions": "x"}})).unwrap();
        assert_eq!(d.name(), "minicpm-legacy");
        assert!(d.new_session_id().starts_with("rt_"));
        // the current dialect's events are now unknown
        let e = decode(&mut d, json!({"type": "session.init", "payload": {}})).unwrap_err();
        assert!(matches!(e, DecodeError::Protocol(ref p) if p.code() == "unknown_event"), "{e:?}");
    }

    #[test]
    fn a_first_event_refused_chooses_no_dialect() {
        let mut d = MiniCpmEndpoint::new(Mode::Audio, Limits::default(), &crate::vad::energy());
        d.encode(Outbound::QueueDone, &mut Outbox::default());
        let broken = bytestring::ByteString::from_static(r#"{"type": "session.update", "session": 3"#);
        assert!(d.decode(&broken, &mut Outbox::default()).is_err());
        assert_eq!(d.name(), "minicpm");
        decode(&mut d, json!({"type": "session.init", "payload": {}})).unwrap();
        assert!(d.new_session_id().starts_with("sess_"));
    }

    #[test]
    fn session_init_after_queue_done_chooses_the_current_dialect() {
        let mut d = MiniCpmEndpoint::new(Mode::Audio, Limits::default(), &crate::vad::energy());
        d.encode(Outbound::QueueDone, &mut Outbox::default());
        decode(&mut d, json!({"type": "session.init", "payload": {}})).unwrap();
        assert_eq!(d.name(), "minicpm");
        assert!(d.new_session_id().starts_with("sess_"));
        let e = decode(&mut d, json!({"type": "session.update", "session": {"instructions": "x"}})).unwrap_err();
        assert!(matches!(e, DecodeError::Protocol(ref p) if p.code() == "unknown_event"));
    }

    #[test]
    fn chat_has_no_earlier_dialect() {
        let mut d = MiniCpmEndpoint::new(Mode::Chat, Limits::default(), &crate::vad::energy());
        d.encode(Outbound::QueueDone, &mut Outbox::default());
        let e = decode(&mut d, json!({"type": "session.update", "session": {"instructions": "x"}})).unwrap_err();
        assert!(matches!(e, DecodeError::Protocol(ref p) if p.code() == "unknown_event"));
    }
}
