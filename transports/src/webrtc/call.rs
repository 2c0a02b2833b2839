//! The WebRTC edge: one actor per call between its UDP socket and its session (`omni_actors::session::SessionActor`), as
//! the WebSocket edge is for a connection. It drives a sans-IO [`Rtc`] (ICE-lite, DTLS-SRTP,
//! SCTP) with the socket's datagrams and its timers; it hands the session the client's events
//! from the `oai-events` data channel, and the client's voice as samples ([`CallerAudio`]); it
//! plays the model's voice, which the session hands it as samples ([`ModelAudio`]), on the
//! audio track, one Opus frame every 20 ms.
//!
//! The call ends when the client hangs up (`/hangup`, closing its connection, or ICE hearing
//! nothing from it for 15 s), when ICE and DTLS are not done within
//! `webrtc.connect_timeout_s`, when the client does not read its data channel, or when the
//! session ends. Ending, the call tells the client (RTCP BYE, SCTP shutdown, DTLS
//! close_notify) and lingers [`CLOSE_GRACE`] for those to leave.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytestring::ByteString;
use omni_actors::edge::client::{CallerAudio, FromClient, ModelAudio, Playback, ToClient};
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, ProtocolError, Violation};
use str0m::channel::ChannelId;
use str0m::format::Codec;
use str0m::media::{Frequency, MediaKind, MediaTime, Mid};
use str0m::net::{Protocol, Receive};
use str0m::{Event, IceConnectionState, Input, Output, Rtc};
use tokio::net::UdpSocket;

use super::Calls;
use super::codec::{Downlink, PacketRefused, RATE, RTP_TICKS_PER_FRAME, UPLINK_FRAME_SAMPLES, UPLINK_RATE, Uplink};
use crate::incoming::{Backlog, IncomingBudget};
use crate::limits::{Admit, MessageRate, RateLimit};
use crate::playout::{FRAME_MS, Notice, Playout};
use crate::{SessionPort, StartSession};

/// The data channel the events travel on, as the OpenAI Realtime API names it.
pub const EVENTS_CHANNEL: &str = "oai-events";
/// The client's voice goes to the session in pieces of at least this much.
const UPLINK_SAMPLES: usize = UPLINK_FRAME_SAMPLES * 2;
/// The largest datagram read.
const DATAGRAM_BYTES: usize = 2048;
/// What the data channel itself holds for a client that has not acknowledged it; more waits in
/// the call (up to `max_outgoing_bytes`) until the channel drains below [`CHANNEL_LOW`].
pub const CHANNEL_BUFFER: usize = 1 << 20;
const CHANNEL_LOW: usize = CHANNEL_BUFFER / 4;
/// How long an ended call lingers for its goodbyes (BYE, SCTP shutdown, close_notify) to leave.
pub const CLOSE_GRACE: Duration = Duration::from_millis(200);

/// What a call may do, from `[server]` and `[webrtc]`.
#[derive(Debug, Clone)]
pub struct CallBounds {
    pub connect_timeout: Duration,
    /// Events the client may send per second; `None`: no limit.
    pub rate: Option<RateLimit>,
    /// Events that may wait for the client: before the data channel opens, and while the
    /// channel's own buffer is full. Past it the client is dropped (`slow_consumer`).
    pub max_outgoing_bytes: usize,
    /// The client's events and voice its session has not handled yet, past which its voice is
    /// dropped (UDP cannot be told to wait) until the session catches up.
    pub max_incoming_bytes: usize,
}

/// Hang up: the client asked (`POST /v1/realtime/calls/{id}/hangup`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Hangup;

/// Where a call is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Live,
    /// Ended: its goodbyes are leaving; the session knows.
    Closing,
}

pub struct CallEdge {
    id: String,
    /// It resumes a session ([`RtcCallParts::resumed`]).
    resumed: bool,
    rtc: Rtc,
    socket: Arc<UdpSocket>,
    local: SocketAddr,
    settings: CallBounds,
    start: Option<StartSession>,
    session: Option<SessionPort>,
    calls: Arc<Calls>,
    phase: Phase,
    /// The session was told the call ended (or ended it).
    session_told: bool,
    audio: Option<Mid>,
    channel: Option<ChannelId>,
    /// Events waiting for the data channel (not open yet, or its buffer full), and their bytes.
    unsent: VecDeque<ByteString>,
    unsent_bytes: usize,
    uplink: Uplink,
    /// The client's voice decoded and not yet handed to the session.
    voice: Vec<f32>,
    downlink: Downlink,
    playout: Playout<Vec<u8>>,
    /// The RTP clock of the model's voice: it advances every tick of the pacer, frame or not,
    /// and jumps over the pauses between the pacer's runs, as a microphone's would.
    rtp_time: u64,
    paced_until: Option<Instant>,
    pacer: Option<SpawnHandle>,
    timer: Option<(Instant, SpawnHandle)>,
    rate: Option<MessageRate>,
    /// What the session has been handed and not handled yet.
    incoming: Arc<Backlog>,
    /// When the client was last told its event was dropped (the session behind): once a second.
    behind_told: Option<Instant>,
}

/// What a call starts from: its negotiated `Rtc` and socket, and how it reaches the rest.
pub struct RtcCallParts {
    pub id: String,
    pub rtc: Rtc,
    pub socket: std::net::UdpSocket,
    pub settings: CallBounds,
    pub start: StartSession,
    pub calls: Arc<Calls>,
    /// What every session may have read and not handled, together.
    pub incoming: Arc<IncomingBudget>,
    /// The call resumes a session whose connection dropped (`?resume=`): one that never
    /// connects leaves the session held, rather than ending it.
    pub resumed: bool,
}

impl CallEdge {
    pub fn new(parts: RtcCallParts) -> std::io::Result<CallEdge> {
        parts.socket.set_nonblocking(true)?;
        let local = parts.socket.local_addr()?;
        let socket = Arc::new(UdpSocket::from_std(parts.socket)?);
        let codec = |e: opus::Error| std::io::Error::other(format!("opus: {e}"));
        let now = Instant::now();
        Ok(CallEdge {
            id: parts.id,
            resumed: parts.resumed,
            rtc: parts.rtc,
            socket,
            local,
            rate: parts.settings.rate.map(|l| MessageRate::new(l, now)),
            incoming: Backlog::new(parts.settings.max_incoming_bytes, parts.incoming),
            behind_told: None,
            settings: parts.settings,
            start: Some(parts.start),
            session: None,
            calls: parts.calls,
            phase: Phase::Live,
            session_told: false,
            audio: None,
            channel: None,
            unsent: VecDeque::new(),
            unsent_bytes: 0,
            uplink: Uplink::new().map_err(codec)?,
            voice: Vec::with_capacity(UPLINK_SAMPLES * 2),
            downlink: Downlink::new().map_err(codec)?,
            playout: Playout::default(),
            rtp_time: 0,
            paced_until: None,
            pacer: None,
            timer: None,
        })
    }

    fn tell(&self, msg: FromClient) {
        if let Some(s) = &self.session {
            s.do_send(msg);
        }
    }

    /// Ends the call: the session hears `reason` now (unless it ended the call), the client
    /// gets its goodbyes, and the actor stops once they have left.
    fn end(&mut self, ctx: &mut Context<Self>, reason: Option<CloseReason>) {
        if self.phase == Phase::Closing {
            return;
        }
        self.phase = Phase::Closing;
        // Gone for hangups at once, while its goodbyes leave.
        self.calls.remove(&self.id);
        if let Some(reason) = reason {
            log::info!("call {}: ended ({})", self.id, reason.as_str());
            if !self.session_told {
                self.session_told = true;
                self.tell(FromClient::Ended(reason));
            }
        }
        if let Some(handle) = self.pacer.take() {
            ctx.cancel_future(handle);
        }
        if self.rtc.close().is_err() {
            self.rtc.disconnect();
        }
        self.drive(ctx);
        ctx.run_later(CLOSE_GRACE, |_, ctx| ctx.stop());
    }

    /// The call lost its client without a goodbye: the session hears it as a lost connection
    /// (held for a resume when resumption is on), and the call ends.
    fn lose(&mut self, ctx: &mut Context<Self>) {
        if self.phase != Phase::Closing && !self.session_told {
            log::info!("call {}: lost its client", self.id);
            self.session_told = true;
            self.tell(FromClient::Lost(CloseReason::ClientGone));
        }
        self.end(ctx, None);
    }

    /// Drains the `Rtc`: sends its datagrams, handles its events, and sets the timer for its
    /// next deadline.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        while self.rtc.is_alive() {
            match self.rtc.poll_output() {
                Ok(Output::Transmit(t)) => {
                    metrics().bytes_sent.inc_by(t.contents.len() as u64);
                    // UDP: a datagram the kernel will not take now is lost, as on the wire.
                    let _ = self.socket.try_send_to(&t.contents, t.destination);
                }
                Ok(Output::Event(e)) => self.on_event(e, ctx),
                Ok(Output::Timeout(at)) => return self.arm(at, ctx),
                Err(e) => {
                    log::info!("call {}: WebRTC error: {e}", self.id);
                    return self.lose(ctx);
                }
            }
        }
        if self.phase == Phase::Live {
            self.lose(ctx);
        }
    }

    fn arm(&mut self, at: Instant, ctx: &mut Context<Self>) {
        if let Some((when, handle)) = self.timer.take() {
            if when == at {
                self.timer = Some((when, handle));
                return;
            }
            ctx.cancel_future(handle);
        }
        let wait = at.saturating_duration_since(Instant::now());
        let handle = ctx.run_later(wait, |act, ctx| {
            act.timer = None;
            if let Err(e) = act.rtc.handle_input(Input::Timeout(Instant::now())) {
                log::info!("call {}: WebRTC error: {e}", act.id);
                return act.lose(ctx);
            }
            act.drive(ctx);
        });
        self.timer = Some((at, handle));
    }

    fn on_event(&mut self, event: Event, ctx: &mut Context<Self>) {
        match event {
            Event::Connected => {
                self.calls.connected(&self.id);
                log::info!("call {}: connected (ICE and DTLS done)", self.id)
            }
            Event::IceConnectionStateChange(IceConnectionState::Disconnected) => {
                // The network went away (no goodbye): the session may be held for a resume.
                log::info!("call {}: ICE lost the client", self.id);
                self.lose(ctx);
            }
            Event::Closed => {
                log::info!("call {}: the client closed the connection", self.id);
                self.end(ctx, Some(CloseReason::ClientGone));
            }
            Event::MediaAdded(m) if m.kind == MediaKind::Audio && self.audio.is_none() => self.audio = Some(m.mid),
            Event::MediaData(data) if Some(data.mid) == self.audio => self.on_voice(&data.data),
            Event::ChannelOpen(id, label) => {
                if label != EVENTS_CHANNEL {
                    // (the label is the client's: clipped, and said once in a while at most)
                    if let Some(more) = omni_actors::observe::gated("call_other_channel") {
                        let label: String = label.chars().take(32).collect();
                        log::info!(
                            "call {}: a data channel {label:?} is not used (events travel on {EVENTS_CHANNEL}){more}",
                            self.id
                        );
                    }
                    return;
                }
                self.channel = Some(id);
                if let Some(mut channel) = self.rtc.channel(id) {
                    channel.set_buffered_amount_low_threshold(CHANNEL_LOW);
                }
                self.flush(ctx);
            }
            Event::ChannelBufferedAmountLow(id) if Some(id) == self.channel => self.flush(ctx),
            Event::ChannelData(data) if Some(data.id) == self.channel => {
                if data.binary {
                    log::info!("call {}: binary message on {EVENTS_CHANNEL}; ending the call", self.id);
                    return self.end(ctx, Some(CloseReason::ProtocolViolation(Violation::BinaryFrame)));
                }
                match String::from_utf8(data.data) {
                    Ok(text) => self.on_client_event(text, ctx),
                    Err(_) => self.end(ctx, Some(CloseReason::ProtocolViolation(Violation::InvalidUtf8))),
                }
            }
            // A message on another channel is not used, and counts against the message rate as
            // any other: a peer pays for what it sends, on whatever channel.
            Event::ChannelData(_) => {
                self.within_rate(ctx);
            }
            Event::ChannelClose(id) if Some(id) == self.channel => {
                log::info!("call {}: the client closed {EVENTS_CHANNEL}", self.id);
                self.end(ctx, Some(CloseReason::ClientGone));
            }
            _ => {}
        }
    }

    /// The client's voice: decoded (at most real time and a half), and handed on in pieces of
    /// at least [`UPLINK_SAMPLES`].
    fn on_voice(&mut self, packet: &[u8]) {
        match self.uplink.decode(Instant::now(), packet, &mut self.voice) {
            Ok(_) => {}
            Err(PacketRefused::TooFast) => {
                log::debug!("call {}: voice faster than real time and a half; a packet dropped", self.id);
                return;
            }
            Err(PacketRefused::Malformed(why)) => {
                log::debug!("call {}: an Opus packet does not decode: {why}", self.id);
                return;
            }
        }
        if self.voice.len() >= UPLINK_SAMPLES {
            // The session is behind by `max_incoming_bytes`: this voice is dropped.
            let samples = std::mem::replace(&mut self.voice, Vec::with_capacity(UPLINK_SAMPLES * 2));
            if !self.offer("audio", || Some(FromClient::Audio(CallerAudio { samples, rate: UPLINK_RATE }))) {
                log::debug!("call {}: its session is behind; voice dropped", self.id);
            }
        }
    }

    fn on_client_event(&mut self, text: String, ctx: &mut Context<Self>) {
        if !self.within_rate(ctx) {
            return;
        }
        // The session is behind by `max_incoming_bytes` (a WebSocket would stop being read; a
        // call cannot, without losing its voice): the event is dropped, and the client told so
        // by its session, once a second at most.
        if !self.offer("event", || Some(FromClient::Text(ByteString::from(text)))) {
            if self.behind_told.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                self.behind_told = Some(Instant::now());
                self.tell(FromClient::Refused(ProtocolError::BufferFull(
                    "the session is behind on what this call sent: an event was dropped; send it again once the \
                     session has answered"
                        .into(),
                )));
            }
        }
    }

    /// Hands the session a client's event or voice through the gate (counted until it is
    /// handled): `false` when the session is behind and it was dropped.
    fn offer(&self, what: &'static str, make: impl FnOnce() -> Option<FromClient>) -> bool {
        self.session.as_ref().is_none_or(|s| self.incoming.offer(s, ("webrtc", what), make))
    }

    fn within_rate(&mut self, ctx: &mut Context<Self>) -> bool {
        let Some(rate) = self.rate.as_mut() else { return true };
        match rate.admit(Instant::now()) {
            Admit::Process => true,
            Admit::Drop => false,
            Admit::Tell(error) => {
                self.tell(FromClient::Refused(error));
                false
            }
            Admit::End => {
                log::warn!("call {}: over the message rate for too long; ending the call", self.id);
                self.end(ctx, Some(CloseReason::ProtocolViolation(Violation::RateLimited)));
                false
            }
        }
    }

    /// Sends an event on the data channel, after those waiting; it waits too while the channel
    /// is not open or its buffer is full. A client that lets more than
    /// `max_outgoing_bytes` wait is dropped.
    fn send(&mut self, text: ByteString, ctx: &mut Context<Self>) {
        self.unsent_bytes += text.len();
        self.unsent.push_back(text);
        if self.unsent_bytes > self.settings.max_outgoing_bytes {
            log::warn!(
                "call {}: the client does not read {EVENTS_CHANNEL} ({} bytes waiting); ending the call",
                self.id,
                self.unsent_bytes
            );
            metrics().slow_consumers.inc();
            return self.end(ctx, Some(CloseReason::SlowConsumer));
        }
        self.flush(ctx);
    }

    /// Writes what waits, in order, until the channel's buffer is full.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        let Some(id) = self.channel else { return };
        while let Some(text) = self.unsent.front() {
            let Some(mut channel) = self.rtc.channel(id) else { return };
            match channel.write(false, text.as_bytes()) {
                Ok(true) => {
                    self.unsent_bytes -= text.len();
                    self.unsent.pop_front();
                }
                // Full: the rest waits for ChannelBufferedAmountLow.
                Ok(false) => break,
                Err(e) => {
                    log::info!("call {}: cannot write to {EVENTS_CHANNEL}: {e}", self.id);
                    return self.lose(ctx);
                }
            }
        }
        self.drive(ctx);
    }

    fn clear(&mut self) -> Option<Notice> {
        self.downlink.drop_pending();
        self.playout.clear()
    }

    /// What the caller heard, for its session's dialect to tell it.
    fn notify(&mut self, notice: Notice) {
        let playback = match notice {
            Notice::Started { response_id } => Playback::Started { response: response_id },
            Notice::Stopped { response_id } => Playback::Stopped { response: response_id },
            Notice::Cleared { response_id } => Playback::Cleared { response: Some(response_id) },
        };
        log::debug!("call {}: {playback:?}", self.id);
        self.tell(FromClient::Playback(playback));
    }

    /// Starts the 20 ms pacer if it is not running; the RTP clock jumps over the pause.
    fn pace(&mut self, ctx: &mut Context<Self>) {
        if self.pacer.is_some() || self.phase != Phase::Live {
            return;
        }
        let now = Instant::now();
        if let Some(until) = self.paced_until {
            let paused = now.saturating_duration_since(until).as_millis() as u64 / FRAME_MS;
            self.rtp_time += paused * RTP_TICKS_PER_FRAME;
        }
        self.pacer = Some(ctx.run_interval(Duration::from_millis(FRAME_MS), |act, ctx| act.tick(ctx)));
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let (frame, notices) = self.playout.tick();
        for notice in notices {
            self.notify(notice);
        }
        let time = MediaTime::new(self.rtp_time, Frequency::FORTY_EIGHT_KHZ);
        self.rtp_time += RTP_TICKS_PER_FRAME;
        if let Some(frame) = frame {
            self.write_frame(frame, time, ctx);
        }
        if !self.playout.busy()
            && let Some(handle) = self.pacer.take()
        {
            ctx.cancel_future(handle);
            self.paced_until = Some(Instant::now());
        }
    }

    fn write_frame(&mut self, frame: Vec<u8>, time: MediaTime, ctx: &mut Context<Self>) {
        let Some(mid) = self.audio else { return };
        let Some(writer) = self.rtc.writer(mid) else { return };
        let Some(pt) = writer.payload_params().find(|p| p.spec().codec == Codec::Opus).map(|p| p.pt()) else {
            return;
        };
        if let Err(e) = writer.write(pt, Instant::now(), time, frame) {
            log::debug!("call {}: an audio frame was not sent: {e}", self.id);
        }
        self.drive(ctx);
    }

    /// The model's voice, as the session hands it: encoded and queued for the pacer.
    fn on_model_audio(&mut self, audio: ModelAudio, ctx: &mut Context<Self>) {
        match audio {
            ModelAudio::Delta { response, samples, rate } => {
                if self.playout.muted(&response) {
                    return;
                }
                let samples = if rate == RATE {
                    samples
                } else {
                    match omni_actors::audio::resample(&samples, rate, RATE) {
                        Ok(s) => s,
                        Err(e) => {
                            return log::warn!("call {}: the model's voice at {rate} Hz is not played: {e}", self.id);
                        }
                    }
                };
                let frames = self.downlink.encode(&samples);
                self.playout.push(&response, frames);
                self.pace(ctx);
            }
            ModelAudio::Done { response } => {
                if !self.playout.muted(&response)
                    && let Some(last) = self.downlink.flush()
                {
                    self.playout.push(&response, [last]);
                }
                if let Some(notice) = self.playout.finish(&response) {
                    self.notify(notice);
                }
            }
            // Cleared: what was playing is told (nothing, when nothing was).
            ModelAudio::Clear => match self.clear() {
                Some(notice) => self.notify(notice),
                None => self.tell(FromClient::Playback(Playback::Cleared { response: None })),
            },
        }
    }
}

impl Actor for CallEdge {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(start) = self.start.take() {
            self.session = Some(start(Box::new(ctx.address().recipient::<ToClient>())));
        }
        ctx.add_stream(crate::udp::datagrams(self.socket.clone(), DATAGRAM_BYTES));
        ctx.run_later(self.settings.connect_timeout, |act, ctx| {
            if act.phase == Phase::Live && !act.rtc.is_connected() {
                log::info!(
                    "call {}: ICE and DTLS not done within {:?}; dropping the call",
                    act.id,
                    act.settings.connect_timeout
                );
                if act.resumed {
                    // A resumed session's new call that never connected: it may try again.
                    act.lose(ctx);
                } else {
                    act.end(ctx, Some(CloseReason::HeartbeatTimeout));
                }
            }
        });
        self.drive(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.calls.remove(&self.id);
        if self.playout.dropped > 0 {
            log::warn!("call {}: {} frames of the model's voice dropped over the bound", self.id, self.playout.dropped);
        }
        if !self.session_told {
            self.tell(FromClient::Lost(CloseReason::ClientGone));
        }
    }
}

impl StreamHandler<std::io::Result<(Vec<u8>, SocketAddr)>> for CallEdge {
    fn handle(&mut self, got: std::io::Result<(Vec<u8>, SocketAddr)>, ctx: &mut Self::Context) {
        let (buf, source) = match got {
            Ok(got) => got,
            Err(e) => {
                // ICMP errors surface here (a port unreachable): ICE decides when the peer is gone.
                log::debug!("call {}: UDP: {e}", self.id);
                return;
            }
        };
        if !self.rtc.is_alive() {
            return;
        }
        // What does not parse as STUN, DTLS or SRTP is dropped before anything else.
        let Ok(receive) = Receive::new(Protocol::Udp, source, self.local, &buf) else { return };
        let input = Input::Receive(Instant::now(), receive);
        if !self.rtc.accepts(&input) {
            return;
        }
        metrics().bytes_received.inc_by(buf.len() as u64);
        if let Err(e) = self.rtc.handle_input(input) {
            log::debug!("call {}: a datagram from {source} was refused: {e}", self.id);
            return;
        }
        self.drive(ctx);
    }

    fn finished(&mut self, _: &mut Self::Context) {}
}

impl Handler<ToClient> for CallEdge {
    type Result = ();

    fn handle(&mut self, msg: ToClient, ctx: &mut Self::Context) {
        if self.phase != Phase::Live {
            return;
        }
        match msg {
            // The session's frame itself waits, not a copy.
            ToClient::Text(text) => self.send(text, ctx),
            ToClient::Audio(audio) => self.on_model_audio(audio, ctx),
            // The client hears what became of its session in the dialect's own events.
            ToClient::Notice(_) => {}
            ToClient::Close(reason) => {
                log::info!("call {}: the session ended ({}); hanging up", self.id, reason.as_str());
                self.session_told = true;
                // What the session said last leaves before the goodbyes.
                self.flush(ctx);
                self.end(ctx, None);
            }
        }
    }
}

impl Handler<Hangup> for CallEdge {
    type Result = ();

    fn handle(&mut self, _: Hangup, ctx: &mut Self::Context) {
        self.end(ctx, Some(CloseReason::Client("hangup".into())));
    }
}

#[cfg(test)]
mod tests {
    //! The call against a stand-in session (its port is all the edge knows of it), with a
    //! str0m peer as the caller over loopback UDP: the caller's voice reaches the session as
    //! samples, the session's events and voice reach the caller (events on `oai-events`, the
    //! voice as Opus on the track), the caller's clear is the call's own, and the session's
    //! close hangs up.

    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use actix::prelude::*;
    use omni_actors::edge::client::{ClientLine, FromClient, FromLine, ModelAudio, SessionPort, ToClient};
    use parking_lot::Mutex;
    use str0m::change::SdpAnswer;
    use str0m::channel::ChannelId;
    use str0m::format::Codec;
    use str0m::media::{Direction, Frequency, MediaKind, MediaTime, Mid};
    use str0m::net::{Protocol, Receive};
    use str0m::{Candidate, Event, Input, Output, Rtc, RtcConfig};
    use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

    use super::{CallBounds, CallEdge, EVENTS_CHANNEL, RtcCallParts};
    use crate::incoming::IncomingBudget;
    use crate::limits::RateLimit;
    use crate::webrtc::Calls;
    use crate::webrtc::codec::{Downlink, FRAME_SAMPLES, RATE, RTP_TICKS_PER_FRAME};
    use crate::webrtc::config::WebRtcSpec;

    const WAIT: Duration = Duration::from_secs(10);

    /// A session that only says what it was handed; with `busy`, it is done with each message
    /// only once `busy` has permits (until then, what it was handed counts as not yet handled:
    /// its receipt is kept).
    struct Stand(UnboundedSender<String>, Option<Arc<tokio::sync::Semaphore>>);

    impl Actor for Stand {
        type Context = Context<Self>;
    }

    impl Handler<FromLine> for Stand {
        type Result = ResponseFuture<()>;
        fn handle(&mut self, FromLine { msg, receipt, .. }: FromLine, _: &mut Context<Self>) -> Self::Result {
            let _ = self.0.send(match msg {
                FromClient::Text(t) => format!("text {t}"),
                FromClient::Audio(a) => format!("audio at {}", a.rate),
                FromClient::Key(k) => format!("key {}", k.key()),
                FromClient::Configure(c) => format!("configure {c:?}"),
                FromClient::Playback(p) => format!("played {p:?}"),
                FromClient::Refused(e) => format!("refused {}", e.code()),
                FromClient::Ended(r) => format!("ended {}", r.as_str()),
                FromClient::Lost(r) => format!("lost {}", r.as_str()),
            });
            let busy = self.1.clone();
            Box::pin(async move {
                if let Some(busy) = busy {
                    let _ = busy.acquire().await;
                }
                // Handled now (and not before).
                drop(receipt);
            })
        }
    }

    /// What the caller saw.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Open,
        Text(String),
        Voice,
        Closed,
    }

    /// The caller: a str0m peer on its own socket.
    struct Caller {
        rtc: Rtc,
        socket: tokio::net::UdpSocket,
        local: SocketAddr,
        mid: Mid,
        channel: ChannelId,
        /// A channel the gateway does not use, when the call has one.
        junk: Option<ChannelId>,
        rtp_time: u64,
    }

    impl Caller {
        /// Runs the peer (sends what it has to send, takes what arrives) until `check`, asked
        /// after every step with everything seen so far, answers.
        async fn drive_until<T>(&mut self, mut check: impl FnMut(&[Seen]) -> Option<T>) -> T {
            let deadline = tokio::time::Instant::now() + WAIT;
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 2048];
            loop {
                let timeout = loop {
                    match self.rtc.poll_output().expect("the caller's peer") {
                        Output::Transmit(t) => {
                            let _ = self.socket.send_to(&t.contents, t.destination).await;
                        }
                        Output::Timeout(at) => break at,
                        Output::Event(e) => seen.extend(match e {
                            Event::ChannelOpen(..) => Some(Seen::Open),
                            Event::ChannelData(d) => Some(Seen::Text(String::from_utf8_lossy(&d.data).into())),
                            Event::MediaData(_) => Some(Seen::Voice),
                            Event::ChannelClose(_) | Event::Closed => Some(Seen::Closed),
                            _ => None,
                        }),
                    }
                };
                if let Some(done) = check(&seen) {
                    return done;
                }
                assert!(tokio::time::Instant::now() < deadline, "not in time; the caller saw {seen:?}");
                let wait = timeout.saturating_duration_since(Instant::now()).min(Duration::from_millis(10));
                match tokio::time::timeout(wait, self.socket.recv_from(&mut buf)).await {
                    Ok(Ok((n, from))) => {
                        let r = Receive::new(Protocol::Udp, from, self.local, &buf[..n]).unwrap();
                        self.rtc.handle_input(Input::Receive(Instant::now(), r)).unwrap();
                    }
                    _ => self.rtc.handle_input(Input::Timeout(Instant::now())).unwrap(),
                }
            }
        }

        fn send_text(&mut self, text: &str) {
            self.rtc.channel(self.channel).expect("open").write(false, text.as_bytes()).unwrap();
        }

        fn send_junk(&mut self, text: &str) {
            let junk = self.junk.expect("a call with a second channel");
            self.rtc.channel(junk).expect("open").write(false, text.as_bytes()).unwrap();
        }

        fn send_binary(&mut self, bytes: &[u8]) {
            self.rtc.channel(self.channel).expect("open").write(true, bytes).unwrap();
        }

        /// 20 ms Opus frames of a tone, on the track.
        fn speak(&mut self, frames: usize) {
            let mut down = Downlink::new().unwrap();
            let tone: Vec<f32> = (0..FRAME_SAMPLES * frames).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
            for frame in down.encode(&tone) {
                let writer = self.rtc.writer(self.mid).expect("the track");
                let pt = writer.payload_params().find(|p| p.spec().codec == Codec::Opus).unwrap().pt();
                let time = MediaTime::new(self.rtp_time, Frequency::FORTY_EIGHT_KHZ);
                self.rtp_time += RTP_TICKS_PER_FRAME;
                writer.write(pt, Instant::now(), time, frame).unwrap();
            }
        }
    }

    struct Call {
        caller: Caller,
        heard: UnboundedReceiver<String>,
        line: Arc<Mutex<Option<Box<dyn ClientLine>>>>,
    }

    impl Call {
        /// What the session is handed next (the caller runs meanwhile).
        async fn heard(&mut self) -> String {
            let heard = &mut self.heard;
            self.caller.drive_until(|_| heard.try_recv().ok()).await
        }

        /// Runs the caller until it sees what `wanted` matches.
        async fn caller_sees(&mut self, wanted: impl Fn(&Seen) -> bool) {
            self.caller.drive_until(|seen| seen.iter().any(&wanted).then_some(())).await
        }

        fn say(&self, msg: ToClient) {
            self.line.lock().as_ref().expect("the session started").tell(msg);
        }
    }

    /// A call answered by the gateway's own signalling and run by its edge, the stand-in behind
    /// it, and a caller through ICE and DTLS with its data channel open.
    async fn call() -> Call {
        call_with(None, false, None).await
    }

    /// A call with a message rate, (`junk`) a second channel the gateway does not use, and
    /// (`busy`) a session that takes its time, with the call's backlog bound in bytes.
    async fn call_with(
        rate: Option<RateLimit>,
        junk: bool,
        busy: Option<(Arc<tokio::sync::Semaphore>, usize)>,
    ) -> Call {
        let spec = WebRtcSpec {
            enabled: true,
            bind: "127.0.0.1".parse().unwrap(),
            ports: 52000..=52999,
            public_ips: vec!["127.0.0.1".parse().unwrap()],
            connect_timeout: Duration::from_secs(5),
            client_secret_ttl: Duration::from_secs(60),
            max_client_secrets: 10,
            max_client_secrets_per_key: 10,
            max_unconnected_calls_per_ip: 8,
            max_unconnected_calls_per_key: 250,
        };
        let calls = Calls::new(spec);
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let local = socket.local_addr().unwrap();
        let mut rtc = RtcConfig::new().clear_codecs().enable_opus(true, false).build(Instant::now());
        rtc.add_local_candidate(Candidate::host(local, "udp").unwrap());
        let mut api = rtc.sdp_api();
        let mid = api.add_media(MediaKind::Audio, Direction::SendRecv, None, None, None);
        let channel = api.add_channel(EVENTS_CHANNEL.into());
        let junk = junk.then(|| api.add_channel("junk".into()));
        let (offer, pending) = api.apply().unwrap();
        let answered = calls.answer(&offer.to_sdp_string()).unwrap();
        rtc.sdp_api().accept_answer(pending, SdpAnswer::from_sdp_string(&answered.sdp).unwrap()).unwrap();
        let (tx, heard) = unbounded_channel();
        let line: Arc<Mutex<Option<Box<dyn ClientLine>>>> = Arc::default();
        let slot = line.clone();
        let max_incoming_bytes = busy.as_ref().map_or(1 << 20, |(_, bound)| *bound);
        let busy = busy.map(|(busy, _)| busy);
        let start = Box::new(move |to: Box<dyn ClientLine>| {
            *slot.lock() = Some(to);
            SessionPort::new(Stand(tx, busy).start().recipient(), 0)
        });
        let settings = CallBounds {
            connect_timeout: Duration::from_secs(5),
            rate,
            max_outgoing_bytes: 1 << 20,
            max_incoming_bytes,
        };
        let parts = RtcCallParts {
            id: "rtc_test".into(),
            rtc: answered.rtc,
            socket: answered.socket,
            settings,
            start,
            calls: calls.clone(),
            incoming: IncomingBudget::new(1 << 20),
            resumed: false,
        };
        CallEdge::new(parts).unwrap().start();
        let opens = if junk.is_some() { 2 } else { 1 };
        let caller = Caller { rtc, socket, local, mid, channel, junk, rtp_time: 0 };
        let mut call = Call { caller, heard, line };
        call.caller
            .drive_until(|seen| (seen.iter().filter(|s| **s == Seen::Open).count() >= opens).then_some(()))
            .await;
        call
    }

    /// Messages on a channel the gateway does not use count against the message rate as any
    /// other: a peer cannot send without limit by choosing another channel.
    #[actix::test]
    async fn messages_on_another_channel_count_against_the_rate() {
        let rate = RateLimit { per_second: 1.0, burst: 2.0, abuse_after: Duration::from_secs(60) };
        let mut call = call_with(Some(rate), true, None).await;
        for _ in 0..10 {
            call.caller.send_junk("x");
        }
        assert_eq!(call.heard().await, "refused rate_limited", "the session heard the peer is over the rate");
    }

    /// A session behind on what its call sent (the call's backlog past `max_incoming_bytes`):
    /// the next event is dropped, never held, and the session told to tell the caller
    /// (`buffer_full`, in its dialect); once it catches up, events go through again.
    #[actix::test]
    async fn an_event_for_a_session_that_is_behind_is_dropped_and_the_caller_told() {
        let busy = Arc::new(tokio::sync::Semaphore::new(0));
        let mut call = call_with(None, false, Some((busy.clone(), 64))).await;
        let event = |n: u32| format!(r#"{{"type":"a.dialects.event","seq":"item_{n:04}","pad":"01234"}}"#);
        assert_eq!(event(1).len(), 59);
        // The first is in the session's hands (59 bytes of 64 waiting); the second still fits
        // under the bound when it is checked; the third finds 118 bytes waiting.
        call.caller.send_text(&event(1));
        assert_eq!(call.heard().await, format!("text {}", event(1)));
        call.caller.send_text(&event(2));
        assert_eq!(call.heard().await, format!("text {}", event(2)));
        call.caller.send_text(&event(3));
        assert_eq!(call.heard().await, "refused buffer_full", "not the event: what the caller is to be told");
        assert!(call.heard.try_recv().is_err(), "the third was handed to a session that is behind");
        // The session catches up: the next event goes through.
        busy.add_permits(1 << 20);
        call.caller.send_text(&event(4));
        assert_eq!(call.heard().await, format!("text {}", event(4)));
    }

    #[actix::test]
    async fn the_callers_voice_and_events_reach_the_session_and_its_events_reach_the_caller() {
        let mut call = call().await;
        call.caller.speak(3);
        assert_eq!(
            call.heard().await,
            format!("audio at {}", crate::webrtc::codec::UPLINK_RATE),
            "samples, not an event"
        );
        call.caller.send_text(r#"{"type":"ask"}"#);
        assert_eq!(call.heard().await, r#"text {"type":"ask"}"#);
        call.say(ToClient::Text(r#"{"type":"answer"}"#.into()));
        call.caller_sees(|s| matches!(s, Seen::Text(t) if t.contains("answer"))).await;
    }

    #[actix::test]
    async fn the_models_voice_plays_on_the_track_and_what_was_heard_is_told_to_the_session() {
        let mut call = call().await;
        // Two seconds of voice: it starts playing, and is still playing when it is cleared.
        let samples = vec![0.2f32; RATE as usize * 2];
        call.say(ToClient::Audio(ModelAudio::Delta { response: "resp_1".into(), samples, rate: RATE }));
        assert_eq!(call.heard().await, r#"played Started { response: "resp_1" }"#);
        call.caller_sees(|s| *s == Seen::Voice).await;
        // Every event is the session's, a clear too (its dialect answers it, and clears the voice).
        call.caller.send_text(r#"{"type":"stop","event_id":"c1"}"#);
        assert_eq!(call.heard().await, r#"text {"type":"stop","event_id":"c1"}"#);
        call.say(ToClient::Audio(ModelAudio::Clear));
        assert_eq!(call.heard().await, r#"played Cleared { response: Some("resp_1") }"#);
        call.say(ToClient::Audio(ModelAudio::Clear));
        assert_eq!(call.heard().await, "played Cleared { response: None }", "nothing playing any more");
        // The rest of a cleared response is not played.
        let samples = vec![0.2f32; RATE as usize];
        call.say(ToClient::Audio(ModelAudio::Delta { response: "resp_1".into(), samples, rate: RATE }));
        call.say(ToClient::Audio(ModelAudio::Delta {
            response: "resp_2".into(),
            samples: vec![0.2f32; RATE as usize / 10],
            rate: RATE,
        }));
        assert_eq!(call.heard().await, r#"played Started { response: "resp_2" }"#);
    }

    #[actix::test]
    async fn a_binary_message_ends_the_call_and_the_session_hears_why() {
        let mut call = call().await;
        call.caller.send_binary(&[1, 2, 3]);
        assert_eq!(call.heard().await, "ended binary_frame");
        call.caller_sees(|s| *s == Seen::Closed).await;
    }

    #[actix::test]
    async fn the_session_ending_hangs_the_call_up() {
        let mut call = call().await;
        call.say(ToClient::Close(omni_actors::protocol::CloseReason::Timeout));
        call.caller_sees(|s| *s == Seen::Closed).await;
    }
}
