//! Fuzzing the SIP port (proptest) as a stranger on the internet can: SIP requests a trunk
//! would send (an INVITE with its offer, OPTIONS, BYE, CANCEL, ACK, REGISTER), mutated (bytes
//! flipped, cut, repeated; numbers swapped for huge ones, headers emptied or doubled), sent as
//! datagrams to one running gateway from an allowed address. Afterwards the gateway must still
//! answer OPTIONS, report its SIP edge up, and have logged no panic.
//!
//! `PROPTEST_CASES` datagrams (proptest's default, 256) in the test suite; `.ci/run` runs 4,000;
//! longer: `PROPTEST_CASES=100000 cargo test --test it fuzz_sip::`.

use std::net::UdpSocket;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::common::*;

/// Requests as a trunk writes them (`{via}`: the sender's address).
const SEEDS: [&str; 6] = [
    "INVITE sip:100@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{n};rport\r\nMax-Forwards: 70\r\n\
     From: <sip:trunk@127.0.0.1>;tag=f{n}\r\nTo: <sip:100@127.0.0.1>\r\nCall-ID: fuzz-{n}\r\nCSeq: 1 INVITE\r\n\
     Contact: <sip:trunk@{via}>\r\nContent-Type: application/sdp\r\nContent-Length: 129\r\n\r\n\
     v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 9 RTP/AVP 0 8\r\n\
     a=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n",
    "OPTIONS sip:100@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{n}\r\nMax-Forwards: 70\r\n\
     From: <sip:trunk@127.0.0.1>;tag=f{n}\r\nTo: <sip:100@127.0.0.1>\r\nCall-ID: fuzz-{n}\r\nCSeq: 7 OPTIONS\r\n\
     Content-Length: 0\r\n\r\n",
    "BYE sip:omni-gateway@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{n}\r\nMax-Forwards: 70\r\n\
     From: <sip:trunk@127.0.0.1>;tag=f{n}\r\nTo: <sip:100@127.0.0.1>;tag=g{n}\r\nCall-ID: fuzz-{n}\r\n\
     CSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n",
    "CANCEL sip:100@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{n}\r\nMax-Forwards: 70\r\n\
     From: <sip:trunk@127.0.0.1>;tag=f{n}\r\nTo: <sip:100@127.0.0.1>\r\nCall-ID: fuzz-{n}\r\nCSeq: 1 CANCEL\r\n\
     Content-Length: 0\r\n\r\n",
    "ACK sip:100@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{n}\r\nMax-Forwards: 70\r\n\
     From: <sip:trunk@127.0.0.1>;tag=f{n}\r\nTo: <sip:100@127.0.0.1>;tag=g{n}\r\nCall-ID: fuzz-{n}\r\n\
     CSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n",
    "REGISTER sip:127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{n}\r\nMax-Forwards: 70\r\n\
     From: <sip:trunk@127.0.0.1>;tag=f{n}\r\nTo: <sip:trunk@127.0.0.1>\r\nCall-ID: fuzz-{n}\r\nCSeq: 1 REGISTER\r\n\
     Contact: <sip:trunk@{via}>\r\nExpires: 3600\r\nContent-Length: 0\r\n\r\n",
];

/// Values that broke parsers before: lengths and counts that overflow, empty and odd tokens.
const NASTY: [&str; 10] = [
    "18446744073709551615",
    "18446744073709551610",
    "4294967296",
    "-1",
    "",
    ";",
    "\u{0}",
    "%",
    "SIP/2.0/UDP",
    "<sip:@>",
];

/// One mutation of a request's text.
#[derive(Debug, Clone)]
enum Mutation {
    /// A byte at a fraction of the length replaced.
    Flip(f64, u8),
    /// Cut at a fraction of the length.
    Cut(f64),
    /// The span between two fractions repeated `n` times.
    Repeat(f64, f64, u8),
    /// Every number at a fraction's place (by order) replaced with a nasty value.
    Number(f64, usize),
    /// One header line's value replaced with a nasty value (`Via:` with nothing after it...).
    Header(f64, usize),
    /// One header line doubled.
    Double(f64),
    /// Line ends made bare `\n` (or `\r`).
    LineEnds(bool),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let f = 0.0..1.0f64;
    prop_oneof![
        (f.clone(), any::<u8>()).prop_map(|(at, b)| Mutation::Flip(at, b)),
        f.clone().prop_map(Mutation::Cut),
        (f.clone(), f.clone(), 1..8u8).prop_map(|(a, b, n)| Mutation::Repeat(a, b, n)),
        (f.clone(), 0..NASTY.len()).prop_map(|(at, v)| Mutation::Number(at, v)),
        (f.clone(), 0..NASTY.len()).prop_map(|(at, v)| Mutation::Header(at, v)),
        f.prop_map(Mutation::Double),
        any::<bool>().prop_map(Mutation::LineEnds),
    ]
}

fn at(len: usize, fraction: f64) -> usize {
    ((len as f64 * fraction) as usize).min(len.saturating_sub(1))
}

fn apply(text: &mut Vec<u8>, m: &Mutation) {
    if text.is_empty() {
        return;
    }
    match *m {
        Mutation::Flip(f, b) => {
            let i = at(text.len(), f);
            text[i] = b;
        }
        Mutation::Cut(f) => text.truncate(at(text.len(), f)),
        Mutation::Repeat(a, b, n) => {
            let (i, j) = (at(text.len(), a.min(b)), at(text.len(), a.max(b)) + 1);
            let span = text[i..j].to_vec();
            for _ in 0..n {
                text.splice(j..j, span.iter().copied());
            }
        }
        Mutation::Number(f, v) => {
            let s = lossy(text);
            let numbers: Vec<(usize, usize)> = digit_runs(&s);
            if let Some(&(i, j)) = numbers.get(at(numbers.len().max(1), f)) {
                text.splice(i..j, NASTY[v].bytes());
            }
        }
        Mutation::Header(f, v) => {
            let s = lossy(text);
            let lines: Vec<(usize, usize)> = header_values(&s);
            if let Some(&(i, j)) = lines.get(at(lines.len().max(1), f)) {
                text.splice(i..j, NASTY[v].bytes());
            }
        }
        Mutation::Double(f) => {
            let s = lossy(text);
            let lines: Vec<(usize, usize)> = header_values(&s);
            if let Some(&(_, j)) = lines.get(at(lines.len().max(1), f)) {
                let start = s[..j].rfind("\r\n").map_or(0, |p| p + 2);
                let line = format!("{}\r\n", &s[start..j]);
                text.splice(start..start, line.bytes());
            }
        }
        Mutation::LineEnds(bare_lf) => {
            let s = String::from_utf8_lossy(text).replace("\r\n", if bare_lf { "\n" } else { "\r" });
            *text = s.into_bytes();
        }
    }
}

/// The text as UTF-8 (invalid bytes replaced), and the bytes made the same, so that positions
/// found in the one are positions in the other.
fn lossy(text: &mut Vec<u8>) -> String {
    let s = String::from_utf8_lossy(text).into_owned();
    *text = s.clone().into_bytes();
    s
}

/// Where each run of digits is, as byte ranges.
fn digit_runs(s: &str) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, c) in s.char_indices() {
        match (c.is_ascii_digit(), start) {
            (true, None) => start = Some(i),
            (false, Some(b)) => {
                runs.push((b, i));
                start = None;
            }
            _ => {}
        }
    }
    runs
}

/// Where each header line's value is (after `Name:`), as byte ranges.
fn header_values(s: &str) -> Vec<(usize, usize)> {
    let head = s.find("\r\n\r\n").unwrap_or(s.len());
    let mut values = Vec::new();
    let mut offset = 0;
    for line in s[..head].split("\r\n").skip(1) {
        let line_start = s[offset..].find(line).map_or(offset, |p| offset + p);
        if let Some(colon) = line.find(':') {
            values.push((line_start + colon + 1, line_start + line.len()));
        }
        offset = line_start + line.len();
    }
    values
}

#[test]
fn mutated_sip_datagrams_leave_the_port_answering() {
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // Calls to 100 find no route (404): the INVITEs that parse are answered without a session.
    let sip = format!(
        "[sip]\nenabled = true\nbind = \"127.0.0.1:{port}\"\nrtp_ports = [42600, 42619]\n\
         allowed_networks = [\"127.0.0.0/8\"]\nmax_invites_per_s_per_ip = 0\n[[sip.routes]]\nnumber = \"555\"\n"
    );
    let server = Server::ready(Setup::default().workers(workers(1, "")).extra(&sip));
    let socket = UdpSocket::bind("127.0.0.2:0").unwrap();
    let via = socket.local_addr().unwrap().to_string();
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::default() });
    let n = std::cell::Cell::new(0u64);
    let strategy = (0..SEEDS.len(), proptest::collection::vec(mutation(), 1..4));
    runner
        .run(&strategy, |(seed, mutations)| {
            n.set(n.get() + 1);
            let mut text = SEEDS[seed].replace("{via}", &via).replace("{n}", &n.get().to_string()).into_bytes();
            for m in &mutations {
                apply(&mut text, m);
            }
            text.truncate(65_000);
            socket.send_to(&text, ("127.0.0.1", port)).unwrap();
            Ok(())
        })
        .unwrap();
    // The port still answers, its edge is up, and nothing panicked. (The burst may have filled
    // the socket's receive buffer, where the kernel drops what does not fit: the keepalive is
    // sent again each second, as a trunk's would be, until answered.)
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    probe.set_read_timeout(Some(std::time::Duration::from_secs(1))).unwrap();
    let options = SEEDS[1].replace("{via}", &probe.local_addr().unwrap().to_string()).replace("{n}", "probe");
    let deadline = std::time::Instant::now() + WAIT;
    let mut buf = vec![0u8; 65536];
    'asking: loop {
        assert!(std::time::Instant::now() < deadline, "no answer to OPTIONS after the fuzzing");
        probe.send_to(options.as_bytes(), ("127.0.0.1", port)).unwrap();
        while let Ok((len, _)) = probe.recv_from(&mut buf) {
            let answer = String::from_utf8_lossy(&buf[..len]);
            if answer.contains("Call-ID: fuzz-probe") {
                assert!(answer.starts_with("SIP/2.0 200 "), "{answer}");
                break 'asking;
            }
        }
    }
    assert_eq!(server.status()["sip"]["up"], true);
    let logs = server.logs();
    assert!(!logs.contains("panicked"), "{logs}");
}
