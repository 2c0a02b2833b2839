//! A second audio edge, written here and nowhere else: raw 16-bit PCM over a TCP socket, with
//! no dialect of its own. It proves the seam between edges and sessions from outside the
//! server's code: a caller described without HTTP passes the shared admission, its voice goes
//! to its session as samples, and the model's voice comes back as samples; the session, its
//! OpenAI-shaped dialect (server VAD, responses) and the reference backend are the ordinary
//! ones, in an in-process gateway on loopback ports.
//!
//! The toy protocol: the caller sends its API key and a newline, then its voice as 16-bit
//! little-endian mono PCM at 16 kHz; it receives the model's voice as 16-bit little-endian
//! mono PCM at 24 kHz. A refused caller gets `refused CODE` and a newline, and the socket
//! closes. When the caller shuts its side, its session ends.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use bytes::BytesMut;
use futures_util::StreamExt;
use omni_actors::edge::client::{CallerAudio, FromClient, ModelAudio, ToClient};
use omni_actors::protocol::CloseReason;
use omni_dialects::openai::Flavor;
use omni_gateway::admission::{self, Caller, Endpoint, Transport};
use omni_gateway::config::Config;
use omni_gateway::roles::Serving;
use omni_transports::{SessionPort, StartSession};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::{BytesCodec, FramedRead};

use crate::common::{WAIT, loud, quiet};

const KEY: &str = "pcm-edge-key-0123456789";

/// The edge of one caller: bytes in are its voice, the model's voice goes out as bytes; the
/// session's text events are noted (this transport has nowhere to send them).
/// The types of the events the session sent, and a wake-up for each one.
#[derive(Default)]
struct Texts {
    seen: Mutex<Vec<String>>,
    changed: tokio::sync::Notify,
}

impl Texts {
    /// Until an event of type `kind` was sent.
    async fn until(&self, kind: &str) {
        loop {
            let changed = self.changed.notified();
            if self.seen.lock().iter().any(|t| t == kind) {
                return;
            }
            changed.await;
        }
    }
}

struct PcmEdge {
    start: Option<StartSession>,
    session: Option<SessionPort>,
    writer: actix::io::Writer<OwnedWriteHalf, std::io::Error>,
    /// An odd byte of the voice, waiting for its pair.
    odd: Option<u8>,
    /// The type of every text event the session sent.
    texts: Arc<Texts>,
}

impl Actor for PcmEdge {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(start) = self.start.take() {
            self.session = Some(start(Box::new(ctx.address().recipient::<ToClient>())));
        }
    }
}

impl actix::io::WriteHandler<std::io::Error> for PcmEdge {}

impl StreamHandler<Result<BytesMut, std::io::Error>> for PcmEdge {
    fn handle(&mut self, bytes: Result<BytesMut, std::io::Error>, ctx: &mut Self::Context) {
        let Ok(bytes) = bytes else { return ctx.stop() };
        let mut all: Vec<u8> = self.odd.take().into_iter().collect();
        all.extend_from_slice(&bytes);
        if all.len() % 2 == 1 {
            self.odd = all.pop();
        }
        let samples = all.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0).collect();
        if let Some(session) = &self.session {
            session.do_send(FromClient::Audio(CallerAudio { samples, rate: 16000 }));
        }
    }

    fn finished(&mut self, ctx: &mut Self::Context) {
        // The caller shut its side: its session ends as a dropped connection's does.
        if let Some(session) = &self.session {
            session.do_send(FromClient::Ended(CloseReason::ClientGone));
        }
        ctx.stop();
    }
}

impl Handler<ToClient> for PcmEdge {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        match msg {
            ToClient::Audio(ModelAudio::Delta { samples, rate, .. }) => {
                assert_eq!(rate, 24000, "the model's voice rate");
                let bytes: Vec<u8> = samples
                    .iter()
                    .flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes())
                    .collect();
                self.writer.write(&bytes);
            }
            ToClient::Audio(ModelAudio::Done { .. } | ModelAudio::Clear) => {}
            ToClient::Text(text) => {
                let v: serde_json::Value = serde_json::from_str(&text).expect("the dialect's events are JSON");
                self.texts.seen.lock().push(v["type"].as_str().unwrap_or_default().to_string());
                self.texts.changed.notify_waiters();
            }
            ToClient::Notice(_) => {}
            ToClient::Close(_) => {
                self.writer.close();
                ctx.stop();
            }
        }
    }
}

/// Reads the key line, checks the caller as every transport does, and starts its edge.
async fn accept(stream: TcpStream, gw: Serving, texts: Arc<Texts>) {
    let peer = stream.peer_addr().expect("a peer");
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut key = String::new();
    if read.read_line(&mut key).await.is_err() {
        return;
    }
    let caller = Caller { ip: Some(peer.ip()), port: peer.port(), ..Caller::default() };
    let checked = match admission::authenticate(&caller, &gw, [Some(key.trim()), None, None], true).await {
        Ok(credential) => {
            let transport = Transport { name: "pcm-tcp", carries_audio: true };
            admission::admit(&caller, &gw, Endpoint::Realtime(Flavor::Ga, "omni".into()), credential, transport)
        }
        Err(refusal) => Err(refusal),
    };
    let admitted = match checked {
        Ok(admitted) => admitted,
        Err(refusal) => {
            let _ = write.write_all(format!("refused {}\n", refusal.code).as_bytes()).await;
            return;
        }
    };
    let start = admitted.starter(&gw);
    // What the key line's reader already took of the voice goes first.
    let early = read.buffer().to_vec();
    PcmEdge::create(move |ctx| {
        let early = futures_util::stream::iter((!early.is_empty()).then(|| Ok(BytesMut::from(&early[..]))));
        ctx.add_stream(early.chain(FramedRead::new(read.into_inner(), BytesCodec::new())));
        let writer = actix::io::Writer::new(write, ctx);
        PcmEdge { start: Some(start), session: None, writer, odd: None, texts }
    });
}

/// A gateway in this process on the reference backend, and the toy edge listening beside it.
async fn gateway(api_keys: &str) -> (std::net::SocketAddr, Arc<Texts>) {
    let toml = format!(
        "[server]\nbind = \"127.0.0.1:0\"\nmax_connections_per_ip = 0\nmax_waiting_per_ip = 0\n\
         [auth]\napi_keys = [{api_keys}]\n[webrtc]\nenabled = false\n[[workers]]\nname = \"ref\"\n"
    );
    let config = Config::parse(&toml, std::path::Path::new("pcm_edge.toml")).expect("a valid configuration");
    let gw = omni_gateway::roles::serve(Arc::new(config)).expect("a gateway has no store to open");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let texts = Arc::new(Texts::default());
    let seen = texts.clone();
    actix::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            actix::spawn(accept(stream, gw.clone(), seen.clone()));
        }
    });
    (addr, texts)
}

fn pcm16(samples: &[f32]) -> Vec<u8> {
    samples.iter().flat_map(|s| ((s * 32767.0) as i16).to_le_bytes()).collect()
}

#[actix::test]
async fn a_raw_pcm_edge_carries_a_session_to_the_reference_backend_and_back() {
    let (addr, texts) = gateway(&format!("\"{KEY}\"")).await;
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(format!("{KEY}\n").as_bytes()).await.unwrap();
    // The caller speaks once its session is created (what it said while it waited for a worker
    // would be dropped, as a call's is).
    tokio::time::timeout(WAIT, texts.until("session.created")).await.expect("the session created in time");
    // A second of speech to the energy detector, then a second of silence: the reference
    // backend answers the quiet step and the two after it (the dialect steps it with
    // silence while it speaks): 1 s, 1 s and 0.5 s of voice at 24 kHz.
    let mut voice = loud();
    voice.extend(quiet());
    for piece in pcm16(&voice).chunks(3201) {
        socket.write_all(piece).await.unwrap();
    }
    let mut heard = vec![0u8; 2 * 60_000];
    tokio::time::timeout(WAIT, socket.read_exact(&mut heard)).await.expect("the answer in time").unwrap();
    let samples: Vec<f32> = heard.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0).collect();
    let rms = (samples.iter().map(|s| s * s).sum::<f32>() / samples.len() as f32).sqrt();
    assert!(rms > 0.01, "the model's voice, not silence (rms {rms})");
    // The caller hangs up: the session ends, the edge closes, and nothing more came.
    socket.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, socket.read_to_end(&mut rest)).await.expect("closed in time").unwrap();
    assert!(rest.is_empty(), "2.5 s of voice and no more: {} bytes more", rest.len());
    let texts = texts.seen.lock().clone();
    for wanted in ["session.created", "input_audio_buffer.speech_started", "response.created", "response.done"] {
        assert!(texts.iter().any(|t| t == wanted), "{wanted} in {texts:?}");
    }
    assert!(!texts.iter().any(|t| t.contains("audio.delta")), "no voice in the dialect's events: {texts:?}");
}

#[actix::test]
async fn a_raw_pcm_caller_is_checked_as_every_caller_is() {
    let (addr, _) = gateway(&format!("\"{KEY}\"")).await;
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(b"not-the-key-at-all-0000\n").await.unwrap();
    let mut answer = String::new();
    let read = tokio::time::timeout(WAIT, socket.read_to_string(&mut answer)).await.expect("an answer in time");
    read.unwrap();
    assert_eq!(answer, "refused unauthorized\n");
    // Not a long wait for anything: the refusal is immediate, the socket is closed.
    assert!(tokio::time::timeout(Duration::from_secs(1), socket.read_u8()).await.expect("closed").is_err());
}
