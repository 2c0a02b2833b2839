//! `omni-gateway flood`: hostile load against a server, for the robustness tests and for
//! measuring how a well-behaved session fares meanwhile (`docs/reliability.md`).
//!
//! - `connect-drop`: open a WebSocket and drop it at once, `--count` times in a tight loop;
//! - `chunks`: one session sending 1 s audio chunks at `--rate` per second;
//! - `tiny`: one connection sending `--rate` tiny (invalid) events per second;
//! - `oversize`: one frame of exactly `--bytes`, and one of `--bytes` + 1, each on its own
//!   connection, reporting how the server answered each.
//!
//! And one attack per buffer a client can make the server hold (`--count` events, each
//! carrying about `--bytes`), against a server with one worker, which the tool first takes
//! with a session of its own when the attack needs to wait in the queue:
//! - `wav-rate`: legacy `session.update` with a 144-byte WAV declaring 4,294,967,291 Hz;
//! - `items`: OpenAI `conversation.item.create` with audio, while queued;
//! - `audio-buffer`: OpenAI manual-mode `input_audio_buffer.append`, never committed;
//! - `images`: OpenAI `input_image_buffer.append`, never sent with a step;
//! - `prelude`: `input.append` while queued (what a recording holds before an id);
//! - `turns`: chat `input.append` back to back;
//! - `fragments`: `--count` connections each sending `--bytes` of a message never finished.
//!
//! Prints one JSON line with what was sent and what came back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::client::{self, WireDialect};

mod args;
mod attack;

pub use args::{FloodArgs, FloodKind};

pub fn run(args: FloodArgs) -> Result<(), crate::ToolError> {
    flood(args).map_err(crate::ToolError::Flood)
}

fn flood(args: FloodArgs) -> Result<(), String> {
    let runtime = client::runtime()?;
    let report = runtime.block_on(async {
        match args.kind {
            FloodKind::ConnectDrop => connect_drop(&args).await,
            FloodKind::Chunks => stream_at_rate(&args, true).await,
            FloodKind::Tiny => stream_at_rate(&args, false).await,
            FloodKind::Oversize => oversize(&args).await,
            kind => attack::run(kind, &args).await,
        }
    })?;
    println!("{report}");
    Ok(())
}

async fn connect_drop(args: &FloodArgs) -> Result<Value, String> {
    let started = Instant::now();
    let (mut opened, mut failed) = (0usize, BTreeMap::<String, usize>::new());
    for _ in 0..args.count {
        match client::connect(&args.url, &args.mode, args.api_key.as_deref()).await {
            Ok(ws) => {
                opened += 1;
                drop(ws);
            }
            Err(e) => *failed.entry(e).or_default() += 1,
        }
    }
    Ok(json!({"kind": "connect-drop", "opened": opened, "failed": failed, "seconds": started.elapsed().as_secs_f64()}))
}

/// One connection sending frames at `rate` per second while a reader counts what comes back.
async fn stream_at_rate(args: &FloodArgs, chunks: bool) -> Result<Value, String> {
    let ws = client::connect(&args.url, &args.mode, args.api_key.as_deref()).await?;
    let (mut sink, mut stream) = ws.split();
    if chunks {
        // A session first: wait for a worker, initialise.
        loop {
            match client::next(&mut stream, Duration::from_secs(60)).await? {
                Some(t) if client::event_type(&t).as_deref() == Some("session.queue_done") => break,
                Some(_) => {}
                None => return Err("closed while waiting for a worker".into()),
            }
        }
        let init = client::init_event(WireDialect::Current, "You are a test.");
        sink.send(Message::Text(init.into())).await.map_err(|e| e.to_string())?;
    }
    let reader = tokio::spawn(async move {
        let mut seen = BTreeMap::<String, usize>::new();
        while let Ok(Some(text)) = client::next(&mut stream, Duration::from_secs(30)).await {
            let kind = match client::event_type(&text).as_deref() {
                Some("error") => {
                    let v: Value = serde_json::from_str(&text).unwrap_or_default();
                    format!("error:{}", v["error"]["code"].as_str().unwrap_or("?"))
                }
                Some(other) => other.to_string(),
                None => "?".into(),
            };
            *seen.entry(kind).or_default() += 1;
        }
        seen
    });
    let frame: Utf8Bytes = if chunks {
        client::chunk_event(WireDialect::Current, &client::second(true), &[], false).into()
    } else {
        r#"{"type":"input.append","input":{"audio":""}}"#.into()
    };
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = (args.rate * args.seconds).round() as usize;
    let mut sent = 0usize;
    let started = Instant::now();
    for _ in 0..total {
        ticker.tick().await;
        if sink.send(Message::Text(frame.clone())).await.is_err() {
            break;
        }
        sent += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Let the answers arrive, then leave.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = sink.send(Message::Text(client::close_event().into())).await;
    let _ = sink.close().await;
    let seen = tokio::time::timeout(Duration::from_secs(30), reader).await.map_err(|_| "the reader hung")?;
    let kind = if chunks { "chunks" } else { "tiny" };
    Ok(json!({"kind": kind, "sent": sent, "seconds": elapsed, "received": seen.unwrap_or_default()}))
}

/// A frame of exactly `bytes`, then one of `bytes + 1`, each on a new connection.
async fn oversize(args: &FloodArgs) -> Result<Value, String> {
    let mut outcomes = Vec::new();
    for size in [args.bytes, args.bytes + 1] {
        let ws = client::connect(&args.url, &args.mode, args.api_key.as_deref()).await?;
        let (mut sink, mut stream) = ws.split();
        // A valid event padded to the size: its audio is base64 of zeros.
        let head = r#"{"type":"input.append","input":{"audio":""#;
        let tail = r#""}}"#;
        let pad = size.saturating_sub(head.len() + tail.len());
        let frame = format!("{head}{}{tail}", "A".repeat(pad));
        let sent = sink.send(Message::Text(frame.into())).await.is_ok();
        // The server's answer: an event, or a close code.
        let outcome = loop {
            match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
                Err(_) => break json!("no answer"),
                Ok(None) => break json!("dropped"),
                Ok(Some(Ok(Message::Close(frame)))) => {
                    break json!({"close": frame.map(|f| u16::from(f.code))});
                }
                Ok(Some(Ok(Message::Text(t)))) => match client::event_type(&t).as_deref() {
                    Some("session.queued") | Some("session.queue_update") | Some("session.queue_done") => {}
                    Some("error") => {
                        let v: Value = serde_json::from_str(&t).unwrap_or_default();
                        break json!({"error": v["error"]["code"]});
                    }
                    other => break json!({"event": other}),
                },
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(e))) => break json!({"failed": e.to_string()}),
            }
        };
        outcomes.push(json!({"bytes": size, "sent": sent, "answer": outcome}));
    }
    Ok(json!({"kind": "oversize", "frames": outcomes}))
}
