//! WebRTC calls, as the OpenAI Realtime API has them: a client posts an SDP offer to
//! `POST /v1/realtime/calls` and gets the answer; its voice and the model's travel as Opus on
//! one audio track, every other event as JSON on the `oai-events` data channel. The session
//! behind a call is an ordinary session of the OpenAI dialect.
//!
//! - [`Calls`]: the calls in progress, by id (for hanging up), their UDP ports, and
//!   [`Calls::answer`]: an offer in, a negotiated `Rtc` on its own port and the answer out
//!   (ICE-lite with host candidates, DTLS-SRTP, Opus only), on `str0m`, a sans-IO stack;
//! - [`call`]: the edge actor between a call's socket and its session;
//! - [`codec`]: Opus both ways (libopus);
//! - [`crate::playout`] (shared with SIP calls): the model's voice, 20 ms at a time, and
//!   when it started, stopped or was cleared (told to the session as `Playback`, for its
//!   dialect to tell the client).

pub mod call;
pub mod codec;
pub mod pending;

pub mod config;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use actix::Addr;
use parking_lot::Mutex;
use str0m::change::SdpOffer;
use str0m::{Candidate, Rtc, RtcConfig};

use crate::webrtc::config::WebRtcSpec;
use call::{CallEdge, Hangup};

/// Why an offer got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The offer is not SDP, or not one this server can answer (400).
    #[error("{0}")]
    Offer(String),
    /// No UDP port of `webrtc.ports` is free (503).
    #[error("no free UDP port in webrtc.ports ({first}-{last})")]
    NoPort { first: u16, last: u16 },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A negotiated call, before its actor starts.
pub struct Answered {
    pub rtc: Rtc,
    pub socket: UdpSocket,
    pub sdp: String,
}

/// A call in progress: who may hang it up.
struct Live {
    call: Addr<CallEdge>,
    /// The id of the API key that opened it (or minted the secret it was opened with).
    key_id: Option<String>,
    /// The SHA-256 of the client secret it was opened with: a page holding only that secret
    /// may hang it up.
    secret: Option<[u8; 32]>,
}

/// Who asks to hang a call up.
#[derive(Debug, Clone, Copy)]
pub enum Hanger<'a> {
    /// An API key (its id; None on a gateway without keys).
    Key(Option<&'a str>),
    /// A client secret, presented again: the one the call was opened with.
    Secret(&'a str),
}

fn digest(secret: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(secret.as_bytes()).into()
}

/// What a hangup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HangUp {
    Done,
    NoSuchCall,
    /// The call was opened with another API key.
    NotYours,
}

/// The calls in progress (each with the id of the API key that opened it), and the UDP ports
/// they take.
pub struct Calls {
    spec: WebRtcSpec,
    live: Mutex<HashMap<String, Live>>,
    /// Those not yet connected, by who opened them (their caps).
    pending: Mutex<pending::Pending>,
    /// Where the next port search starts, so that a port just freed is not taken again at once.
    cursor: AtomicU32,
    crypto: Arc<str0m::config::CryptoProvider>,
}

impl Calls {
    pub fn new(spec: WebRtcSpec) -> Arc<Calls> {
        Arc::new(Calls {
            spec,
            live: Mutex::new(HashMap::new()),
            pending: Mutex::default(),
            cursor: AtomicU32::new(0),
            crypto: Arc::new(str0m::crypto::from_feature_flags()),
        })
    }

    pub fn spec(&self) -> &WebRtcSpec {
        &self.spec
    }

    /// Call `id` is live, opened with API key `key_id` (or a secret it minted: `secret`).
    pub fn insert(&self, id: String, call: Addr<CallEdge>, key_id: Option<String>, secret: Option<&str>) {
        self.live.lock().insert(id, Live { call, key_id, secret: secret.map(digest) });
    }

    pub fn remove(&self, id: &str) {
        self.live.lock().remove(id);
        self.pending.lock().settle(id);
    }

    /// Counts call `id` as not yet connected, unless its address or key is at its cap. Until
    /// [`Calls::connected`] (or [`Calls::remove`]).
    pub fn admit_unconnected(
        &self,
        id: &str,
        ip: Option<IpAddr>,
        key: Option<&str>,
    ) -> Result<(), pending::CallRefused> {
        let caps = pending::Caps {
            per_address: self.spec.max_unconnected_calls_per_ip,
            per_key: self.spec.max_unconnected_calls_per_key,
        };
        self.pending.lock().admit(id, ip, key, caps)
    }

    /// Call `id` is through ICE and DTLS.
    pub fn connected(&self, id: &str) {
        self.pending.lock().settle(id);
    }

    /// Hangs a call up for the API key `key_id` (none: no keys are configured). The call is
    /// gone for hangups at once: a second one finds no call, even before the call's actor has
    /// handled the first.
    pub fn hang_up(&self, id: &str, who: Hanger<'_>) -> HangUp {
        let mut live = self.live.lock();
        let Some(call) = live.get(id) else { return HangUp::NoSuchCall };
        let allowed = match who {
            Hanger::Key(key_id) => call.key_id.as_deref() == key_id,
            Hanger::Secret(secret) => call.secret.is_some_and(|d| d == digest(secret)),
        };
        if !allowed {
            return HangUp::NotYours;
        }
        if let Some(call) = live.remove(id) {
            call.call.do_send(Hangup);
        }
        HangUp::Done
    }

    /// A UDP socket on `webrtc.bind`, on the first free port of the range from the cursor.
    fn bind(&self) -> Result<UdpSocket, AnswerError> {
        let range: &RangeInclusive<u16> = &self.spec.ports;
        let (first, last) = (*range.start(), *range.end());
        let size = u32::from(last - first) + 1;
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % size;
        for i in 0..size {
            let port = first + ((start + i) % size) as u16;
            match UdpSocket::bind(SocketAddr::new(self.spec.bind, port)) {
                Ok(socket) => return Ok(socket),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(AnswerError::NoPort { first, last })
    }

    /// Answers an offer: a new `Rtc` (ICE-lite, Opus only) on its own port, with one host
    /// candidate per advertised address.
    pub fn answer(&self, offer: &str) -> Result<Answered, AnswerError> {
        let offer = SdpOffer::from_sdp_string(offer)
            .map_err(|e| AnswerError::Offer(format!("not an SDP offer: {}", parse_error(&e.to_string()))))?;
        let socket = self.bind()?;
        let port = socket.local_addr()?.port();
        let mut rtc = RtcConfig::new()
            .set_crypto_provider(self.crypto.clone())
            .set_ice_lite(true)
            .set_sctp_max_buffered_amount(call::CHANNEL_BUFFER)
            .clear_codecs()
            .enable_opus(true, false)
            .build(Instant::now());
        for ip in &self.spec.public_ips {
            let candidate = Candidate::host(SocketAddr::new(*ip, port), "udp")
                .map_err(|e| AnswerError::Offer(format!("cannot advertise {ip}: {e}")))?;
            rtc.add_local_candidate(candidate);
        }
        let answer = rtc.sdp_api().accept_offer(offer).map_err(|e| AnswerError::Offer(e.to_string()))?;
        Ok(Answered { rtc, socket, sdp: answer.to_sdp_string() })
    }
}

/// The SDP parser's words for a refused offer, without the memory address it names the place by
/// (`at PointerOffset(0x7f...)`: a heap address is not for a client) and on one line.
fn parse_error(said: &str) -> String {
    let mut out = String::with_capacity(said.len());
    let mut rest = said;
    while let Some(at) = rest.find(" at PointerOffset(") {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once(')').map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod parse_error_tests {
    #[test]
    fn a_parse_error_names_no_memory_address() {
        let said = "SDP parse: Parse error at PointerOffset(0x7fbcfc026fa5)\nUnexpected `n`\nExpected `o`\nsdp line\n";
        assert_eq!(super::parse_error(said), "SDP parse: Parse error; Unexpected `n`; Expected `o`; sdp line");
    }
}
