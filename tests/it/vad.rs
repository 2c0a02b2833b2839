//! The gateway's voice activity detection (`[vad]`): Silero VAD finds the edges of spoken
//! sentences where they are, tells speech from noise, and drives the OpenAI-shaped dialects'
//! speech events over a real socket.

use std::time::Duration;

use crate::common::*;
use omni_actors::edge::vad::{Edge, EdgeRules, SpeechEdges, VoiceDetector};
use omni_gateway::config::VadSpec;
use serde_json::{Value, json};

const SENTENCES: [&str; 3] =
    ["What is the capital of France?", "Tell me a short story.", "How many legs does a spider have?"];

fn silero() -> Box<dyn VoiceDetector> {
    let model = omni_vad_silero::Model {
        path: models_dir().join("silero_vad.onnx"),
        onnxruntime_library: models_dir().join("libonnxruntime.so.1.31.1"),
    };
    omni_dialects::vad::detectors(&VadSpec::Silero(model)).detector()
}

/// Where a clean recording's speech starts and ends (samples louder than -40 dBFS).
fn bounds(speech: &[f32]) -> (usize, usize) {
    let loud = |s: &&f32| s.abs() > 0.01;
    let first = speech.iter().position(|s| loud(&s)).unwrap();
    let last = speech.len() - speech.iter().rev().position(|s| loud(&s)).unwrap();
    (first, last)
}

/// `text` in the CPU model backend's voice (Piper), as 16 kHz float samples (the workspace's
/// `speak` example).
fn piper(text: &str) -> Vec<f32> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("speech.f32");
    let run = std::process::Command::new(target_dir().join("examples/speak")).arg(&out).arg(text).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    std::fs::read(&out).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Sentences in a voice, with silences of known length between them; the true edges in
/// milliseconds.
fn conversation_in(voice: fn(&str) -> Vec<f32>) -> (Vec<f32>, Vec<(u64, u64)>) {
    let mut audio = vec![0.0; 8000];
    let mut truth = Vec::new();
    for (i, text) in SENTENCES.iter().enumerate() {
        let speech = voice(text);
        let (first, last) = bounds(&speech);
        let at = audio.len();
        truth.push((((at + first) / 16) as u64, ((at + last) / 16) as u64));
        audio.extend_from_slice(&speech);
        audio.resize(audio.len() + 16 * [1200, 1800, 2500][i], 0.0);
    }
    (audio, truth)
}

/// The sentences spoken by espeak-ng.
fn conversation() -> (Vec<f32>, Vec<(u64, u64)>) {
    conversation_in(speech)
}

fn edges(detector: &mut dyn VoiceDetector, audio: &[f32], rules: &EdgeRules) -> Vec<Edge> {
    let mut edges = SpeechEdges::default();
    let size = detector.window();
    audio.chunks(size).filter_map(|w| edges.push(rules, detector.probability(w), w.len())).collect()
}

#[test]
fn silero_finds_each_sentence_and_its_end_within_a_window() {
    if !needs(&[Need::Models]) {
        return;
    }
    // espeak-ng's voice, and the CPU model backend's (Piper), which breathes between words.
    for (name, voice) in [("espeak-ng", speech as fn(&str) -> Vec<f32>), ("piper", piper)] {
        let (audio, truth) = conversation_in(voice);
        let rules = EdgeRules { threshold: 0.5, prefix_padding_ms: 0, silence_duration_ms: 500 };
        let found = edges(silero().as_mut(), &audio, &rules);
        assert_eq!(
            found.len(),
            2 * truth.len(),
            "{name}: one start and one stop per sentence: {found:?} for {truth:?}"
        );
        for (pair, (start, end)) in found.chunks(2).zip(&truth) {
            let [Edge::Started { audio_start_ms }, Edge::Stopped { audio_end_ms }] = pair else { panic!("{pair:?}") };
            // (`cargo test --test it vad:: -- --nocapture` shows the errors docs/performance.md reports.)
            println!(
                "silero edges, {name}: start {:+} ms, end {:+} ms",
                *audio_start_ms as i64 - *start as i64,
                *audio_end_ms as i64 - *end as i64
            );
            // The onset needs 90 ms of voiced windows; a window is 32 ms.
            assert!(
                audio_start_ms.abs_diff(*start) <= 130,
                "{name}: started at {audio_start_ms} ms, speech at {start} ms"
            );
            assert!(
                audio_end_ms.abs_diff(*end) <= 96,
                "{name}: stopped at {audio_end_ms} ms, speech ended at {end} ms"
            );
        }
    }
}

#[test]
fn silero_does_not_take_noise_for_speech_where_loudness_does() {
    if !needs(&[Need::Models]) {
        return;
    }
    // Two seconds of loud hiss (a fan, a street), then silence.
    let mut seed = 12345u32;
    let mut audio: Vec<f32> = (0..32000)
        .map(|_| {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.2
        })
        .collect();
    audio.resize(48000, 0.0);
    let rules = EdgeRules { threshold: 0.5, prefix_padding_ms: 0, silence_duration_ms: 500 };
    assert_eq!(edges(silero().as_mut(), &audio, &rules), []);
    let loudness = edges(omni_dialects::vad::energy().detector().as_mut(), &audio, &rules);
    assert_eq!(loudness.len(), 2, "the energy detector calls the hiss speech: {loudness:?}");
}

/// Over a socket, with `[vad] engine = "silero"`: each sentence gets `speech_started`, then
/// `speech_stopped` at the end of its speech (not of the audio), `committed` and the user item,
/// whatever the backend does (the reference backend here, told never to hear speech, so that
/// no answer takes the floor).
#[tokio::test]
async fn a_qwen_client_gets_speech_events_at_the_speechs_own_edges() {
    if !needs(&[Need::Models]) {
        return;
    }
    let server = Server::ready(Setup::default().workers(workers(1, "vad_threshold = 0.9")).extra(&silero_section()));
    let mut c = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    c.expect("session.created").await;
    // Qwen's documented 800 ms of silence.
    c.send(json!({"type": "session.update", "session": {"modalities": ["text"], "input_audio_format": "pcm16",
        "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 800}}}))
        .await;
    c.expect("session.updated").await;
    let (audio, truth) = conversation();
    for piece in audio.chunks(1600) {
        c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(piece)})).await;
    }
    let mut seen: Vec<Value> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.iter().filter(|e| e["type"] == "conversation.item.created" && e["item"]["role"] == "user").count()
        < truth.len()
    {
        let e = tokio::time::timeout_at(deadline, c.event()).await.expect("every sentence committed within 60 s");
        seen.push(e);
    }
    let of = |kind: &str| -> Vec<&Value> { seen.iter().filter(|e| e["type"] == kind).collect() };
    let started = of("input_audio_buffer.speech_started");
    let stopped = of("input_audio_buffer.speech_stopped");
    let committed = of("input_audio_buffer.committed");
    assert_eq!((started.len(), stopped.len(), committed.len()), (3, 3, 3), "{:?}", kinds(&seen));
    for (i, (start, end)) in truth.iter().enumerate() {
        let s = started[i]["audio_start_ms"].as_u64().unwrap();
        let e = stopped[i]["audio_end_ms"].as_u64().unwrap();
        // Qwen's default padding is 300 ms before the speech.
        assert!((s + 300).abs_diff(*start) <= 130, "sentence {i}: started at {s} (+300), speech at {start}");
        assert!(e.abs_diff(*end) <= 96, "sentence {i}: stopped at {e}, speech ended at {end}");
        assert_eq!(started[i]["item_id"], stopped[i]["item_id"]);
        assert_eq!(committed[i]["item_id"], stopped[i]["item_id"]);
    }
}

/// check-config loads the Silero model and says so; a missing model is named with its key.
#[test]
fn check_config_loads_silero_and_names_a_missing_model() {
    if !needs(&[Need::Models]) {
        return;
    }
    let base = format!("[server]\nbind = \"127.0.0.1:0\"\n{}", workers(1, ""));
    let (code, stdout, stderr) = check_config(&format!("{base}[vad]\nengine = \"silero\"\n"));
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    assert!(stdout.contains("vad: Silero VAD loads and runs"), "{stdout}");
    let (code, _, stderr) =
        check_config(&format!("{base}[vad]\nengine = \"silero\"\nmodel = \"/nowhere/absent.onnx\"\n"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("vad.model: no such file: /nowhere/absent.onnx"), "{stderr}");
}

/// `speech_stopped.audio_end_ms` within 100 ms of the end of speech, for utterances of about a
/// third of a second, one second and three seconds (espeak-ng), each followed by two seconds of
/// silence, over a socket with Silero.
#[tokio::test]
async fn utterances_from_a_third_of_a_second_to_three_seconds_stop_within_100_ms() {
    if !needs(&[Need::Models]) {
        return;
    }
    let server = Server::ready(Setup::default().workers(workers(1, "vad_threshold = 0.9")).extra(&silero_section()));
    let mut c = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    c.expect("session.created").await;
    c.send(json!({"type": "session.update", "session": {"input_audio_format": "pcm16",
        "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500}}}))
        .await;
    c.expect("session.updated").await;
    let mut audio = vec![0.0; 8000];
    let mut truth = Vec::new();
    for (text, about) in [("Yes.", 0.3), ("Good morning.", 1.0), ("The quick brown fox jumps over the lazy dog.", 3.0)]
    {
        let s = speech(text);
        let (first, last) = bounds(&s);
        let seconds = (last - first) as f64 / 16000.0;
        assert!((seconds - about).abs() < about * 0.5 + 0.1, "{text:?} lasts {seconds:.2} s, not about {about} s");
        truth.push(((audio.len() + last) / 16) as u64);
        audio.extend_from_slice(&s);
        audio.resize(audio.len() + 32000, 0.0);
    }
    for piece in audio.chunks(1600) {
        c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(piece)})).await;
    }
    let mut stops = Vec::new();
    while stops.len() < truth.len() {
        let e = c.event().await;
        assert_ne!(e["type"], "error", "{e}");
        if e["type"] == "input_audio_buffer.speech_stopped" {
            stops.push(e["audio_end_ms"].as_u64().unwrap());
        }
    }
    for (stop, end) in stops.iter().zip(&truth) {
        println!("speech ended at {end} ms, speech_stopped at {stop} ms");
        assert!(stop.abs_diff(*end) <= 100, "speech_stopped at {stop} ms, speech ended at {end} ms");
    }
}
