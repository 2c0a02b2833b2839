//! The voice-agent frameworks people point at a base URL, unchanged: the OpenAI Agents SDK
//! (`agents.realtime`), Pipecat's OpenAI realtime service and LiveKit Agents' OpenAI realtime
//! model, each driven headless by a script in `tests/agents/` against a gateway on the
//! reference backend: typed and spoken turns, interruptions, function calls through the ABI,
//! a handoff with the conversation intact. Every event the gateway sent them (and the
//! official SDK clients, `sdk_clients`) is then validated against the official `openai`
//! Python SDK's types.
//!
//! The frameworks live in `.venv-agents` (created by `./test.sh` from
//! `tests/agents/requirements.txt`), or where `OMNI_AGENTS_PYTHON` points.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

pub(crate) const KEY: &str = "agents-test-key-0123456789";

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agents").join(name)
}

/// Runs one case (`tests/agents/CASE`), which must pass; its output.
pub(crate) fn run(case: &str, args: &[&str]) -> String {
    let out = Command::new(agents_python())
        .arg(script(case))
        .args(args)
        .current_dir(script(""))
        .output()
        .unwrap_or_else(|e| panic!("run {case}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr.chars().rev().take(4000).collect::<Vec<_>>().into_iter().rev().collect();
    assert!(out.status.success(), "{case} failed:\n{stdout}\n{tail}");
    println!("{case}:\n{stdout}");
    stdout
}

/// Every event the gateway sent in the recordings under `dir`, against the types of the `openai`
/// SDK that `python` has.
pub(crate) fn validate_events(python: &Path, dir: &Path) -> String {
    let out = Command::new(python).arg(script("event_shapes.py")).arg(dir).output().expect("run event_shapes.py");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "events the SDK's types refuse:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn the_agent_frameworks_run_unchanged_on_the_reference_backend() {
    if !needs(&[Need::Agents]) {
        return;
    }
    // Three Python frameworks take both cores for most of a minute: not beside a model's
    // real-time test.
    let _one = one_model_at_a_time();
    // Answers slow enough (150 ms a word) for speech to come over them.
    let mut server = Server::ready(
        Setup::default()
            // As shipped: sessions resumable, so the clients see the resume token in the first event.
            .server("resume_grace_s = 30")
            .auth(&format!("api_keys = [\"{KEY}\"]"))
            .recording("enabled = true")
            .workers(workers(2, "token_ms = 150")),
    );
    let ws = server.url("/v1/realtime").replacen("http", "ws", 1);
    let agents = run("agents_sdk_case.py", &[&format!("{ws}?model=omni"), KEY]);
    let pipecat = run("pipecat_case.py", &[&ws, KEY, "omni"]);
    let livekit = run("livekit_case.py", &[&ws, KEY, "omni"]);
    for (out, steps) in [
        (
            &agents,
            &[
                "typed turn",
                "spoken turn",
                "transcript in history",
                "tool call",
                "tool result in the answer",
                "interruption",
                "answers after the interruption",
                "handoff",
                "the conversation survives the handoff",
            ][..],
        ),
        (
            &pipecat,
            &["first reply", "spoken turn", "interruption", "answers after the interruption", "function call"][..],
        ),
        (
            &livekit,
            &["generate_reply", "generate_reply with instructions", "function call", "its output in the next reply"][..],
        ),
    ] {
        for step in steps {
            assert!(out.contains(&format!("ok {step}:")), "{step} missing:\n{out}");
        }
    }
    assert!(server.metric("omni_function_calls_total") >= 4.0, "the calls are counted");
    server.check_invariants();
    let shapes = validate_events(&agents_python(), &server.dir().join("recordings"));
    println!("{shapes}");
    for kind in ["response.function_call_arguments.done", "conversation.item.truncated", "conversation.item.added"] {
        assert!(shapes.contains(kind), "no {kind} in what the frameworks heard:\n{shapes}");
    }
}
