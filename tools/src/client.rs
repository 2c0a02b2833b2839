//! What the probe and the load generator share: connecting, building the events of either
//! MiniCPM-o dialect, and reading the server's events cheaply.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use clap::ValueEnum;
use futures_util::stream::SplitStream;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub(crate) type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WireDialect {
    /// `session.init` / `input.append` (the MiniCPM-o Realtime API).
    Current,
    /// `session.update` / `input_audio_buffer.append` (the earlier duplex protocol).
    Legacy,
}

/// Connects to `base` (`ws://host:port`) with `?mode=`, sending the key as a Bearer header.
pub(crate) async fn connect(base: &str, mode: &str, api_key: Option<&str>) -> Result<Ws, String> {
    let url = format!("{}/v1/realtime?mode={mode}", base.trim_end_matches('/'));
    let mut req = url.as_str().into_client_request().map_err(|e| format!("{url}: {e}"))?;
    if let Some(key) = api_key {
        let value =
            format!("Bearer {key}").parse().map_err(|_| "the API key is not a valid header value".to_string())?;
        req.headers_mut().insert("Authorization", value);
    }
    // Nagle off: a small event after a large one must not wait for a delayed ACK.
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true).await.map_err(|e| refused(&url, e))?;
    Ok(ws)
}

/// Why a connection failed; a refusal with the server's own reason (its JSON error's message).
fn refused(url: &str, e: tokio_tungstenite::tungstenite::Error) -> String {
    let tokio_tungstenite::tungstenite::Error::Http(response) = e else { return format!("{url}: {e}") };
    let reason = response
        .body()
        .as_deref()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
        .and_then(|v| v["error"]["message"].as_str().map(String::from));
    let status = response.status();
    // The tools take a key with --api-key (or OMNI_API_KEY), whatever the server's words.
    let hint = if status.as_u16() == 401 { " (give the key with --api-key KEY or OMNI_API_KEY)" } else { "" };
    match reason {
        Some(why) => format!("{url}: the server refused the connection (HTTP {}): {why}{hint}", status.as_u16()),
        None => format!("{url}: the server refused the connection (HTTP {status}){hint}"),
    }
}

/// The tools' runtime: two worker threads, like the machine they are measured on.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())
}

/// Base64 of little-endian float32 samples.
pub(crate) fn b64_f32(samples: &[f32]) -> String {
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    STANDARD.encode(bytes)
}

/// Float32 samples from base64 (the server's audio).
pub(crate) fn f32_of(b64: &str) -> Vec<f32> {
    STANDARD
        .decode(b64)
        .map(|bytes| bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        .unwrap_or_default()
}

pub(crate) fn init_event(dialect: WireDialect, instructions: &str) -> String {
    match dialect {
        WireDialect::Current => json!({"type": "session.init", "payload": {"system_prompt": instructions}}),
        WireDialect::Legacy => json!({"type": "session.update", "session": {"instructions": instructions}}),
    }
    .to_string()
}

/// The same, asking for `input.transcript` events (what the model heard) where the dialect has them.
pub(crate) fn init_event_with_transcripts(dialect: WireDialect, instructions: &str) -> String {
    match dialect {
        WireDialect::Current => {
            json!({"type": "session.init", "payload": {"system_prompt": instructions, "transcripts": true}})
        }
        WireDialect::Legacy => json!({"type": "session.update", "session": {"instructions": instructions}}),
    }
    .to_string()
}

/// One duplex chunk event.
pub(crate) fn chunk_event(dialect: WireDialect, samples: &[f32], frames: &[String], force_listen: bool) -> String {
    let audio = b64_f32(samples);
    match dialect {
        WireDialect::Current => {
            let mut input = json!({"audio": audio});
            if !frames.is_empty() {
                input["video_frames"] = json!(frames);
            }
            if force_listen {
                input["force_listen"] = json!(true);
            }
            typed("input.append", json!({"input": input}))
        }
        WireDialect::Legacy => {
            let mut event = json!({"audio": audio});
            if !frames.is_empty() {
                event["video_frames"] = json!(frames);
            }
            if force_listen {
                event["force_listen"] = json!(true);
            }
            typed("input_audio_buffer.append", event)
        }
    }
}

/// `body`'s members after a leading `"type"`, as the page, the SDKs and most clients write
/// events (`json!` sorts keys, which would put `type` after `audio` and `input`).
fn typed(kind: &str, body: Value) -> String {
    #[derive(serde::Serialize)]
    struct Typed<'a> {
        r#type: &'a str,
        #[serde(flatten)]
        body: Value,
    }
    serde_json::to_string(&Typed { r#type: kind, body }).expect("a JSON value serialises")
}

/// A MiniCPM-o model worker's own `prepare` (its `/ws/duplex`, no gateway between).
pub(crate) fn worker_prepare_event(instructions: &str) -> String {
    json!({"type": "prepare", "system_prompt": instructions}).to_string()
}

/// A MiniCPM-o model worker's own `audio_chunk`: float32 at 16 kHz, as the gateway forwards it.
pub(crate) fn worker_chunk_event(samples: &[f32], frames: &[String], force_listen: bool) -> String {
    let mut event = json!({"audio_base64": b64_f32(samples), "force_listen": force_listen});
    if !frames.is_empty() {
        event["frame_base64_list"] = json!(frames);
    }
    typed("audio_chunk", event)
}

/// vLLM-Omni's opening `session.update` as the gateway's `vllm-omni` backend sends it, with a
/// tenth of a second of silence as the voice prompt.
pub(crate) fn vllm_session_event(instructions: &str) -> String {
    let mut wav = Vec::new();
    let mut w = hound::WavWriter::new(
        std::io::Cursor::new(&mut wav),
        hound::WavSpec {
            channels: 1,
            sample_rate: 16000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        },
    )
    .expect("a WAV header");
    for _ in 0..1600 {
        w.write_sample(0i16).expect("a sample");
    }
    w.finalize().expect("a WAV file");
    json!({"type": "session.update", "session": {
        "modalities": ["text", "audio"], "instructions": instructions,
        "input_audio_format": "pcm_f32le", "sample_rate_hz": 16000, "output_audio_format": "pcm16",
        "turn_detection": null, "overlap_policy": "listen_only",
        "extra_body": {"auto_response": true, "force_listen_count": 0},
        "ref_audio": format!("data:audio/wav;base64,{}", STANDARD.encode(&wav)),
    }})
    .to_string()
}

/// vLLM-Omni's `input_audio_buffer.append` of float32 at 16 kHz, frames as bare base64.
pub(crate) fn vllm_append_event(samples: &[f32], frames: &[String], force_listen: bool) -> String {
    let mut event = json!({"audio": b64_f32(samples)});
    if force_listen {
        event["force_listen"] = json!(true);
    }
    if !frames.is_empty() {
        event["video_frames"] = json!(frames);
    }
    typed("input_audio_buffer.append", event)
}

/// Connects to a vLLM-Omni server's duplex endpoint (`base`: `ws://host:port`).
pub(crate) async fn connect_vllm(base: &str) -> Result<Ws, String> {
    let url = format!("{}/v1/realtime?duplex=1&autostart=0", base.trim_end_matches('/'));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url.as_str(), None, true)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    Ok(ws)
}

/// Connects to a MiniCPM-o model worker's `/ws/duplex` (`base`: `ws://host:port`).
pub(crate) async fn connect_worker(base: &str) -> Result<Ws, String> {
    let url = format!("{}/ws/duplex", base.trim_end_matches('/'));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url.as_str(), None, true)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    Ok(ws)
}

pub(crate) fn close_event() -> String {
    json!({"type": "session.close", "reason": "user_stop"}).to_string()
}

pub(crate) async fn send(ws: &mut Ws, text: impl Into<Utf8Bytes>) -> Result<(), String> {
    ws.send(Message::Text(text.into())).await.map_err(|e| e.to_string())
}

/// A tiny JPEG (start and end markers): the gateway checks the marker, the reference
/// backend counts frames.
pub(crate) const TINY_JPEG: &str = "/9j/4AAQSkZJRgABAQAAAQABAAD/2Q==";

/// The next text frame of a split connection (pings are answered by the library),
/// `None` when the connection closed.
pub(crate) async fn next(stream: &mut SplitStream<Ws>, within: Duration) -> Result<Option<Utf8Bytes>, String> {
    loop {
        match tokio::time::timeout(within, stream.next()).await {
            Err(_) => return Err(format!("nothing from the server for {within:?}")),
            Ok(None) | Ok(Some(Ok(Message::Close(_)))) => return Ok(None),
            Ok(Some(Ok(Message::Text(t)))) => return Ok(Some(t)),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => return Err(e.to_string()),
        }
    }
}

/// The `type` of an event, read from its first bytes when the server put it first (it
/// does), so that large audio events are not parsed whole.
pub(crate) fn event_type(text: &str) -> Option<String> {
    let prefix = head(text, 160);
    if let Some(rest) = prefix.strip_prefix("{\"type\":\"")
        && let Some(end) = rest.find('"')
    {
        return Some(rest[..end].to_string());
    }
    serde_json::from_str::<Value>(text).ok()?.get("type")?.as_str().map(String::from)
}

/// At most the first `n` bytes of `text`, cut at a character boundary.
fn head(text: &str, n: usize) -> &str {
    let mut end = n.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A string field found in the first bytes of an event (`"input_id":"input_7"`).
pub(crate) fn early_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    let prefix = head(text, 400);
    let key = format!("\"{field}\":\"");
    let start = prefix.find(&key)? + key.len();
    let end = prefix[start..].find('"')?;
    Some(&prefix[start..start + end])
}

/// A tone (speech to the reference backend) or silence, one second at 16 kHz.
pub(crate) fn second(loud: bool) -> Vec<f32> {
    (0..16000)
        .map(|i| if loud { 0.3 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 16000.0).sin() } else { 0.0 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_the_prefix() {
        let e = r#"{"type":"response.output.delta","kind":"audio","session_id":"s","response_id":"r","input_id":"input_12","audio":"AAAA"}"#;
        assert_eq!(event_type(e).as_deref(), Some("response.output.delta"));
        assert_eq!(early_field(e, "input_id"), Some("input_12"));
        assert_eq!(early_field(e, "kind"), Some("audio"));
        assert_eq!(event_type(r#"{"kind":1,"type":"x"}"#).as_deref(), Some("x"));
    }

    #[test]
    fn events_are_sent_with_their_type_first() {
        let e = chunk_event(WireDialect::Current, &[0.0], &[], true);
        assert!(e.starts_with(r#"{"type":"input.append","input":{"#), "{e}");
        let v: Value = serde_json::from_str(&e).unwrap();
        assert_eq!(v["input"]["force_listen"], true);
        assert_eq!(v["input"]["audio"], "AAAAAA==");
        assert_eq!(typed("x", json!({})), r#"{"type":"x"}"#);
        let w: Value = serde_json::from_str(&worker_chunk_event(&[0.0], &[], false)).unwrap();
        assert_eq!(w, json!({"type": "audio_chunk", "audio_base64": "AAAAAA==", "force_listen": false}));
    }
}
