//! The SIP client, as a trunk calls: an INVITE with an SDP offer of PCMU (ezk's SIP stack, one
//! endpoint for every call of the run), then 20 ms μ-law frames over RTP in real time, the
//! model's voice timed against its RTP clock, and a BYE at the end.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytesstr::BytesStr;
use ezk_sdp_types::{SessionDescription, TaggedAddress};
use ezk_sip_auth::{DigestAuthenticator, DigestCredentials};
use ezk_sip_core::Endpoint;
use ezk_sip_types::header::typed::Contact;
use ezk_sip_types::uri::{NameAddr, SipUri};
use ezk_sip_ua::dialog::DialogLayer;
use ezk_sip_ua::invite::InviteLayer;
use ezk_sip_ua::{CallEvent, MediaBackend, OutboundCall};
use rtp_types::{RtpPacket, RtpPacketBuilder};
use tokio::sync::OnceCell;

use super::{FRAME_MS, Heard, Shared};

/// The run's one SIP endpoint, and the address it listens on.
static ENDPOINT: OnceCell<(Endpoint, SocketAddr)> = OnceCell::const_new();

async fn endpoint() -> Result<&'static (Endpoint, SocketAddr), String> {
    ENDPOINT
        .get_or_try_init(|| async {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            let addr = socket.local_addr().map_err(|e| e.to_string())?;
            drop(socket);
            let mut builder = Endpoint::builder();
            builder.add_layer(DialogLayer::default());
            builder.add_layer(InviteLayer::default());
            builder.bind_udp(addr).await.map_err(|e| e.to_string())?;
            Ok((builder.build(), addr))
        })
        .await
}

/// The call's side of the media: an offer of PCMU from its RTP port; the answer's address.
struct Offer {
    local: SocketAddr,
    remote: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct MediaError(String);

impl MediaBackend for Offer {
    type Error = MediaError;
    type Event = ();

    fn has_media(&self) -> bool {
        true
    }

    async fn create_sdp_offer(&mut self) -> Result<SessionDescription, MediaError> {
        let (ip, port) = (self.local.ip(), self.local.port());
        let text = format!(
            "v=0\r\no=- 1 1 IN IP4 {ip}\r\ns=-\r\nc=IN IP4 {ip}\r\nt=0 0\r\nm=audio {port} RTP/AVP 0 101\r\n\
             a=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\na=ptime:20\r\na=sendrecv\r\n"
        );
        SessionDescription::parse(&BytesStr::from(text)).map_err(|e| MediaError(e.to_string()))
    }

    async fn receive_sdp_answer(&mut self, sdp: SessionDescription) -> Result<(), MediaError> {
        let m = sdp.media_descriptions.first().ok_or_else(|| MediaError("an answer without media".into()))?;
        let ip = match m.connection.as_ref().or(sdp.connection.as_ref()).map(|c| &c.address) {
            Some(TaggedAddress::IP4(ip)) => std::net::IpAddr::V4(*ip),
            Some(TaggedAddress::IP6(ip)) => std::net::IpAddr::V6(*ip),
            _ => return Err(MediaError("an answer without an address".into())),
        };
        self.remote = Some(SocketAddr::new(ip, m.media.port));
        Ok(())
    }

    async fn receive_sdp_offer(&mut self, _: SessionDescription) -> Result<SessionDescription, MediaError> {
        Err(MediaError("a re-INVITE is not expected".into()))
    }

    async fn run(&mut self) -> Result<(), MediaError> {
        std::future::pending().await
    }
}

pub(super) async fn call(shared: &Shared) -> Result<(), String> {
    let (endpoint, sip) = endpoint().await?;
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let me: SipUri = format!("sip:load@{sip}").parse().map_err(|_| "a SIP URI")?;
    let target: SipUri = format!("sip:100@{}", shared.args.sip).parse().map_err(|_| "the gateway's SIP URI")?;
    let offer = Offer { local, remote: None };
    let authenticator = DigestAuthenticator::new(DigestCredentials::new());
    let mut outbound = OutboundCall::make(
        endpoint.clone(),
        authenticator,
        NameAddr::uri(me.clone()),
        Contact::new(NameAddr::uri(me)),
        target,
        offer,
    )
    .await
    .map_err(|e| format!("the INVITE: {e}"))?;
    let answered = outbound.wait_for_completion().await.map_err(|e| format!("the answer: {e}"))?;
    let mut call = answered.finish().await.map_err(|e| format!("the ACK: {e}"))?;
    let remote = call.media().remote.ok_or("no RTP address in the answer")?;

    let (mut up, mut down) = (0u64, 0u64);
    let mut heard = Heard::default();
    let began = Instant::now();
    let mut next_frame = began;
    let mut frame_no = 0usize;
    let mut buf = vec![0u8; 2048];
    let ssrc = local.port().into();
    // The gateway's RTP clock starts anywhere: timed from its first packet, wrapping.
    let mut first_ts: Option<u32> = None;
    loop {
        if began.elapsed().as_secs_f64() >= shared.args.duration {
            heard.report(shared, up, down, began.elapsed());
            // ezk's caller numbers its ACK as a request of its own, so the gateway's side of the
            // dialog (ezk too) waits for the CSeq it skipped and never sees this BYE: not waited
            // for (the gateway ends the call when its RTP stops).
            tokio::spawn(call.terminate());
            return Ok(());
        }
        tokio::select! {
            event = call.run() => match event.map_err(|e| e.to_string())? {
                CallEvent::Internal(e) => call.handle_internal_event(e).await.map_err(|e| e.to_string())?,
                CallEvent::Media(()) => {}
                CallEvent::Terminated => return Err("the gateway hung up".into()),
            },
            got = socket.recv_from(&mut buf) => {
                let (n, _) = got.map_err(|e| e.to_string())?;
                down += n as u64;
                let Ok(packet) = RtpPacket::parse(&buf[..n]) else { continue };
                let now = Instant::now();
                // μ-law silence is 0xff (or 0x7f); the reference backend's voice is not.
                if packet.payload().iter().any(|&b| b & 0x7f < 0x70) {
                    heard.voice(now);
                }
                let ts0 = *first_ts.get_or_insert(packet.timestamp());
                heard.frame(now, f64::from(packet.timestamp().wrapping_sub(ts0)) / 8.0);
            }
            _ = tokio::time::sleep_until(next_frame.into()) => {
                let i = heard.frame_out(shared, frame_no, shared.ulaw.len(), Instant::now());
                let packet = RtpPacketBuilder::new()
                    .payload_type(0)
                    .sequence_number(frame_no as u16)
                    .timestamp((frame_no * 160) as u32)
                    .ssrc(ssrc)
                    .marker_bit(frame_no == 0)
                    .payload(shared.ulaw[i].as_slice())
                    .write_vec_unchecked();
                up += packet.len() as u64;
                let _ = socket.send_to(&packet, remote).await;
                frame_no += 1;
                next_frame += Duration::from_millis(FRAME_MS);
            }
        }
    }
}
