//! What a BackendActor and its `worker-host` child say to each other over the child's
//! stdin and stdout: length-prefixed frames (`u32` little-endian length, then the message
//! in postcard), one message per frame.
//!
//! The parent sends [`ToHost`]: first what to open, then owner-thread calls, which the child runs one at a time and
//! answers with one [`FromHost::Reply`] each, in order; and the any-thread calls
//! (interrupt, force-listen), which the child applies at once, even mid-call, and does not
//! answer. The child's first message is [`FromHost::Opened`].

use std::io::{self, Read, Write};

use omni_actors::domain::{BackendInfo, DuplexChunk, SessionSetup, StepOutcome, StepPiece, TurnInput, TurnPiece};
use omni_actors::edge::backend::BackendError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A frame larger than this is a broken peer, not a message (a minute of audio is 4 MB).
pub const MAX_FRAME_BYTES: usize = 256 << 20;

/// What the child opens: the parent's first message. Options travel here, never on the
/// command line, where every local user could read them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostOpen {
    /// A backend library; `None`: the built-in reference backend.
    pub library: Option<std::path::PathBuf>,
    pub options: Vec<(String, String)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ToHost {
    /// The first message: open this backend.
    Open(HostOpen),
    Prepare(SessionSetup),
    Reset,
    DuplexPrefill(DuplexChunk),
    DuplexGenerate,
    DuplexDrain,
    DuplexFinalize,
    /// Prefill, generate, drain and finalize in one round trip.
    DuplexStep(DuplexChunk),
    TurnPrefill(TurnInput),
    TurnGenerate,
    /// Any-thread: cut the call in flight short.
    Interrupt,
    /// Any-thread.
    ForceListen(bool),
}

impl ToHost {
    /// The call's name, for logs (never its data).
    pub fn kind(&self) -> &'static str {
        match self {
            ToHost::Open(_) => "Open",
            ToHost::Prepare(_) => "Prepare",
            ToHost::Reset => "Reset",
            ToHost::DuplexPrefill(_) => "DuplexPrefill",
            ToHost::DuplexGenerate => "DuplexGenerate",
            ToHost::DuplexDrain => "DuplexDrain",
            ToHost::DuplexFinalize => "DuplexFinalize",
            ToHost::DuplexStep(_) => "DuplexStep",
            ToHost::TurnPrefill(_) => "TurnPrefill",
            ToHost::TurnGenerate => "TurnGenerate",
            ToHost::Interrupt => "Interrupt",
            ToHost::ForceListen(_) => "ForceListen",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum FromHost {
    Opened(Result<BackendInfo, BackendError>),
    /// The answer to the oldest unanswered call, with the backend's KV length after it.
    Reply {
        kv_length: u64,
        value: Result<Value, BackendError>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Value {
    Done,
    Piece(StepPiece),
    MaybePiece(Option<StepPiece>),
    Outcome(StepOutcome),
    Turn(TurnPiece),
}

/// Writes one frame and flushes it.
pub(crate) fn write_frame<T: Serialize>(out: &mut impl Write, message: &T) -> io::Result<()> {
    let body = postcard::to_stdvec(message).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame over 4 GiB"))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    out.write_all(&frame)?;
    out.flush()
}

/// Reads one frame; `Ok(None)` at a clean end of the stream (between frames).
pub(crate) fn read_frame<T: DeserializeOwned>(input: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    buf.resize(len, 0);
    input.read_exact(buf)?;
    postcard::from_bytes(buf).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::SessionKind;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut wire = Vec::new();
        let chunk = DuplexChunk { audio: vec![0.5; 16000], frames: vec![vec![1, 2, 3]], ..Default::default() };
        write_frame(&mut wire, &ToHost::DuplexStep(chunk.clone())).unwrap();
        write_frame(&mut wire, &ToHost::Prepare(SessionSetup::new(SessionKind::Duplex))).unwrap();
        write_frame(&mut wire, &FromHost::Reply { kv_length: 7, value: Err(BackendError::Interrupted) }).unwrap();
        assert!(wire.len() < 16000 * 4 + 100, "audio travels as 4 bytes a sample: {}", wire.len());
        let (mut input, mut buf) = (&wire[..], Vec::new());
        match read_frame::<ToHost>(&mut input, &mut buf).unwrap() {
            Some(ToHost::DuplexStep(c)) => assert_eq!(c, chunk),
            other => panic!("{other:?}"),
        }
        assert!(matches!(read_frame::<ToHost>(&mut input, &mut buf).unwrap(), Some(ToHost::Prepare(_))));
        assert!(matches!(
            read_frame::<FromHost>(&mut input, &mut buf).unwrap(),
            Some(FromHost::Reply { kv_length: 7, value: Err(BackendError::Interrupted) })
        ));
        assert!(read_frame::<FromHost>(&mut input, &mut buf).unwrap().is_none());
    }

    #[test]
    fn a_torn_or_oversized_frame_is_an_error_not_a_panic() {
        let mut wire = Vec::new();
        write_frame(&mut wire, &ToHost::Reset).unwrap();
        let (mut torn, mut buf) = (&wire[..wire.len() - 1], Vec::new());
        assert!(read_frame::<ToHost>(&mut torn, &mut buf).is_err());
        let huge = (u32::MAX).to_le_bytes();
        assert!(read_frame::<ToHost>(&mut &huge[..], &mut buf).is_err());
        let garbage = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(read_frame::<ToHost>(&mut &garbage[..], &mut buf).is_err());
    }
}
