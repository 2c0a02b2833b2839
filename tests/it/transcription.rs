//! The gateway's own transcription (`[transcription]`): for a backend that reports no
//! transcript (here the reference backend at ABI revision 1.0), each user turn's audio goes to
//! Whisper on the gateway's threads, and the client gets the words.

use std::time::Duration;

use crate::common::*;
use serde_json::{Value, json};

/// Reads events until one of `kind` (60 s at most).
async fn until(c: &mut Client, kind: &str, seen: &mut Vec<Value>) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let e = tokio::time::timeout_at(deadline, c.event()).await.unwrap_or_else(|_| panic!("no {kind}: {seen:?}"));
        seen.push(e.clone());
        if e["type"] == kind {
            return e;
        }
    }
}

#[tokio::test]
async fn a_backend_without_transcripts_gets_the_gateways_whisper() {
    if !needs(&[Need::Models]) {
        return;
    }
    // revision 0: the reference backend as an ABI 1.0 backend, which reports no transcripts; it
    // never hears speech (vad_threshold 0.9), so the turn ends at the speech's own end.
    let server = Server::ready(
        Setup::default().workers(workers(1, "revision = 0\nvad_threshold = 0.9")).extra(&transcription_section()),
    );
    let mut c = Client::connect(&server.url("/v1/realtime?model=omni")).await;
    c.expect("session.created").await;
    c.send(json!({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                            "transcription": {"model": "whisper-1"}}}}}))
        .await;
    c.expect("session.updated").await;
    let mut audio = vec![0.0; 8000];
    audio.extend(speech("What is the capital of France?"));
    audio.extend(vec![0.0; 24000]);
    for piece in audio.chunks(3200) {
        c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(piece)})).await;
    }
    let mut seen = Vec::new();
    let item = until(&mut c, "conversation.item.added", &mut seen).await;
    let delta = until(&mut c, "conversation.item.input_audio_transcription.delta", &mut seen).await;
    let done = until(&mut c, "conversation.item.input_audio_transcription.completed", &mut seen).await;
    assert_eq!(done["item_id"], item["item"]["id"]);
    assert_eq!(delta["delta"], done["transcript"]);
    let words = done["transcript"].as_str().unwrap().to_lowercase();
    assert!(words.contains("capital") && words.contains("france"), "{words}");
    assert!(!kinds(&seen).contains(&"conversation.item.input_audio_transcription.failed".to_string()));
}

/// Without `[transcription]`, such a backend's items say at once that nothing will come.
#[tokio::test]
async fn without_the_gateways_transcription_the_item_fails_at_once_with_the_reason() {
    let server = Server::ready(Setup::default().workers(workers(1, "revision = 0\nvad_threshold = 0.9")));
    let mut c = Client::connect(&server.url("/api-ws/v1/realtime?model=qwen-omni")).await;
    c.expect("session.created").await;
    let tone: Vec<f32> = (0..8000).map(|i| 0.3 * (i as f32 * 0.1).sin()).chain(vec![0.0; 24000]).collect();
    c.send(json!({"type": "input_audio_buffer.append", "audio": pcm16_of(&tone)})).await;
    let mut seen = Vec::new();
    let failed = until(&mut c, "conversation.item.input_audio_transcription.failed", &mut seen).await;
    assert_eq!(failed["error"]["code"], "transcription_unavailable", "{failed}");
}

/// check-config opens the recogniser and says so; a missing library is named.
#[test]
fn check_config_loads_whisper_and_names_a_missing_library() {
    if !needs(&[Need::Models]) {
        return;
    }
    let base = format!("[server]\nbind = \"127.0.0.1:0\"\n{}", workers(1, ""));
    let (code, stdout, stderr) = check_config(&format!("{base}{}", transcription_section()));
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    assert!(stdout.contains("transcription: Whisper"), "{stdout}");
    let (code, _, stderr) =
        check_config(&format!("{base}[transcription]\nenabled = true\nlibrary = \"/nowhere/lib.so\"\n"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("transcription.library: no such file: /nowhere/lib.so"), "{stderr}");
}
