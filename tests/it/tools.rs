//! The probe and the load generator, run as a user would against a server started here.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use serde_json::Value;

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_omni-gateway"))
}

/// 2 s of speech then 0.5 s of silence, 22.05 kHz stereo 16-bit: the probe resamples it.
fn write_wav(path: &std::path::Path) {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 22050,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..(22050 * 5 / 2) {
        let v = if i < 22050 * 2 {
            (9000.0 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 22050.0).sin()) as i16
        } else {
            0
        };
        w.write_sample(v).unwrap();
        w.write_sample(v).unwrap();
    }
    w.finalize().unwrap();
}

fn last_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}:\n{stdout}"))
}

/// The probe against `server`, streaming `wav` 20 times faster than real time, the reply saved
/// to `out`, the summary printed as JSON too.
fn probe_wav(server: &Server, wav: &Path, out: &Path, args: &[&str]) -> std::process::Output {
    gateway()
        .args(["probe", "--speed", "20", "--json"])
        .args(args)
        .arg("--url")
        .arg(format!("ws://{}", server.addr))
        .arg("--wav")
        .arg(wav)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn probe_streams_a_wav_and_saves_the_reply() {
    let server = Server::ready(Setup::default());
    let dir = tempfile::tempdir().unwrap();
    let (wav, out) = (dir.path().join("in.wav"), dir.path().join("reply.wav"));
    write_wav(&wav);
    let run = probe_wav(&server, &wav, &out, &["--mode", "video", "--frames", "tests/c/abi_test.c"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    // A frame that is not a JPEG is refused by the server, chunk by chunk: the probe reports it.
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    let s = last_json(&stdout);
    assert!(s["errors"].as_array().unwrap().iter().all(|e| e == "invalid_payload"), "{s}");

    let run = probe_wav(&server, &wav, &out, &["--mode", "audio"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}");
    for line in
        ["queue done", "session.created", "listen", "text", "audio", "summary:", "to first audio", "chunks answered"]
    {
        assert!(stdout.contains(line), "{line} missing from\n{stdout}");
    }
    let s = last_json(&stdout);
    assert!(s["session_id"].as_str().unwrap().starts_with("sess_"));
    assert!(s["queue_done_ms"].as_f64().unwrap() <= s["created_ms"].as_f64().unwrap());
    assert!(s["first_audio_ms"].as_f64().unwrap() >= s["created_ms"].as_f64().unwrap());
    assert_eq!(s["text"], "Reply 1: I heard 2.0 seconds of speech. Still talking (2). Over.");
    // 2.5 s of WAV and 3 s of tail: 6 chunks, each answered.
    assert_eq!((s["chunks_sent"].as_u64(), s["chunks_answered"].as_u64()), (Some(6), Some(6)));
    assert_eq!(s["audio_samples"], 60000);
    assert_eq!(s["errors"].as_array().unwrap().len(), 0);
    let reply = hound::WavReader::open(&out).unwrap();
    assert_eq!((reply.spec().sample_rate, reply.duration()), (24000, 60000));
    // sox reads it without a warning.
    if needs(&[Need::Sox]) {
        let soxi = Command::new("soxi").arg(&out).output().unwrap();
        let said = String::from_utf8_lossy(&soxi.stderr);
        assert!(soxi.status.success() && !said.contains("WARN"), "soxi: {said}");
    }
}

/// `--chunk-ms 250` streams quarter-second chunks, each answered; less than the gateway's
/// smallest chunk is refused before anything is sent.
#[test]
fn probe_sends_smaller_chunks() {
    let server = Server::ready(Setup::default());
    let dir = tempfile::tempdir().unwrap();
    let (wav, out) = (dir.path().join("in.wav"), dir.path().join("reply.wav"));
    write_wav(&wav);
    let probe = |chunk_ms: &str| probe_wav(&server, &wav, &out, &["--mode", "audio", "--chunk-ms", chunk_ms]);
    let run = probe("250");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    let s = last_json(&stdout);
    // 2.5 s of WAV and 3 s of tail: 22 chunks, each answered.
    assert_eq!((s["chunks_sent"].as_u64(), s["chunks_answered"].as_u64()), (Some(22), Some(22)), "{s}");
    assert_eq!(s["errors"].as_array().unwrap().len(), 0, "{s}");
    let run = probe("100");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && stderr.contains("--chunk-ms"), "{stderr}");
}

#[test]
fn probe_speaks_the_earlier_dialect_and_chat() {
    let server = Server::ready(Setup::default());
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("in.wav");
    write_wav(&wav);
    let url = format!("ws://{}", server.addr);
    let run = gateway()
        .args([
            "probe",
            "--mode",
            "audio",
            "--dialect",
            "legacy",
            "--speed",
            "20",
            "--force-listen-at",
            "2",
            "--json",
            "--url",
            &url,
        ])
        .arg("--wav")
        .arg(&wav)
        .arg("--out")
        .arg(dir.path().join("l.wav"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}");
    let s = last_json(&stdout);
    assert!(s["session_id"].as_str().unwrap().starts_with("rt_"));
    assert_eq!(s["listens"], 6, "the force-listen at 2 s stops the answer before it starts: {stdout}");
    assert!(stdout.contains("with force_listen"));

    let run = gateway()
        .args([
            "probe",
            "--mode",
            "chat",
            "--message",
            "Reply with exactly: probe says hi",
            "--tts",
            "--json",
            "--url",
            &url,
            "--out",
        ])
        .arg(dir.path().join("c.wav"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}");
    let s = last_json(&stdout);
    assert_eq!(s["text"], "probe says hi");
    assert_eq!(s["audio_samples"], 3 * 6000);
}

#[test]
fn loadgen_runs_five_sessions_for_five_seconds() {
    let server = Server::ready(Setup::default().workers(workers(5, "")));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("load.json");
    let run = gateway()
        .args(["loadgen", "--sessions", "5", "--duration", "5", "--ramp", "0.5", "--quiet", "--url"])
        .arg(format!("ws://{}", server.addr))
        .arg("--json-out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    for row in ["sessions     5 started, 5 finished, 0 gave up waiting", "chunk round trip", " ms", "latency"] {
        assert!(stdout.contains(row), "{row} missing from\n{stdout}");
    }
    assert!(!stdout.contains("0.16766852900810894") && !stdout.contains("{\""), "no raw floats or JSON: {stdout}");
    assert!(r_queue_wait_is_measured_below_a_millisecond(&out));
    let r: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(r["errors"], serde_json::json!({}), "{r}");
    assert_eq!(r["sessions"]["finished"], 5);
    assert_eq!(r["sessions"]["connect_failures"], 0);
    assert_eq!(r["chunks"]["sent"], 25);
    assert_eq!(r["chunks"]["answered"], 25);
    assert_eq!(r["chunks"]["dropped"], 0);
    let rtt = &r["rtt_ms"];
    assert_eq!(rtt["count"], 25);
    let (p50, p90, p99, max) = (
        rtt["p50"].as_f64().unwrap(),
        rtt["p90"].as_f64().unwrap(),
        rtt["p99"].as_f64().unwrap(),
        rtt["max"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= max && max < 1000.0, "{rtt}");
    assert_eq!(r["queue_wait_ms"]["count"], 5);
    server.wait_idle();
}

fn r_queue_wait_is_measured_below_a_millisecond(out: &std::path::Path) -> bool {
    let r: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    r["queue_wait_ms"]["p50"].as_f64().unwrap() > 0.0
}

/// `--target worker`: the same load straight to MiniCPM-o model workers (their own `prepare`
/// and `audio_chunk`), one session per worker in turn, the path the gateway is measured against.
#[test]
fn loadgen_speaks_to_model_workers_directly() {
    let workers = [MockWorker::start(), MockWorker::start()];
    let urls: Vec<String> = workers.iter().map(|w| format!("ws://{}", w.addr)).collect();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("load.json");
    let run = gateway()
        .args(["loadgen", "--target", "worker", "--sessions", "2", "--duration", "3", "--ramp", "0.2", "--quiet"])
        .args(["--url", &urls.join(","), "--json-out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    let r: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(r["errors"], serde_json::json!({}), "{r}");
    assert_eq!((r["chunks"]["sent"].as_u64(), r["chunks"]["answered"].as_u64()), (Some(6), Some(6)), "{r}");
    for w in &workers {
        let (prompt, chunks, busy) =
            w.wait_for(|s| !s.busy, |s| (s.prepares[0]["system_prompt"].clone(), s.chunks, s.busy));
        assert_eq!((prompt.as_str(), chunks, busy), (Some("You are a test."), 3, false), "each worker had one session");
    }
}

#[test]
fn loadgen_says_why_when_sessions_cannot_all_be_served() {
    let server = Server::ready(Setup::default().workers(workers(1, "")));
    let run = gateway()
        .args(["loadgen", "--sessions", "3", "--duration", "2", "--ramp", "0.2", "--max-wait", "1", "--quiet", "--url"])
        .arg(format!("ws://{}", server.addr))
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert_eq!(run.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("warning: sessions wait in the server's queue"), "{stderr}");
    assert!(stderr.contains("gave up waiting for a worker"), "{stderr}");
    assert!(stdout.contains("2 gave up waiting"), "{stdout}");
    server.wait_idle();
}

#[test]
fn probe_answers_without_a_wav_and_prints_what_it_receives() {
    let server = Server::ready(Setup::default());
    let dir = tempfile::tempdir().unwrap();
    let url = format!("ws://{}", server.addr);
    let run = gateway()
        .args(["probe", "--mode", "audio", "--speed", "20", "--json", "--url", &url, "--out"])
        .arg(dir.path().join("r.wav"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}");
    assert!(stdout.contains("no --wav given: sending 2 s of a synthetic voice"), "{stdout}");
    let s = last_json(&stdout);
    assert_eq!(s["text"], "Reply 1: I heard 2.0 seconds of speech. Still talking (2). Over.");
    // Each text line shows what arrived, not the running total.
    let texts: Vec<&str> = stdout.lines().filter(|l| l.contains("] text ")).collect();
    assert_eq!(texts.len(), 3, "{stdout}");
    assert!(texts[1].ends_with("\" Still talking (2).\""), "{}", texts[1]);

    let run = gateway()
        .args(["probe", "--mode", "video", "--speed", "20", "--url", &url, "--out"])
        .arg(dir.path().join("v.wav"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("video mode without --frames: no frames are sent"), "{stdout}");

    let run = gateway()
        .args(["probe", "--mode", "chat", "--message", "Reply with exactly: hi", "--url", &url, "--out"])
        .arg(dir.path().join("c.wav"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("messages sent      1") && stdout.contains("answers            1"), "{stdout}");
    assert!(!stdout.contains("chunks sent"), "{stdout}");
}

/// `scripts/fetch-models.py` checks every file it puts in the models folder on every run: a
/// library planted there is removed, and when it cannot be fetched again (pip's index is a
/// closed port here) the script fails and says why. A `wheels` folder beside the models folder,
/// which the script did not create, is left alone.
#[test]
fn fetch_models_refuses_a_planted_library_and_keeps_a_wheels_directory_it_did_not_create() {
    if !needs(&[Need::Models]) {
        return;
    }
    let real = models_dir();
    let dir = tempfile::tempdir().unwrap();
    let (models, wheels) = (dir.path().join("models"), dir.path().join("wheels"));
    std::fs::create_dir(&models).unwrap();
    std::fs::create_dir(&wheels).unwrap();
    std::fs::write(wheels.join("keep-me.txt"), "mine").unwrap();
    // The big files, which check, as links (the script removes a wrong link, never writes through it).
    for file in ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "ggml-tiny.en.bin", "en_US-joe-medium.onnx"] {
        std::os::unix::fs::symlink(real.join(file), models.join(file)).unwrap();
    }
    std::fs::copy(real.join("en_US-joe-medium.onnx.json"), models.join("en_US-joe-medium.onnx.json")).unwrap();
    let planted = models.join("libonnxruntime.so.1.31.1");
    std::fs::write(&planted, "not the library").unwrap();
    let run = Command::new("python3")
        .arg("scripts/fetch-models.py")
        .arg("--dir")
        .arg(&models)
        .env("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
        .env("PIP_RETRIES", "0")
        .env("PIP_CONFIG_FILE", "/dev/null")
        .env_remove("PIP_FIND_LINKS")
        .env_remove("PIP_EXTRA_INDEX_URL")
        .env_remove("PIP_NO_INDEX")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert!(stderr.contains("libonnxruntime.so.1.31.1") && stderr.contains("sha256"), "{stderr}");
    assert!(std::fs::symlink_metadata(&planted).is_err(), "the planted library is still there: {stderr}");
    assert!(wheels.join("keep-me.txt").is_file(), "{stderr}");
}

/// The try-it command the server prints fits its backend: the probe's tone for the reference
/// backend, a spoken question for a model (a library, a MiniCPM-o worker, a node's workers).
#[test]
fn the_printed_try_it_command_speaks_words_to_a_model() {
    let reference = Server::ready(Setup::default());
    let logs = reference.logs();
    let line = logs.lines().find(|l| l.starts_with("try it")).unwrap_or_else(|| panic!("{logs}"));
    assert!(line.contains("probe --mode audio --url ws://") && !line.contains("--say"), "{line}");
    let model = Server::ready(
        Setup::default()
            .workers(format!("[[workers]]\nbackend = \"library\"\nlibrary = \"{}\"\n", env!("OMNI_REFERENCE_LIB"))),
    );
    let logs = model.logs();
    let line = logs.lines().find(|l| l.starts_with("try it")).unwrap_or_else(|| panic!("{logs}"));
    assert!(line.contains("--say \"What is the capital of France?\""), "{line}");
    // With API keys: the command takes one (never printed), and the probe tells the server's
    // reason when it has none.
    let keyed = Server::ready(Setup::default().auth("api_keys = [\"tools-key-0123456789\"]"));
    let logs = keyed.logs();
    let line = logs.lines().find(|l| l.starts_with("try it")).unwrap_or_else(|| panic!("{logs}"));
    assert!(line.contains("--api-key KEY") && !line.contains("tools-key"), "{line}");
    let out = Command::new(env!("CARGO_BIN_EXE_omni-gateway"))
        .args(["probe", "--mode", "audio", "--url", &format!("ws://{}", keyed.addr)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("refused the connection (HTTP 401): an API key is required"), "{stderr}");
    // WebRTC calls on (the default): one line says where their UDP goes.
    assert!(
        logs.lines().any(|l| l.starts_with("WebRTC calls are on: UDP ") && l.contains("advertised to callers as")),
        "{logs}"
    );
}

/// `--say` speaks a question with espeak-ng; the probe shows what the model heard (`input.transcript`,
/// the reference backend's stand-in) and, when the model said nothing, says so and how to fix it.
#[test]
fn probe_says_words_and_tells_what_was_heard_or_that_nothing_was() {
    if !needs(&[Need::Models]) {
        return;
    }
    let server = Server::ready(Setup::default());
    let url = format!("ws://{}", server.addr);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_omni-gateway"))
        .args(["probe", "--mode", "audio", "--speed", "20", "--json", "--say", "What is the capital of France?"])
        .args(["--url", &url, "--out"])
        .arg(dir.path().join("reply.wav"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("saying \"What is the capital of France?\""), "{stdout}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let heard = summary["heard"][0].as_str().unwrap_or_default();
    assert!(heard.contains("seconds of speech"), "{summary}");
    assert!(stdout.contains("  heard "), "{stdout}");
    assert!(!stdout.contains("note: the model said nothing"), "{stdout}");

    // A model that hears nothing in it (the reference backend told so): the summary says so.
    let deaf = Server::ready(Setup::default().workers(workers(1, "vad_threshold = 0.9")));
    let out = Command::new(env!("CARGO_BIN_EXE_omni-gateway"))
        .args(["probe", "--mode", "audio", "--speed", "20", "--say", "Hello there."])
        .args(["--url", &format!("ws://{}", deaf.addr), "--out"])
        .arg(dir.path().join("reply2.wav"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("note: the model said nothing and reported hearing nothing"), "{stdout}");
}

/// A probe stopped with Ctrl-C closes its session: its worker is not left held for a resume.
#[test]
fn a_probe_stopped_with_ctrl_c_closes_its_session() {
    use std::io::BufRead;
    let server = Server::ready(Setup::default().server("resume_grace_s = 30"));
    let url = format!("ws://{}", server.addr);
    let mut probe = gateway()
        .args(["probe", "--mode", "audio", "--tail", "60", "--url", &url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its output is read to the end (a pipe closed early would fail its prints first).
    let stdout = probe.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let created = lines.iter().find(|l| l.contains("session.created"));
    assert!(created.is_some(), "the probe's session was created");
    let kill = Command::new("kill").args(["-INT", &probe.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = probe.wait().unwrap();
    assert!(!status.success(), "an interrupted probe says so");
    server.wait_idle();
    assert_eq!(server.status()["sessions"]["held"], 0, "closed, not held");
    assert!(
        server.logs().contains("ended (user_stop)") || server.logs().contains("ended (client_closed)"),
        "{}",
        server.logs()
    );
}
