//! The buffer attacks of `omni-gateway flood`: one per buffer a client can make the server
//! hold, each sending `--count` events of about `--bytes`, and reporting what came back
//! (errors by code, how the connection ended). `scripts/attack.sh` runs each against a
//! release server and reads its memory before and after (docs/reliability.md).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures_util::stream::SplitStream;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::{Bytes, Message};

use super::args::{FloodArgs, FloodKind};
use crate::client::{self, Ws};

/// What came back from the server.
#[derive(Default)]
struct Answers {
    counts: BTreeMap<String, u64>,
    close: Option<u16>,
}

impl Answers {
    fn json(&self) -> Value {
        json!({"received": self.counts, "close": self.close})
    }
}

/// Reads what the server says until it is quiet for `quiet`, or it closes.
async fn drain<S>(stream: &mut S, answers: &mut Answers, quiet: Duration)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    // Until it is quiet for `quiet`, and at most 20 s (a queued client hears updates).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while let Ok(Some(msg)) =
        tokio::time::timeout(quiet.min(deadline - tokio::time::Instant::now()), stream.next()).await
    {
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        match msg {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(&t).unwrap_or_default();
                let kind = match v["type"].as_str() {
                    Some("error") => format!("error:{}", v["error"]["code"].as_str().unwrap_or("?")),
                    Some(k) => k.to_string(),
                    None => "?".into(),
                };
                *answers.counts.entry(kind).or_default() += 1;
            }
            Ok(Message::Close(f)) => {
                answers.close = f.map(|f| u16::from(f.code));
                return;
            }
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

async fn connect(args: &FloodArgs, path: &str) -> Result<Ws, String> {
    let url = format!("{}{path}", args.url.trim_end_matches('/'));
    let (ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.map_err(|e| format!("{url}: {e}"))?;
    Ok(ws)
}

/// Takes the server's worker with a session of its own, so that the attack waits.
async fn hold_worker(args: &FloodArgs) -> Result<Ws, String> {
    let mut ws = client::connect(&args.url, "audio", args.api_key.as_deref()).await?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) if client::event_type(&t).as_deref() == Some("session.queue_done") => break,
            Some(Ok(_)) => {}
            _ => return Err("the holder lost its connection".into()),
        }
    }
    client::send(&mut ws, client::init_event(client::WireDialect::Current, "hold")).await?;
    Ok(ws)
}

fn pcm16_b64(bytes: usize) -> String {
    STANDARD.encode(vec![0u8; bytes / 4 * 3 / 2 * 2])
}

fn crafted_wav() -> Vec<u8> {
    let mut w = Vec::new();
    for part in [
        &b"RIFF"[..],
        &136u32.to_le_bytes(),
        b"WAVEfmt ",
        &16u32.to_le_bytes(),
        &1u16.to_le_bytes(),
        &1u16.to_le_bytes(),
    ] {
        w.extend_from_slice(part);
    }
    w.extend_from_slice(&4_294_967_291u32.to_le_bytes());
    w.extend_from_slice(&4_294_967_291u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&8u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&100u32.to_le_bytes());
    w.extend_from_slice(&[128u8; 100]);
    w
}

pub(crate) async fn run(kind: FloodKind, args: &FloodArgs) -> Result<Value, String> {
    if kind == FloodKind::Fragments {
        return fragments(args).await;
    }
    let needs_queue = matches!(kind, FloodKind::Items | FloodKind::Prelude);
    let holder = if needs_queue { Some(hold_worker(args).await?) } else { None };
    let path = match kind {
        FloodKind::WavRate => "/v1/realtime?mode=video",
        FloodKind::Items | FloodKind::AudioBuffer | FloodKind::Images => "/v1/realtime?model=attack",
        FloodKind::Turns => "/v1/realtime?mode=chat",
        _ => "/v1/realtime?mode=audio",
    };
    let (mut sink, mut stream) = connect(args, path).await?.split();
    let mut answers = Answers::default();
    // Into the state each attack needs.
    match kind {
        FloodKind::WavRate | FloodKind::Turns if !needs_queue => {
            wait_for(&mut stream, "session.queue_done").await?;
            if kind == FloodKind::Turns {
                sink.send(Message::text(client::init_event(client::WireDialect::Current, "x")))
                    .await
                    .map_err(|e| e.to_string())?;
                wait_for(&mut stream, "session.created").await?;
            }
        }
        FloodKind::AudioBuffer | FloodKind::Images => {
            wait_for(&mut stream, "session.created").await?;
            let manual = json!({"type": "session.update", "session": {"turn_detection": null}});
            sink.send(Message::text(manual.to_string())).await.map_err(|e| e.to_string())?;
            if kind == FloodKind::Images {
                let audio = json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(4000)});
                sink.send(Message::text(audio.to_string())).await.map_err(|e| e.to_string())?;
            }
        }
        _ => {}
    }
    let event = match kind {
        FloodKind::WavRate => {
            json!({"type": "session.update", "session": {"instructions": "x", "ref_audio": STANDARD.encode(crafted_wav())}})
        }
        FloodKind::Items => json!({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
            "content": [{"type": "input_audio", "audio": pcm16_b64(args.bytes)}]}}),
        FloodKind::AudioBuffer => json!({"type": "input_audio_buffer.append", "audio": pcm16_b64(args.bytes)}),
        FloodKind::Images => {
            let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0];
            jpeg.resize(args.bytes / 4 * 3, 0);
            json!({"type": "input_image_buffer.append", "image": STANDARD.encode(jpeg)})
        }
        FloodKind::Prelude => json!({"type": "input.append", "input": {"audio": STANDARD.encode(vec![0u8; args.bytes / 4 * 3 / 4 * 4])}}),
        FloodKind::Turns => json!({"type": "input.append", "input": {"streaming": false,
            "messages": [{"role": "user", "content": "x ".repeat(args.bytes / 2)}]}}),
        _ => return Err(format!("{kind:?} is not a buffer attack")),
    }
    .to_string();
    let mut sent = 0;
    for _ in 0..args.count {
        if sink.send(Message::text(event.clone())).await.is_err() {
            break;
        }
        sent += 1;
    }
    drain(&mut stream, &mut answers, Duration::from_secs(3)).await;
    let _ = sink.send(Message::text(client::close_event())).await;
    drop(holder);
    let mut report = answers.json();
    report["kind"] = json!(format!("{kind:?}").to_lowercase());
    report["sent"] = json!(sent);
    report["bytes_each"] = json!(event.len());
    Ok(report)
}

async fn wait_for(stream: &mut SplitStream<Ws>, kind: &str) -> Result<(), String> {
    loop {
        let text = client::next(stream, Duration::from_secs(60)).await?.ok_or("closed")?;
        if client::event_type(&text).as_deref() == Some(kind) {
            return Ok(());
        }
    }
}

/// `--count` connections, each sending `--bytes` of a text message it never finishes.
async fn fragments(args: &FloodArgs) -> Result<Value, String> {
    let mut conns = Vec::new();
    for _ in 0..args.count {
        let mut ws = connect(args, "/v1/realtime?mode=audio").await?;
        let first = Frame::message(Bytes::from(vec![b' '; args.bytes]), OpCode::Data(Data::Text), false);
        if ws.send(Message::Frame(first)).await.is_err() {
            continue;
        }
        conns.push(ws);
    }
    let mut closes = BTreeMap::<String, u64>::new();
    for ws in &mut conns {
        let mut answers = Answers::default();
        drain(ws, &mut answers, Duration::from_millis(200)).await;
        let key = answers.close.map_or("open".to_string(), |c| c.to_string());
        *closes.entry(key).or_default() += 1;
    }
    Ok(json!({"kind": "fragments", "sent": conns.len(), "closes": closes}))
}
