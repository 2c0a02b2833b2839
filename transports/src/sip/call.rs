//! One SIP call's edge: the actor between the call's RTP socket and its session. The trunk's
//! frames are put back in order ([`super::rtp::Inbound`]), decoded ([`super::voice`]: G.711 at
//! 8 kHz, Opus at 16 kHz) and handed to the session (the dialect resamples); its RFC 4733 keys
//! are handed on as keys. The model's voice is encoded in 20 ms frames and paced out one
//! every 20 ms ([`crate::playout`], as a WebRTC call's);
//! when the caller speaks over it, what is queued is dropped. RTP from any address other than
//! the one agreed is dropped, but for symmetric RTP: a trunk behind NAT (or one that names
//! another of its addresses in SDP) sends from the address its SIP came from, and the call
//! latches on to that address (and sends there) when the agreed one has sent nothing yet. The SIP dialog itself (BYE, CANCEL, re-INVITE) is the signalling
//! task's ([`super`]): it tells this actor what changed, and this actor tells it to hang up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytestring::ByteString;
use omni_actors::edge::client::{ClientLine, FromClient, ModelAudio, Notice, ToClient};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::CloseReason;
use tokio::net::UdpSocket;
use tokio::sync::mpsc::UnboundedSender;

use super::rtp::{Datagram, Inbound, Outbound};
use super::sdp::Media;
use super::voice::Voice;
use crate::incoming::{Backlog, IncomingBudget};
use crate::outgoing::OutgoingLimit;
use crate::playout::{FRAME_MS, Playout};
use crate::{SessionPort, StartSession};

/// The largest datagram read.
const DATAGRAM_BYTES: usize = 2048;
/// No RTP from a call that is not on hold for this long: its trunk is gone.
pub const MEDIA_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the media timeout is looked at.
const MEDIA_CHECK: Duration = Duration::from_secs(1);
/// Keys closer together than this are not a person's: dropped (RFC 4733 keys last 40 ms and
/// more, with a pause between).
const KEY_GAP: Duration = Duration::from_millis(100);

/// The trunk hung up (BYE), cancelled, or its dialog ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PeerHungUp;

/// The app's socket on the call (`super::sideband`) asks to hear the session's events, which
/// the call counts against the socket's outgoing bound as it hands them on.
#[derive(Message)]
#[rtype(result = "Attached")]
pub struct Attach {
    pub app: Recipient<ToClient>,
    pub outgoing: Option<Arc<OutgoingLimit>>,
}

/// The call's answer to [`Attach`].
#[derive(MessageResponse)]
pub enum Attached {
    /// On: the session's port, to hand it the app's events.
    On(omni_actors::edge::client::SessionPort),
    /// The call has ended.
    Ended,
    /// The call has an app socket already.
    Taken,
}

/// The app's socket closed (it names itself: only that one is let go).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Detach(pub Recipient<ToClient>);

/// The session's line to its call: the call's edge, reading the dialect's text only while an
/// app's socket is on the call (to hand it on).
struct CallLine {
    to: Recipient<ToClient>,
    app_on: Arc<AtomicBool>,
}

impl ClientLine for CallLine {
    fn tell(&self, msg: ToClient) {
        self.to.do_send(msg);
    }

    fn wants_text(&self) -> bool {
        self.app_on.load(Ordering::Relaxed)
    }
}

/// The app's socket on the call.
struct AppSocket {
    to: Recipient<ToClient>,
    outgoing: Option<Arc<OutgoingLimit>>,
}

/// A re-INVITE agreed new media (a hold, a resume, a new address).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Renegotiated(pub Media);

/// What a call starts from.
pub struct SipCallParts {
    /// Names the call in logs (`sip-3`).
    pub label: String,
    pub socket: std::net::UdpSocket,
    pub media: Media,
    pub start: StartSession,
    pub max_incoming_bytes: usize,
    pub incoming: Arc<IncomingBudget>,
    /// Tells the signalling task to hang up (send BYE).
    pub hang_up: UnboundedSender<()>,
    /// The address the INVITE came from: RTP from its IP may be latched on to.
    pub trunk: std::net::IpAddr,
    /// Told when the session is created (a worker took it): the call is answered then.
    pub ready: tokio::sync::oneshot::Sender<()>,
}

/// The trunk has the call (its 200 and ACK): RTP flows from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CallAnswered;

pub struct SipCall {
    label: String,
    socket: Arc<UdpSocket>,
    media: Media,
    start: Option<StartSession>,
    session: Option<SessionPort>,
    incoming: Arc<Backlog>,
    hang_up: UnboundedSender<()>,
    /// The session knows the call ended (or ended it).
    done: bool,
    inbound: Inbound,
    outbound: Outbound,
    /// The voice in the agreed codec, both ways.
    voice: Voice,
    playout: Playout<Vec<u8>>,
    pacer: Option<SpawnHandle>,
    paced_until: Option<Instant>,
    last_heard: Instant,
    /// Datagrams dropped from an address other than the agreed one (said once in the log).
    strangers: u64,
    trunk: std::net::IpAddr,
    /// The address the SDP agreed; `media.remote` is where the voice goes (the same, or the
    /// address latched on to).
    agreed: SocketAddr,
    /// RTP came from the agreed address, or was latched on to: no more latching.
    settled: bool,
    /// When the last key was handed on.
    last_key: Option<Instant>,
    /// The app's socket on the call, when one is on.
    sideband: Option<AppSocket>,
    /// Whether one is: the session's line reads it (no app, no text of the dialect's).
    app_on: Arc<AtomicBool>,
    /// Told when the session is created, until it is.
    ready: Option<tokio::sync::oneshot::Sender<()>>,
    /// The call is answered: before, it rings and no RTP is awaited.
    answered: bool,
}

/// An address as compared: an IPv4 address mapped into IPv6 as the IPv4 one.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl SipCall {
    pub fn new(parts: SipCallParts) -> std::io::Result<SipCall> {
        let voice = Voice::new(parts.media.codec).map_err(std::io::Error::other)?;
        parts.socket.set_nonblocking(true)?;
        let socket = Arc::new(UdpSocket::from_std(parts.socket)?);
        let media = parts.media;
        let media_remote = media.remote;
        let ssrc = rand_u32();
        Ok(SipCall {
            label: parts.label,
            socket,
            inbound: Inbound::new(media.payload_type, media.events),
            outbound: Outbound::new(media.payload_type, media.codec.clock_rate(), ssrc, rand_u32() as u16, rand_u32()),
            voice,
            media,
            start: Some(parts.start),
            session: None,
            incoming: Backlog::new(parts.max_incoming_bytes, parts.incoming),
            hang_up: parts.hang_up,
            done: false,
            playout: Playout::default(),
            pacer: None,
            paced_until: None,
            last_heard: Instant::now(),
            strangers: 0,
            trunk: parts.trunk.to_canonical(),
            agreed: media_remote,
            settled: false,
            last_key: None,
            sideband: None,
            app_on: Arc::default(),
            ready: Some(parts.ready),
            answered: false,
        })
    }

    fn hand(&self, msg: FromClient) {
        if let Some(s) = &self.session {
            self.incoming.hand(s, msg);
        }
    }

    /// The app's socket on the call from now on (or none).
    fn set_sideband(&mut self, app: Option<AppSocket>) {
        self.app_on.store(app.is_some(), Ordering::Relaxed);
        self.sideband = app;
    }

    /// The call ends: the session hears why (unless it ended it), the trunk gets a BYE (unless
    /// it hung up), and the actor stops.
    fn end(&mut self, reason: Option<CloseReason>, bye: bool, ctx: &mut Context<Self>) {
        if let Some(reason) = reason
            && !std::mem::replace(&mut self.done, true)
        {
            log::info!("session {}: the call ended ({})", self.label, reason.as_str());
            if let Some(s) = &self.session {
                s.do_send(FromClient::Ended(reason));
            }
        }
        self.done = true;
        if bye {
            let _ = self.hang_up.send(());
        }
        ctx.stop();
    }

    fn on_datagram(&mut self, datagram: &[u8], from: SocketAddr) {
        let from = canonical(from);
        // Only RTP of an agreed payload type is latched on to (not another call's RTCP).
        let agreed_rtp = || {
            rtp_types::RtpPacket::parse(datagram).is_ok_and(|p| {
                p.payload_type() == self.media.payload_type || Some(p.payload_type()) == self.media.events
            })
        };
        if from != canonical(self.media.remote) && !self.settled && from.ip() == self.trunk && agreed_rtp() {
            // Symmetric RTP: the trunk sends from its signalling address, not the one it named.
            log::info!(
                "session {}: RTP latched on to {from} (the trunk's address; its SDP named {})",
                self.label,
                self.agreed
            );
            self.media.remote = from;
        }
        if from != canonical(self.media.remote) {
            // RTP from anyone but the trunk's agreed address is not the caller's.
            self.strangers += 1;
            if self.strangers == 1 {
                log::info!("session {}: RTP from {from}, not the agreed {}; dropped", self.label, self.media.remote);
            }
            return;
        }
        metrics().bytes_received.inc_by(datagram.len() as u64);
        self.settled = true;
        self.last_heard = Instant::now();
        let mut heard = Vec::new();
        if let Err(e) = self.inbound.push(datagram, &mut heard) {
            log::debug!("session {}: {e}", self.label);
        }
        for h in heard {
            match h {
                // What a trunk sends while it holds the call (music) is not the caller's voice.
                Datagram::Voice(_) | Datagram::Lost if self.media.held => {}
                // UDP cannot be told to wait: the voice of a session that is behind is dropped.
                Datagram::Voice(frame) => {
                    let (voice, label) = (&mut self.voice, &self.label);
                    if let Some(s) = &self.session {
                        self.incoming.offer(s, ("sip", "audio"), || match voice.heard(&frame, Instant::now()) {
                            Ok(audio) => Some(FromClient::Audio(audio)),
                            Err(why) => {
                                log::debug!("session {label}: a frame not heard: {why}");
                                None
                            }
                        });
                    }
                }
                Datagram::Lost => {
                    if let Some(s) = &self.session {
                        let voice = &mut self.voice;
                        self.incoming.offer(s, ("sip", "audio"), || Some(FromClient::Audio(voice.lost())));
                    }
                }
                // Never logged which (callers type PINs); a flood of them is not a person's.
                Datagram::Key(key) => {
                    let now = Instant::now();
                    if self.last_key.is_none_or(|at| now.saturating_duration_since(at) >= KEY_GAP) {
                        self.last_key = Some(now);
                        self.hand(FromClient::Key(key));
                    }
                }
            }
        }
    }

    /// The model's voice: frames in the call's codec queued for the pacer; cut when the caller
    /// speaks over it.
    fn on_model_audio(&mut self, audio: ModelAudio, ctx: &mut Context<Self>) {
        match audio {
            ModelAudio::Delta { response, samples, rate } => {
                if self.playout.muted(&response) {
                    return;
                }
                let frames = self.voice.speak(&samples, rate);
                self.playout.push(&response, frames);
                self.pace(ctx);
            }
            ModelAudio::Done { response } => {
                if !self.playout.muted(&response) {
                    let frames = self.voice.finish();
                    self.playout.push(&response, frames);
                    self.pace(ctx);
                } else {
                    self.voice.clear();
                }
                self.playout.finish(&response);
            }
            ModelAudio::Clear => {
                self.voice.clear();
                self.playout.clear();
            }
        }
    }

    /// One of the session's events for the app's socket, counted against its outgoing bound
    /// here (the socket's actor does not run while its client does not read): past the bound
    /// the socket is cut, and the call goes on.
    fn tell_app(&mut self, text: ByteString) {
        let Some(app) = &self.sideband else { return };
        if let Some(limit) = &app.outgoing
            && let Err(waiting) = limit.wrote(text.len())
        {
            log::warn!(
                "session {}: the app does not read its call's socket ({waiting} bytes waiting); cut",
                self.label
            );
            limit.cut();
            self.set_sideband(None);
            return;
        }
        app.to.do_send(ToClient::Text(text));
    }

    /// Starts the 20 ms pacer if it is not running; the RTP clock jumps over the pause.
    fn pace(&mut self, ctx: &mut Context<Self>) {
        if self.pacer.is_some() || self.done {
            return;
        }
        if let Some(until) = self.paced_until.take() {
            let paused = Instant::now().saturating_duration_since(until).as_millis() as u64 / FRAME_MS;
            self.outbound.skip(paused as u32);
        }
        self.pacer = Some(ctx.run_interval(Duration::from_millis(FRAME_MS), |act, ctx| act.tick(ctx)));
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let (frame, _) = self.playout.tick();
        match frame {
            // A call on hold that takes no voice (`inactive`) is not sent any; it still plays out.
            Some(frame) if self.media.receives => {
                let packet = self.outbound.packet(&frame);
                metrics().bytes_sent.inc_by(packet.len() as u64);
                // UDP: a datagram the kernel will not take now is lost, as on the wire.
                let _ = self.socket.try_send_to(&packet, self.media.remote);
            }
            // Nothing to play this tick (held, or the voice runs dry mid-answer): the clock
            // moves on all the same, as a microphone's would.
            Some(_) => self.outbound.skip(1),
            None if self.playout.busy() => self.outbound.skip(1),
            None => {}
        }
        if !self.playout.busy()
            && let Some(handle) = self.pacer.take()
        {
            ctx.cancel_future(handle);
            self.paced_until = Some(Instant::now());
        }
    }
}

/// A random number (an RTP stream's SSRC, its first sequence number and timestamp: RFC 3550
/// wants them unpredictable).
fn rand_u32() -> u32 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

impl Actor for SipCall {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(start) = self.start.take() {
            let line = CallLine { to: ctx.address().recipient(), app_on: self.app_on.clone() };
            self.session = Some(start(Box::new(line)));
        }
        ctx.add_stream(crate::udp::datagrams(self.socket.clone(), DATAGRAM_BYTES));
        ctx.run_interval(MEDIA_CHECK, |act, ctx| {
            if act.session.as_ref().is_some_and(|s| !s.connected()) {
                return act.end(None, true, ctx);
            }
            // A trunk that sends nothing by agreement (`recvonly`, `inactive`) is not timed
            // out; the session's time limit still ends its call.
            let silent = Instant::now().saturating_duration_since(act.last_heard);
            if act.answered && act.media.sends && silent > MEDIA_TIMEOUT {
                log::info!("session {}: no RTP from the trunk for {MEDIA_TIMEOUT:?}", act.label);
                act.end(Some(CloseReason::HeartbeatTimeout), true, ctx);
            }
        });
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        if !self.done
            && let Some(s) = &self.session
        {
            s.do_send(FromClient::Ended(CloseReason::ClientGone));
        }
        if let Some(app) = self.sideband.take() {
            app.to.do_send(ToClient::Close(CloseReason::Client("hangup".into())));
        }
        self.app_on.store(false, Ordering::Relaxed);
        let _ = self.hang_up.send(());
    }
}

impl StreamHandler<std::io::Result<(Vec<u8>, SocketAddr)>> for SipCall {
    fn handle(&mut self, got: std::io::Result<(Vec<u8>, SocketAddr)>, _: &mut Self::Context) {
        match got {
            Ok((datagram, from)) if !self.done => self.on_datagram(&datagram, from),
            Ok(_) => {}
            // ICMP errors surface here (a port unreachable): the media timeout decides.
            Err(e) => log::debug!("session {}: RTP socket: {e}", self.label),
        }
    }

    fn finished(&mut self, _: &mut Self::Context) {}
}

impl Handler<ToClient> for SipCall {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        match msg {
            ToClient::Audio(audio) => self.on_model_audio(audio, ctx),
            // The dialect's events have no place on a phone line: the app's socket takes them
            // when one is on (none are written otherwise).
            ToClient::Text(text) => self.tell_app(text),
            // A worker took the session: the call is answered now.
            ToClient::Notice(Notice::Created { .. }) => {
                if let Some(ready) = self.ready.take() {
                    let _ = ready.send(());
                }
            }
            // With no app to hear it, an error is the route's (or its accept's) settings
            // refused: the log is the only place it can be seen.
            ToClient::Notice(notice) => {
                if self.sideband.is_none() {
                    crate::phone::log_refusal(&self.label, &notice);
                }
            }
            ToClient::Close(reason) => {
                if let Some(app) = self.sideband.take() {
                    app.to.do_send(ToClient::Close(reason.clone()));
                }
                self.app_on.store(false, Ordering::Relaxed);
                log::info!("session {}: the session ended ({}); hanging up", self.label, reason.as_str());
                self.done = true;
                self.end(None, true, ctx);
            }
        }
    }
}

impl Handler<PeerHungUp> for SipCall {
    type Result = ();

    fn handle(&mut self, _: PeerHungUp, ctx: &mut Self::Context) {
        self.end(Some(CloseReason::Client("hangup".into())), false, ctx);
    }
}

impl Handler<CallAnswered> for SipCall {
    type Result = ();

    fn handle(&mut self, _: CallAnswered, _: &mut Self::Context) {
        self.answered = true;
        self.last_heard = Instant::now();
    }
}

impl Handler<Attach> for SipCall {
    type Result = Attached;

    fn handle(&mut self, Attach { app, outgoing }: Attach, _: &mut Self::Context) -> Self::Result {
        let Some(session) = self.session.clone().filter(|_| !self.done) else { return Attached::Ended };
        if self.sideband.as_ref().is_some_and(|a| a.to.connected()) {
            return Attached::Taken;
        }
        self.set_sideband(Some(AppSocket { to: app, outgoing }));
        Attached::On(session)
    }
}

impl Handler<Detach> for SipCall {
    type Result = ();

    fn handle(&mut self, Detach(app): Detach, _: &mut Self::Context) {
        if self.sideband.as_ref().is_some_and(|a| a.to == app) {
            self.set_sideband(None);
        }
    }
}

impl Handler<Renegotiated> for SipCall {
    type Result = ();

    fn handle(&mut self, Renegotiated(media): Renegotiated, _: &mut Self::Context) {
        log::info!(
            "session {}: the trunk {} the call",
            self.label,
            if media.held {
                "holds"
            } else if self.media.held {
                "resumes"
            } else {
                "renegotiated"
            }
        );
        // Another codec: its coder first (if it cannot start, the call goes on as it was);
        // what waits to be played is of the old one, and is dropped.
        if media.codec != self.voice.codec() {
            match Voice::new(media.codec) {
                Ok(voice) => {
                    self.voice = voice;
                    self.playout.clear();
                }
                Err(e) => {
                    return log::warn!("session {}: the new codec cannot start ({e}); the old one goes on", self.label);
                }
            }
        }
        if media.payload_type != self.media.payload_type || media.events != self.media.events {
            self.inbound = Inbound::new(media.payload_type, media.events);
            let clock = media.codec.clock_rate();
            self.outbound = Outbound::new(media.payload_type, clock, rand_u32(), rand_u32() as u16, rand_u32());
        }
        self.last_heard = Instant::now();
        // The same address agreed again: the one latched on to stays.
        let latched = (media.remote == self.agreed).then_some(self.media.remote);
        self.agreed = media.remote;
        self.media = media;
        if let Some(remote) = latched {
            self.media.remote = remote;
        }
    }
}
