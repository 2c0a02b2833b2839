//! A call's media, agreed in SDP (on ezk's SDP types; nothing here parses text): the trunk's
//! offer names where it takes RTP and which codecs; the answer takes Opus when it is offered
//! (48 kHz on the RTP clock, 20 ms: wideband, the model hears 16 kHz instead of 8), else the
//! first G.711 offered (PCMU or PCMA, 8 kHz, 20 ms), RFC 4733 telephone events when it offers
//! them, and names this call's RTP port. Every other stream (video, a second audio) is
//! refused in the answer with port 0, as RFC 3264 has it. Media it cannot take (SRTP, neither
//! Opus nor G.711) is refused as a whole (488).

use std::net::{IpAddr, SocketAddr};

use bytesstr::BytesStr;
use ezk_sdp_types::{
    Connection, Direction, Fmtp, MediaDescription, MediaType, Origin, RtpMap, SessionDescription, TaggedAddress,
    TransportProtocol,
};

pub use omni_actors::audio::g711::Law;

/// The voice's codec, both ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    G711(Law),
    /// Opus (RFC 7587): 48 kHz on the RTP clock, mono from here.
    Opus,
}

impl Codec {
    pub fn name(self) -> &'static str {
        match self {
            Codec::G711(law) => law.sdp_name(),
            Codec::Opus => "opus",
        }
    }

    /// Its RTP clock, in ticks a second.
    pub fn clock_rate(self) -> u32 {
        match self {
            Codec::G711(_) => 8000,
            Codec::Opus => 48_000,
        }
    }
}

/// What was agreed for a call's audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Media {
    /// Where the trunk takes RTP (the offer's address and port).
    pub remote: SocketAddr,
    /// The voice's codec both ways and its RTP payload type.
    pub codec: Codec,
    pub payload_type: u8,
    /// RFC 4733's payload type, when the trunk sends keys as telephone events, and its clock.
    pub events: Option<u8>,
    pub events_clock: u32,
    /// The trunk holds the call (`sendonly`: it may play music; `inactive`): what it sends is
    /// not the caller's voice.
    pub held: bool,
    /// The trunk sends RTP (`sendrecv`, `sendonly`): its silence for long is a dead call.
    pub sends: bool,
    /// The trunk takes voice: its offer is `sendrecv` or `recvonly` (on hold, `sendonly` or
    /// `inactive`, it takes none).
    pub receives: bool,
}

/// Why an offer gets no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OfferRefused {
    #[error("the offer has no audio stream")]
    NoAudio,
    #[error("the offer's audio is {0}, not plain RTP (RTP/AVP)")]
    Protocol(String),
    #[error("the offer's audio has none of opus, PCMU and PCMA")]
    NoCodec,
    #[error("the offer names no address for its audio")]
    NoAddress,
}

/// The static payload types of G.711 (RFC 3551).
const PCMU: u8 = 0;
const PCMA: u8 = 8;

/// The codec a payload type of `m` stands for, if it is one of G.711's at 8 kHz.
fn g711(m: &MediaDescription, pt: u8) -> Option<Law> {
    match m.rtpmap.iter().find(|r| r.payload == pt) {
        Some(r) if r.clock_rate != 8000 => None,
        Some(r) if r.encoding.eq_ignore_ascii_case("PCMU") => Some(Law::Mu),
        Some(r) if r.encoding.eq_ignore_ascii_case("PCMA") => Some(Law::A),
        Some(_) => None,
        None if pt == PCMU => Some(Law::Mu),
        None if pt == PCMA => Some(Law::A),
        None => None,
    }
}

/// Whether payload type `pt` of `m` is Opus (dynamic, so named by its rtpmap).
fn opus(m: &MediaDescription, pt: u8) -> bool {
    m.rtpmap.iter().any(|r| r.payload == pt && r.encoding.eq_ignore_ascii_case("opus") && r.clock_rate == 48_000)
}

fn address(c: &Connection) -> Option<IpAddr> {
    match &c.address {
        TaggedAddress::IP4(ip) => Some(IpAddr::V4(*ip)),
        TaggedAddress::IP6(ip) => Some(IpAddr::V6(*ip)),
        // A host name in SDP is rare from a trunk; resolving it is not done here.
        TaggedAddress::IP4FQDN(_) | TaggedAddress::IP6FQDN(_) => None,
    }
}

/// The audio `sdp` (an offer, or the answer to ours) agrees on, and the index of its stream.
pub fn agreed(sdp: &SessionDescription) -> Result<(usize, Media), OfferRefused> {
    let offer = sdp;
    let audio = offer
        .media_descriptions
        .iter()
        .position(|m| m.media.media_type == MediaType::Audio && m.media.port != 0)
        .ok_or(OfferRefused::NoAudio)?;
    let m = &offer.media_descriptions[audio];
    if m.media.proto != TransportProtocol::RtpAvp {
        return Err(OfferRefused::Protocol(m.media.proto.to_string()));
    }
    let (payload_type, codec) = m
        .media
        .fmts
        .iter()
        .find(|&&pt| opus(m, pt))
        .map(|&pt| (pt, Codec::Opus))
        .or_else(|| m.media.fmts.iter().find_map(|&pt| g711(m, pt).map(|law| (pt, Codec::G711(law)))))
        .ok_or(OfferRefused::NoCodec)?;
    // Keys on the voice's clock, else on another (user agents offer telephone-event/8000 beside
    // Opus; a key is told by its timestamp changing, whatever the clock).
    let keys = |same_clock: bool| {
        m.rtpmap
            .iter()
            .filter(|r| r.encoding.eq_ignore_ascii_case("telephone-event") && m.media.fmts.contains(&r.payload))
            .find(|r| (r.clock_rate == codec.clock_rate()) == same_clock)
            .map(|r| (r.payload, r.clock_rate))
    };
    let events = keys(true).or_else(|| keys(false));
    let ip = m.connection.as_ref().or(offer.connection.as_ref()).and_then(address).ok_or(OfferRefused::NoAddress)?;
    let direction = if m.direction != Direction::SendRecv { m.direction } else { offer.direction };
    let media = Media {
        remote: SocketAddr::new(ip, m.media.port),
        codec,
        payload_type,
        events: events.map(|(pt, _)| pt),
        events_clock: events.map_or(8000, |(_, clock)| clock),
        held: matches!(direction, Direction::SendOnly | Direction::Inactive),
        sends: matches!(direction, Direction::SendRecv | Direction::SendOnly),
        receives: matches!(direction, Direction::SendRecv | Direction::RecvOnly),
    };
    Ok((audio, media))
}

/// Our offer in a re-INVITE that asks for one (a resume without SDP): the last answer, both
/// ways, as the next version.
pub fn reoffer(last: &SessionDescription, version: u64) -> SessionDescription {
    let mut offer = last.clone();
    offer.origin.session_version = BytesStr::from(version.to_string());
    for m in offer.media_descriptions.iter_mut().filter(|m| m.media.port != 0) {
        m.direction = Direction::SendRecv;
    }
    offer
}

/// Agrees on the audio of `offer` and answers it with `local` (the address and port of this
/// call's RTP as the trunk reaches it), as session `version` of `session_id` (a re-INVITE's
/// answer is the next version).
pub fn answer(
    offer: &SessionDescription,
    local: SocketAddr,
    session_id: u64,
    version: u64,
) -> Result<(Media, SessionDescription), OfferRefused> {
    let (audio, media) = agreed(offer)?;
    let m = &offer.media_descriptions[audio];
    let (payload_type, codec, events) = (media.payload_type, media.codec, media.events);
    let direction = if m.direction != Direction::SendRecv { m.direction } else { offer.direction };

    let mut fmts = vec![payload_type];
    let mut rtpmap = vec![RtpMap {
        payload: payload_type,
        encoding: BytesStr::from_static(codec.name()),
        clock_rate: codec.clock_rate(),
        // RFC 7587: Opus is always named with two channels; it is sent mono.
        params: (codec == Codec::Opus).then(|| BytesStr::from_static("2")),
    }];
    let mut fmtp = Vec::new();
    if codec == Codec::Opus {
        fmtp.push(Fmtp { format: payload_type, params: BytesStr::from_static("stereo=0;sprop-stereo=0") });
    }
    if let Some(pt) = events {
        fmts.push(pt);
        rtpmap.push(RtpMap {
            payload: pt,
            encoding: BytesStr::from_static("telephone-event"),
            clock_rate: media.events_clock,
            params: None,
        });
        fmtp.push(Fmtp { format: pt, params: BytesStr::from_static("0-15") });
    }
    let mut ours = MediaDescription::rejected(MediaType::Audio);
    ours.media.port = local.port();
    ours.media.fmts = fmts;
    ours.rtpmap = rtpmap;
    ours.fmtp = fmtp;
    ours.direction = direction.flipped();
    ours.mid = m.mid.clone();
    ours.attributes.push(ezk_sdp_types::UnknownAttribute {
        name: BytesStr::from_static("ptime"),
        value: Some(BytesStr::from_static("20")),
    });
    let media_descriptions = offer
        .media_descriptions
        .iter()
        .enumerate()
        .map(|(i, m)| if i == audio { ours.clone() } else { MediaDescription::rejected(m.media.media_type) })
        .collect();
    let tagged = TaggedAddress::from(local.ip());
    let answer = SessionDescription {
        origin: Origin {
            username: BytesStr::from_static("omni-gateway"),
            session_id: BytesStr::from(session_id.to_string()),
            session_version: BytesStr::from(version.to_string()),
            address: tagged.clone(),
        },
        name: BytesStr::from_static("omni-gateway"),
        connection: Some(Connection { address: tagged, ttl: None, num: None }),
        bandwidth: Vec::new(),
        time: offer.time.clone(),
        direction: Direction::SendRecv,
        group: Vec::new(),
        extmap: Vec::new(),
        extmap_allow_mixed: false,
        ice_lite: false,
        ice_options: Default::default(),
        ice_ufrag: None,
        ice_pwd: None,
        setup: None,
        fingerprint: Vec::new(),
        attributes: Vec::new(),
        media_descriptions,
    };
    Ok((media, answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(sdp: &str) -> SessionDescription {
        SessionDescription::parse(&BytesStr::from(sdp.replace('\n', "\r\n"))).unwrap()
    }

    const BARESIP: &str = "v=0
o=- 1 2 IN IP4 192.0.2.10
s=-
c=IN IP4 192.0.2.10
t=0 0
m=audio 4000 RTP/AVP 9 0 8 101
a=rtpmap:9 G722/8000
a=rtpmap:101 telephone-event/8000
a=fmtp:101 0-15
a=sendrecv
m=video 4002 RTP/AVP 96
a=rtpmap:96 H264/90000
";

    #[test]
    fn the_first_g711_offered_is_taken_with_its_keys_and_video_is_refused() {
        let local: SocketAddr = "198.51.100.1:40000".parse().unwrap();
        let (media, answer) = answer(&parse(BARESIP), local, 7, 1).unwrap();
        assert_eq!(media.remote, "192.0.2.10:4000".parse().unwrap());
        assert_eq!((media.codec, media.payload_type, media.events), (Codec::G711(Law::Mu), 0, Some(101)));
        assert!(!media.held && media.receives);
        let text = answer.to_string();
        assert!(text.contains("c=IN IP4 198.51.100.1"), "{text}");
        assert!(text.contains("m=audio 40000 RTP/AVP 0 101"), "{text}");
        assert!(text.contains("a=rtpmap:101 telephone-event/8000"), "{text}");
        assert!(text.contains("m=video 0 "), "{text}");
        // What the answer says parses back.
        parse(&text.replace("\r\n", "\n"));
    }

    #[test]
    fn opus_offered_is_taken_before_g711_with_the_keys_it_offers() {
        let local: SocketAddr = "198.51.100.1:40000".parse().unwrap();
        let offer = BARESIP
            .replace("RTP/AVP 9 0 8 101", "RTP/AVP 0 8 111 101")
            .replace("a=rtpmap:9 G722/8000", "a=rtpmap:111 opus/48000/2\na=fmtp:111 stereo=1;sprop-stereo=1");
        let (media, answer) = answer(&parse(&offer), local, 7, 1).unwrap();
        assert_eq!((media.codec, media.payload_type, media.events), (Codec::Opus, 111, Some(101)));
        let text = answer.to_string();
        assert!(text.contains("m=audio 40000 RTP/AVP 111 101"), "{text}");
        assert!(text.contains("a=rtpmap:111 opus/48000/2"), "{text}");
        assert!(text.contains("a=fmtp:111 stereo=0"), "{text}");
        // Keys on Opus's own clock when offered so.
        let keys48 = offer.replace("a=rtpmap:101 telephone-event/8000", "a=rtpmap:101 telephone-event/48000");
        let (media, answer) = super::answer(&parse(&keys48), local, 7, 1).unwrap();
        assert_eq!((media.events, media.events_clock), (Some(101), 48_000));
        assert!(answer.to_string().contains("a=rtpmap:101 telephone-event/48000"), "{answer}");
        parse(&text.replace("\r\n", "\n"));
    }

    #[test]
    fn a_hold_is_answered_in_kind_and_an_offer_without_g711_or_over_srtp_is_refused() {
        let local: SocketAddr = "198.51.100.1:40000".parse().unwrap();
        let hold = BARESIP.replace("a=sendrecv", "a=sendonly");
        let (media, answer) = answer(&parse(&hold), local, 7, 2).unwrap();
        assert!(media.held && !media.receives, "a trunk that only sends takes no voice");
        assert!(answer.to_string().contains("a=recvonly"), "{answer}");
        let g722_only = BARESIP.replace("RTP/AVP 9 0 8 101", "RTP/AVP 9 101");
        assert_eq!(super::answer(&parse(&g722_only), local, 7, 1).unwrap_err(), OfferRefused::NoCodec);
        let srtp = BARESIP.replace("m=audio 4000 RTP/AVP", "m=audio 4000 RTP/SAVP");
        assert!(matches!(super::answer(&parse(&srtp), local, 7, 1), Err(OfferRefused::Protocol(_))));
    }
}
