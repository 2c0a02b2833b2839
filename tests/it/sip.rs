//! Phone calls from a SIP trunk, with a real SIP user agent: Debian's baresip, headless, driven
//! over its TCP control socket (`ctrl_tcp`: JSON commands in, call events out), playing a WAV
//! (an espeak-ng question, then silence; baresip hangs up when it ends) and writing what it
//! hears to a WAV (`sndfile`). It calls the gateway, is answered, hears the model, presses a
//! key that reaches the session, and hangs up with no session left; a call from a network that
//! is not allowed gets 403.

use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// A free UDP port on loopback.
fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A port baresip can listen on: free for SIP over UDP and TCP, and the next one for its TLS
/// (it binds all three; a port free for UDP alone was seen taken for TCP).
fn free_sip_port() -> u16 {
    loop {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        let free = |p: u16| p != 0 && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if port < u16::MAX && free(port) && free(port + 1) {
            return port;
        }
    }
}

/// baresip, headless, with its control socket; stopped when dropped.
struct Baresip {
    child: Child,
    control: TcpStream,
    /// What it has sent on its control socket and not yet read.
    pending: Vec<u8>,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Baresip {
    /// Starts baresip playing `wav` (8 kHz, mono, 16-bit) when a call connects. Its two ports
    /// are found free just before it binds them: when another test took one meanwhile, baresip
    /// exits, and it is started again on others (three tries).
    fn start(wav: &Path) -> Baresip {
        Baresip::start_as(wav, "<sip:caller@127.0.0.1>;regint=0")
    }

    /// [`Baresip::start`] with its account line (`auth_pass=` for a trunk's credentials).
    fn start_as(wav: &Path, account: &str) -> Baresip {
        Baresip::start_with(wav, account, &["g711.so"])
    }

    /// [`Baresip::start_as`] with its codecs' modules (offered in this order).
    fn start_with(wav: &Path, account: &str, codecs: &[&str]) -> Baresip {
        let mut said = String::new();
        for _ in 0..5 {
            match Baresip::try_start(wav, account, codecs) {
                Ok(ua) => return ua,
                Err(log) => said = log,
            }
        }
        panic!("baresip did not start in five tries; the last said:\n{said}");
    }

    fn try_start(wav: &Path, account: &str, codecs: &[&str]) -> Result<Baresip, String> {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let (sip, control) = (free_sip_port(), free_tcp_port());
        std::fs::write(
            dir.join("config"),
            format!(
                "sip_listen 127.0.0.1:{sip}\n\
                 audio_source aufile,{wav}\n\
                 audio_player aubridge,nil\n\
                 audio_alert aubridge,nil\n\
                 module_path /usr/lib/baresip/modules\n\
                 module account.so\n\
                 {codecs}\
                 module aufile.so\n\
                 module aubridge.so\n\
                 module sndfile.so\n\
                 module_app menu.so\n\
                 module_app ctrl_tcp.so\n\
                 ctrl_tcp_listen 127.0.0.1:{control}\n\
                 snd_path {out}\n",
                wav = wav.display(),
                codecs = codecs.iter().map(|c| format!("module {c}\n")).collect::<String>(),
                out = dir.display()
            ),
        )
        .unwrap();
        std::fs::write(dir.join("accounts"), format!("{account}\n")).unwrap();
        let mut child = Command::new("baresip")
            .arg("-f")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("baresip.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("baresip.err")).unwrap())
            .spawn()
            .expect("baresip (apt-get install baresip-core)");
        let log = |dir: &Path| {
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            format!("{}{}", read("baresip.log"), read("baresip.err"))
        };
        // Its control socket opens once its modules are loaded (unless it exited).
        let deadline = Instant::now() + WAIT;
        let control = loop {
            match TcpStream::connect(("127.0.0.1", control)) {
                Ok(s) => break s,
                Err(_) if child.try_wait().is_ok_and(|exited| exited.is_some()) => return Err(log(&dir)),
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)), // the next try to connect
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("its control socket did not open: {e}\n{}", log(&dir)));
                }
            }
        };
        control.set_read_timeout(Some(WAIT)).unwrap();
        Ok(Baresip { child, control, pending: Vec::new(), dir, _tmp: tmp })
    }

    /// Runs one of baresip's commands (`dial`, `sndcode`, `hangup`).
    fn command(&mut self, command: &str, params: &str) {
        let msg = json!({"command": command, "params": params, "token": command}).to_string();
        write!(self.control, "{}:{msg},", msg.len()).unwrap();
    }

    /// The next message on the control socket (a netstring of JSON).
    fn next(&mut self) -> Value {
        loop {
            if let Some(colon) = self.pending.iter().position(|&b| b == b':') {
                let len: usize = std::str::from_utf8(&self.pending[..colon]).unwrap().parse().unwrap();
                if self.pending.len() > colon + len + 1 {
                    let body = self.pending[colon + 1..colon + 1 + len].to_vec();
                    self.pending.drain(..colon + len + 2);
                    return serde_json::from_slice(&body).unwrap();
                }
            }
            let mut buf = [0u8; 4096];
            let n = self
                .control
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("baresip said nothing in time: {e}\n{}", self.log()));
            assert!(n > 0, "baresip closed its control socket\n{}", self.log());
            self.pending.extend_from_slice(&buf[..n]);
        }
    }

    /// Waits for call event `kind` (`CALL_ESTABLISHED`, `CALL_CLOSED`); answers its event.
    fn event(&mut self, kind: &str) -> Value {
        loop {
            let v = self.next();
            if v["event"] == true && v["type"] == kind {
                return v;
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("baresip.log")).unwrap_or_default()
    }

    /// Waits until baresip's log says `needle`.
    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.log().contains(needle) {
            assert!(Instant::now() < deadline, "baresip never said {needle:?}\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20)); // the next look at its log
        }
    }

    /// What it heard: the WAV `sndfile` wrote of the audio it decoded, as samples, and their
    /// rate.
    fn heard_at(&self) -> (Vec<f32>, u32) {
        let dump = std::fs::read_dir(&self.dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with("-dec.wav"))
            .unwrap_or_else(|| panic!("no WAV of what baresip heard\n{}", self.log()));
        let mut reader = hound::WavReader::open(dump).unwrap();
        let spec = reader.spec();
        let samples: Vec<f32> = reader.samples::<i16>().map(|s| f32::from(s.unwrap()) / 32768.0).collect();
        // One channel of what may be two.
        (samples.iter().step_by(usize::from(spec.channels)).copied().collect(), spec.sample_rate)
    }

    /// What it heard at 8 kHz (G.711).
    fn heard(&self) -> Vec<f32> {
        let (samples, rate) = self.heard_at();
        assert_eq!(rate, 8000);
        samples
    }
}

impl Drop for Baresip {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A WAV baresip plays: half a second of silence, `question`, then `tail_s` of silence, at 8
/// kHz mono (G.711's own).
fn call_wav(dir: &Path, question: &[f32], tail_s: f32) -> PathBuf {
    call_wav_at(dir, question, tail_s, 8000, 1)
}

/// [`call_wav`] at another rate and channel count (baresip plays a WAV only at its codec's).
fn call_wav_at(dir: &Path, question: &[f32], tail_s: f32, rate: u32, channels: u16) -> PathBuf {
    let path = dir.join("caller.wav");
    let spec =
        hound::WavSpec { channels, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    let resampled = omni_actors::audio::resample(question, 16000, rate).unwrap();
    let silence = |s: f32| vec![0.0f32; (rate as f32 * s) as usize];
    for s in silence(0.5).iter().chain(&resampled).chain(&silence(tail_s)) {
        for _ in 0..channels {
            w.write_sample((s.clamp(-1.0, 1.0) * 32767.0) as i16).unwrap();
        }
    }
    w.finalize().unwrap();
    path
}

fn sip_section(port: u16, rtp: u16, networks: &str) -> String {
    format!(
        "[sip]\nenabled = true\nbind = \"127.0.0.1:{port}\"\nrtp_ports = [{rtp}, {}]\nallowed_networks = {networks}\n\
         [[sip.routes]]\nnumber = \"*\"\ninstructions = \"You answer the phone. Be brief.\"\n",
        rtp + 20
    )
}

/// A gateway answering calls from loopback with `rtp` on, its sessions recorded and its worker
/// answering in 300 ms steps; and its SIP port.
fn answering(rtp: u16) -> (Server, u16) {
    let port = free_udp_port();
    let setup = Setup::default().recording("enabled = true").workers(workers(1, "step_ms = 300"));
    (Server::ready(setup.extra(&sip_section(port, rtp, "[\"127.0.0.0/8\"]"))), port)
}

/// The 20 ms windows of `heard` (at `rate`) with voice in them.
fn voiced(heard: &[f32], rate: u32) -> usize {
    let window = rate as usize / 50;
    heard.chunks(window).filter(|w| (w.iter().map(|s| s * s).sum::<f32>() / w.len() as f32).sqrt() > 0.02).count()
}

#[test]
fn a_sip_user_agent_calls_hears_the_model_presses_a_key_and_hangs_up() {
    if !needs(&[Need::Baresip]) {
        return;
    }
    let (server, port) = answering(41000);
    assert!(server.logs().contains(&format!("SIP calls are on: UDP 127.0.0.1:{port}")), "{}", server.logs());
    let tmp = tempfile::tempdir().unwrap();
    let wav = call_wav(tmp.path(), &speech("What is the capital of France?"), 9.0);
    let mut ua = Baresip::start(&wav);
    ua.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    ua.event("CALL_ESTABLISHED");
    // The call's session on the worker: then the key (one pressed while it waits for a worker
    // would not be kept).
    let deadline = Instant::now() + WAIT;
    let session = loop {
        let status = server.status();
        if let Some(id) = status["workers"][0]["session"].as_str() {
            assert_eq!(status["workers"][0]["transport"], "sip", "{status}");
            break id.to_string();
        }
        assert!(Instant::now() < deadline, "no session on the worker: {status}");
        std::thread::sleep(Duration::from_millis(50)); // the next look at /status
    };
    ua.command("sndcode", "7");
    // baresip hangs up when its WAV ends.
    let closed = ua.event("CALL_CLOSED");
    server.wait_idle();
    assert!(server.logs().contains("the trunk hung up"), "{closed}\n{}", server.logs());

    // It heard the model's voice: 2.5 s of it (20 ms windows with voice in them).
    let heard = ua.heard();
    let voiced = voiced(&heard, 8000);
    assert!(
        (110..=140).contains(&voiced),
        "{voiced} windows of 20 ms with voice in {} s heard\n{}\n{}",
        heard.len() / 8000,
        ua.log(),
        server.logs()
    );
    // The key reached the session: in the recording, and not in the log.
    let events = std::fs::read_to_string(server.recording(&session).join("events.jsonl")).unwrap();
    let keys: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["dir"] == "out" && l["event"]["type"] == "input_audio_buffer.dtmf_event_received")
        .collect();
    assert_eq!(keys.len(), 1, "{events}");
    assert_eq!(keys[0]["event"]["event"], "7");
    assert!(!server.logs().contains("pressed 7"), "{}", server.logs());
}

#[test]
fn a_call_from_a_network_not_allowed_gets_403() {
    if !needs(&[Need::Baresip]) {
        return;
    }
    let port = free_udp_port();
    let server =
        Server::ready(Setup::default().workers(workers(1, "")).extra(&sip_section(port, 41100, "[\"192.0.2.0/24\"]")));
    let tmp = tempfile::tempdir().unwrap();
    let wav = call_wav(tmp.path(), &[], 5.0);
    let mut ua = Baresip::start(&wav);
    ua.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    let closed = ua.event("CALL_CLOSED");
    assert!(closed["param"].as_str().is_some_and(|p| p.contains("403")), "{closed}\n{}", ua.log());
    assert!(server.logs().contains("refused (403): not from sip.allowed_networks"), "{}", server.logs());
    assert_eq!(server.metric("omni_connections_refused_total{reason=\"forbidden_network\"}"), 1.0);
    assert_eq!(server.status()["sessions"]["open"], 0);
}

#[test]
fn options_are_answered_and_a_call_put_on_hold_and_resumed_is_answered_and_its_hangup_ends_the_session() {
    if !needs(&[Need::Baresip]) {
        return;
    }
    let port = free_udp_port();
    let server =
        Server::ready(Setup::default().workers(workers(1, "")).extra(&sip_section(port, 41200, "[\"127.0.0.1\"]")));
    let tmp = tempfile::tempdir().unwrap();
    let wav = call_wav(tmp.path(), &[], 30.0);
    let mut ua = Baresip::start(&wav);
    // A trunk's keepalive: OPTIONS is answered 200.
    ua.command("options", &format!("sip:100@127.0.0.1:{port}"));
    ua.wait_log("----- OPTIONS of");
    ua.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    ua.event("CALL_ESTABLISHED");
    // A re-INVITE with `sendonly` (hold), then `sendrecv` (resume): each answered.
    ua.command("hold", "");
    server.wait_log("the trunk holds the call", WAIT);
    ua.command("resume", "");
    server.wait_log("the trunk resumes the call", WAIT);
    assert_eq!(server.status()["sessions"]["open"], 1);
    // The caller hangs up (BYE): the session ends.
    ua.command("hangup", "");
    ua.event("CALL_CLOSED");
    server.wait_idle();
    server.wait_log("the call ended (hangup)", WAIT);
}

/// The app of `tests/sdk/sip_app.py` (the official openai SDK answering SIP calls as OpenAI's
/// guide has it), its lines read as they come.
struct App {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl App {
    fn start(args: &[&str]) -> (App, u16) {
        let python = sdk_python();
        assert!(python.exists(), "{} not found: run ./test.sh, which creates .venv", python.display());
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/sip_app.py");
        let mut child = Command::new(python)
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the app");
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(stdout).map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut app = App { child, lines, seen: Vec::new() };
        let port = app.wait("listening ").trim().parse().unwrap();
        (app, port)
    }

    fn tell(&mut self, line: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    /// The rest of the next line that starts with `prefix`.
    fn wait(&mut self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(WAIT) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.to_string();
                    }
                }
                Err(_) => panic!("the app never said {prefix:?}; it said {:?}", self.seen),
            }
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_app_told_by_webhook_accepts_a_call_with_the_sdk_rejects_one_and_lets_one_ring_out() {
    if !needs(&[Need::Baresip, Need::Sdks]) {
        return;
    }
    let key = "sip-app-key-0123456789";
    let secret = "whsec_c2lwLWFwcC13ZWJob29rLXNlY3JldA==";
    let other_key = "sip-app-other-key-0123456789";
    let (mut app, app_port) = App::start(&[key, secret, other_key]);
    let port = free_udp_port();
    let sip = format!(
        "[sip]\nenabled = true\nbind = \"127.0.0.1:{port}\"\nrtp_ports = [41300, 41320]\naccept_timeout_s = 4\n\
         allowed_networks = [\"127.0.0.1\"]\n[[sip.routes]]\nnumber = \"*\"\naccept = \"webhook\"\n\
         [[webhooks]]\nurl = \"http://127.0.0.1:{app_port}/hook\"\nevents = [\"realtime.call.incoming\"]\n\
         secret = \"{secret}\"\nformat = \"openai\"\n[[models]]\nname = \"gpt-realtime\"\nmodes = [\"audio\"]\n"
    );
    let server = Server::ready(
        Setup::default()
            .auth(&format!("api_keys = [\"{key}\", \"{other_key}\"]"))
            .recording("enabled = true")
            .workers(workers(1, "step_ms = 300"))
            .extra(&sip),
    );
    app.tell(&server.addr.port().to_string());
    app.wait("ready");
    let tmp = tempfile::tempdir().unwrap();
    let wav = call_wav(tmp.path(), &speech("What is the capital of France?"), 30.0);
    let mut ua = Baresip::start(&wav);

    // 100: told with the INVITE's headers, accepted with the SDK, answered.
    ua.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    let incoming = app.wait("incoming ");
    let (call_id, to) = incoming.split_once(' ').unwrap();
    assert!(call_id.starts_with("rtc_") && to.contains("sip:100@127.0.0.1"), "{incoming}");
    assert_eq!(app.wait("accepted "), call_id);
    ua.event("CALL_ESTABLISHED");
    let status =
        server.wait_status("the call's session on the worker", WAIT, |s| s["workers"][0]["session"].is_string());
    assert_eq!(status["workers"][0]["transport"], "sip", "{status}");
    let session = status["workers"][0]["session"].as_str().unwrap().to_string();
    // On the call's own WebSocket, the app asks by text, answers the model's call of its tool,
    // and the model speaks the answer (to the caller; its transcript to the app).
    app.tell(&format!("tools {call_id}"));
    assert_eq!(app.wait("tool-answer "), "The tool said: noon.");
    // One socket a call; another key finds no call.
    app.tell(&format!("second {call_id}"));
    assert_eq!(app.wait("second closed "), "1008 call has an app socket");
    app.tell(&format!("otherkey {call_id}"));
    assert_eq!(app.wait("otherkey refused "), "404");
    // The app hangs it up; its socket closes with the call.
    app.tell(&format!("hangup {call_id}"));
    assert_eq!(app.wait("hung-up "), call_id);
    ua.event("CALL_CLOSED");
    app.wait("sideband closed");
    server.wait_idle();
    // The accept's settings were the session's.
    let events = std::fs::read_to_string(server.recording(&session).join("events.jsonl")).unwrap();
    let updated = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["dir"] == "out" && l["event"]["type"] == "session.updated")
        .unwrap_or_else(|| panic!("no session.updated: {events}"));
    let applied = &updated["event"]["session"];
    assert_eq!(applied["instructions"], "You answer the phone for Example Inc.", "{updated}");
    assert_eq!(applied["audio"]["output"]["voice"], "marin", "{updated}");

    // 200: rejected with 486.
    ua.command("dial", &format!("sip:200@127.0.0.1:{port}"));
    let rejected = app.wait("incoming ");
    assert_eq!(app.wait("rejected "), rejected.split_once(' ').unwrap().0);
    let closed = ua.event("CALL_CLOSED");
    assert!(closed["param"].as_str().is_some_and(|p| p.contains("486")), "{closed}\n{}", ua.log());

    // 300: the app says nothing but two accepts that are refused (a model not served, a voice
    // speed out of range: each 400, the call ringing on); a call it does not know and a wrong
    // key are refused meanwhile; and the call rings out (480) at accept_timeout_s.
    ua.command("dial", &format!("sip:300@127.0.0.1:{port}"));
    let ignored = app.wait("incoming ");
    let ignored = ignored.split_once(' ').unwrap().0.to_string();
    assert_eq!(app.wait("ignored "), ignored);
    app.tell(&format!("bad {ignored}"));
    app.wait("bad refused");
    app.tell(&format!("strangers {ignored}"));
    app.wait("strangers refused");
    let closed = ua.event("CALL_CLOSED");
    assert!(closed["param"].as_str().is_some_and(|p| p.contains("480")), "{closed}\n{}", ua.log());
    assert!(server.logs().contains(&format!("{ignored} was neither accepted nor rejected")), "{}", server.logs());
    assert!(
        !app.seen
            .iter()
            .any(|l| l.starts_with("bad-signature") || l.starts_with("strangers:") || l.starts_with("bad:")),
        "{:?}",
        app.seen
    );
    let why: Vec<&String> = app.seen.iter().filter(|l| l.starts_with("bad-why")).collect();
    assert!(why[0].contains("no-such-model") && why[1].contains("speed"), "{why:?}");
    assert_eq!(server.status()["sessions"]["open"], 0);
}

#[test]
fn with_trunk_credentials_a_call_is_challenged_and_answered_and_a_wrong_password_gets_403() {
    if !needs(&[Need::Baresip]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let password = tmp.path().join("trunk.pass");
    std::fs::write(&password, "a-long-trunk-password-0123\n").unwrap();
    let port = free_udp_port();
    let section = format!(
        "{}[[sip.users]]\nuser = \"trunk\"\npassword_file = \"{}\"\n",
        sip_section(port, 41400, "[\"127.0.0.1\"]"),
        password.display()
    );
    let server = Server::ready(Setup::default().workers(workers(1, "")).extra(&section));
    let wav = call_wav(tmp.path(), &[], 30.0);

    let mut ua = Baresip::start_as(&wav, "<sip:trunk@127.0.0.1>;auth_pass=a-long-trunk-password-0123;regint=0");
    ua.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    ua.event("CALL_ESTABLISHED");
    server.wait_status("the call's session", WAIT, |s| s["workers"][0]["transport"] == "sip");
    ua.command("hangup", "");
    ua.event("CALL_CLOSED");
    server.wait_idle();
    drop(ua);

    let mut ua = Baresip::start_as(&wav, "<sip:trunk@127.0.0.1>;auth_pass=not-the-trunk-password;regint=0");
    ua.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    let closed = ua.event("CALL_CLOSED");
    assert!(closed["param"].as_str().is_some_and(|p| p.contains("403")), "{closed}\n{}", ua.log());
    let logs = server.logs();
    assert!(logs.contains("refused (403): a wrong password for user 'trunk'"), "{logs}");
    assert!(!logs.contains("not-the-trunk-password") && !logs.contains("a-long-trunk-password"), "{logs}");
    assert_eq!(server.metric("omni_connections_refused_total{reason=\"sip_credentials\"}"), 1.0);
    // Each call was asked for its credentials first.
    assert_eq!(server.metric("omni_connections_refused_total{reason=\"sip_challenged\"}"), 2.0);
    assert_eq!(server.status()["sessions"]["open"], 0);
}

#[test]
fn a_user_agent_offering_opus_is_answered_in_opus_hears_the_model_and_its_key_arrives() {
    if !needs(&[Need::Baresip]) {
        return;
    }
    let (server, port) = answering(41500);
    let tmp = tempfile::tempdir().unwrap();
    let wav = call_wav_at(tmp.path(), &speech("What is the capital of France?"), 9.0, 48_000, 2);
    // Opus offered after G.711: taken all the same (the model hears 16 kHz, not 8).
    let mut ua = Baresip::start_with(&wav, "<sip:caller@127.0.0.1>;regint=0", &["g711.so", "opus.so"]);
    ua.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    ua.event("CALL_ESTABLISHED");
    let status =
        server.wait_status("the call's session on the worker", WAIT, |s| s["workers"][0]["session"].is_string());
    let session = status["workers"][0]["session"].as_str().unwrap().to_string();
    assert!(server.logs().contains("to '100': opus on RTP"), "{}", server.logs());
    ua.command("sndcode", "7");
    ua.event("CALL_CLOSED");
    server.wait_idle();

    // The question was heard (the model answered it) and the answer too: 2.5 s of voice.
    let (heard, rate) = ua.heard_at();
    let window = rate as usize / 50;
    let voiced =
        heard.chunks(window).filter(|w| (w.iter().map(|s| s * s).sum::<f32>() / w.len() as f32).sqrt() > 0.02).count();
    assert!((110..=140).contains(&voiced), "{voiced} windows of 20 ms with voice at {rate} Hz\n{}", ua.log());
    let events = std::fs::read_to_string(server.recording(&session).join("events.jsonl")).unwrap();
    assert!(events.contains("input_audio_buffer.dtmf_event_received"), "{events}");
}

#[test]
fn a_call_rings_while_its_session_waits_for_a_worker_and_is_answered_when_one_is_free() {
    if !needs(&[Need::Baresip]) {
        return;
    }
    let (server, port) = answering(41600);
    let tmp = tempfile::tempdir().unwrap();
    let wav = call_wav(tmp.path(), &[], 60.0);
    // The one worker is taken by a first call.
    let mut first = Baresip::start(&wav);
    first.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    first.event("CALL_ESTABLISHED");
    server.wait_status("the first call on the worker", WAIT, |s| s["workers"][0]["session"].is_string());
    // A second call rings (its caller hears ringback) while its session waits in the queue...
    let mut second = Baresip::start(&wav);
    second.command("dial", &format!("sip:100@127.0.0.1:{port}"));
    second.event("CALL_RINGING");
    server.wait_status("the second call in the queue", WAIT, |s| s["queue"]["length"] == 1);
    // ...and is answered when the first hangs up and the worker takes it.
    first.command("hangup", "");
    first.event("CALL_CLOSED");
    second.event("CALL_ESTABLISHED");
    server.wait_status("the second call on the worker", WAIT, |s| {
        s["queue"]["length"] == 0 && s["workers"][0]["session"].is_string()
    });
    second.command("hangup", "");
    second.event("CALL_CLOSED");
    server.wait_idle();
    assert!(server.logs().matches("the trunk hung up").count() == 2, "{}", server.logs());
}
