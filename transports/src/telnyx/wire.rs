//! Telnyx Media Streaming's messages, as Telnyx documents them for a bidirectional stream in RTP
//! mode (`stream_bidirectional_mode: "rtp"`): what Telnyx sends (`connected`, `start`, `media`,
//! `dtmf`, `mark`, `error`, `stop`; its counters are strings) and what it takes back (`media`
//! with the stream's codec, 20 ms at least a message; `mark`; `clear`). Audio is G.711 at 8 kHz,
//! base64, both ways: `PCMU` or `PCMA`, the stream's `media_format` (the bidirectional codec is
//! to be the same).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use omni_actors::audio::g711::{self, Law};
use omni_actors::edge::client::Keypress;
use serde::Deserialize;
use serde_json::{Value, json};

/// The rate of a stream's audio, both ways.
pub const RATE: u32 = g711::RATE;
/// The fewest samples a `media` message back may carry: 20 ms.
pub const MIN_SAMPLES: usize = RATE as usize / 50;

/// One message from Telnyx.
#[derive(Debug, PartialEq)]
pub enum TelnyxMessage {
    /// The socket is up (`connected`).
    Connected,
    /// The stream starts: its id, its call, its codec, and the parameters the call gave
    /// (`custom_parameters`).
    Start { stream_id: String, call_control_id: String, law: Law, parameters: serde_json::Map<String, Value> },
    /// The caller's voice, decoded to samples in -1..1 at 8 kHz.
    Media { samples: Vec<f32> },
    /// Telnyx played the audio sent before the mark of this name (or cleared it).
    Mark { name: String },
    /// The caller pressed a key.
    Dtmf { key: Keypress },
    /// Telnyx refused something sent to it: its code and title.
    Error { code: i64, title: String },
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
    payload: Option<ErrorPayload>,
    #[serde(default)]
    stream_id: Option<String>,
}

#[derive(Deserialize)]
struct Start {
    #[serde(default)]
    call_control_id: String,
    #[serde(default)]
    custom_parameters: serde_json::Map<String, Value>,
    media_format: MediaFormat,
}

#[derive(Deserialize)]
struct MediaFormat {
    encoding: String,
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

#[derive(Deserialize)]
struct ErrorPayload {
    code: i64,
    #[serde(default)]
    title: String,
}

/// Why a message from Telnyx was not taken.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum TelnyxRefused {
    #[error("not a Telnyx media streaming message: {0}")]
    Malformed(String),
    #[error("the stream's audio is {0}, not PCMU or PCMA at 8000 Hz")]
    Format(String),
    /// An event this edge does not use (a new one of Telnyx's): ignored.
    #[error("an event not used here: {0}")]
    Unknown(String),
}

/// One text message from Telnyx, for a stream of `law` (`None` before its `start`).
pub fn parse(text: &str, law: Option<Law>) -> Result<TelnyxMessage, TelnyxRefused> {
    let m: Message = serde_json::from_str(text).map_err(|e| TelnyxRefused::Malformed(e.to_string()))?;
    let missing = |what: &str| TelnyxRefused::Malformed(format!("a {} event without its '{what}'", m.event));
    Ok(match m.event.as_str() {
        "connected" => TelnyxMessage::Connected,
        "start" => {
            let start = m.start.ok_or_else(|| missing("start"))?;
            let f = &start.media_format;
            let law = match (f.encoding.as_str(), f.sample_rate) {
                ("PCMU", RATE) => Law::Mu,
                ("PCMA", RATE) => Law::A,
                _ => return Err(TelnyxRefused::Format(format!("{} at {} Hz", clipped(&f.encoding), f.sample_rate))),
            };
            TelnyxMessage::Start {
                stream_id: m.stream_id.ok_or_else(|| missing("stream_id"))?,
                call_control_id: start.call_control_id,
                law,
                parameters: start.custom_parameters,
            }
        }
        "media" => {
            let media = m.media.ok_or_else(|| missing("media"))?;
            if media.track.as_deref().is_some_and(|t| t != "inbound") {
                // (a stream of both tracks: the call's own outbound audio is not the caller's)
                return Err(TelnyxRefused::Unknown("media of another track than the caller's".into()));
            }
            let law = law.ok_or_else(|| TelnyxRefused::Malformed("media before the stream's start".into()))?;
            let bytes =
                STANDARD.decode(&media.payload).map_err(|e| TelnyxRefused::Malformed(format!("payload: {e}")))?;
            TelnyxMessage::Media { samples: law.expand_vec(&bytes) }
        }
        "mark" => TelnyxMessage::Mark { name: m.mark.ok_or_else(|| missing("mark"))?.name },
        "dtmf" => {
            let digit = m.dtmf.ok_or_else(|| missing("dtmf"))?.digit;
            let key = digit.chars().next().filter(|_| digit.chars().count() == 1).and_then(Keypress::new);
            // A key no keypad has is passed over, not worth the call.
            TelnyxMessage::Dtmf {
                key: key.ok_or_else(|| TelnyxRefused::Unknown("a dtmf of a key no keypad has".into()))?,
            }
        }
        "error" => {
            let e = m.payload.ok_or_else(|| missing("payload"))?;
            TelnyxMessage::Error { code: e.code, title: clipped(&e.title) }
        }
        "stop" => TelnyxMessage::Stop,
        other => return Err(TelnyxRefused::Unknown(clipped(other))),
    })
}

/// What Telnyx sent, clipped for a log line.
pub fn clipped(text: &str) -> String {
    text.chars().filter(|c| c.is_ascii_alphanumeric() || "_-:".contains(*c)).take(40).collect()
}

/// The model's voice for the stream: samples in -1..1 at 8 kHz as a `media` message in the
/// stream's codec (its RTP payload, no header).
pub fn media(law: Law, samples: &[f32]) -> String {
    let mut bytes = Vec::with_capacity(samples.len());
    law.compand(samples, &mut bytes);
    json!({"event": "media", "media": {"payload": STANDARD.encode(bytes)}}).to_string()
}

/// A mark after the audio sent so far: Telnyx sends it back once that audio has played (or
/// was cleared).
pub fn mark(name: &str) -> String {
    json!({"event": "mark", "mark": {"name": name}}).to_string()
}

/// Stops what plays and drops what is queued.
pub fn clear() -> String {
    json!({"event": "clear"}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = r#"{"event":"start","sequence_number":"1","start":{"user_id":"3E6F995F-85F7-4705-9741-53B116D28237",
        "call_control_id":"v2:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ","call_session_id":"ff55a038",
        "from":"+13122010094","to":"+13122123456","tags":["TAG1"],"client_state":"aGF2ZQ==",
        "custom_parameters":{"instructions":"Be brief."},
        "media_format":{"encoding":"PCMA","sample_rate":8000,"channels":1}},"stream_id":"32DE0DEA-53CB-4B21-89A4-9E1819C043BC"}"#;

    #[test]
    fn the_documented_messages_are_read_and_the_codec_is_the_streams() {
        assert_eq!(parse(r#"{"event":"connected","version":"1.0.0"}"#, None), Ok(TelnyxMessage::Connected));
        let Ok(TelnyxMessage::Start { stream_id, law, parameters, .. }) = parse(START, None) else { panic!("a start") };
        assert_eq!((stream_id.as_str(), law), ("32DE0DEA-53CB-4B21-89A4-9E1819C043BC", Law::A));
        assert_eq!(parameters["instructions"], "Be brief.");
        let tone: Vec<f32> = (0..160).map(|i| (i as f32 * 0.3).sin() * 0.4).collect();
        let mut bytes = Vec::new();
        Law::A.compand(&tone, &mut bytes);
        let media = json!({"event": "media", "sequence_number": "4", "stream_id": "s",
            "media": {"track": "inbound", "chunk": "2", "timestamp": "5", "payload": STANDARD.encode(&bytes)}});
        let Ok(TelnyxMessage::Media { samples }) = parse(&media.to_string(), Some(Law::A)) else { panic!("media") };
        assert!(samples.iter().zip(&tone).all(|(a, b)| (a - b).abs() < 0.02));
        assert!(matches!(parse(&media.to_string(), None), Err(TelnyxRefused::Malformed(_))), "media before its start");
        let dtmf = r#"{"event":"dtmf","stream_id":"s","occurred_at":"2025-06-05T08:54:19.698408Z","sequence_number":"5","dtmf":{"digit":"1"}}"#;
        assert_eq!(parse(dtmf, Some(Law::A)), Ok(TelnyxMessage::Dtmf { key: Keypress::new('1').unwrap() }));
        let error =
            r#"{"event":"error","payload":{"code":100003,"title":"malformed_frame","detail":"x"},"stream_id":"s"}"#;
        assert_eq!(
            parse(error, Some(Law::A)),
            Ok(TelnyxMessage::Error { code: 100003, title: "malformed_frame".into() })
        );
        let stop =
            r#"{"event":"stop","sequence_number":"5","stop":{"user_id":"u","call_control_id":"c"},"stream_id":"s"}"#;
        assert_eq!(parse(stop, Some(Law::A)), Ok(TelnyxMessage::Stop));
        let l16 = START.replace("PCMA", "L16").replace("8000", "16000");
        assert_eq!(parse(&l16, None), Err(TelnyxRefused::Format("L16 at 16000 Hz".into())));
    }

    #[test]
    fn the_models_voice_goes_back_in_the_streams_codec() {
        let v: Value = serde_json::from_str(&media(Law::Mu, &[0.0; 160])).unwrap();
        assert_eq!(v["event"], "media");
        let bytes = STANDARD.decode(v["media"]["payload"].as_str().unwrap()).unwrap();
        assert_eq!(bytes, vec![Law::Mu.silence(); 160]);
        assert_eq!(serde_json::from_str::<Value>(&clear()).unwrap(), json!({"event": "clear"}));
    }
}
