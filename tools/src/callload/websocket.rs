//! The WebSocket client: the OpenAI dialect, 24 kHz PCM in base64, 40 ms a message.

use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use super::{FRAME, FRAME_MS, Heard, Shared, auth};

pub(super) async fn socket(shared: &Shared) -> Result<(), String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let base = shared.args.url.replacen("http", "ws", 1);
    let mut req = format!("{base}/v1/realtime?model=omni").into_client_request().map_err(|e| e.to_string())?;
    if let Some(k) = auth(shared) {
        req.headers_mut().insert("Authorization", k.parse().map_err(|_| "a bad key")?);
    }
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true).await.map_err(|e| e.to_string())?;
    let (mut tx, mut rx) = ws.split();
    let (mut up, mut down) = (0u64, 0u64);
    let mut heard = Heard::default();
    let mut created: Option<Instant> = None;
    let mut next_frame = Instant::now();
    let mut frame_no = 0usize;
    // The same 40 ms pieces the gateway hands the session from a call.
    let mut pending: Vec<i16> = Vec::with_capacity(FRAME * 2);
    let b64 = base64::engine::general_purpose::STANDARD;
    loop {
        if let Some(since) = created
            && since.elapsed().as_secs_f64() >= shared.args.duration
        {
            let talked = since.elapsed();
            let _ = tx.close().await;
            heard.report(shared, up, down, talked);
            return Ok(());
        }
        let wake = if created.is_some() { next_frame } else { Instant::now() + Duration::from_secs(60) };
        tokio::select! {
            msg = rx.next() => {
                let text = match msg {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    other => return Err(format!("the socket ended: {other:?}")),
                };
                down += text.len() as u64;
                if text.contains(r#""type":"response.output_audio.delta""#) {
                    heard.voice(Instant::now());
                } else if text.contains(r#""type":"session.created""#) {
                    created = Some(Instant::now());
                    next_frame = Instant::now();
                } else if text.contains(r#""type":"error""#) {
                    return Err(format!("error event: {text}"));
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                let i = heard.frame_out(shared, frame_no, shared.pcm.len(), Instant::now());
                pending.extend_from_slice(&shared.pcm[i]);
                if pending.len() >= FRAME * 2 {
                    let bytes: Vec<u8> = pending.iter().flat_map(|s| s.to_le_bytes()).collect();
                    let text = format!(r#"{{"type":"input_audio_buffer.append","audio":"{}"}}"#, b64.encode(bytes));
                    up += text.len() as u64;
                    tx.send(Message::text(text)).await.map_err(|e| e.to_string())?;
                    pending.clear();
                }
                frame_no += 1;
                next_frame += Duration::from_millis(FRAME_MS);
            }
        }
    }
}
