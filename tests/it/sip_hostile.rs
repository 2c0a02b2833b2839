//! The SIP port faces the internet: what strangers, forged sources and broken datagrams can do
//! to it, over real UDP sockets against a real gateway. The test speaks SIP itself (a few lines
//! of RFC 3261 text per request), so it can send what no user agent would.

use std::net::UdpSocket;
use std::time::Duration;

use crate::common::*;

/// A SIP peer on a loopback address of its own choosing (`127.0.0.2` is another host to the
/// gateway's `allowed_networks`).
struct Peer {
    socket: UdpSocket,
}

impl Peer {
    fn on(ip: &str) -> Peer {
        let socket = UdpSocket::bind((ip, 0)).unwrap();
        socket.set_read_timeout(Some(WAIT)).unwrap();
        Peer { socket }
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.socket.local_addr().unwrap()
    }

    fn send(&self, port: u16, message: &str) {
        self.socket.send_to(message.as_bytes(), ("127.0.0.1", port)).unwrap();
    }

    /// The next datagram, within [`WAIT`].
    fn recv(&self) -> String {
        let mut buf = vec![0u8; 65536];
        let (n, _) = self.socket.recv_from(&mut buf).unwrap_or_else(|e| panic!("no answer in time: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// The next response to call `call_id`'s requests with `code`, skipping provisional ones
    /// and what belongs to other calls.
    fn response(&self, code: u16, call_id: &str) -> String {
        loop {
            let got = self.recv();
            if !got.contains(&format!("Call-ID: {call_id}\r\n")) {
                continue;
            }
            if got.starts_with(&format!("SIP/2.0 {code} ")) {
                return got;
            }
            assert!(got.starts_with("SIP/2.0 1"), "wanted {code}, got:\n{got}");
        }
    }

    /// What arrives within `window` (nothing, it is expected).
    fn within(&self, window: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(window)).unwrap();
        let mut buf = vec![0u8; 65536];
        let got = self.socket.recv_from(&mut buf).ok().map(|(n, _)| String::from_utf8_lossy(&buf[..n]).into_owned());
        self.socket.set_read_timeout(Some(WAIT)).unwrap();
        got
    }
}

/// A request as a trunk writes it (`to_tag`: in a dialog; `via`: its Via's sent-by and
/// parameters, e.g. `127.0.0.1:5099;maddr=...`).
struct Request<'a> {
    method: &'a str,
    call_id: &'a str,
    to_tag: Option<&'a str>,
    cseq: u32,
    via: String,
    body: &'a str,
    extra: &'a str,
}

impl<'a> Request<'a> {
    fn new(method: &'a str, call_id: &'a str, from: &Peer) -> Request<'a> {
        Request { method, call_id, to_tag: None, cseq: 1, via: from.addr().to_string(), body: "", extra: "" }
    }

    fn text(&self) -> String {
        let branch = uuid::Uuid::new_v4().simple().to_string();
        let to_tag = self.to_tag.map(|t| format!(";tag={t}")).unwrap_or_default();
        let content_type = if self.body.is_empty() { "" } else { "Content-Type: application/sdp\r\n" };
        format!(
            "{m} sip:100@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{branch}\r\nMax-Forwards: 70\r\n\
             From: <sip:trunk@127.0.0.1>;tag=trunk-tag\r\nTo: <sip:100@127.0.0.1>{to_tag}\r\nCall-ID: {call_id}\r\n\
             CSeq: {cseq} {m}\r\nContact: <sip:trunk@{via}>\r\n{extra}{content_type}Content-Length: {len}\r\n\r\n{body}",
            m = self.method,
            via = self.via,
            call_id = self.call_id,
            cseq = self.cseq,
            extra = self.extra,
            len = self.body.len(),
            body = self.body,
        )
    }
}

/// The tag the gateway gave the dialog, from its 200.
fn to_tag(ok: &str) -> String {
    ok.lines()
        .find(|l| l.to_ascii_lowercase().starts_with("to:"))
        .and_then(|l| l.split(";tag=").nth(1))
        .map(|t| t.split(';').next().unwrap().trim().to_string())
        .unwrap_or_else(|| panic!("a 200 without a To tag:\n{ok}"))
}

/// An SDP offer of G.711 µ-law, its RTP on `rtp`.
fn offer(rtp: u16) -> String {
    format!(
        "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio {rtp} RTP/AVP 0\r\n\
         a=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n"
    )
}

/// A gateway with SIP on a free port, requests taken from `networks`, `rtp` the first of its
/// RTP ports (`pairs` calls' worth), and `more` lines in `[sip]`.
fn gateway(networks: &str, rtp: u16, pairs: u16, more: &str) -> (Server, u16) {
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sip = format!(
        "[sip]\nenabled = true\nbind = \"127.0.0.1:{port}\"\nrtp_ports = [{rtp}, {last}]\n\
         allowed_networks = {networks}\n{more}\n[[sip.routes]]\nnumber = \"*\"\n",
        last = rtp + 2 * pairs - 1
    );
    (Server::ready(Setup::default().workers(workers(1, "")).extra(&sip)), port)
}

fn refused(server: &Server, reason: &str) -> f64 {
    server.metric(&format!("omni_sip_requests_refused_total{{reason=\"{reason}\"}}"))
}

#[test]
fn datagrams_that_broke_the_parser_are_dropped_unlogged_and_sip_keeps_answering() {
    let (server, port) = gateway("[\"127.0.0.0/8\"]", 42000, 4, "");
    let peer = Peer::on("127.0.0.1");
    let options = |extra: &str| {
        let mut r = Request::new("OPTIONS", "alive", &peer);
        r.extra = extra;
        r.text()
    };
    // A Content-Length of usize::MAX overflowed the parser's arithmetic (its only receive task
    // panicked: nothing read the port again), and so did one that wraps just short of it.
    peer.send(port, &options("").replace("Content-Length: 0", "Content-Length: 18446744073709551615"));
    peer.send(port, &options("").replace("Content-Length: 0", "Content-Length: 18446744073709551610"));
    // A Via that is there and empty panicked the request's task.
    peer.send(
        port,
        "OPTIONS sip:100@127.0.0.1 SIP/2.0\r\nVia:\r\nFrom: <sip:a@127.0.0.1>;tag=a\r\nTo: <sip:100@127.0.0.1>\r\n\
         Call-ID: empty-via\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
    );
    // A first line of junk, long: the stack logged it whole, escaped.
    peer.send(port, &format!("{}\r\n\r\n", "\u{1b}[31m".repeat(2000)));
    server.wait_metric("omni_sip_messages_discarded_total", 4.0, WAIT);
    // The port still answers, and nothing of it went into the log.
    peer.send(port, &options(""));
    assert!(peer.response(200, "alive").contains("CSeq: 1 OPTIONS"));
    assert_eq!(server.status()["sip"]["up"], true);
    assert_eq!(server.metric("omni_sip_up"), 1.0);
    let logs = server.logs();
    assert!(!logs.contains("panicked") && !logs.contains("ezk_sip"), "{logs}");
    assert!(!logs.contains("\u{1b}[31m") && !logs.contains("\\u{1b}[31m"), "{logs}");
}

#[test]
fn answers_go_back_where_requests_came_from_never_where_a_via_points() {
    let (server, port) = gateway("[\"127.0.0.1/32\"]", 42100, 4, "");
    let (trunk, victim, stranger) = (Peer::on("127.0.0.1"), Peer::on("127.0.0.1"), Peer::on("127.0.0.2"));
    // A Via naming a third party by maddr and sent-by: the answer goes to the source all the same.
    let mut options = Request::new("OPTIONS", "reflect-1", &trunk);
    options.via = format!("127.0.0.1:{};maddr=127.0.0.1;rport", victim.addr().port());
    trunk.send(port, &options.text());
    trunk.response(200, "reflect-1");
    // A stranger's INVITE with the victim in its Via: its one 403 goes to the stranger.
    let mut invite = Request::new("INVITE", "reflect-2", &stranger);
    invite.via = format!("127.0.0.1:{};maddr=127.0.0.1", victim.addr().port());
    stranger.send(port, &invite.text());
    stranger.response(403, "reflect-2");
    server.wait_metric("omni_sip_requests_refused_total{reason=\"stranger\"}", 1.0, WAIT);
    // A call whose Via names the third party: its 100, 180 and 200 (the SIP stack's own
    // answers, retransmitted until the ACK) go to the trunk, and so does the BYE's 200.
    let media = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sdp = offer(media.local_addr().unwrap().port());
    let mut call = Request::new("INVITE", "reflect-3", &trunk);
    call.via = format!("127.0.0.1:{};maddr=127.0.0.1", victim.addr().port());
    call.body = &sdp;
    trunk.send(port, &call.text());
    let ok = trunk.response(200, "reflect-3");
    let to_tag = to_tag(&ok);
    let mut ack = Request::new("ACK", "reflect-3", &trunk);
    ack.to_tag = Some(&to_tag);
    trunk.send(port, &ack.text());
    let mut bye = Request::new("BYE", "reflect-3", &trunk);
    bye.to_tag = Some(&to_tag);
    bye.cseq = 2;
    trunk.send(port, &bye.text());
    assert!(trunk.response(200, "reflect-3").contains(" BYE\r\n"));
    server.wait_idle();
    assert_eq!(victim.within(Duration::from_millis(200)), None, "the third party was sent an answer");
}

#[test]
fn a_stranger_gets_one_stateless_403_for_an_invite_and_nothing_for_anything_else() {
    let (server, port) = gateway("[\"127.0.0.1/32\"]", 42200, 4, "");
    let stranger = Peer::on("127.0.0.2");
    stranger.send(port, &Request::new("INVITE", "s-1", &stranger).text());
    let forbidden = stranger.response(403, "s-1");
    assert!(to_tag(&forbidden).len() >= 8, "a final answer carries the answerer's To tag:\n{forbidden}");
    for method in ["OPTIONS", "REGISTER", "MESSAGE"] {
        stranger.send(port, &Request::new(method, "s-2", &stranger).text());
    }
    let mut bye = Request::new("BYE", "s-3", &stranger);
    bye.to_tag = Some("gw");
    stranger.send(port, &bye.text());
    server.wait_metric("omni_sip_requests_refused_total{reason=\"stranger\"}", 5.0, WAIT);
    // Nothing else: no answer to the rest, and the 403 is not sent again (a transaction would
    // have retransmitted it at 0.5 s and 1.5 s, RFC 3261's timer G, waiting for an ACK).
    assert_eq!(stranger.within(Duration::from_millis(2000)), None);
    assert_eq!(server.metric("omni_connections_refused_total{reason=\"forbidden_network\"}"), 1.0);
    assert!(server.logs().contains("refused (403): not from sip.allowed_networks"));
    assert_eq!(server.status()["sessions"]["open"], 0);
}

#[test]
fn a_call_is_obeyed_only_from_where_it_came_and_holds_its_place() {
    // One call's place (one RTP port pair); two trunks, each its own entry of the networks.
    let (server, port) = gateway("[\"127.0.0.1/32\", \"127.0.0.2/32\"]", 42300, 1, "");
    let (trunk, intruder) = (Peer::on("127.0.0.1"), Peer::on("127.0.0.2"));
    let media = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sdp = offer(media.local_addr().unwrap().port());
    let mut invite = Request::new("INVITE", "call-1", &trunk);
    invite.body = &sdp;
    trunk.send(port, &invite.text());
    let ok = trunk.response(200, "call-1");
    let to_tag = to_tag(&ok);
    let in_dialog = |method: &'static str, cseq: u32, from: &Peer| {
        let mut r = Request::new(method, "call-1", from);
        r.to_tag = Some(&to_tag);
        r.cseq = cseq;
        r.text()
    };
    trunk.send(port, &in_dialog("ACK", 1, &trunk));
    server.wait_status("the call's session", WAIT, |s| s["sessions"]["open"] == 1);
    // Another trunk (or a source forged in its network) cannot hang it up or move its media.
    intruder.send(port, &in_dialog("BYE", 2, &intruder));
    let mut reinvite = Request::new("INVITE", "call-1", &intruder);
    reinvite.to_tag = Some(&to_tag);
    reinvite.cseq = 3;
    let moved = offer(40);
    reinvite.body = &moved;
    intruder.send(port, &reinvite.text());
    server.wait_metric("omni_sip_requests_refused_total{reason=\"dialog_elsewhere\"}", 2.0, WAIT);
    assert_eq!(intruder.within(Duration::from_millis(200)), None);
    assert_eq!(server.status()["sessions"]["open"], 1);
    // A late copy of its INVITE opens no second call.
    trunk.send(port, &invite.text());
    server.wait_metric("omni_sip_requests_refused_total{reason=\"call_exists\"}", 1.0, WAIT);
    // The call holds the only place: another INVITE gets a stateless 503.
    let mut second = Request::new("INVITE", "call-2", &trunk);
    second.body = &sdp;
    trunk.send(port, &second.text());
    trunk.response(503, "call-2");
    assert_eq!(refused(&server, "busy"), 1.0);
    // A BYE for a call that is not here: 481, stateless.
    let mut stray = Request::new("BYE", "no-such-call", &trunk);
    stray.to_tag = Some("x");
    trunk.send(port, &stray.text());
    trunk.response(481, "no-such-call");
    // The trunk's own BYE ends it (its next CSeq: the intruder's were never the dialog's).
    trunk.send(port, &in_dialog("BYE", 2, &trunk));
    assert!(trunk.response(200, "call-1").contains(" BYE\r\n"));
    server.wait_idle();
    server.wait_log("the call ended", WAIT);
}

#[test]
fn an_address_past_its_invites_a_second_is_dropped_and_other_methods_get_405() {
    let (server, port) = gateway("[\"127.0.0.0/8\"]", 42400, 4, "max_invites_per_s_per_ip = 2");
    let trunk = Peer::on("127.0.0.1");
    // Six INVITEs (no offer: each that gets through is refused 488) in a moment: at most two a
    // second pass (three seconds' worth if the moment straddles two).
    for i in 0..6 {
        trunk.send(port, &Request::new("INVITE", &format!("burst-{i}"), &trunk).text());
    }
    server.wait_metric("omni_sip_requests_refused_total{reason=\"rate\"}", 2.0, WAIT);
    trunk.send(port, &Request::new("REGISTER", "register-1", &trunk).text());
    trunk.response(405, "register-1");
}
