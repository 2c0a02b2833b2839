//! Twilio Media Streams' messages, as Twilio documents them for a bidirectional stream
//! (`<Connect><Stream>`): what Twilio sends (`connected`, `start`, `media`, `mark`, `dtmf`,
//! `stop`) and what it takes back (`media` with μ-law audio for the stream, `mark`, `clear`).
//! Audio is G.711 μ-law at 8 kHz, base64, both ways.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::audio::g711::Law;
use omni_actors::edge::client::Keypress;
use serde::Deserialize;
use serde_json::{Value, json};

/// The rate of a stream's audio, both ways.
pub const RATE: u32 = 8000;

/// One message from Twilio.
#[derive(Debug, PartialEq)]
pub enum TwilioMessage {
    /// The socket is up (`connected`).
    Connected,
    /// The stream starts: its id, its call, and the parameters the TwiML gave
    /// (`<Parameter name= value=>`).
    Start { stream_sid: String, call_sid: String, parameters: serde_json::Map<String, Value> },
    /// The caller's voice: μ-law at 8 kHz, decoded to samples in -1..1.
    Media { samples: Vec<f32> },
    /// Twilio played the audio sent before the mark of this name.
    Mark { name: String },
    /// The caller pressed a key.
    Dtmf { key: Keypress },
    /// The call hung up, or the stream was stopped.
    Stop,
}

#[derive(Deserialize)]
struct Message {
    event: String,
    start: Option<Start>,
    media: Option<Media>,
    mark: Option<Mark>,
    dtmf: Option<Dtmf>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Start {
    stream_sid: String,
    #[serde(default)]
    call_sid: String,
    #[serde(default)]
    custom_parameters: serde_json::Map<String, Value>,
    media_format: Option<MediaFormat>,
}

#[derive(Deserialize)]
struct MediaFormat {
    encoding: String,
    #[serde(rename = "sampleRate")]
    sample_rate: u32,
}

#[derive(Deserialize)]
struct Media {
    payload: String,
    #[serde(default)]
    track: Option<String>,
}

#[derive(Deserialize)]
struct Mark {
    name: String,
}

#[derive(Deserialize)]
struct Dtmf {
    digit: String,
}

/// Why a message from Twilio was not taken.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum TwilioRefused {
    #[error("not a Twilio Media Streams message: {0}")]
    Malformed(String),
    #[error("the stream's audio is {0}, not audio/x-mulaw at 8000 Hz")]
    Format(String),
    /// An event this edge does not use (a new one of Twilio's): ignored.
    #[error("an event not used here: {0}")]
    Unknown(String),
}

/// One text message from Twilio.
pub fn parse(text: &str) -> Result<TwilioMessage, TwilioRefused> {
    let m: Message = serde_json::from_str(text).map_err(|e| TwilioRefused::Malformed(e.to_string()))?;
    let missing = |what: &str| TwilioRefused::Malformed(format!("a {} event without its '{what}'", m.event));
    Ok(match m.event.as_str() {
        "connected" => TwilioMessage::Connected,
        "start" => {
            let start = m.start.ok_or_else(|| missing("start"))?;
            if let Some(f) = &start.media_format
                && (f.encoding != "audio/x-mulaw" || f.sample_rate != RATE)
            {
                return Err(TwilioRefused::Format(format!("{} at {} Hz", f.encoding, f.sample_rate)));
            }
            TwilioMessage::Start {
                stream_sid: start.stream_sid,
                call_sid: start.call_sid,
                parameters: start.custom_parameters,
            }
        }
        "media" => {
            let media = m.media.as_ref().ok_or_else(|| missing("media"))?;
            if media.track.as_deref().is_some_and(|t| t != "inbound") {
                // (a stream of both tracks: the call's own outbound audio is not the caller's)
                return Err(TwilioRefused::Unknown("media of another track than the caller's".into()));
            }
            let bytes =
                STANDARD.decode(&media.payload).map_err(|e| TwilioRefused::Malformed(format!("payload: {e}")))?;
            let mut samples = Vec::with_capacity(bytes.len());
            Law::Mu.expand(&bytes, &mut samples);
            TwilioMessage::Media { samples }
        }
        "mark" => TwilioMessage::Mark { name: m.mark.ok_or_else(|| missing("mark"))?.name },
        "dtmf" => {
            let digit = m.dtmf.ok_or_else(|| missing("dtmf"))?.digit;
            let key = digit.chars().next().filter(|_| digit.chars().count() == 1).and_then(Keypress::new);
            // A key no keypad has is passed over, not worth the call.
            TwilioMessage::Dtmf {
                key: key.ok_or_else(|| TwilioRefused::Unknown("a dtmf of a key no keypad has".into()))?,
            }
        }
        "stop" => TwilioMessage::Stop,
        other => return Err(TwilioRefused::Unknown(other.to_string())),
    })
}

/// An id Twilio sent, clipped for a log line.
pub fn clipped(id: &str) -> String {
    id.chars().filter(char::is_ascii_alphanumeric).take(40).collect()
}

/// The model's voice for the stream: samples in -1..1 at 8 kHz, as a `media` message.
pub fn media(stream_sid: &str, samples: &[f32]) -> String {
    let mut bytes = Vec::with_capacity(samples.len());
    Law::Mu.compand(samples, &mut bytes);
    json!({"event": "media", "streamSid": stream_sid, "media": {"payload": STANDARD.encode(bytes)}}).to_string()
}

/// A mark after the audio sent so far: Twilio sends it back once that audio has played.
pub fn mark(stream_sid: &str, name: &str) -> String {
    json!({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}}).to_string()
}

/// Drops the audio Twilio has not played yet (the caller spoke over it).
pub fn clear(stream_sid: &str) -> String {
    json!({"event": "clear", "streamSid": stream_sid}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twilios_messages_as_its_documentation_shows_them() {
        let start = r#"{"event":"start","sequenceNumber":"1","start":{"accountSid":"AC1","streamSid":"MZ1","callSid":"CA1",
            "tracks":["inbound"],"customParameters":{"instructions":"Be brief."},
            "mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000,"channels":1}},"streamSid":"MZ1"}"#;
        let TwilioMessage::Start { stream_sid, call_sid, parameters } = parse(start).unwrap() else {
            panic!("a start")
        };
        assert_eq!((stream_sid.as_str(), call_sid.as_str()), ("MZ1", "CA1"));
        assert_eq!(parameters["instructions"], "Be brief.");
        let media = r#"{"event":"media","sequenceNumber":"3","media":{"track":"inbound","chunk":"1","timestamp":"5","payload":"//8="},"streamSid":"MZ1"}"#;
        assert_eq!(parse(media).unwrap(), TwilioMessage::Media { samples: vec![0.0, 0.0] }, "0xff is μ-law's zero");
        let dtmf =
            r#"{"event":"dtmf","streamSid":"MZ1","sequenceNumber":"5","dtmf":{"track":"inbound_track","digit":"7"}}"#;
        assert_eq!(parse(dtmf).unwrap(), TwilioMessage::Dtmf { key: Keypress::new('7').unwrap() });
        let no_key = r#"{"event":"dtmf","streamSid":"MZ1","dtmf":{"digit":"77"}}"#;
        assert!(matches!(parse(no_key), Err(TwilioRefused::Unknown(_))));
        assert_eq!(parse(r#"{"event":"stop","streamSid":"MZ1","stop":{}}"#).unwrap(), TwilioMessage::Stop);
        assert!(matches!(
            parse(
                r#"{"event":"start","start":{"streamSid":"MZ","mediaFormat":{"encoding":"audio/x-l16","sampleRate":16000}}}"#
            ),
            Err(TwilioRefused::Format(_))
        ));
        assert!(matches!(parse("[]"), Err(TwilioRefused::Malformed(_))));
        assert!(matches!(parse(r#"{"event":"somethingnew"}"#), Err(TwilioRefused::Unknown(_))));
    }

    #[test]
    fn the_models_voice_goes_back_as_mulaw_for_the_stream() {
        let v: Value = serde_json::from_str(&media("MZ1", &[0.0, 0.5])).unwrap();
        assert_eq!(v["streamSid"], "MZ1");
        let bytes = STANDARD.decode(v["media"]["payload"].as_str().unwrap()).unwrap();
        assert_eq!(bytes.len(), 2);
        assert_eq!(bytes[0], 0xff);
        assert_eq!(serde_json::from_str::<Value>(&clear("MZ1")).unwrap()["event"], "clear");
        assert_eq!(serde_json::from_str::<Value>(&mark("MZ1", "resp_1")).unwrap()["mark"]["name"], "resp_1");
    }
}
