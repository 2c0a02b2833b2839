//! Test harness: the real server binary on a free loopback port, and a real WebSocket
//! client. A server's log is printed when the test using it fails.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

mod browser;
mod decider;
mod mock_worker;
mod needs;
mod node;
mod proxy;
mod receiver;
mod redis;
mod vllm_omni;
#[allow(unused_imports)]
pub(crate) use browser::*;
#[allow(unused_imports)]
pub(crate) use decider::*;
#[allow(unused_imports)]
pub(crate) use mock_worker::*;
#[allow(unused_imports)]
pub(crate) use needs::*;
#[allow(unused_imports)]
pub(crate) use node::*;
#[allow(unused_imports)]
pub(crate) use proxy::*;
#[allow(unused_imports)]
pub(crate) use receiver::*;
#[allow(unused_imports)]
pub(crate) use redis::*;
#[allow(unused_imports)]
pub(crate) use vllm_omni::*;

/// How long a test waits for any one event before failing.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// The sections of a test configuration; `bind` is always a free port.
pub(crate) struct Setup {
    pub server: Vec<String>,
    pub queue: Vec<String>,
    pub limits: Vec<String>,
    pub recording: Vec<String>,
    pub auth: Vec<String>,
    pub admin: Option<String>,
    pub workers: String,
    /// Whole sections appended at the end (e.g. `[server.tls]`).
    pub extra: Vec<String>,
    /// Run this executable instead of the one cargo built.
    pub binary: Option<std::path::PathBuf>,
    /// Environment variables of the server process.
    pub env: Vec<(String, String)>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            server: vec![],
            queue: vec![],
            limits: vec![],
            recording: vec![],
            auth: vec![],
            admin: None,
            workers: workers(1, ""),
            extra: vec![],
            binary: None,
            env: vec![],
        }
    }
}

impl Setup {
    pub(crate) fn server(mut self, line: &str) -> Self {
        self.server.push(line.into());
        self
    }
    pub(crate) fn queue(mut self, line: &str) -> Self {
        self.queue.push(line.into());
        self
    }
    pub(crate) fn limits(mut self, line: &str) -> Self {
        self.limits.push(line.into());
        self
    }
    pub(crate) fn workers(mut self, toml: String) -> Self {
        self.workers = toml;
        self
    }
    pub(crate) fn recording(mut self, line: &str) -> Self {
        self.recording.push(line.into());
        self
    }
    pub(crate) fn auth(mut self, line: &str) -> Self {
        self.auth.push(line.into());
        self
    }
    /// Sets `[auth] admin_key`; the harness then sends it on its own status requests.
    pub(crate) fn admin_key(mut self, key: &str) -> Self {
        self.auth.push(format!("admin_key = \"{key}\""));
        self.admin = Some(key.into());
        self
    }
    pub(crate) fn binary(mut self, path: &std::path::Path) -> Self {
        self.binary = Some(path.to_path_buf());
        self
    }
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
    pub(crate) fn extra(mut self, section: &str) -> Self {
        self.extra.push(section.into());
        self
    }
    fn render(&self) -> String {
        // Every test client connects from 127.0.0.1: the per-address caps are off unless
        // a test sets them. A client a test drops gives its worker back at once (sessions are
        // held for a resume only in the tests of resumption).
        let mut server = self.server.clone();
        for default in ["max_connections_per_ip = 0", "max_waiting_per_ip = 0", "resume_grace_s = 0"] {
            let key = default.split(' ').next().unwrap_or_default();
            if !server.iter().any(|l| l.lines().any(|l| l.trim_start().starts_with(key))) {
                server.push(default.into());
            }
        }
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\n{}\n[queue]\n{}\n[limits]\n{}\n[recording]\n{}\n[auth]\n{}\n{}\n{}\n",
            server.join("\n"),
            self.queue.join("\n"),
            self.limits.join("\n"),
            self.recording.join("\n"),
            self.auth.join("\n"),
            self.workers,
            self.extra.join("\n")
        )
    }
}

/// The `kind` of each delta, in order.
pub(crate) fn kinds(events: &[Value]) -> Vec<String> {
    events.iter().map(|v| v["kind"].as_str().unwrap_or("?").to_string()).collect()
}

/// `count` builtin workers named sim-0.., with extra `[workers.options]` lines.
pub(crate) fn workers(count: usize, options: &str) -> String {
    format!("[[workers]]\nname = \"sim\"\ncount = {count}\n[workers.options]\n{options}\n")
}

/// `count` builtin workers named sim-0.. whose backends run in child processes.
pub(crate) fn process_workers(count: usize, options: &str) -> String {
    format!("[[workers]]\nname = \"sim\"\ncount = {count}\nisolation = \"process\"\n[workers.options]\n{options}\n")
}

pub(crate) struct Server {
    child: Child,
    pub addr: SocketAddr,
    logs: Arc<Mutex<String>>,
    admin: Option<String>,
    dir: tempfile::TempDir,
    /// Check the invariants when dropped.
    invariants: bool,
}

impl Server {
    pub(crate) fn start(setup: Setup) -> Server {
        Server::start_in(setup, tempfile::tempdir().unwrap())
    }

    /// Starts the server with its config (and relative paths) in `dir`.
    pub(crate) fn start_in(setup: Setup, dir: tempfile::TempDir) -> Server {
        let path = dir.path().join("config.toml");
        std::fs::write(&path, setup.render()).unwrap();
        let exe = setup.binary.clone().unwrap_or_else(|| env!("CARGO_BIN_EXE_omni-gateway").into());
        let mut child = Command::new(exe)
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "debug,actix_server=warn,actix_http=warn,str0m=info,sctp_proto=info,is=info,dimpl=info")
            .envs(setup.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start omni-gateway");
        let logs = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let printed = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // What the server prints for people (the page, the try-it command) joins its log.
                printed.lock().unwrap().push_str(&format!("{line}\n"));
                if let Some(addr) = line.strip_prefix("omni-gateway listening on ") {
                    let _ = tx.send(addr.trim().parse::<SocketAddr>().unwrap());
                }
            }
        });
        let addr = match rx.recv_timeout(WAIT) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("the server did not start:\n{}", logs.lock().unwrap());
            }
        };
        Server { child, addr, logs, admin: setup.admin.clone(), dir, invariants: true }
    }

    /// Starts the server and waits until every worker is idle.
    pub(crate) fn ready(setup: Setup) -> Server {
        let server = Server::start(setup);
        server.wait_idle();
        server
    }

    pub(crate) fn url(&self, path_and_query: &str) -> String {
        format!("ws://{}{}", self.addr, path_and_query)
    }

    pub(crate) fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// A plain HTTP GET; returns the status code and the body.
    pub(crate) fn get(&self, path: &str) -> (u16, String) {
        http(self.addr, "GET", path, &[])
    }

    /// The directory holding the config (relative paths such as `recordings` are in it).
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// A GET with the admin key, when the setup has one.
    pub(crate) fn admin_get(&self, path: &str) -> (u16, String) {
        let auth = self.admin.as_ref().map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        http(self.addr, "GET", path, &headers)
    }

    pub(crate) fn status(&self) -> Value {
        let (code, body) = self.admin_get("/status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Waits until every worker is idle and the queue is empty (the invariant after a test).
    pub(crate) fn wait_idle(&self) {
        self.wait_status("workers not idle", WAIT, |s| {
            s["workers"].as_array().unwrap().iter().all(|w| w["state"] == "idle") && s["queue"]["length"] == 0
        });
    }

    /// Polls `/status` until `check` holds; fails with `what` and the last status after `within`.
    pub(crate) fn wait_status(&self, what: &str, within: Duration, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status();
            if check(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the server's log contains `needle`.
    pub(crate) fn wait_log(&self, needle: &str, within: Duration) {
        self.wait_log_count(needle, 1, within);
    }

    /// Waits until the log says `needle` `count` times.
    pub(crate) fn wait_log_count(&self, needle: &str, count: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.logs().matches(needle).count() < count {
            assert!(Instant::now() < deadline, "the log never said {needle:?} {count} times:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The value of one sample of `/metrics` (`name` with its labels, as printed), 0 when absent.
    pub(crate) fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.admin_get("/metrics");
        body.lines()
            .find_map(|l| {
                l.strip_prefix(name).filter(|rest| rest.starts_with(' ')).and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap_or(0.0)
    }

    /// Waits until a metric sample reaches `at_least`.
    pub(crate) fn wait_metric(&self, name: &str, at_least: f64, within: Duration) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let v = self.metric(name);
            if v >= at_least {
                return v;
            }
            assert!(Instant::now() < deadline, "{name} stayed at {v} (wanted {at_least})");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for a finished recording (its meta.json) and returns its directory.
    pub(crate) fn recording(&self, session_id: &str) -> std::path::PathBuf {
        let root = self.dir().join("recordings");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(dates) = std::fs::read_dir(&root) {
                for date in dates.flatten() {
                    let dir = date.path().join(session_id);
                    if dir.join("meta.json").is_file() {
                        return dir;
                    }
                }
            }
            assert!(Instant::now() < deadline, "no finished recording for {session_id}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's resident memory now and at its peak, in MB (`/proc/PID/status`).
    pub(crate) fn memory_mb(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (kb("VmRSS:") / 1024.0, kb("VmHWM:") / 1024.0)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends a signal (`TERM`, `INT`, `KILL`...) to the server process.
    pub(crate) fn signal(&self, name: &str) {
        let ok = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(ok.success(), "kill -{name}");
    }

    /// Waits for the process to exit; `None` when it is still running after `within`.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's child processes (the `worker-host` of each process-isolated worker).
    pub(crate) fn children(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let tasks = format!("/proc/{}/task", self.child.id());
        for task in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
            let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(listed.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
        pids.sort_unstable();
        pids
    }

    pub(crate) fn child(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Server {
    /// The invariants every test must leave behind, checked when the server is dropped:
    /// every worker idle (or failed, with a reason), the queue empty, no session open, and
    /// every recording finalized. Clients dropped just before get a moment to be noticed.
    pub(crate) fn check_invariants(&mut self) {
        if !self.alive() {
            return self.check_recordings();
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.status();
            let workers_ok = s["workers"].as_array().unwrap().iter().all(|w| {
                w["state"] == "idle" || (w["state"] == "failed" && !w["failure"].as_str().unwrap_or("").is_empty())
            });
            if workers_ok && s["queue"]["length"] == 0 && s["sessions"]["open"] == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "invariants broken at the end of the test: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.check_recordings();
    }

    fn check_recordings(&self) {
        let root = self.dir.path().join("recordings");
        let days = std::fs::read_dir(&root).into_iter().flatten().flatten();
        for session in days.flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten()) {
            let deadline = Instant::now() + WAIT;
            while !session.path().join("meta.json").exists() {
                assert!(Instant::now() < deadline, "recording {} never finalized", session.path().display());
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// For a test that leaves the server in a state the invariants do not allow on purpose.
    pub(crate) fn skip_invariants(&mut self) {
        self.invariants = false;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let checked = if self.invariants && !std::thread::panicking() {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.check_invariants()))
        } else {
            Ok(())
        };
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() || checked.is_err() {
            eprintln!("---- server log ----\n{}", self.logs());
        }
        if let Err(panic) = checked {
            std::panic::resume_unwind(panic);
        }
    }
}

/// A minimal HTTP/1.1 request; returns the status code and the body.
pub(crate) fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// What the client saw next.
#[derive(Debug)]
pub(crate) enum Seen {
    Event(Value),
    Closed(Option<u16>),
}

pub(crate) struct Client {
    ws: Ws,
    /// Every event received, in order.
    pub seen: Vec<Value>,
}

impl Client {
    pub(crate) async fn connect(url: &str) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
        Client { ws, seen: Vec::new() }
    }

    /// A client on a connection made elsewhere (custom headers, TLS).
    pub(crate) fn from_stream(ws: Ws) -> Client {
        Client { ws, seen: Vec::new() }
    }

    /// The connection itself, to read it without the client's expectations.
    pub(crate) fn into_inner(self) -> Ws {
        self.ws
    }

    pub(crate) async fn send(&mut self, event: Value) {
        self.ws.send(Message::text(event.to_string())).await.unwrap();
    }

    pub(crate) async fn send_raw(&mut self, msg: Message) {
        self.ws.send(msg).await.unwrap();
    }

    /// The next event or close, within `WAIT`; pings and pongs are skipped.
    pub(crate) async fn next(&mut self) -> Seen {
        // One deadline for the event, whatever pings come meanwhile.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("no event within {WAIT:?}; seen so far: {:?}", self.seen));
            match msg {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).expect("server sent non-JSON text");
                    self.seen.push(v.clone());
                    return Seen::Event(v);
                }
                Some(Ok(Message::Close(frame))) => {
                    return Seen::Closed(frame.map(|f: CloseFrame| u16::from(f.code)));
                }
                Some(Ok(Message::Binary(_))) => panic!("the server sent a binary frame"),
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Seen::Closed(None),
            }
        }
    }

    /// The next event, which must not be a close.
    pub(crate) async fn event(&mut self) -> Value {
        match self.next().await {
            Seen::Event(v) => v,
            Seen::Closed(code) => panic!("closed ({code:?}) while expecting an event; seen: {:?}", self.seen),
        }
    }

    /// The next event, which must have type `kind`.
    pub(crate) async fn expect(&mut self, kind: &str) -> Value {
        let v = self.event().await;
        assert_eq!(v["type"], kind, "expected {kind}, got {v}");
        v
    }

    /// Skips events until one of type `kind`.
    pub(crate) async fn until(&mut self, kind: &str) -> Value {
        loop {
            let v = self.event().await;
            if v["type"] == kind {
                return v;
            }
        }
    }

    /// Reads until the connection closes; returns the close code. Events on the way
    /// are kept in `seen`.
    pub(crate) async fn closed(&mut self) -> Option<u16> {
        loop {
            if let Seen::Closed(code) = self.next().await {
                return code;
            }
        }
    }

    /// Expects an error event with `code`.
    pub(crate) async fn expect_error(&mut self, code: &str) -> Value {
        let v = self.expect("error").await;
        assert_eq!(v["error"]["code"], code, "{v}");
        v
    }

    pub(crate) async fn close_socket(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// Connects and waits for `session.queue_done` (no queueing expected).
pub(crate) async fn connected(server: &Server, mode: &str) -> Client {
    let mut c = Client::connect(&server.url(&format!("/v1/realtime?mode={mode}"))).await;
    // (the worker may still be resetting after the previous test client: queued first)
    c.until("session.queue_done").await;
    c
}

/// Connects, initialises and waits for `session.created`.
pub(crate) async fn active(server: &Server, mode: &str) -> Client {
    let mut c = connected(server, mode).await;
    c.send(json!({"type": "session.init", "payload": {"system_prompt": "You are a test."}})).await;
    c.expect("session.created").await;
    c
}

/// `text` spoken by espeak-ng, as 16 kHz float samples.
pub(crate) fn speech(text: &str) -> Vec<f32> {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("speech.wav");
    let out = std::process::Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "150", "-w"])
        .arg(&wav)
        .args(["--", text])
        .output()
        .expect("espeak-ng (apt-get install espeak-ng)");
    assert!(out.status.success());
    let mut reader = hound::WavReader::open(&wav).unwrap();
    let rate = reader.spec().sample_rate;
    let samples: Vec<f32> = reader.samples::<i16>().map(|s| s.unwrap() as f32 / 32768.0).collect();
    omni_actors::audio::resample(&samples, rate, 16000).unwrap()
}

/// One second of a 220 Hz tone: speech to the reference backend.
pub(crate) fn loud() -> Vec<f32> {
    (0..16000).map(|i| 0.3 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 16000.0).sin()).collect()
}

/// One second of silence.
pub(crate) fn quiet() -> Vec<f32> {
    vec![0.0; 16000]
}

/// `samples` as base64 pcm16 (the OpenAI and Qwen dialects' audio).
pub(crate) fn pcm16_of(samples: &[f32]) -> String {
    let bytes: Vec<u8> = samples.iter().flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0) as i16).to_le_bytes()).collect();
    STANDARD.encode(bytes)
}

/// A `[vad]` section that runs Silero VAD from the models folder.
pub(crate) fn silero_section() -> String {
    format!(
        "[vad]\nengine = \"silero\"\nmodel = \"{}\"\nonnxruntime_library = \"{}\"\n",
        models_dir().join("silero_vad.onnx").display(),
        models_dir().join("libonnxruntime.so.1.31.1").display()
    )
}

/// A `[transcription]` section that runs Whisper tiny.en with the workspace's library.
pub(crate) fn transcription_section() -> String {
    format!(
        "[transcription]\nenabled = true\nlibrary = \"{}\"\nmodel = \"{}\"\n",
        target_dir().join("libomni_asr_whisper.so").display(),
        models_dir().join("ggml-tiny.en.bin").display()
    )
}

/// `omni-gateway check-config` on a file holding `config`: its exit code, stdout and stderr.
pub(crate) fn check_config(config: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_omni-gateway"))
        .arg("check-config")
        .arg(&path)
        .env("OMNI_MODELS", models_dir())
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

pub(crate) fn pcm16(seconds: f32, rate: u32, amplitude: f32) -> String {
    let n = (seconds * rate as f32) as usize;
    let bytes: Vec<u8> = (0..n)
        .flat_map(|i| {
            let s = amplitude * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / rate as f32).sin();
            ((s * 32767.0) as i16).to_le_bytes()
        })
        .collect();
    STANDARD.encode(bytes)
}

pub(crate) fn b64_pcm(samples: &[f32]) -> String {
    let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    STANDARD.encode(bytes)
}

pub(crate) fn pcm_of(b64: &Value) -> Vec<f32> {
    let bytes = STANDARD.decode(b64.as_str().expect("base64 string")).unwrap();
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A tiny valid JPEG header (the gateway checks the SOI marker; the reference backend counts frames).
pub(crate) fn jpeg_b64() -> String {
    STANDARD.encode([0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, b'J', b'F', b'I', b'F', 0x00, 0xFF, 0xD9])
}

pub(crate) fn append(audio: &[f32]) -> Value {
    json!({"type": "input.append", "input": {"audio": b64_pcm(audio)}})
}

pub(crate) fn append_with(audio: &[f32], extra: Value) -> Value {
    let mut v = append(audio);
    for (k, val) in extra.as_object().unwrap() {
        v["input"][k] = val.clone();
    }
    v
}

/// Reads deltas until the one answering `input_id` whose kind is listen or the last of its step.
pub(crate) async fn answer_to(c: &mut Client, input_id: &str) -> Vec<Value> {
    let mut got = Vec::new();
    loop {
        let v = c.event().await;
        assert_ne!(v["type"], "error", "unexpected error: {v}");
        if v["type"] != "response.output.delta" {
            continue;
        }
        let done = v["input_id"] == input_id && (v["kind"] == "listen" || v["kind"] == "audio");
        got.push(v);
        if done {
            return got;
        }
    }
}

/// A self-signed certificate for `localhost`, written to `cert`/`key` (PEM) in `dir`.
pub(crate) fn localhost_certificate(
    dir: &std::path::Path,
    cert: &str,
    key: &str,
) -> rcgen::CertifiedKey<rcgen::KeyPair> {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.join(cert), made.cert.pem()).unwrap();
    std::fs::write(dir.join(key), made.signing_key.serialize_pem()).unwrap();
    made
}
