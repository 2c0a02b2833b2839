//! The Twilio Media Streams client, as Twilio behaves: `connected`, `start`, then a `media` frame
//! of 20 ms of μ-law every 20 ms, each `mark` sent back as played. The gateway sends the
//! model's voice as it comes (Twilio paces the playback), so only the end of speech to voice is
//! timed, not the frames.

use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::{FRAME_MS, Heard, Shared};

pub(super) async fn stream(shared: &Shared) -> Result<(), String> {
    let base = shared.args.url.replacen("http", "ws", 1);
    let key = shared.args.api_key.as_ref().map_or(String::new(), |k| format!("&key={k}"));
    let url = format!("{base}/v1/telephony/twilio?model=omni{key}");
    let (ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.map_err(|e| e.to_string())?;
    let (mut tx, mut rx) = ws.split();
    let sid = format!("MZ{:032x}", rand_id());
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut up, mut down) = (0u64, 0u64);
    send(&mut tx, json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}), &mut up).await?;
    let start = json!({"event": "start", "sequenceNumber": "1", "streamSid": sid,
        "start": {"accountSid": "AC0", "streamSid": sid, "callSid": "CA0", "tracks": ["inbound"], "customParameters": {},
                  "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}});
    send(&mut tx, start, &mut up).await?;
    let mut heard = Heard::default();
    let began = Instant::now();
    let mut next_frame = began;
    let mut frame_no = 0usize;
    loop {
        if began.elapsed().as_secs_f64() >= shared.args.duration {
            let stop = json!({"event": "stop", "sequenceNumber": "0", "streamSid": sid, "stop": {}});
            send(&mut tx, stop, &mut up).await?;
            let _ = tx.close().await;
            heard.report(shared, up, down, began.elapsed());
            return Ok(());
        }
        tokio::select! {
            msg = rx.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    other => return Err(format!("the stream ended: {other:?}")),
                };
                down += text.len() as u64;
                let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                match v["event"].as_str() {
                    Some("media") => heard.voice(Instant::now()),
                    Some("mark") => {
                        let back = json!({"event": "mark", "sequenceNumber": "0", "streamSid": sid, "mark": v["mark"]});
                        send(&mut tx, back, &mut up).await?;
                    }
                    _ => {}
                }
            }
            _ = tokio::time::sleep_until(next_frame.into()) => {
                let i = heard.frame_out(shared, frame_no, shared.ulaw.len(), Instant::now());
                let media = json!({"event": "media", "sequenceNumber": (frame_no + 2).to_string(), "streamSid": sid,
                    "media": {"track": "inbound", "chunk": (frame_no + 1).to_string(),
                              "timestamp": (frame_no as u64 * FRAME_MS).to_string(), "payload": b64.encode(&shared.ulaw[i])}});
                send(&mut tx, media, &mut up).await?;
                frame_no += 1;
                next_frame += Duration::from_millis(FRAME_MS);
            }
        }
    }
}

type Sink = futures_util::stream::SplitSink<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    Message,
>;

/// One message to the gateway, counted.
async fn send(tx: &mut Sink, v: Value, up: &mut u64) -> Result<(), String> {
    let text = v.to_string();
    *up += text.len() as u64;
    tx.send(Message::text(text)).await.map_err(|e| e.to_string())
}

/// A stream id's random part.
fn rand_id() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    u128::from(h.finish())
}
