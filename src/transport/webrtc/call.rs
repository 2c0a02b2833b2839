//! The WebRTC edge: one actor per call between its UDP socket and its [`SessionActor`], as
//! the WebSocket edge is for a connection. It drives a sans-IO [`Rtc`] (ICE-lite, DTLS-SRTP,
//! SCTP) with the socket's datagrams and its timers; it hands the session the client's events
//! from the `oai-events` data channel and the client's voice as `input_audio_buffer.append`
//! events; it plays the model's voice on the audio track, one Opus frame every 20 ms.
//!
//! The call ends when the client hangs up (`/hangup`, or ICE gives up on it), when ICE and
//! DTLS are not done within `webrtc.connect_timeout_s`, when the client does not read its data
//! channel, or when the session ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytestring::ByteString;
use omni_actors::observe::metrics::metrics;
use omni_actors::protocol::{CloseReason, Violation};
use omni_actors::session::SessionActor;
use omni_actors::session::messages::{FromClient, ToClient};
use str0m::channel::ChannelId;
use str0m::format::Codec;
use str0m::media::{Frequency, MediaKind, MediaTime, Mid};
use str0m::net::{Protocol, Receive};
use str0m::{Event, IceConnectionState, Input, Output, Rtc};
use tokio::net::UdpSocket;

use super::Calls;
use super::codec::{Downlink, FRAME_SAMPLES, RTP_TICKS_PER_FRAME, Uplink};
use super::events::{self, Incoming, Outgoing};
use super::playout::{FRAME_MS, Notice, Playout};
use crate::transport::limits::{Admit, MessageRate, RateLimit};
use crate::transport::websocket::StartSession;

/// The data channel the events travel on, as the OpenAI Realtime API names it.
pub const EVENTS_CHANNEL: &str = "oai-events";
/// The client's voice goes to the session in pieces this long.
const UPLINK_SAMPLES: usize = FRAME_SAMPLES * 2;
/// The largest datagram read.
const DATAGRAM_BYTES: usize = 2048;

/// What a call may do, from `[server]` and `[webrtc]`.
#[derive(Debug, Clone)]
pub struct CallSettings {
    pub connect_timeout: Duration,
    /// Events the client may send per second; `None`: no limit.
    pub rate: Option<RateLimit>,
    /// What may wait for the client on the data channel (and before it opens).
    pub max_outgoing_bytes: usize,
}

/// Hang up: the client asked (`POST /v1/realtime/calls/{id}/hangup`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Hangup;

pub struct CallEdge {
    id: String,
    rtc: Rtc,
    socket: Arc<UdpSocket>,
    local: SocketAddr,
    settings: CallSettings,
    start: Option<StartSession>,
    /// Events for the session before the client's own (the settings the call was made with).
    first: Vec<String>,
    session: Option<Addr<SessionActor>>,
    calls: Arc<Calls>,
    audio: Option<Mid>,
    channel: Option<ChannelId>,
    /// Events waiting for the data channel to open, and their bytes.
    unsent: Vec<String>,
    unsent_bytes: usize,
    uplink: Uplink,
    heard: Vec<i16>,
    downlink: Downlink,
    playout: Playout<Vec<u8>>,
    rtp_time: u64,
    /// When the last frame left, and whether the pacer was idle since: after a pause the RTP
    /// clock jumps by the pause, as a microphone's would, so the client's jitter buffer sees
    /// the silence (while the pacer runs, its ticks keep the clock).
    last_frame_at: Option<Instant>,
    resumed: bool,
    pacer: Option<SpawnHandle>,
    timer: Option<(Instant, SpawnHandle)>,
    rate: Option<MessageRate>,
    ended: Option<CloseReason>,
    closed_by_session: bool,
}

/// What a call starts from: its negotiated `Rtc` and socket, and how it reaches the rest.
pub struct CallParts {
    pub id: String,
    pub rtc: Rtc,
    pub socket: std::net::UdpSocket,
    pub settings: CallSettings,
    pub start: StartSession,
    pub first: Vec<String>,
    pub calls: Arc<Calls>,
}

impl CallEdge {
    pub fn new(parts: CallParts) -> std::io::Result<CallEdge> {
        parts.socket.set_nonblocking(true)?;
        let local = parts.socket.local_addr()?;
        let socket = Arc::new(UdpSocket::from_std(parts.socket)?);
        let codec = |e: opus::Error| std::io::Error::other(format!("opus: {e}"));
        let now = Instant::now();
        Ok(CallEdge {
            id: parts.id,
            rtc: parts.rtc,
            socket,
            local,
            rate: parts.settings.rate.map(|l| MessageRate::new(l, now)),
            settings: parts.settings,
            start: Some(parts.start),
            first: parts.first,
            session: None,
            calls: parts.calls,
            audio: None,
            channel: None,
            unsent: Vec::new(),
            unsent_bytes: 0,
            uplink: Uplink::new().map_err(codec)?,
            heard: Vec::with_capacity(UPLINK_SAMPLES * 2),
            downlink: Downlink::new().map_err(codec)?,
            playout: Playout::default(),
            rtp_time: 0,
            last_frame_at: None,
            resumed: false,
            pacer: None,
            timer: None,
            ended: None,
            closed_by_session: false,
        })
    }

    fn tell(&self, msg: FromClient) {
        if let Some(s) = &self.session {
            s.do_send(msg);
        }
    }

    /// The edge ends the call; the session hears why when the actor stops.
    fn end(&mut self, ctx: &mut Context<Self>, reason: CloseReason) {
        if self.ended.is_some() || self.closed_by_session {
            return;
        }
        log::info!("call {}: ended ({})", self.id, reason.as_str());
        self.ended = Some(reason);
        self.rtc.disconnect();
        ctx.stop();
    }

    /// Drains the `Rtc`: sends its datagrams, handles its events, and sets the timer for its
    /// next deadline.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        loop {
            match self.rtc.poll_output() {
                Ok(Output::Transmit(t)) => {
                    metrics().bytes_sent.inc_by(t.contents.len() as u64);
                    // UDP: a datagram the kernel will not take now is lost, as on the wire.
                    let _ = self.socket.try_send_to(&t.contents, t.destination);
                }
                Ok(Output::Event(e)) => self.on_event(e, ctx),
                Ok(Output::Timeout(at)) => {
                    self.arm(at, ctx);
                    return;
                }
                Err(e) => {
                    log::info!("call {}: WebRTC error: {e}", self.id);
                    return self.end(ctx, CloseReason::ClientGone);
                }
            }
            if !self.rtc.is_alive() {
                if self.ended.is_none() && !self.closed_by_session {
                    self.end(ctx, CloseReason::ClientGone);
                }
                return;
            }
        }
    }

    fn arm(&mut self, at: Instant, ctx: &mut Context<Self>) {
        if self.ended.is_some() || self.closed_by_session {
            return;
        }
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
            if act.rtc.handle_input(Input::Timeout(Instant::now())).is_ok() {
                act.drive(ctx);
            }
        });
        self.timer = Some((at, handle));
    }

    fn on_event(&mut self, event: Event, ctx: &mut Context<Self>) {
        match event {
            Event::Connected => log::info!("call {}: connected (ICE and DTLS done)", self.id),
            Event::IceConnectionStateChange(IceConnectionState::Disconnected) => {
                log::info!("call {}: ICE lost the client", self.id);
                self.end(ctx, CloseReason::ClientGone);
            }
            Event::MediaAdded(m) if m.kind == MediaKind::Audio && self.audio.is_none() => self.audio = Some(m.mid),
            Event::MediaData(data) if Some(data.mid) == self.audio => self.heard(&data.data),
            Event::ChannelOpen(id, label) => {
                if label != EVENTS_CHANNEL {
                    log::info!(
                        "call {}: a data channel '{label}' is not used (events travel on {EVENTS_CHANNEL})",
                        self.id
                    );
                    return;
                }
                self.channel = Some(id);
                for text in std::mem::take(&mut self.unsent) {
                    self.send(&text, ctx);
                }
                self.unsent_bytes = 0;
            }
            Event::ChannelData(data) if Some(data.id) == self.channel => {
                metrics().bytes_received.inc_by(data.data.len() as u64);
                if data.binary {
                    log::info!("call {}: binary message on {EVENTS_CHANNEL}; ending the call", self.id);
                    return self.end(ctx, CloseReason::ProtocolViolation(Violation::BinaryFrame));
                }
                match String::from_utf8(data.data) {
                    Ok(text) => self.on_client_event(text, ctx),
                    Err(_) => self.end(ctx, CloseReason::ProtocolViolation(Violation::InvalidUtf8)),
                }
            }
            Event::ChannelClose(id) if Some(id) == self.channel => {
                log::info!("call {}: the client closed {EVENTS_CHANNEL}", self.id);
                self.end(ctx, CloseReason::ClientGone);
            }
            _ => {}
        }
    }

    /// The client's voice: decoded, and handed on in pieces of [`UPLINK_SAMPLES`].
    fn heard(&mut self, packet: &[u8]) {
        metrics().bytes_received.inc_by(packet.len() as u64);
        if let Err(e) = self.uplink.decode(packet, &mut self.heard) {
            log::debug!("call {}: an Opus packet does not decode: {e}", self.id);
            return;
        }
        if self.heard.len() >= UPLINK_SAMPLES {
            let text = events::append(&self.heard);
            self.heard.clear();
            self.tell(FromClient::Text(ByteString::from(text)));
        }
    }

    fn on_client_event(&mut self, text: String, ctx: &mut Context<Self>) {
        if !self.within_rate(ctx) {
            return;
        }
        let text = match events::incoming(&text) {
            Incoming::Clear { event_id } => {
                if let Some(notice) = self.clear() {
                    self.notify(notice, event_id.as_deref(), ctx);
                }
                return;
            }
            Incoming::Cancel => {
                if let Some(notice) = self.clear() {
                    self.notify(notice, None, ctx);
                }
                text
            }
            Incoming::Rewritten(rewritten) => rewritten,
            Incoming::Forward => text,
        };
        self.tell(FromClient::Text(ByteString::from(text)));
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
                self.end(ctx, CloseReason::ProtocolViolation(Violation::RateLimited));
                false
            }
        }
    }

    /// Sends an event on the data channel (held until it opens); a client that does not read
    /// it is dropped.
    fn send(&mut self, text: &str, ctx: &mut Context<Self>) {
        let Some(id) = self.channel else {
            self.unsent_bytes += text.len();
            if self.unsent_bytes > self.settings.max_outgoing_bytes {
                return self.slow_consumer(ctx);
            }
            self.unsent.push(text.to_string());
            return;
        };
        let accepted = match self.rtc.channel(id) {
            Some(mut channel) => channel.write(false, text.as_bytes()),
            None => return,
        };
        match accepted {
            Ok(true) => metrics().bytes_sent.inc_by(text.len() as u64),
            Ok(false) => self.slow_consumer(ctx),
            Err(e) => {
                log::info!("call {}: cannot write to {EVENTS_CHANNEL}: {e}", self.id);
                self.end(ctx, CloseReason::ClientGone);
            }
        }
        self.drive(ctx);
    }

    fn slow_consumer(&mut self, ctx: &mut Context<Self>) {
        log::warn!("call {}: the client does not read {EVENTS_CHANNEL}; ending the call", self.id);
        metrics().slow_consumers.inc();
        self.end(ctx, CloseReason::SlowConsumer);
    }

    fn clear(&mut self) -> Option<Notice> {
        self.downlink.drop_pending();
        self.playout.clear()
    }

    fn notify(&mut self, notice: Notice, event_id: Option<&str>, ctx: &mut Context<Self>) {
        let (kind, id) = match &notice {
            Notice::Started { response_id } => ("started", response_id),
            Notice::Stopped { response_id } => ("stopped", response_id),
            Notice::Cleared { response_id } => ("cleared", response_id),
        };
        log::debug!("call {}: output_audio_buffer.{kind} ({id})", self.id);
        let mut text = events::buffer_event(kind, id);
        if let Some(event_id) = event_id {
            // The answer to the client's clear names it.
            text = text.replacen('{', &format!("{{\"client_event_id\":{},", serde_json::json!(event_id)), 1);
        }
        self.send(&text, ctx);
    }

    /// Starts the 20 ms pacer if it is not running.
    fn pace(&mut self, ctx: &mut Context<Self>) {
        if self.pacer.is_some() {
            return;
        }
        self.resumed = true;
        self.pacer = Some(ctx.run_interval(Duration::from_millis(FRAME_MS), |act, ctx| act.tick(ctx)));
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let (frame, notice) = self.playout.tick();
        if let Some(notice) = notice {
            self.notify(notice, None, ctx);
        }
        if let Some(frame) = frame {
            self.write_frame(frame, ctx);
        }
        if !self.playout.busy()
            && let Some(handle) = self.pacer.take()
        {
            ctx.cancel_future(handle);
        }
    }

    fn write_frame(&mut self, frame: Vec<u8>, ctx: &mut Context<Self>) {
        let Some(mid) = self.audio else { return };
        let now = Instant::now();
        if let Some(last) = self.last_frame_at.filter(|_| std::mem::take(&mut self.resumed)) {
            let skipped = (now.saturating_duration_since(last).as_millis() as u64 / FRAME_MS).saturating_sub(1);
            self.rtp_time += skipped * RTP_TICKS_PER_FRAME;
        }
        self.last_frame_at = Some(now);
        let time = MediaTime::new(self.rtp_time, Frequency::FORTY_EIGHT_KHZ);
        self.rtp_time += RTP_TICKS_PER_FRAME;
        let Some(writer) = self.rtc.writer(mid) else { return };
        let Some(pt) = writer.payload_params().find(|p| p.spec().codec == Codec::Opus).map(|p| p.pt()) else {
            return;
        };
        if let Err(e) = writer.write(pt, now, time, frame) {
            log::debug!("call {}: an audio frame was not sent: {e}", self.id);
        }
        self.drive(ctx);
    }

    fn on_session_event(&mut self, text: ByteString, ctx: &mut Context<Self>) {
        match events::outgoing(&text) {
            Outgoing::Audio { response_id, pcm } => {
                let frames = self.downlink.encode(&pcm);
                self.playout.push(&response_id, frames);
                self.pace(ctx);
                return;
            }
            Outgoing::AudioDone { response_id } => {
                if let Some(last) = self.downlink.flush() {
                    self.playout.push(&response_id, [last]);
                }
                if let Some(notice) = self.playout.finish(&response_id) {
                    self.notify(notice, None, ctx);
                }
            }
            Outgoing::SpeechStarted => {
                if let Some(notice) = self.clear() {
                    self.notify(notice, None, ctx);
                }
            }
            Outgoing::Other => {}
        }
        self.send(&text, ctx);
    }
}

impl Actor for CallEdge {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.calls.insert(self.id.clone(), ctx.address());
        if let Some(start) = self.start.take() {
            let session = start(ctx.address().recipient());
            for text in self.first.drain(..) {
                session.do_send(FromClient::Text(ByteString::from(text)));
            }
            self.session = Some(session);
        }
        let socket = self.socket.clone();
        let datagrams = futures_util::stream::unfold(socket, |socket| async move {
            let mut buf = vec![0u8; DATAGRAM_BYTES];
            let got = socket.recv_from(&mut buf).await.map(|(n, from)| {
                buf.truncate(n);
                (buf, from)
            });
            Some((got, socket))
        });
        ctx.add_stream(datagrams);
        ctx.run_later(self.settings.connect_timeout, |act, ctx| {
            if !act.rtc.is_connected() {
                log::info!(
                    "call {}: ICE and DTLS not done within {:?}; dropping the call",
                    act.id,
                    act.settings.connect_timeout
                );
                act.end(ctx, CloseReason::HeartbeatTimeout);
            }
        });
        self.drive(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.calls.remove(&self.id);
        if !self.closed_by_session {
            let reason = self.ended.take().unwrap_or(CloseReason::ClientGone);
            self.tell(FromClient::Ended(reason));
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
        // What does not parse as STUN, DTLS or SRTP is dropped before anything else.
        let Ok(receive) = Receive::new(Protocol::Udp, source, self.local, &buf) else { return };
        let input = Input::Receive(Instant::now(), receive);
        if !self.rtc.accepts(&input) {
            return;
        }
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
        if self.ended.is_some() || self.closed_by_session {
            return;
        }
        match msg {
            ToClient::Text(text) => self.on_session_event(text, ctx),
            ToClient::Close(reason) => {
                log::info!("call {}: the session ended ({}); hanging up", self.id, reason.as_str());
                self.closed_by_session = true;
                self.rtc.disconnect();
                ctx.stop();
            }
        }
    }
}

impl Handler<Hangup> for CallEdge {
    type Result = ();

    fn handle(&mut self, _: Hangup, ctx: &mut Self::Context) {
        self.end(ctx, CloseReason::Client("hangup".into()));
    }
}
