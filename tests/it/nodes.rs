//! Workers on other machines: `omni-gateway node` serving its workers to a gateway over
//! TCP, on loopback. Sessions of every dialect through a node, force-listen mid-step, the
//! token, one gateway per worker, a node that dies or stops answering, a crash and a hang on
//! the node, TLS, check-config.

use std::time::{Duration, Instant};

use crate::common::*;
use omni_backend_host::link::handshake;
use omni_backend_host::link::wire::{
    FromNode, MAX_FRAME_BYTES, MAX_UNPROVEN_FRAME, Request, ToNode, read_frame, write_frame,
};
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// A gateway with no workers of its own, using the nodes `entries`.
fn gateway(entries: &str) -> Server {
    Server::start(Setup::default().workers(String::new()).extra(entries))
}

/// A connection to `node` through the handshake, asking `request`.
async fn prove(node: &Node, token: &str, request: Request) -> Result<TcpStream, omni_backend_host::link::LinkError> {
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    handshake::open(&mut stream, handshake::Secret::Token(token), request).await.map(|()| stream)
}

/// The node's link of `node`, as a gateway's config would give it.
fn link_to(node: &Node) -> omni_gateway::config::NodeLink {
    omni_gateway::config::NodeLink {
        name: "gpu1".into(),
        address: node.addr.to_string(),
        token: NODE_TOKEN.into(),
        ca: None,
        server_name: "127.0.0.1".into(),
        heartbeat_interval: Duration::from_secs(1),
        heartbeat_timeout: Duration::from_secs(5),
        networks: Vec::new(),
        replica: None,
    }
}

/// Waits until the gateway's pool has `count` workers, all idle.
fn joined(server: &Server, count: usize) -> Value {
    server.wait_status("the node's workers join and open", WAIT, |s| {
        let w = s["workers"].as_array().unwrap();
        w.len() == count && w.iter().all(|w| w["state"] == "idle")
    })
}

#[tokio::test]
async fn sessions_of_every_dialect_run_on_a_nodes_workers() {
    let node = Node::start(&workers(2, ""), "");
    let server = gateway(&node.entry("gpu1", ""));
    let status = joined(&server, 2);
    let w = &status["workers"][0];
    assert_eq!((w["name"].as_str(), w["node"].as_str()), (Some("gpu1/sim-0"), Some("gpu1")), "{status}");
    assert!(w["backend"].as_str().unwrap().starts_with("node gpu1 ("), "{w}");
    assert_eq!(server.metric("omni_node_links{node=\"gpu1\"}"), 2.0);

    // The MiniCPM-o Realtime API, duplex: listen, then speech.
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    assert_eq!(kinds(&answer_to(&mut c, "input_1").await), ["listen"]);
    c.send(append(&quiet())).await;
    let deltas = answer_to(&mut c, "input_2").await;
    assert_eq!(kinds(&deltas), ["text", "audio"]);
    assert!(deltas[0]["text"].as_str().unwrap().starts_with("Reply 1"));
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;

    // Chat.
    let mut chat = active(&server, "chat").await;
    chat.send(json!({"type": "input.append", "input": {"messages": [{"role": "user", "content": "Reply with exactly: from the node"}]}})).await;
    assert_eq!(chat.until("response.done").await["text"], "from the node");
    chat.send(json!({"type": "session.close"})).await;
    chat.until("session.closed").await;
    assert!(!node.logs().contains(NODE_TOKEN) && !server.logs().contains(NODE_TOKEN), "a log shows the token");

    // The earlier dialect.
    let mut legacy = connected(&server, "video").await;
    legacy.send(json!({"type": "session.update", "session": {"instructions": "x"}})).await;
    legacy.expect("session.created").await;
    legacy.send(json!({"type": "input_audio_buffer.append", "audio": b64_pcm(&loud())})).await;
    legacy.expect("response.listen").await;
    legacy.send(json!({"type": "session.close"})).await;
    legacy.until("session.closed").await;

    // Qwen-Omni-Realtime, server VAD.
    let mut qwen = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    qwen.until("session.created").await;
    qwen.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.3)})).await;
    qwen.send(json!({"type": "input_audio_buffer.append", "audio": pcm16(1.0, 16000, 0.0)})).await;
    let done = qwen.until("response.done").await;
    assert_eq!(done["response"]["status"], "completed");
    drop(qwen);
    server.wait_idle();
}

#[tokio::test]
async fn force_listen_reaches_the_node_mid_step() {
    // Speaking steps take 30 s on the node: only an interrupt that reaches it ends one.
    let node = Node::start(&workers(1, "token_ms = 30000"), "");
    let server = gateway(&node.entry("gpu1", ""));
    joined(&server, 1);
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&quiet())).await; // starts a reply: its step blocks on the node
    // The gateway has it (and sends it to the idle worker at once): the next chunk overtakes it.
    server.wait_metric("omni_chunks_received_total{mode=\"audio\"}", 2.0, WAIT);
    let sent = Instant::now();
    c.send(append_with(&quiet(), json!({"force_listen": true}))).await;
    let deltas = answer_to(&mut c, "input_3").await;
    assert_eq!(kinds(&deltas).last().map(String::as_str), Some("listen"));
    assert!(sent.elapsed() < Duration::from_secs(5), "the interrupt reached the node: {:?}", sent.elapsed());
    assert!(deltas.iter().all(|d| d["kind"] != "audio"), "no speech after the force-listen: {deltas:?}");
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
}

/// Strangers cannot flood a node's log: a hundred connections that send junk for a hello are
/// each refused, and the log says so once (the next line in ten seconds would say how many more).
#[tokio::test]
async fn a_hundred_strangers_cost_the_node_one_log_line() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = Node::start(&workers(1, ""), "");
    for _ in 0..100 {
        let mut stream = TcpStream::connect(node.addr).await.unwrap();
        stream.write_all(b"\x00\x00\x00\x05junk!").await.unwrap();
        let mut rest = Vec::new();
        // The node closes the connection once it refused it (its line, if any, written before).
        let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest)).await.expect("the node closes");
    }
    node.wait_log("refused:", WAIT);
    let lines = node.logs().lines().filter(|l| l.contains("refused:")).count();
    assert_eq!(lines, 1, "one line for a hundred refusals:\n{}", node.logs());
}

#[tokio::test]
async fn a_wrong_token_is_refused() {
    let node = Node::start(&workers(1, ""), "");
    let entry = node.entry("gpu1", "").replace(NODE_TOKEN, "Wm0Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7l=");
    let mut server = gateway(&entry);
    // The node proves the token first: the gateway, holding another, cannot check the proof and
    // says nothing more; the node sees a peer leave without proving the token.
    server.wait_log("could not prove it holds the token", WAIT);
    node.wait_log("closed without proving the token", WAIT);
    assert_eq!(server.status()["workers"].as_array().unwrap().len(), 0, "no worker joins");
    server.skip_invariants();
    // A peer that takes the node's proof on trust and proves a token it does not hold is told.
    let mut stream = TcpStream::connect(node.addr).await.unwrap();
    let nonce = handshake::nonce();
    let (_, pake) = handshake::exchange("Wm0Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7l=");
    write_frame(
        &mut stream,
        &ToNode::Hello { protocol: omni_backend_host::link::wire::PROTOCOL, nonce, pake, replica: None },
    )
    .await
    .unwrap();
    assert!(matches!(
        read_frame::<FromNode>(&mut stream, MAX_UNPROVEN_FRAME).await,
        Ok(Some(FromNode::Challenge { .. }))
    ));
    write_frame(&mut stream, &ToNode::Prove { proof: vec![7; 32], request: Request::Discover }).await.unwrap();
    match read_frame::<FromNode>(&mut stream, MAX_UNPROVEN_FRAME).await.unwrap() {
        Some(FromNode::Refused(why)) => assert!(why.starts_with("wrong token"), "{why}"),
        other => panic!("{other:?}"),
    }
    node.wait_log("refused: wrong token", WAIT);
}

#[tokio::test]
async fn a_stranger_announcing_a_huge_hello_is_cut_off_before_it_is_buffered() {
    use tokio::io::AsyncWriteExt;
    let node = Node::start(&workers(1, ""), "");
    // 100 MiB announced, before any token: the node ends the connection at once instead of
    // waiting to buffer them.
    let mut stranger = TcpStream::connect(node.addr).await.unwrap();
    stranger.write_all(&(100u32 << 20).to_le_bytes()).await.unwrap();
    let ended = tokio::time::timeout(WAIT, read_frame::<FromNode>(&mut stranger, MAX_FRAME_BYTES)).await;
    assert!(matches!(ended, Ok(Ok(None)) | Ok(Err(_))), "the connection is still open: {ended:?}");
    node.wait_log("over the 4096 allowed", WAIT);
    // The node serves on.
    let mut link = prove(&node, NODE_TOKEN, Request::Discover).await.unwrap();
    assert!(matches!(read_frame::<FromNode>(&mut link, MAX_FRAME_BYTES).await.unwrap(), Some(FromNode::Workers(_))));
}

#[tokio::test]
async fn a_listener_that_is_not_the_node_hears_a_hello_and_nothing_else() {
    use std::io::{Read, Write};
    // Something else answers on the node's address (a host that took it, an address a store was
    // made to name): it hears the gateway's hello, then answers a 256 MiB frame.
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = fake.local_addr().unwrap();
    let heard = std::thread::spawn(move || {
        let (mut socket, _) = fake.accept().unwrap();
        let mut len = [0u8; 4];
        socket.read_exact(&mut len).unwrap();
        let mut hello = vec![0u8; u32::from_le_bytes(len) as usize];
        socket.read_exact(&mut hello).unwrap();
        socket.write_all(&(256u32 << 20).to_le_bytes()).unwrap();
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest);
        (hello, rest)
    });
    let entry = format!("[[nodes]]\nname = \"gpu1\"\naddress = \"{address}\"\ntoken = \"{NODE_TOKEN}\"\n");
    let mut server = gateway(&entry);
    server.wait_log("over the 4096 allowed", WAIT);
    let (hello, rest) = heard.join().unwrap();
    assert!(matches!(postcard::from_bytes::<ToNode>(&hello), Ok(ToNode::Hello { .. })), "{hello:?}");
    let token = NODE_TOKEN.as_bytes();
    assert!(!hello.windows(token.len()).any(|w| w == token), "the hello carries the token");
    assert!(rest.is_empty(), "{} bytes after the hello", rest.len());
    server.skip_invariants();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_idle_connections_do_not_keep_a_gateway_out() {
    // The node runs with 1,024 descriptors (a systemd unit's default), soft and hard: raising
    // the limit cannot help; its caps on connections still to prove the token must.
    let node = Node::start_with_open_files(&workers(1, ""), "", 1024, 1024);
    let _ = rlimit::increase_nofile_limit(4096); // this test's own 1,100 connections
    // Strangers on 20 addresses (127.0.0.2 to .21) keep 1,100 connections open, opening another
    // as each ends: more than the node's 256 unproven places, more than 32 from each address.
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut strangers = tokio::task::JoinSet::new();
    for i in 0..1100 {
        let (to, stop) = (node.addr, stop.clone());
        let from: std::net::SocketAddr = format!("127.0.0.{}:0", 2 + i % 20).parse().unwrap();
        strangers.spawn(async move {
            use tokio::io::AsyncReadExt;
            loop {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind(from).unwrap();
                let idle = async {
                    if let Ok(mut s) = socket.connect(to).await {
                        let _ = s.read(&mut [0u8; 64]).await; // until the node closes it
                    }
                    // The stranger's own pace between attempts (not a wait for the node).
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                tokio::select! {
                    _ = idle => {}
                    _ = stop.notified() => return,
                }
            }
        });
    }
    // All of them connected: at most 256 held, the others closed (and opened again).
    node.wait_log_count("closed before it proved the token", 1100 - 256, WAIT);
    // A gateway on 127.0.0.1 is served meanwhile, each time.
    for _ in 0..3 {
        let link = link_to(&node);
        let found = tokio::task::spawn_blocking(move || omni_backend_host::remote::discover(&link)).await.unwrap();
        assert_eq!(found.map(|w| w.len()).map_err(|e| e.to_string()), Ok(1));
    }
    stop.notify_waiters();
    strangers.abort_all();
}

#[tokio::test]
async fn a_node_raises_its_open_file_limit_and_goes_on_after_a_sighup() {
    let node = Node::start_with_open_files(&workers(1, ""), "", 1024, 4096);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.pid())).unwrap();
    let open_files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    assert_eq!(open_files.split_whitespace().collect::<Vec<_>>()[3..5], ["4096", "4096"], "{open_files}");
    node.signal("HUP");
    node.wait_log("SIGHUP: revoked replicas now [] (0 newly revoked); nothing else is reloaded", WAIT);
    let mut link = prove(&node, NODE_TOKEN, Request::Discover).await.unwrap();
    assert!(matches!(read_frame::<FromNode>(&mut link, MAX_FRAME_BYTES).await.unwrap(), Some(FromNode::Workers(_))));
}

#[tokio::test]
async fn one_gateway_per_worker_and_a_gateway_that_leaves_frees_it() {
    let node = Node::start(&workers(1, ""), "");
    let first = gateway(&node.entry("gpu1", ""));
    joined(&first, 1);
    let second = gateway(&node.entry("gpu1", ""));
    second.wait_status("the second gateway is refused the worker", WAIT, |s| {
        s["workers"][0]["state"] == "failed"
            && s["workers"][0]["failure"].as_str().unwrap_or("").contains("attached to another gateway")
    });
    // Waiting for it, a client of the second gateway is told to wait, not refused.
    let mut waiting = Client::connect(&second.url("/v1/realtime?mode=audio")).await;
    assert_eq!(waiting.event().await["type"], "session.queued");
    drop(first); // the first gateway goes away: the node frees the worker at once
    waiting.until("session.queue_done").await;
    waiting.send(json!({"type": "session.init", "payload": {}})).await;
    waiting.expect("session.created").await;
    waiting.send(json!({"type": "session.close"})).await;
    waiting.until("session.closed").await;
    node.wait_log("the gateway closed the link", WAIT);
    second.wait_idle();
}

#[tokio::test]
async fn a_node_that_stops_answering_ends_its_sessions_and_comes_back() {
    let node = Node::start(&workers(1, ""), "heartbeat_interval_s = 0.5\nheartbeat_timeout_s = 2");
    let server = gateway(&node.entry("gpu1", "heartbeat_interval_s = 0.5\nheartbeat_timeout_s = 2"));
    joined(&server, 1);
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    // Frozen: the socket stays open but nothing comes (a host cut off, a half-open link).
    node.signal("STOP");
    let frozen = Instant::now();
    let closed = c.until("session.closed").await;
    assert_eq!(closed["reason"], "backend_error");
    assert_eq!(c.closed().await, Some(1011));
    let took = frozen.elapsed();
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(5), "detected after {took:?}");
    assert!(server.metric("omni_node_link_failures_total{node=\"gpu1\",reason=\"heartbeat\"}") >= 1.0);
    // A client arriving meanwhile waits for the node rather than being refused.
    let mut waiting = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    assert_eq!(waiting.event().await["type"], "session.queued");
    node.signal("CONT");
    waiting.until("session.queue_done").await;
    waiting.send(json!({"type": "session.init", "payload": {}})).await;
    waiting.expect("session.created").await;
    waiting.send(json!({"type": "session.close"})).await;
    waiting.until("session.closed").await;
    server.wait_idle();
}

#[tokio::test]
async fn a_killed_node_is_replaced_on_the_same_address_and_its_workers_rejoin() {
    let node = Node::start(&workers(1, ""), "");
    let addr = node.addr;
    let server = gateway(&node.entry("gpu1", ""));
    joined(&server, 1);
    let mut c = active(&server, "audio").await;
    let dir = node.kill();
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    server.wait_status("the worker is failed while the node is down", WAIT, |s| s["workers"][0]["state"] == "failed");
    let node = Node::start_in(dir, &workers(1, ""), &format!("bind = \"{addr}\""));
    joined(&server, 1);
    let mut again = active(&server, "audio").await;
    again.send(append(&loud())).await;
    answer_to(&mut again, "input_1").await;
    again.send(json!({"type": "session.close"})).await;
    again.until("session.closed").await;
    drop(node);
}

#[tokio::test]
async fn a_crash_on_the_node_ends_that_session_and_the_worker_is_opened_again() {
    let node = Node::start(&process_workers(1, "segv_at_step = 2"), "");
    let server = gateway(&node.entry("gpu1", ""));
    joined(&server, 1);
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    node.wait_log("SIGSEGV", WAIT);
    joined(&server, 1);
    let mut again = active(&server, "audio").await;
    again.send(append(&loud())).await;
    answer_to(&mut again, "input_1").await;
}

#[tokio::test]
async fn a_hung_step_on_the_node_is_ended_by_the_watchdog() {
    let node = Node::start(&process_workers(1, "hang_at_step = 2"), "");
    let server = Server::start(
        Setup::default().workers(String::new()).limits("step_timeout_ms = 1500").extra(&node.entry("gpu1", "")),
    );
    joined(&server, 1);
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(append(&loud())).await;
    assert_eq!(c.until("session.closed").await["reason"], "backend_error");
    node.wait_log("ended its backend", WAIT);
    joined(&server, 1);
}

#[tokio::test]
async fn the_link_can_be_tls() {
    let dir = tempfile::tempdir().unwrap();
    localhost_certificate(dir.path(), "node.pem", "node.key");
    let tls = format!(
        "[node.tls]\ncert = \"{}\"\nkey = \"{}\"",
        dir.path().join("node.pem").display(),
        dir.path().join("node.key").display()
    );
    let node = Node::start(&workers(1, ""), &tls);
    let ca = format!("ca = \"{}\"\nserver_name = \"localhost\"", dir.path().join("node.pem").display());
    let server = gateway(&node.entry("gpu1", &ca));
    joined(&server, 1);
    let mut c = active(&server, "audio").await;
    c.send(append(&loud())).await;
    answer_to(&mut c, "input_1").await;
    c.send(json!({"type": "session.close"})).await;
    c.until("session.closed").await;
    // A gateway speaking plain TCP to it gets nowhere.
    let mut plain = gateway(&node.entry("gpu2", ""));
    node.wait_log("TLS handshake failed", WAIT);
    plain.wait_log("node gpu2 (", WAIT);
    plain.wait_log("trying again", WAIT);
    assert_eq!(plain.status()["workers"].as_array().unwrap().len(), 0);
    plain.skip_invariants();
}

#[test]
fn check_config_reaches_each_node_and_reports_what_it_serves() {
    let node = Node::start(&workers(2, ""), "");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, node.entry("gpu1", "")).unwrap();
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_omni-gateway")).arg("check-config").arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("node gpu1 (") && stdout.contains("serves 2 worker(s)"), "{stdout}");
    assert!(stdout.contains("gpu1/sim-0 [builtin; chat, video, audio]: idle"), "{stdout}");
    let down = node.kill();
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_omni-gateway")).arg("check-config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("nodes[0]: node gpu1") && stderr.contains("cannot connect"),
        "{stderr}"
    );
    drop(down);
}

#[tokio::test]
async fn a_link_kept_open_for_grants_checks_the_token_answers_pings_and_takes_nothing_else() {
    let node = Node::start(&workers(1, ""), "");
    let standby = Request::Standby { gateway: "test".into() };
    // A wrong token gets no link, as for any other.
    let wrong = prove(&node, "not-the-node-token-0000", standby.clone()).await.unwrap_err();
    assert!(matches!(wrong, omni_backend_host::link::LinkError::NotTheNode), "{wrong}");
    // The node's token is no replica's name: a link kept open for grants is proved with the
    // replica's own credential (tests/cluster.rs, each_replica_proves_its_own_name...).
    let mut token_holder = prove(&node, NODE_TOKEN, standby.clone()).await.unwrap();
    match read_frame::<FromNode>(&mut token_holder, MAX_FRAME_BYTES).await.unwrap() {
        Some(FromNode::Refused(why)) => assert!(why.contains("own credential"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Its credential: Ready, then each ping answered (grants are pushed on it only by a node
    // of a cluster: tests/cluster.rs).
    let credential = omni_backend_host::link::replica::issue(NODE_TOKEN, "test");
    let credential = omni_backend_host::link::replica::Credential::parse(&credential).unwrap();
    let mut link = TcpStream::connect(node.addr).await.unwrap();
    let as_test = handshake::Secret::Replica { name: "test", password: credential.password() };
    handshake::open(&mut link, as_test, standby).await.unwrap();
    assert!(matches!(read_frame::<FromNode>(&mut link, MAX_FRAME_BYTES).await.unwrap(), Some(FromNode::Ready)));
    for _ in 0..3 {
        write_frame(&mut link, &ToNode::Ping).await.unwrap();
        assert!(matches!(read_frame::<FromNode>(&mut link, MAX_FRAME_BYTES).await.unwrap(), Some(FromNode::Ping)));
    }
    // The replica does not call on it: a call (anything but a ping) is refused, and the link
    // ends; the worker is still free for a link of its own.
    write_frame(&mut link, &ToNode::Terminate).await.unwrap();
    match read_frame::<FromNode>(&mut link, MAX_FRAME_BYTES).await.unwrap() {
        Some(FromNode::Refused(why)) => assert!(why.contains("on a link kept open for grants"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(read_frame::<FromNode>(&mut link, MAX_FRAME_BYTES).await.unwrap().is_none(), "the link ends");
    // The node listens before its workers are open, and refuses one still opening.
    node.wait_log("worker sim-0: backend omni-reference open", WAIT);
    let attach = Request::Attach { worker: "sim-0".into(), gateway: "test".into(), grant: None };
    let mut own = prove(&node, NODE_TOKEN, attach).await.unwrap();
    match read_frame::<FromNode>(&mut own, MAX_FRAME_BYTES).await.unwrap() {
        Some(FromNode::Attached(info)) => assert_eq!(info.name, "omni-reference"),
        other => panic!("{other:?}"),
    }
    node.wait_log("worker sim-0: attached to gateway test", WAIT);
}

/// Reads a client's events until its worker is assigned; none of them is an error.
async fn served_without_error(c: &mut Client) {
    loop {
        let e = c.event().await;
        assert_ne!(e["type"], "error", "{e}");
        if e["type"] == "session.queue_done" {
            return;
        }
    }
}

/// A gateway just started with [[nodes]] has no worker until it reaches the node: a client
/// in that first instant waits for the node's workers instead of being refused. Run 20 times
/// (the audit saw the refusal in 1 run of 3), then with the node started after the client.
#[tokio::test]
async fn a_client_of_a_gateway_whose_node_is_not_reached_yet_waits_and_is_served() {
    let node = Node::start(&workers(1, ""), "");
    for _ in 0..20 {
        let server = gateway(&node.entry("gpu1", ""));
        let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
        served_without_error(&mut c).await;
        c.close_socket().await;
        server.wait_idle();
    }
    // The node comes up after the client joined.
    let port = free_port();
    let entry = format!("[[nodes]]\nname = \"late\"\naddress = \"127.0.0.1:{port}\"\ntoken = \"{NODE_TOKEN}\"\n");
    let server = gateway(&entry);
    let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    assert_eq!(c.expect("session.queued").await["position"], 1);
    let late = Node::start(&workers(1, ""), &format!("bind = \"127.0.0.1:{port}\""));
    served_without_error(&mut c).await;
    c.close_socket().await;
    server.wait_idle();
    drop(late);
}

/// A node that is never reached: its clients wait `unavailable_after_s`, then are refused
/// with the reason.
#[tokio::test]
async fn a_node_never_reached_lets_its_clients_go_after_unavailable_after() {
    let port = free_port();
    let entry = format!("[[nodes]]\nname = \"gone\"\naddress = \"127.0.0.1:{port}\"\ntoken = \"{NODE_TOKEN}\"\n");
    let mut server =
        Server::start(Setup::default().workers(String::new()).queue("unavailable_after_s = 1").extra(&entry));
    let mut c = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    c.expect("session.queued").await;
    let refused = c.expect_error("service_unavailable").await;
    assert!(refused["error"]["message"].as_str().unwrap().contains("for 1 s"), "{refused}");
    server.skip_invariants();
}
