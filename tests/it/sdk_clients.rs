//! The official OpenAI (GA and beta) and DashScope Python clients, unchanged apart from the
//! URL and a key, hold voice turns with the server: a manual and a server-VAD turn each,
//! receiving audio and a transcript and ending with `response.done` status completed; and
//! the conversation calls (truncate, retrieve, delete), out-of-band responses, the idle
//! timeout, `create_response: false` and OpenAI's error codes through the GA client. Every
//! event the server sent them validates against the SDK's own types.
//! The clients live in `.venv` (created by `./test.sh`), or where `OMNI_SDK_PYTHON` points.
//! A plain `cargo test` skips this test without them (it needs the Python package index);
//! `./test.sh` makes `.venv` and runs it.

use std::path::PathBuf;
use std::process::Command;

use crate::common::*;

#[test]
fn the_official_openai_and_dashscope_clients_hold_voice_turns() {
    if !needs(&[Need::Sdks]) {
        return;
    }
    let python = sdk_python();
    assert!(
        python.exists(),
        "{} not found: run ./test.sh, which creates .venv with the official SDKs (tests/sdk/requirements.txt)",
        python.display()
    );
    let mut server = Server::ready(
        Setup::default()
            // As shipped: sessions resumable, so the clients see the resume token in the first event.
            .server("resume_grace_s = 30")
            .auth("api_keys = [\"sdk-test-key-0123456789\"]")
            .recording("enabled = true")
            .workers(workers(2, "token_ms = 100")),
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/sdk_e2e.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(server.addr.port().to_string())
        .arg("sdk-test-key-0123456789")
        .output()
        .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "SDK clients failed:\n{stdout}\n{stderr}");
    println!("{stdout}");
    for case in [
        "openai-ga-manual",
        "openai-ga-vad",
        "openai-beta-manual",
        "openai-beta-vad",
        "dashscope-manual",
        "dashscope-vad",
        "openai-ga-conversation",
        "openai-ga-out-of-band",
        "openai-ga-idle-timeout",
        "openai-ga-no-auto-response",
        "openai-ga-error-codes",
    ] {
        assert!(stdout.contains(&format!("ok {case}:")), "{case} missing:\n{stdout}");
    }
    server.check_invariants();
    let shapes = crate::agents::validate_events(&python, &server.dir().join("recordings"));
    println!("{shapes}");
    assert!(shapes.contains("openai-beta") && shapes.contains("conversation.item.retrieved"), "{shapes}");
}
