//! WebRTC calls (`POST /v1/realtime/calls`): an independent WebRTC stack (Python's aiortc, in
//! `.venv`) mints a client secret, makes a call, waits in the queue, speaks Opus, hears the
//! model's voice on its track, clears it, and hangs up; the session is recorded and accounted
//! as a WebSocket session is. Then what the signalling refuses, and a call that never
//! connects.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::common::*;

const KEY: &str = "rtc-test-key-0123456789";
const OTHER_KEY: &str = "rtc-other-key-0123456789";

/// An SDP offer from str0m acting as a browser: an audio track and the events' data channel.
fn offer() -> String {
    let crypto = std::sync::Arc::new(str0m::crypto::from_feature_flags());
    let mut rtc = str0m::RtcConfig::new().set_crypto_provider(crypto).build(std::time::Instant::now());
    let mut change = rtc.sdp_api();
    change.add_media(str0m::media::MediaKind::Audio, str0m::media::Direction::SendRecv, None, None, None);
    change.add_channel("oai-events".into());
    let (offer, _pending) = change.apply().expect("an offer");
    offer.to_sdp_string()
}

/// A POST with a body; the status, the headers (lower-cased names) and the body.
fn post(server: &Server, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String, String) {
    request(server, "POST", path, headers, body)
}

/// A request with a body; the status, the headers (lower-cased) and the body.
fn request(server: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        server.addr,
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (code, head.to_lowercase(), body.to_string())
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

#[tokio::test]
async fn an_independent_webrtc_stack_queues_talks_clears_and_hangs_up() {
    if !needs(&[Need::Sdks]) {
        return;
    }
    let server = Server::ready(
        Setup::default()
            .auth(&format!("api_keys = [\"{KEY}\"]"))
            .recording("enabled = true\ndir = \"recordings\"")
            .extra("[usage]\nenabled = true\ndir = \"usage\""),
    );
    // The only worker is busy: the call waits.
    let mut holder = Client::connect(&server.url(&format!("/v1/realtime?model=omni&api_key={KEY}"))).await;
    holder.expect("session.created").await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/webrtc_call.py");
    let mut child = Command::new(sdk_python())
        .arg(script)
        .arg(server.addr.port().to_string())
        .arg(KEY)
        .arg("--queued")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the aiortc script");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let queued = lines.next().expect("a line").unwrap();
    assert_eq!(queued, "queued 1", "the call waits first in line");
    holder.close_socket().await;
    let Some(Ok(last)) = lines.next() else {
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        panic!("the call printed no summary:\n{stderr}\n{}", server.logs());
    };
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "the call failed:\n{last}\n{stderr}\n{}", server.logs());
    let seen: Value = serde_json::from_str(&last).unwrap();
    println!("{seen}");
    assert_eq!(seen["secret_reused"], 401, "a client secret is good once");
    assert!(seen["turn1_heard_ms"].as_u64().unwrap() >= 1000, "the model's voice on the track: {seen}");
    assert_eq!(seen["audio_deltas_on_channel"], 0, "audio travels on the track only");
    assert_eq!(seen["turn2_end"], "output_audio_buffer.cleared");
    assert_eq!(seen["turn2_cleared_id_matches"], true);
    assert_eq!(seen["loud_after_clear_ms"], 0, "nothing of a cleared answer plays on: {seen}");
    assert_eq!((seen["hangup"].as_u64(), seen["hangup_again"].as_u64()), (Some(200), Some(404)));
    assert_eq!(seen["hangup_other_secret"], 404, "another secret hangs up no call: {seen}");
    assert!(seen["secret_reused_says"].as_str().unwrap().contains("already used or has expired"), "{seen}");
    assert!(seen["turn1_usage"]["input_token_details"]["audio_tokens"].as_u64().unwrap() > 0, "{seen}");

    // Recorded and accounted as any session: the user's voice, the model's, the close reason.
    let session_id = seen["session_id"].as_str().unwrap();
    let dir = server.recording(session_id);
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["close_reason"], "hangup", "{meta}");
    let input = hound::WavReader::open(dir.join("input.wav")).unwrap();
    let heard_s = input.duration() as f64 / input.spec().sample_rate as f64;
    assert!(heard_s >= 3.0, "the user's voice recorded: {heard_s} s");
    let usage = std::fs::read_dir(server.dir().join("usage")).unwrap().flatten().next().unwrap().path();
    let usage = std::fs::read_to_string(usage).unwrap();
    let line: Value = usage
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["session_id"] == session_id)
        .unwrap();
    assert!(line["audio_in_s"].as_f64().unwrap() >= 3.0, "{line}");
    assert!(line["audio_out_s"].as_f64().unwrap() > 0.0, "{line}");
    assert!(!usage.contains("ek_"), "a client secret is never written down");
    assert!(!server.logs().contains("ek_"), "nor logged");
    server.wait_idle();
}

/// A call offer is read within bounds before anything else: an oversized body is refused by
/// its declared length, a multipart form whose part headers never end costs the gateway no
/// more than the bound, and a client that stalls is cut off at the deadline. (The audit's
/// 512 MB upload held 512 MB of the gateway's memory.)
#[test]
fn a_call_offer_is_bounded_in_bytes_and_time() {
    use std::io::{Read, Write};
    let server = Server::ready(Setup::default().auth(&format!("api_keys = [\"{KEY}\"]")));
    let auth = bearer(KEY);
    let head = |extra: &str| {
        format!(
            "POST /v1/realtime/calls HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nConnection: close\r\n{extra}\r\n",
            server.addr
        )
    };
    let answer = |stream: &mut std::net::TcpStream| {
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        String::from_utf8_lossy(&raw).into_owned()
    };

    // Declared too large: refused before a byte of the body is read.
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.write_all(head("Content-Type: application/sdp\r\nContent-Length: 536870912\r\n").as_bytes()).unwrap();
    let got = answer(&mut stream);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("over 147456 bytes"), "{got}");

    // A form whose first part's headers never end, 8 MiB of it, chunked (no declared length).
    let before = server.memory_mb().0;
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let form = "Content-Type: multipart/form-data; boundary=XyZ\r\nTransfer-Encoding: chunked\r\n";
    stream.write_all(head(form).as_bytes()).unwrap();
    let opening = b"--XyZ\r\nContent-Disposition: form-data; name=\"sdp\"\r\nX-Pad: ";
    let chunk = [opening.as_slice(), &vec![b'a'; 65536 - opening.len()]].concat();
    let mut sent = 0;
    for i in 0..128 {
        let piece = if i == 0 { chunk.clone() } else { vec![b'a'; 65536] };
        let framed = [format!("{:x}\r\n", piece.len()).as_bytes(), &piece, b"\r\n"].concat();
        if stream.write_all(&framed).is_err() {
            break; // the server answered and closed
        }
        sent += piece.len();
    }
    let got = answer(&mut stream);
    let after = server.memory_mb().0;
    assert!(got.starts_with("HTTP/1.1 413"), "after {sent} bytes sent: {got}");
    assert!(
        after - before < 16.0,
        "the gateway grew {:.1} MB ({before:.1} -> {after:.1}) for a {sent}-byte form",
        after - before
    );

    // A client that sends part of its offer and stalls: 408 at the deadline, nothing held.
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(WAIT * 2)).unwrap();
    stream.write_all(head("Content-Type: application/sdp\r\nContent-Length: 1000\r\n").as_bytes()).unwrap();
    stream.write_all(b"v=0\r\n").unwrap();
    let got = answer(&mut stream);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("within 10 s"), "{got}");
    // And the gateway serves the next call as ever; its answer is not for a cache on the way.
    let sdp = [("Authorization", auth.as_str()), ("Content-Type", "application/sdp")];
    let (code, head, body) = post(&server, "/v1/realtime/calls", &sdp, offer().as_bytes());
    assert_eq!(code, 201, "{body}");
    assert!(head.contains("cache-control: no-store"), "{head}");
}

/// Minting a client secret checks the key from the headers before it reads a byte of the body,
/// then reads the body within bounds, counted as a connection of its address meanwhile.
/// (The audit's 600 stalled mint requests from one address held 253 MB.)
#[test]
fn minting_checks_the_key_first_and_reads_the_body_within_bounds() {
    use std::io::{Read, Write};
    let server =
        Server::ready(Setup::default().auth(&format!("api_keys = [\"{KEY}\"]")).server("max_connections_per_ip = 3"));
    let open = |key: &str, length: usize| {
        let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
        stream.set_read_timeout(Some(WAIT * 2)).unwrap();
        let head = format!(
            "POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{{",
            server.addr
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream
    };
    let answer = |mut stream: std::net::TcpStream| {
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        String::from_utf8_lossy(&raw).into_owned()
    };
    // A wrong key is refused on its headers, the body never read.
    let got = answer(open("sk-wrong-0123456789", 200_000));
    assert!(got.starts_with("HTTP/1.1 401"), "{got}");
    // Declared over the bound: 413 at once.
    let got = answer(open(KEY, 200_000));
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("over 32768 bytes"), "{got}");
    // Stalled bodies hold a connection of their address each, up to its cap; then 429. (Whole
    // requests, each answered at once, 400 for a body that is not JSON so none mints, until the
    // server has taken up the three; one of the three may come after a whole one is being read,
    // and be the one refused.)
    let stalled: Vec<_> = (0..3).map(|_| open(KEY, 1000)).collect();
    let whole = [("Authorization", bearer(KEY)), ("Content-Type", "application/json".to_string())];
    let whole: Vec<(&str, &str)> = whole.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let answered = |s: &std::net::TcpStream| {
        s.set_nonblocking(true).unwrap();
        let some = s.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0);
        s.set_nonblocking(false).unwrap();
        some
    };
    let mut refused = None;
    for _ in 0..1000 {
        let (code, _, body) = post(&server, "/v1/realtime/client_secrets", &whole, b"not json");
        if code != 400 || stalled.iter().any(answered) {
            refused = Some((code, body));
            break;
        }
    }
    let (code, body) = refused.expect("the three stalled bodies never counted against the address");
    let said: Vec<String> = stalled.into_iter().map(answer).collect();
    let turned_away = said.iter().filter(|a| a.starts_with("HTTP/1.1 429")).count() + usize::from(code == 429);
    assert_eq!(turned_away, 1, "the address's cap counts bodies being read: {code} {body} {said:?}");
    assert!(said.iter().chain([&body]).any(|a| a.contains("too_many_connections")), "{said:?} {body}");
    // Each stalled one still held is cut off at the deadline.
    assert_eq!(said.iter().filter(|a| a.starts_with("HTTP/1.1 408")).count(), 3 - usize::from(code != 429), "{said:?}");
    // Minting is counted, not logged a line each.
    for _ in 0..20 {
        let (code, _, _) =
            post(&server, "/v1/realtime/client_secrets", &[("Authorization", bearer(KEY).as_str())], b"");
        assert_eq!(code, 200);
    }
    assert!(server.metric("omni_client_secrets_minted_total") >= 20.0);
    let lines = server.logs().lines().filter(|l| l.contains("a client secret was minted")).count();
    assert!(lines <= 2, "{lines} lines for 20 mints");
    // And a good request mints as ever, not for a cache on the way; a model that is not a name
    // is refused (a secret bound to no model).
    let (code, head, body) =
        post(&server, "/v1/realtime/client_secrets", &[("Authorization", bearer(KEY).as_str())], b"{}");
    assert_eq!(code, 200, "{body}");
    assert!(head.contains("cache-control: no-store"), "{head}");
    let (code, _, body) = post(
        &server,
        "/v1/realtime/client_secrets",
        &[("Authorization", bearer(KEY).as_str())],
        br#"{"session": {"model": 7}}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("session.model: must be a string"), "{body}");
}

/// On an open gateway (no API keys) a page of another site cannot start a call or mint a
/// secret with a cross-site simple request (a browser sends those without asking first): its
/// Origin must be this server's own, or one `allowed_origins` lists; and an offer is taken only
/// as `application/sdp` or a form, never as `text/plain`.
#[test]
fn a_page_of_another_site_cannot_start_calls_or_mint_secrets() {
    let server = Server::ready(Setup::default());
    let own = format!("http://{}", server.addr);
    for path in ["/v1/realtime/client_secrets", "/v1/realtime/calls"] {
        let (code, _, body) = post(
            &server,
            path,
            &[("Origin", "https://evil.example"), ("Content-Type", "application/sdp")],
            offer().as_bytes(),
        );
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("forbidden_origin"), "{body}");
    }
    let (code, _, body) = post(&server, "/v1/realtime/client_secrets", &[("Origin", own.as_str())], b"");
    assert_eq!(code, 200, "the server's own page mints: {body}");
    let (code, _, body) = post(&server, "/v1/realtime/calls", &[("Content-Type", "text/plain")], offer().as_bytes());
    assert_eq!(code, 415, "{body}");
    assert!(body.contains("application/sdp"), "{body}");
    // With a list, the sites it names.
    let listed = Server::ready(Setup::default().server("allowed_origins = [\"https://app.example\"]"));
    let (code, _, body) = post(&listed, "/v1/realtime/client_secrets", &[("Origin", "https://app.example")], b"");
    assert_eq!(code, 200, "{body}");
    let (code, _, _) = post(&listed, "/v1/realtime/client_secrets", &[("Origin", "https://evil.example")], b"");
    assert_eq!(code, 403);
}

/// A secret minted with session settings opens the OpenAI endpoint they are for and nothing
/// else: a MiniCPM-o session (bare, or by mode) would apply none of them, and refuses it; the
/// refusal leaves it good for what it is for. A secret minted without settings opens either.
#[tokio::test]
async fn a_secret_opens_what_it_was_minted_for_on_every_endpoint() {
    let server = Server::ready(Setup::default().auth(&format!("api_keys = [\"{KEY}\"]")));
    let mint = |body: &str| {
        let (code, _, minted) =
            post(&server, "/v1/realtime/client_secrets", &[("Authorization", bearer(KEY).as_str())], body.as_bytes());
        assert_eq!(code, 200, "{minted}");
        serde_json::from_str::<Value>(&minted).unwrap()["value"].as_str().unwrap().to_string()
    };
    let open = |query: String| tokio_tungstenite::connect_async(server.url(&format!("/v1/realtime?{query}")));
    let secret = mint(r#"{"session": {"model": "omni", "instructions": "Be brief."}}"#);
    for query in [format!("mode=video&api_key={secret}"), format!("api_key={secret}")] {
        let e = open(query.clone()).await.map(drop).expect_err("a MiniCPM-o session");
        let tokio_tungstenite::tungstenite::Error::Http(answer) = e else { panic!("{query}: {e}") };
        assert_eq!(answer.status().as_u16(), 400, "{query}");
        let body = String::from_utf8_lossy(answer.body().as_deref().unwrap_or_default()).into_owned();
        assert!(body.contains("minted with session settings") && body.contains("?model=omni"), "{body}");
    }
    open(format!("model=omni&api_key={secret}")).await.expect("what it was minted for");
    let plain = mint("");
    open(format!("mode=audio&api_key={plain}")).await.expect("a secret without settings");
}

/// An answered call holds a UDP port until it connects or its connect timeout passes, without
/// a datagram: one address holds at most `max_unconnected_calls_per_ip` of them (and one key
/// `max_unconnected_calls_per_key`), so it cannot take every port. (The audit's 125 addresses
/// held all 1,000 ports.) A call that timed out frees its place.
#[test]
fn an_address_holds_only_so_many_calls_not_yet_connected() {
    let server = Server::ready(
        Setup::default()
            .auth(&format!("api_keys = [\"{KEY}\"]"))
            .extra("[webrtc]\nmax_unconnected_calls_per_ip = 2\nconnect_timeout_s = 1"),
    );
    let sdp = [("Authorization", bearer(KEY)), ("Content-Type", "application/sdp".to_string())];
    let sdp: Vec<(&str, &str)> = sdp.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for _ in 0..2 {
        let (code, _, body) = post(&server, "/v1/realtime/calls", &sdp, offer().as_bytes());
        assert_eq!(code, 201, "{body}");
    }
    let (code, _, body) = post(&server, "/v1/realtime/calls", &sdp, offer().as_bytes());
    assert_eq!(code, 429, "{body}");
    assert!(body.contains("too_many_unconnected_calls") && body.contains("max_unconnected_calls_per_ip"), "{body}");
    assert_eq!(server.metric("omni_connections_refused_total{reason=\"too_many_unconnected_calls\"}"), 1.0);
    // Both drop at their connect timeout; then the address may call again.
    server.wait_log_count("dropping the call", 2, WAIT);
    let answered =
        (0..200).map(|_| post(&server, "/v1/realtime/calls", &sdp, offer().as_bytes()).0).find(|c| *c != 429);
    assert_eq!(answered, Some(201), "a call that timed out frees its place");
}

#[test]
fn the_signalling_refuses_with_reasons() {
    let server = Server::ready(Setup::default().auth(&format!("api_keys = [\"{KEY}\", \"{OTHER_KEY}\"]")));
    let auth = bearer(KEY);
    let sdp = [("Authorization", auth.as_str()), ("Content-Type", "application/sdp")];
    let (code, _, body) =
        post(&server, "/v1/realtime/calls", &[("Content-Type", "application/sdp")], offer().as_bytes());
    assert_eq!(code, 401, "no key: {body}");
    let (code, _, body) = post(&server, "/v1/realtime/calls", &sdp, b"v=0\r\nnot an offer");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("SDP"), "the reason: {body}");
    assert!(!body.contains("PointerOffset") && !body.contains("0x7"), "no memory address: {body}");
    let (code, _, body) = post(&server, "/v1/realtime/calls", &sdp, &vec![b'a'; 70_000]);
    assert_eq!(code, 413, "{body}");
    assert!(body.contains("over 65536 bytes"), "{body}");
    let form = "multipart/form-data; boundary=XyZ";
    let (code, _, body) = post(
        &server,
        "/v1/realtime/calls",
        &[("Authorization", auth.as_str()), ("Content-Type", form)],
        b"--XyZ\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n{}\r\n--XyZ--\r\n",
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("no 'sdp' part"), "{body}");
    let (code, _, body) = post(
        &server,
        "/v1/realtime/client_secrets",
        &[("Authorization", auth.as_str())],
        b"{\"expires_after\": {\"seconds\": 5}}",
    );
    assert_eq!(code, 400, "{body}");
    let (code, _, _) = post(&server, "/v1/realtime/client_secrets", &[], b"");
    assert_eq!(code, 401, "minting needs the API key");
    let (code, _, _) = post(&server, "/v1/realtime/calls/rtc_nope/hangup", &[("Authorization", auth.as_str())], b"");
    assert_eq!(code, 404);
    let (code, _, body) = post(
        &server,
        "/v1/realtime/client_secrets",
        &[("Authorization", auth.as_str())],
        json!({"session": {"instructions": "x".repeat(20_000)}}).to_string().as_bytes(),
    );
    assert_eq!(code, 400, "a secret holds at most 16 KiB of session: {body}");

    // A refused call does not use up its client secret; an answered one does.
    let (_, _, minted) = post(&server, "/v1/realtime/client_secrets", &[("Authorization", auth.as_str())], b"");
    let secret: Value = serde_json::from_str(&minted).unwrap();
    let with_secret = format!("Bearer {}", secret["value"].as_str().unwrap());
    let sdp_secret = [("Authorization", with_secret.as_str()), ("Content-Type", "application/sdp")];
    let (code, _, _) = post(&server, "/v1/realtime/calls", &sdp_secret, b"not an offer");
    assert_eq!(code, 400);
    let (code, head, body) = post(&server, "/v1/realtime/calls", &sdp_secret, offer().as_bytes());
    assert_eq!(code, 201, "the secret is still good: {body}");
    assert!(body.contains("a=max-message-size:262144"), "the answer says what the channel takes: {body}");
    let (code, _, _) = post(&server, "/v1/realtime/calls", &sdp_secret, offer().as_bytes());
    assert_eq!(code, 401, "and now used up");
    // Only the key that opened a call (here: minted its secret) hangs it up.
    let location = head.lines().find_map(|l| l.strip_prefix("location: ")).unwrap().trim().to_string();
    let other = bearer(OTHER_KEY);
    let (code, _, _) = post(&server, &format!("{location}/hangup"), &[("Authorization", other.as_str())], b"");
    assert_eq!(code, 404, "another key's call is not found");
    let (code, _, _) = post(&server, &format!("{location}/hangup"), &[("Authorization", auth.as_str())], b"");
    assert_eq!(code, 200);
    server.wait_idle();
}

#[test]
fn a_call_that_never_connects_frees_everything() {
    let server = Server::ready(
        Setup::default()
            .server("max_connections_per_ip = 1")
            .extra("[webrtc]\nconnect_timeout_s = 1\nports = [41000, 41009]"),
    );
    // A multipart offer with a session, from a client that never sends a datagram.
    let form = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\n{}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n{}\r\n--XyZ--\r\n",
        offer(),
        json!({"instructions": "Be brief."})
    );
    let (code, head, answer) = post(
        &server,
        "/v1/realtime/calls?model=omni",
        &[("Content-Type", "multipart/form-data; boundary=XyZ")],
        form.as_bytes(),
    );
    assert_eq!(code, 201, "{answer}");
    assert!(head.contains("location: /v1/realtime/calls/rtc_"), "{head}");
    assert!(head.contains("content-type: application/sdp"), "{head}");
    assert!(answer.contains("a=ice-lite") && answer.contains("opus/48000"), "{answer}");
    assert!(answer.contains("127.0.0.1 4100"), "a host candidate in the port range: {answer}");
    // Datagrams from a stranger (noise, and a STUN request without the call's credentials) are
    // dropped: the call neither answers nor counts them as its client.
    let port: u16 = answer
        .lines()
        .find(|l| l.starts_with("a=candidate"))
        .and_then(|l| l.split_whitespace().nth(5))
        .and_then(|p| p.parse().ok())
        .expect("the candidate's port");
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let stun = [0u8, 1, 0, 0, 0x21, 0x12, 0xa4, 0x42, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    for i in 0..2000u32 {
        let junk: Vec<u8> = (0..(i % 1200) as usize).map(|j| (i as usize * 31 + j) as u8).collect();
        stranger.send_to(if i % 2 == 0 { &stun } else { &junk }, ("127.0.0.1", port)).unwrap();
    }
    stranger.set_read_timeout(Some(std::time::Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 1500];
    assert!(stranger.recv_from(&mut buf).is_err(), "the call answered a stranger");
    // The address's one connection is the call's.
    let (code, _, _) = post(&server, "/v1/realtime/calls", &[("Content-Type", "application/sdp")], offer().as_bytes());
    assert_eq!(code, 429, "the call counts against the per-address cap");
    server.wait_log("ICE and DTLS not done within", WAIT);
    server.wait_idle();
    let (code, _, body) =
        post(&server, "/v1/realtime/calls", &[("Content-Type", "application/sdp")], offer().as_bytes());
    assert_eq!(code, 201, "the cap is free again: {body}");
}

#[tokio::test]
async fn a_client_secret_opens_one_websocket_session_with_its_settings() {
    let server = Server::ready(Setup::default().auth(&format!("api_keys = [\"{KEY}\"]")));
    let auth = bearer(KEY);
    let body = json!({"expires_after": {"anchor": "created_at", "seconds": 30},
        "session": {"type": "realtime", "model": "omni", "instructions": "Answer in French."}});
    let (code, _, minted) =
        post(&server, "/v1/realtime/client_secrets", &[("Authorization", auth.as_str())], body.to_string().as_bytes());
    assert_eq!(code, 200, "{minted}");
    let minted: Value = serde_json::from_str(&minted).unwrap();
    let secret = minted["value"].as_str().unwrap();
    assert_eq!(minted["session"]["instructions"], "Answer in French.");
    // Minted for "omni": another model is refused, and the secret stays good.
    let other = server.url(&format!("/v1/realtime?model=other&api_key={secret}"));
    let req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(other.as_str()).unwrap();
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 400),
        other => panic!("another model was not refused: {:?}", other.map(|_| ())),
    }
    let url = server.url(&format!("/v1/realtime?model=omni&api_key={secret}"));
    let mut c = Client::connect(&url).await;
    c.expect("session.created").await;
    let updated = c.expect("session.updated").await;
    assert_eq!(updated["session"]["instructions"], "Answer in French.", "the secret's settings apply");
    // Good once: a second connection with it is refused before the upgrade.
    let req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).unwrap();
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("a used secret was not refused: {:?}", other.map(|_| ())),
    }
    // A secret cannot mint another.
    let (code, _, _) =
        post(&server, "/v1/realtime/client_secrets", &[("Authorization", &format!("Bearer {secret}"))], b"");
    assert_eq!(code, 401);
    c.close_socket().await;
    assert!(!server.logs().contains(secret), "a client secret is never logged");
    server.wait_idle();
}

/// A page holding only a client secret ends its own call with that secret; another secret, or a
/// wrong one, finds no call and never counts as a wrong key (the page's address is not
/// throttled by its own hangups).
#[test]
fn a_page_hangs_up_its_call_with_the_secret_that_opened_it() {
    let server = Server::ready(Setup::default().auth(&format!("api_keys = [\"{KEY}\"]")));
    let (code, _, body) = post(&server, "/v1/realtime/client_secrets", &[("Authorization", bearer(KEY).as_str())], b"");
    assert_eq!(code, 200, "{body}");
    let secret = serde_json::from_str::<Value>(&body).unwrap()["value"].as_str().unwrap().to_string();
    let sdp = [("Authorization", bearer(&secret)), ("Content-Type", "application/sdp".to_string())];
    let sdp: Vec<(&str, &str)> = sdp.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (code, head, body) = post(&server, "/v1/realtime/calls", &sdp, offer().as_bytes());
    assert_eq!(code, 201, "{body}");
    let location = head.lines().find_map(|l| l.strip_prefix("location: ")).unwrap().trim().to_string();
    let hangup = format!("{location}/hangup");
    for _ in 0..(omni_gateway::auth::THROTTLE_ATTEMPTS + 2) {
        let (code, _, _) = post(&server, &hangup, &[("Authorization", "Bearer ek_not-this-calls-secret")], b"");
        assert_eq!(code, 404);
    }
    // Past the throttle's count had those been wrong keys: a wrong key now is told it is wrong,
    // not made to wait.
    let (code, _, body) = post(&server, &hangup, &[("Authorization", "Bearer not-a-key-0123456789")], b"");
    assert_eq!(code, 401, "{body}");
    let (code, _, body) = post(&server, &hangup, &[("Authorization", bearer(&secret).as_str())], b"");
    assert_eq!(code, 200, "{body}");
    // The secret again: it was good once.
    let (code, _, body) = post(&server, "/v1/realtime/calls", &sdp, offer().as_bytes());
    assert_eq!(code, 401);
    assert!(body.contains("this client secret was already used or has expired"), "{body}");
}

/// A page of a site `allowed_origins` lists may call and mint from the browser (CORS: the
/// preflight answered, `Authorization` and `Content-Type` allowed, `Location` exposed); any
/// other site's preflight is refused.
#[test]
fn the_sites_allowed_origins_lists_may_call_from_their_pages() {
    let server = Server::ready(
        Setup::default().auth(&format!("api_keys = [\"{KEY}\"]")).server("allowed_origins = [\"https://app.example\"]"),
    );
    let preflight = |origin: &str, path: &str| {
        request(
            &server,
            "OPTIONS",
            path,
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "authorization, content-type"),
            ],
            b"",
        )
    };
    for path in ["/v1/realtime/calls", "/v1/realtime/client_secrets", "/v1/realtime/calls/rtc_x/hangup"] {
        let (code, head, _) = preflight("https://app.example", path);
        assert_eq!(code, 200, "{path}: {head}");
        assert!(head.contains("access-control-allow-origin: https://app.example"), "{path}: {head}");
        let allowed = head.lines().find(|l| l.starts_with("access-control-allow-headers")).unwrap_or("").to_string();
        assert!(allowed.contains("authorization") && allowed.contains("content-type"), "{head}");
        let (code, head, _) = preflight("https://evil.example", path);
        assert!(code >= 400 && !head.contains("access-control-allow-origin"), "{path}: {code} {head}");
    }
    let headers =
        [("Origin", "https://app.example"), ("Authorization", &bearer(KEY)), ("Content-Type", "application/sdp")];
    let (code, head, body) = post(&server, "/v1/realtime/calls", &headers, offer().as_bytes());
    assert_eq!(code, 201, "{body}");
    assert!(head.contains("access-control-allow-origin: https://app.example"), "{head}");
    assert!(head.contains("access-control-expose-headers: location"), "{head}");
    let (code, head, _) = post(
        &server,
        "/v1/realtime/client_secrets",
        &[("Origin", "https://evil.example"), ("Authorization", &bearer(KEY))],
        b"",
    );
    assert_eq!(code, 403);
    assert!(!head.contains("access-control-allow-origin"), "{head}");
}

#[tokio::test]
async fn a_call_whose_peer_connection_is_replaced_resumes_its_session() {
    if !needs(&[Need::Sdks]) {
        return;
    }
    let server = Server::ready(Setup::default().server("resume_grace_s = 30").auth(&format!("api_keys = [\"{KEY}\"]")));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/webrtc_resume.py");
    let out = Command::new(sdk_python())
        .arg(script)
        .arg(server.addr.port().to_string())
        .arg(KEY)
        .output()
        .expect("run the aiortc script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}\n{}", String::from_utf8_lossy(&out.stderr), server.logs());
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    println!("{seen}");
    assert_eq!(seen["resumed_session_id"], seen["session_id"], "the same session: {seen}");
    assert_eq!(seen["resumed_token_is_new"], true);
    assert_eq!(seen["first_call_hangup"], 404, "the server ended the replaced call: {seen}");
    assert!(seen["turn1_heard_ms"].as_u64().unwrap() >= 1000 && seen["turn2_heard_ms"].as_u64().unwrap() >= 1000);
    assert_eq!(seen["turn2_response_differs"], true);
    assert_eq!(seen["token_reused"], 404, "a token resumes once");
    server.wait_idle();
    assert_eq!(server.metric("omni_resumes_total{outcome=\"resumed\"}"), 1.0);
}
