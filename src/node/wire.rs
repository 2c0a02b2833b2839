//! What a gateway and a node say to each other over TCP (or TLS): the frames of the
//! `worker-host` protocol ([`crate::backend::ipc`]: a little-endian `u32` length, then the
//! message in postcard), wrapped in a hello, a heartbeat and the node's answers.
//!
//! A connection is one of two kinds, chosen by its first frame:
//! - discovery: [`ToNode::Discover`], answered with [`FromNode::Workers`] (or
//!   [`FromNode::Refused`]), then closed;
//! - a link kept ready: [`ToNode::Standby`], answered [`FromNode::Ready`]; each
//!   [`ToNode::Ping`] on it is answered with [`FromNode::Ping`] until its `Attach` comes, and
//!   it goes on as a worker link;
//! - a worker link: [`ToNode::Attach`], answered with [`FromNode::Attached`] (the worker's
//!   backend info) or [`FromNode::Refused`]; then [`ToNode::Call`]s answered in order by
//!   [`FromNode::Reply`], the any-thread calls applied at once, and [`ToNode::Ping`] /
//!   [`FromNode::Ping`] whenever a side has had nothing else to say for a heartbeat interval.

use std::io;

use omni_actors::backend::BackendError;
use omni_actors::domain::{BackendInfo, Mode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::backend::ipc::{MAX_FRAME_BYTES, ToHost, Value};

/// The version of this protocol; a node refuses another.
pub const PROTOCOL: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
pub enum ToNode {
    /// A discovery connection's first frame.
    Discover {
        protocol: u32,
        token: String,
    },
    /// A worker link's first frame. `gateway` names the gateway in the node's logs. A node
    /// of a cluster admits it only with the grant it offered the worker under.
    Attach {
        protocol: u32,
        token: String,
        worker: String,
        gateway: String,
        grant: Option<AttachGrant>,
    },
    /// An owner-thread call (answered by one `Reply`, in order), or an any-thread call
    /// (interrupt, force-listen: applied at once, not answered).
    Call(ToHost),
    /// The gateway gave up on the call in flight (its step watchdog fired): end the
    /// backend at once; the node opens it again.
    Terminate,
    Ping,
    // New variants go last: postcard numbers them in order.
    /// A link opened ahead of a grant (a replica of a cluster keeps a few per node): answered
    /// [`FromNode::Ready`], then pinged (each ping answered) until its `Attach` comes.
    Standby {
        protocol: u32,
        token: String,
        gateway: String,
    },
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
    /// "starting", "ready", "attached" or "failed".
    pub state: String,
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
    /// The answer to [`ToNode::Standby`]: the token and protocol were accepted.
    Ready,
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

/// Reads one frame; `Ok(None)` at a clean end of the stream (between frames).
pub async fn read_frame<T: DeserializeOwned>(
    input: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    buf.resize(len, 0);
    input.read_exact(buf).await?;
    postcard::from_bytes(buf).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
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
        let mut buf = Vec::new();
        match read_frame::<ToNode>(&mut b, &mut buf).await.unwrap() {
            Some(ToNode::Call(ToHost::DuplexStep(c))) => assert_eq!(c, chunk),
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_frame::<ToNode>(&mut b, &mut buf).await.unwrap(), Some(ToNode::Ping)));
        assert!(read_frame::<ToNode>(&mut b, &mut buf).await.unwrap().is_none(), "a clean end");
    }
}
