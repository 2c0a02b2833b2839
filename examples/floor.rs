//! The floor: the least a server speaking the MiniCPM-o dialect must do per chunk, and nothing
//! else. It takes a WebSocket, says `session.queue_done`, answers `session.init` with
//! `session.created`, and for each `input.append` parses the event, decodes its base64 float32
//! audio, checks every sample is a number, and answers as the reference backend does: a tone
//! makes it speak on that chunk and the next two (a text delta and an audio delta each, of
//! 24,000, 24,000 and 12,000 samples), anything else gets a `listen`. No queue, no actors, no
//! backend, no recording: the gateway's CPU per chunk is read against this one's, under the same
//! load generator (`scripts/floorcheck.sh`, docs/performance.md). It batches nothing and keeps no
//! bound: its tail and its memory are not a yardstick, its CPU is.
//!
//!     cargo run --release --example floor -- PORT

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio_tungstenite::tungstenite::Message;

/// What a chunk's event carries, borrowed from its text.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    input: Option<Input<'a>>,
}

#[derive(Deserialize)]
struct Input<'a> {
    #[serde(default, borrow)]
    audio: Option<&'a str>,
}

/// The reference backend's reply to a tone: samples per speaking step.
const REPLY: [usize; 3] = [24_000, 24_000, 12_000];
/// The loudness (mean square) above which a chunk is a tone.
const LOUD: f32 = 1e-4;

/// One session: the steps of its reply still to speak.
#[derive(Default)]
struct Session {
    chunks: u64,
    speaking: Option<usize>,
}

impl Session {
    /// The answers to one chunk's audio (`None`: not audio of numbers, no answer).
    fn answer(&mut self, samples: &[u8], voice: &[Vec<u8>; 3]) -> Option<Vec<String>> {
        let mut energy = 0.0f32;
        for b in samples.chunks_exact(4) {
            let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if !x.is_finite() {
                return None;
            }
            energy += x * x;
        }
        self.chunks += 1;
        let id = self.chunks;
        if self.speaking.is_none() && energy / (samples.len() / 4).max(1) as f32 > LOUD {
            self.speaking = Some(0);
        }
        let Some(step) = self.speaking else {
            return Some(vec![format!(
                r#"{{"type":"response.output.delta","input_id":"input_{id}","kind":"listen"}}"#
            )]);
        };
        self.speaking = (step + 1 < REPLY.len()).then_some(step + 1);
        let last = self.speaking.is_none();
        Some(vec![
            format!(
                r#"{{"type":"response.output.delta","input_id":"input_{id}","kind":"text","text":"Reply piece {step}."}}"#
            ),
            // Encoded for each answer, as any server encodes the voice it sends.
            format!(
                r#"{{"type":"response.output.delta","input_id":"input_{id}","kind":"audio","audio":"{}","end_of_turn":{last}}}"#,
                base64_simd::STANDARD.encode_to_string(&voice[step])
            ),
        ])
    }
}

async fn serve(socket: tokio::net::TcpStream, voice: std::sync::Arc<[Vec<u8>; 3]>) {
    let _ = socket.set_nodelay(true);
    let Ok(mut ws) = tokio_tungstenite::accept_async(socket).await else { return };
    if ws.send(Message::text(r#"{"type":"session.queue_done"}"#)).await.is_err() {
        return;
    }
    let mut session = Session::default();
    let mut audio = Vec::with_capacity(64 * 1024);
    while let Some(Ok(message)) = ws.next().await {
        let text = match message {
            Message::Text(text) => text,
            Message::Close(_) => break,
            _ => continue,
        };
        let Ok(event) = serde_json::from_str::<Event>(&text) else { continue };
        let answers = match event.kind.as_ref() {
            "session.init" => vec![r#"{"type":"session.created","session_id":"floor"}"#.to_string()],
            "input.append" => {
                let Some(b64) = event.input.and_then(|i| i.audio) else { continue };
                audio.clear();
                if base64_simd::STANDARD.decode_append(b64, &mut audio).is_err() {
                    continue;
                }
                let Some(answers) = session.answer(&audio, &voice) else { continue };
                answers
            }
            "session.close" => {
                let _ = ws.send(Message::text(r#"{"type":"session.closed","reason":"user_stop"}"#)).await;
                break;
            }
            _ => continue,
        };
        for answer in answers {
            if ws.feed(Message::text(answer)).await.is_err() {
                return;
            }
        }
        if ws.flush().await.is_err() {
            return;
        }
    }
}

fn main() {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).expect("usage: floor PORT");
    // The voice of each step, made once: the floor does not synthesise (the gateway's backend
    // does, inline, and that is counted against the gateway).
    let voice = REPLY.map(|n| (0..n).flat_map(|i| (0.2 * (i as f32 * 0.06).sin()).to_le_bytes()).collect::<Vec<u8>>());
    let voice = std::sync::Arc::new(voice);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("the port");
        println!("floor listening on 127.0.0.1:{port}");
        loop {
            let Ok((socket, _)) = listener.accept().await else { continue };
            tokio::spawn(serve(socket, voice.clone()));
        }
    });
}
