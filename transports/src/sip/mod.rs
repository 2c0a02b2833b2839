//! Phone calls from a SIP trunk (`[sip]`): a carrier or a PBX sends an INVITE over UDP, the
//! gateway answers it with SDP, and the call's voice travels as G.711 over RTP on a port of its
//! own. The session behind it is an ordinary session of the OpenAI dialect (server VAD turning),
//! which the call opens as any client does, through the server that runs the edge ([`CallHost`]).
//!
//! SIP itself (parsing, transactions and their retransmissions, the INVITE dialog, CANCEL,
//! BYE, re-INVITE) is ezk's (`ezk-sip-core`, `ezk-sip-ua`), running on an arbiter of its own.
//! Every request first meets the [`gate`] (strangers, rates, dialogs from elsewhere, methods not
//! served: dropped or answered once, before any transaction). Then one signalling task per call
//! ([`invite::answer`]) takes the INVITE, checks its credentials (`[[sip.users]]`) and which
//! number it called (no route: 404), agrees on the
//! media ([`sdp`]; nothing it can take: 488), binds the call's RTP port, starts the call's
//! edge ([`call::SipCall`], which starts the session; a refusal of the admission is answered
//! with its SIP code), answers 200, and then carries the dialog: a re-INVITE is answered and
//! its media handed to the edge, a BYE ends the session, and the session's end sends a BYE.
//! A route whose calls the app accepts (`accept = "webhook"`) rings instead (`accept`): the call
//! is offered to the app (`realtime.call.incoming`) and waits for its decision ([`offers`]).
//! - [`sdp`]: the offer and the answer;
//! - [`offers`]: the calls offered to the app, ringing or answered;
//! - [`digest`]: the trunks' credentials (`[[sip.users]]`), when set;
//! - [`sideband`]: the app's WebSocket on a call it accepted;
//! - [`rtp`]: the jitter buffer, RFC 4733 keys, the packets out;
//! - [`voice`]: the voice in the agreed codec (G.711 or Opus), both ways;
//! - [`call`]: the edge actor.

mod accept;
pub mod call;
pub mod config;
pub mod digest;
pub mod gate;
mod invite;
pub mod offers;
pub mod rtp;
pub mod sdp;
pub mod sideband;
pub mod voice;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use actix::ArbiterHandle;
use ezk_sip_core::{Endpoint, IncomingRequest, Layer, MayTake};
use ezk_sip_types::header::typed::Contact;
use ezk_sip_types::uri::{NameAddr, SipUri};
use ezk_sip_types::{Method, StatusCode};
use ezk_sip_ua::dialog::DialogLayer;
use ezk_sip_ua::invite::InviteLayer;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::StartSession;
use crate::caller::{Caller, Refusal};
use crate::incoming::IncomingBudget;
use config::SipRouteEntry;
pub use config::{SipConfig, SipSpec};
use omni_actors::edge::client::CallSettings;
use omni_actors::observe::metrics::metrics;

/// What the SIP edge asks of the server it runs in: a call's session admitted (the server's
/// checks, its dialect, its caps), the app told of a call that rings, and whether the server is
/// stopping.
pub trait CallHost: Send + Sync + 'static {
    /// Admits the session of a call from `caller`: how its edge starts it (with the call's
    /// settings, then the app's), or why it is refused. Called on the calls' arbiter, where the
    /// edge and its session run.
    fn admit(&self, caller: &Caller, call: CallStart) -> Result<StartSession, Refusal>;

    /// Tells the app of a call that rings (`realtime.call.incoming` with `data`), to be told by
    /// `deadline` and while `settled` is not set: how many of its webhooks took it.
    fn offer(&self, data: &serde_json::Value, deadline: std::time::Instant, settled: &Arc<AtomicBool>) -> usize;

    /// Whether the server is stopping (OPTIONS says so, for a trunk that fails over).
    fn shutting_down(&self) -> bool;
}

/// What a call's session starts with.
pub struct CallStart {
    /// The model it speaks as.
    pub model: String,
    /// A call the app accepted counts as this key's.
    pub key_id: Option<String>,
    /// Its route's settings, handed to the session first.
    pub settings: CallSettings,
    /// The app's settings from its accept, in the session's dialect (written by the server's
    /// accept route): handed after the route's, as the app's own.
    pub app: Option<String>,
}

/// What the SIP edge is given by the server that starts it.
pub struct SipParts {
    pub spec: SipSpec,
    pub host: Arc<dyn CallHost>,
    /// The model a route that names none speaks as.
    pub default_model: String,
    /// Calls offered to the app, ringing or answered (the accept routes' book too).
    pub offers: Arc<offers::Offers>,
    /// `server.max_connections_per_ip`: calls ringing per trunk address (0: no cap).
    pub max_connections_per_ip: usize,
    /// `server.max_incoming_bytes`: what a call's session may have been handed and not handled.
    pub max_incoming_bytes: usize,
    pub incoming: Arc<IncomingBudget>,
    /// Told whether the edge reads its port (for `/status` and `/readyz`).
    pub liveness: Arc<SipLiveness>,
}

/// Whether the SIP edge reads its port: not started (SIP off, or not bound yet), up, or
/// stopped (nothing reads the port any more: the server is not ready).
#[derive(Debug, Default)]
pub struct SipLiveness(AtomicU8);

impl SipLiveness {
    const UP: u8 = 1;
    const STOPPED: u8 = 2;

    /// `None` while the edge is not started; else whether it reads its port.
    pub fn up(&self) -> Option<bool> {
        match self.0.load(Ordering::Relaxed) {
            Self::UP => Some(true),
            Self::STOPPED => Some(false),
            _ => None,
        }
    }

    fn set(&self, state: u8) {
        self.0.store(state, Ordering::Relaxed);
        metrics().sip_up.set(i64::from(state == Self::UP));
    }
}

/// The SIP edge: what every call's signalling task shares.
pub struct Sip {
    spec: SipSpec,
    host: Arc<dyn CallHost>,
    default_model: String,
    offers: Arc<offers::Offers>,
    max_connections_per_ip: usize,
    max_incoming_bytes: usize,
    incoming: Arc<IncomingBudget>,
    /// Where the calls' edges (and their sessions) run.
    arbiter: ArbiterHandle,
    /// The trunks' credentials, when INVITEs must prove one.
    guard: Option<digest::Guard>,
    /// Where the next RTP port search starts.
    cursor: AtomicU32,
    calls: AtomicU64,
    /// The first look's rules and state ([`gate`]), and the clock its seconds count from.
    screen: Arc<Mutex<gate::Screen>>,
    started: Instant,
    /// A place for each call being set up or carried: one per RTP port pair.
    places: Arc<Semaphore>,
}

/// Starts the SIP edge: binds `[sip] bind`, and answers INVITEs from then on. Answers the bound
/// address, or why it could not bind.
pub async fn start(parts: SipParts) -> std::io::Result<SocketAddr> {
    let arbiter = actix::Arbiter::new();
    let SipParts { spec, host, default_model, offers, max_connections_per_ip, max_incoming_bytes, incoming, liveness } =
        parts;
    let guard = digest::Guard::new(&spec.realm, spec.digest_algorithm, &spec.users);
    let allowed = spec.clone();
    let screen = gate::Screen::new(move |ip| allowed.network_of(ip), spec.max_invites_per_s_per_ip);
    let pairs = (usize::from(spec.rtp_ports.end().saturating_sub(*spec.rtp_ports.start())) / 2 + 1).max(1);
    let sip = Arc::new(Sip {
        spec,
        host,
        default_model,
        offers,
        max_connections_per_ip,
        max_incoming_bytes,
        incoming,
        guard,
        arbiter: arbiter.handle(),
        cursor: AtomicU32::new(0),
        calls: AtomicU64::new(0),
        screen: Arc::new(Mutex::new(screen)),
        started: Instant::now(),
        places: Arc::new(Semaphore::new(pairs)),
    });
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let bind = sip.spec.bind;
    arbiter.spawn(async move {
        let mut builder = Endpoint::builder();
        builder.user_agent("omni-gateway");
        builder.add_layer(gate::Gate(sip.clone()));
        builder.add_layer(DialogLayer::default());
        builder.add_layer(InviteLayer::default());
        builder.add_layer(Answering(sip));
        match builder.bind_udp(bind).await {
            Ok(udp) => {
                let _endpoint = builder.build();
                let _ = bound_tx.send(Ok(bind));
                liveness.set(SipLiveness::UP);
                watch(udp, &liveness, bind).await;
                // The endpoint lives as long as the arbiter (the calls it carries go on).
                std::future::pending::<()>().await;
            }
            Err(e) => drop(bound_tx.send(Err(e))),
        }
    });
    // The arbiter lives until the process ends.
    std::mem::forget(arbiter);
    bound_rx.await.map_err(|_| std::io::Error::other("the SIP edge's arbiter stopped"))?
}

/// Watches the task that reads the SIP port until it ends (it should not: a datagram that
/// makes the parser panic is dropped inside it), counting meanwhile the datagrams it
/// discarded; then the edge is stopped, and says so (`/readyz`, `omni_sip_up`, the log).
async fn watch(udp: ezk_sip_core::transport::TpHandle, liveness: &SipLiveness, bind: SocketAddr) {
    use ezk_sip_core::transport::{TransportState, discarded_messages};
    let mut state = udp.watch_state();
    let mut counted = 0;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = state.wait_for(|s| matches!(s, TransportState::Closed(_))) => break,
            _ = tick.tick() => {}
        }
        let discarded = discarded_messages();
        metrics().sip_messages_discarded.inc_by(discarded.saturating_sub(counted));
        counted = discarded;
    }
    liveness.set(SipLiveness::STOPPED);
    log::error!(
        "sip: nothing reads {bind} any more (its receive task ended): SIP calls are not answered; restart the gateway"
    );
}

/// The layer of ezk's endpoint that takes INVITEs and OPTIONS outside a dialog (the [`gate`]
/// let them through).
struct Answering(Arc<Sip>);

#[async_trait::async_trait]
impl Layer for Answering {
    fn name(&self) -> &'static str {
        "omni-gateway"
    }

    async fn receive(&self, endpoint: &Endpoint, request: MayTake<'_, IncomingRequest>) {
        if request.line.method == Method::OPTIONS {
            // A trunk's keepalive (or a question of what the gateway takes): 200, stateless (a
            // lost answer is asked again by the next keepalive). A stopping gateway says so,
            // for a trunk that fails over by its keepalives.
            let code = if self.0.host.shutting_down() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
            return gate::stateless(endpoint, request.take(), code).await;
        }
        if request.line.method != Method::INVITE {
            return;
        }
        let invite = request.take();
        // A place for the call while it is set up and carried: none free, 503 (stateless;
        // nothing of the call is kept).
        let Ok(place) = self.0.places.clone().try_acquire_owned() else {
            metrics().sip_requests_refused.with_label_values(&["busy"]).inc();
            log::info!("sip: an INVITE from {} refused (503): every call's place is taken", invite.tp_info.source);
            return gate::stateless(endpoint, invite, StatusCode::SERVICE_UNAVAILABLE).await;
        };
        invite::answer(self.0.clone(), endpoint.clone(), invite).await;
        drop(place);
    }
}

impl Sip {
    /// A UDP socket for a call's RTP, on the first free even port of `rtp_ports` from the
    /// cursor (the odd one above is RTCP's, by RFC 3550's rule: a trunk may send it there, and
    /// another call must not be there to hear it).
    fn bind_rtp(&self) -> std::io::Result<UdpSocket> {
        let (first, last) = (*self.spec.rtp_ports.start(), *self.spec.rtp_ports.end());
        let first_even = first + first % 2;
        let size = (u32::from(last.saturating_sub(first_even)) / 2 + 1).max(1);
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % size;
        for i in 0..size {
            let port = first_even + 2 * ((start + i) % size) as u16;
            if port > last {
                continue;
            }
            match UdpSocket::bind(SocketAddr::new(self.spec.rtp_bind, port)) {
                Ok(socket) => return Ok(socket),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no free UDP port in sip.rtp_ports ({first}-{last})"),
        ))
    }

    /// The model a call to `route` speaks as: the one its accept asked for, else the route's,
    /// else the first served.
    fn model_of(&self, route: &SipRouteEntry, asked: Option<&str>) -> String {
        match asked.filter(|m| !m.is_empty()) {
            Some(m) => m.to_string(),
            None if !route.model.is_empty() => route.model.clone(),
            None => self.default_model.clone(),
        }
    }

    /// Where in-dialog requests (ACK, BYE, re-INVITE) reach this gateway: the address trunks
    /// reach it at (`public_ip`, behind NAT too), and the SIP port.
    fn contact(&self) -> Contact {
        let ip = self.spec.public_ip;
        let host = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let uri: SipUri =
            format!("sip:omni-gateway@{host}:{}", self.spec.bind.port()).parse().expect("a SIP URI of an address");
        Contact::new(NameAddr::uri(uri))
    }
}
