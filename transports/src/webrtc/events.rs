//! The call's own events on the data channel, as plain functions. Everything else on
//! `oai-events` is the session's, both ways, as a WebSocket client would send and get it; the
//! voice travels on the audio track and crosses to the session as samples, so no event here
//! carries audio.
//!
//! In: `output_audio_buffer.clear` is the call's (it clears the voice it plays). Out: the
//! call tells the client when the model's voice starts and stops playing, and when it was
//! cleared (`output_audio_buffer.started`, `.stopped`, `.cleared`).

use serde::Deserialize;

/// A client event from the data channel, as the call sees it.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// `output_audio_buffer.clear`: the call's own.
    Clear { event_id: Option<String> },
    /// Anything else, for the session (malformed JSON too: the session answers it).
    Forward,
}

#[derive(Deserialize)]
struct Head<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    event_id: Option<String>,
}

/// Classifies one client event by its type.
pub fn incoming(text: &str) -> Incoming {
    match serde_json::from_str::<Head>(text) {
        Ok(Head { kind: Some(kind), event_id }) if kind == "output_audio_buffer.clear" => Incoming::Clear { event_id },
        _ => Incoming::Forward,
    }
}

/// An `output_audio_buffer.*` event; the answer to a client's clear names its event.
pub fn buffer_event(kind: &str, response_id: &str, client_event_id: Option<&str>) -> String {
    let mut event = serde_json::json!({
        "type": format!("output_audio_buffer.{kind}"),
        "event_id": format!("event_{}", uuid::Uuid::new_v4().simple()),
        "response_id": response_id,
    });
    if let Some(id) = client_event_id {
        event["client_event_id"] = id.into();
    }
    event.to_string()
}

/// The error a client hears when its event was dropped: its session is behind.
pub fn behind_error() -> String {
    serde_json::json!({
        "type": "error",
        "event_id": format!("event_{}", uuid::Uuid::new_v4().simple()),
        "error": {"type": "invalid_request_error", "code": "buffer_full",
                  "message": "the session is behind on what this call sent: an event was dropped; send it again once the session has answered"},
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn only_a_clear_is_the_calls_own() {
        assert_eq!(
            incoming(r#"{"type":"output_audio_buffer.clear","event_id":"e1"}"#),
            Incoming::Clear { event_id: Some("e1".into()) }
        );
        assert_eq!(incoming(r#"{"type":"output_audio_buffer.clear"}"#), Incoming::Clear { event_id: None });
        for other in [r#"{"type":"response.cancel"}"#, r#"{"type":"session.update","session":{}}"#, "not json", "[]"] {
            assert_eq!(incoming(other), Incoming::Forward, "{other}");
        }
    }

    #[test]
    fn a_buffer_event_names_its_response_and_the_clear_it_answers() {
        let v: Value = serde_json::from_str(&buffer_event("cleared", "resp_1", Some("e1"))).unwrap();
        assert_eq!(
            (v["type"].as_str(), v["response_id"].as_str()),
            (Some("output_audio_buffer.cleared"), Some("resp_1"))
        );
        assert_eq!(v["client_event_id"], "e1");
    }
}
