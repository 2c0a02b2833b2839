//! What a gateway and a node say to each other over TCP (or TLS): the frames of the
//! `worker-host` protocol ([`crate::ipc`]: a little-endian `u32` length, then the
//! message in postcard), wrapped in a handshake, a heartbeat and the node's answers.
//!
//! Every connection opens with the handshake ([`crate::link::handshake`]): [`ToNode::Hello`],
//! [`FromNode::Challenge`] (the node proves it holds the token), [`ToNode::Prove`] (the
//! gateway proves it too, with its [`Request`]). The request chooses the connection's kind:
//! - discovery: [`Request::Discover`], answered with [`FromNode::Workers`] (or
//!   [`FromNode::Refused`]), then closed;
//! - a link kept open for grants (a replica of a cluster keeps a few to each node):
//!   [`Request::Standby`], answered [`FromNode::Ready`]; each [`ToNode::Ping`] on it is
//!   answered with [`FromNode::Ping`] until the node grants a worker to one of that replica's
//!   tickets: it attaches the worker to the link itself and says so with [`FromNode::Granted`],
//!   and the link goes on as a worker link (the replica never sends an attach on it);
//! - a worker link: [`Request::Attach`], answered with [`FromNode::Attached`] (the worker's
//!   backend info) or [`FromNode::Refused`]; then [`ToNode::Call`]s answered in order by
//!   [`FromNode::Reply`], the any-thread calls applied at once, and [`ToNode::Ping`] /
//!   [`FromNode::Ping`] whenever a side has had nothing else to say for a heartbeat interval.

use std::io;

use futures_util::StreamExt;
use omni_actors::domain::{BackendInfo, Mode};
use omni_actors::edge::backend::BackendError;
use omni_actors::status::WorkerStatus;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

pub use crate::ipc::MAX_FRAME_BYTES;
use crate::ipc::{ToHost, Value};

/// The version of this protocol; a node refuses another.
/// 8: ABI 1.3 (tools, calls, prefill-only turns) in the setups, turns and outputs it carries.
/// 9: the handshake is SPAKE2. 10: a replica proves its own name (its credential). 11: what a
/// backend ignores is typed (`SetupField`).
pub const PROTOCOL: u32 = 11;

#[derive(Debug, Serialize, Deserialize)]
pub enum ToNode {
    /// A connection's first frame: the protocol, and the gateway's nonce for the handshake.
    /// (First in the enum: an older gateway's discovery reads as a hello of its protocol, and is
    /// told which protocol this node speaks.)
    Hello {
        protocol: u32,
        nonce: Vec<u8>,
        /// The gateway's SPAKE2 message (protocol 9).
        pake: Vec<u8>,
        /// A replica of a cluster: the name its credential is for, the password of its SPAKE2
        /// message ([`crate::link::replica`]). None: a gateway with the node's token.
        replica: Option<String>,
    },
    /// The gateway's proof that it holds the token, over both nonces and its request.
    Prove {
        proof: Vec<u8>,
        request: Request,
    },
    /// An owner-thread call (answered by one `Reply`, in order), or an any-thread call
    /// (interrupt, force-listen: applied at once, not answered).
    Call(ToHost),
    /// The gateway gave up on the call in flight (its step watchdog fired): end the
    /// backend at once; the node opens it again.
    Terminate,
    Ping,
}

impl ToNode {
    /// The message's kind, for logs: never its fields.
    pub fn kind(&self) -> &'static str {
        match self {
            ToNode::Hello { .. } => "Hello",
            ToNode::Prove { .. } => "Prove",
            ToNode::Call(_) => "Call",
            ToNode::Terminate => "Terminate",
            ToNode::Ping => "Ping",
        }
    }
}

/// What a gateway asks of a node, once both proved they hold its token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// The node's workers ([`FromNode::Workers`]).
    Discover,
    /// A worker link. `gateway` names the gateway in the node's logs. A node of a cluster
    /// admits it only with the grant it offered the worker under.
    Attach { worker: String, gateway: String, grant: Option<AttachGrant> },
    /// A link opened ahead of grants (a replica of a cluster keeps a few per node): answered
    /// [`FromNode::Ready`], then pinged (each ping answered) until the node pushes a grant on
    /// it ([`FromNode::Granted`]). `gateway` is the replica's name in the cluster's store.
    Standby { gateway: String },
}

/// The grant a gateway of a cluster attaches with: the ticket it is for, and the nonce the
/// node offered the worker under (one use: the node draws a new one for its next offer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttachGrant {
    pub ticket: u64,
    pub nonce: String,
    pub mode: Mode,
}

/// One of a node's workers, as discovery reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeWorker {
    pub name: String,
    pub modes: Vec<Mode>,
    /// Where its backend comes from on the node ("builtin", a library path).
    pub backend: String,
    /// Its state, in the words every role uses (`starting`, `idle`, `busy`: lent to a
    /// gateway, `failed`).
    pub state: WorkerStatus,
    /// Why it failed.
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum FromNode {
    Workers(Vec<NodeWorker>),
    Attached(BackendInfo),
    Refused(String),
    Reply {
        kv_length: u64,
        value: Result<Value, BackendError>,
    },
    Ping,
    /// The answer to [`Request::Standby`].
    Ready,
    /// On a link kept open for grants: the node granted `grant.slot` to one of the replica's
    /// tickets and attached it to this link, which is now that worker's link.
    Granted {
        grant: PushedGrant,
        info: BackendInfo,
    },
    /// The answer to a [`ToNode::Hello`]: the node's nonce, its SPAKE2 message, and its proof
    /// that it holds the token (under the key both derive) over what both said.
    Challenge {
        nonce: Vec<u8>,
        pake: Vec<u8>,
        proof: Vec<u8>,
    },
}

impl FromNode {
    /// The message's kind, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            FromNode::Workers(_) => "Workers",
            FromNode::Attached(_) => "Attached",
            FromNode::Refused(_) => "Refused",
            FromNode::Reply { .. } => "Reply",
            FromNode::Ping => "Ping",
            FromNode::Ready => "Ready",
            FromNode::Granted { .. } => "Granted",
            FromNode::Challenge { .. } => "Challenge",
        }
    }
}

/// A grant a node pushes to the replica of its ticket (as the store records it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushedGrant {
    pub ticket: u64,
    /// `NODE/WORKER`.
    pub slot: String,
    /// The node's advertised address.
    pub addr: String,
    pub nonce: String,
    pub mode: Mode,
    /// The node's signature of the grant ([`crate::link::grant::sign`]).
    pub sig: String,
}

impl From<PushedGrant> for omni_actors::edge::coordinator::Grant {
    fn from(g: PushedGrant) -> Self {
        omni_actors::edge::coordinator::Grant {
            ticket: g.ticket,
            slot: g.slot,
            addr: g.addr,
            nonce: g.nonce,
            mode: g.mode,
            sig: g.sig,
        }
    }
}

/// The largest frame either side reads from a peer that has not proved it holds the token (the
/// handshake), and a node reads on a link no worker is attached to (a link kept open for
/// grants): a stranger cannot make it buffer a worker link's largest frame.
pub const MAX_UNPROVEN_FRAME: usize = 4096;

/// The frames read from a stream, one at a time and cancel safe: a frame half read when a
/// `select!` takes another branch stays buffered for the next [`next_frame`].
pub type Frames<R> = FramedRead<R, LengthDelimitedCodec>;

/// Reads the frames [`write_frame`] writes (a little-endian `u32` length, then the body), each
/// at most `max` bytes (a longer one is an error before any of it is buffered).
pub fn frames_up_to<R: AsyncRead>(input: R, max: usize) -> Frames<R> {
    let codec =
        LengthDelimitedCodec::builder().little_endian().length_field_length(4).max_frame_length(max).new_codec();
    FramedRead::new(input, codec)
}

/// [`frames_up_to`] a worker link's largest frame.
pub fn frames<R: AsyncRead>(input: R) -> Frames<R> {
    frames_up_to(input, MAX_FRAME_BYTES)
}

/// The next frame; `Ok(None)` at a clean end of the stream (between frames).
pub async fn next_frame<T: DeserializeOwned, R: AsyncRead + Unpin>(frames: &mut Frames<R>) -> io::Result<Option<T>> {
    match frames.next().await {
        None => Ok(None),
        Some(body) => {
            let body = body?;
            postcard::from_bytes(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        }
    }
}

/// Writes one frame.
pub async fn write_frame<T: Serialize>(out: &mut (impl AsyncWrite + Unpin), message: &T) -> io::Result<()> {
    let body = postcard::to_stdvec(message).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame over 4 GiB"))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    out.write_all(&frame).await?;
    out.flush().await
}

/// Reads one frame of at most `max` bytes; `Ok(None)` at a clean end of the stream (between
/// frames). The body is buffered as its bytes arrive: a length the peer announces is checked
/// against `max` and never sizes a buffer by itself.
pub async fn read_frame<T: DeserializeOwned>(
    input: &mut (impl AsyncRead + Unpin),
    max: usize,
) -> io::Result<Option<T>> {
    let Some(body) = read_frame_bytes(input, max).await? else { return Ok(None) };
    postcard::from_bytes(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// One frame's bytes, not decoded (at most `max`).
pub async fn read_frame_bytes(input: &mut (impl AsyncRead + Unpin), max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes, over the {max} allowed"),
        ));
    }
    let mut body = Vec::with_capacity(len.min(MAX_UNPROVEN_FRAME));
    (&mut *input).take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the frame ended early"));
    }
    Ok(Some(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_over_a_stream() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let chunk = omni_actors::domain::DuplexChunk { audio: vec![0.25; 16000], ..Default::default() };
        write_frame(&mut a, &ToNode::Call(ToHost::DuplexStep(chunk.clone()))).await.unwrap();
        write_frame(&mut a, &ToNode::Ping).await.unwrap();
        drop(a);
        match read_frame::<ToNode>(&mut b, MAX_FRAME_BYTES).await.unwrap() {
            Some(ToNode::Call(ToHost::DuplexStep(c))) => assert_eq!(c, chunk),
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_frame::<ToNode>(&mut b, MAX_FRAME_BYTES).await.unwrap(), Some(ToNode::Ping)));
        assert!(read_frame::<ToNode>(&mut b, MAX_FRAME_BYTES).await.unwrap().is_none(), "a clean end");
    }

    #[tokio::test]
    async fn a_frame_half_read_when_a_select_moves_on_is_read_whole_next_time() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let mut frames = frames(b);
        let body = postcard::to_stdvec(&ToNode::Ping).unwrap();
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        // Two bytes of the length arrive; the read is given up (a select's other branch).
        a.write_all(&frame[..2]).await.unwrap();
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(50), next_frame::<ToNode, _>(&mut frames));
        assert!(gave_up.await.is_err());
        a.write_all(&frame[2..]).await.unwrap();
        write_frame(&mut a, &ToNode::Terminate).await.unwrap();
        assert!(matches!(next_frame::<ToNode, _>(&mut frames).await.unwrap(), Some(ToNode::Ping)));
        assert!(matches!(next_frame::<ToNode, _>(&mut frames).await.unwrap(), Some(ToNode::Terminate)));
        drop(a);
        assert!(next_frame::<ToNode, _>(&mut frames).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_is_an_error() {
        let (mut a, b) = tokio::io::duplex(64);
        let mut frames = frames(b);
        a.write_all(&((MAX_FRAME_BYTES + 1) as u32).to_le_bytes()).await.unwrap();
        let e = next_frame::<ToNode, _>(&mut frames).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn a_length_over_the_limit_is_refused_before_anything_is_buffered() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&(256u32 << 20).to_le_bytes()).await.unwrap();
        let e = read_frame::<FromNode>(&mut b, MAX_UNPROVEN_FRAME).await.unwrap_err();
        assert!(e.to_string().contains("over the 4096 allowed"), "{e}");
    }

    #[tokio::test]
    async fn a_frame_that_ends_early_is_an_error_not_a_buffer_of_its_announced_length() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&(1u32 << 20).to_le_bytes()).await.unwrap();
        a.write_all(b"short").await.unwrap();
        drop(a);
        let e = read_frame::<FromNode>(&mut b, MAX_FRAME_BYTES).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }
}
