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

/// The same frameworks, unchanged, on a voice that calls no tools (a MiniCPM-o worker: the mock
/// of its protocol) with the gateway's decider beside it (a chat-completions server: a fake that
/// calls a tool by rule). Their questions are spoken with espeak-ng and heard by the gateway's
/// Whisper; the tool is called with the right arguments, the voice speaks its result, and after
/// the Agents SDK's handoff the new agent's voice has the conversation.
#[test]
fn the_agent_frameworks_call_tools_on_a_minicpmo_voice_through_the_decider() {
    if !needs(&[Need::Agents, Need::Models]) {
        return;
    }
    let _one = one_model_at_a_time();
    let (first, second) = (MockWorker::start(), MockWorker::start());
    let entries = format!("{}{}", first.entry("gpu0", ""), second.entry("gpu1", ""));
    frameworks_through_the_decider(entries, None, || prepared_prompts(&[&first, &second]));
}

/// The same on a vLLM-Omni server's slots (the mock of its duplex API), whose sessions take
/// their instructions once: the voice learns by a new session.
#[test]
fn the_agent_frameworks_call_tools_on_a_vllm_omni_voice_through_the_decider() {
    if !needs(&[Need::Agents, Need::Models]) {
        return;
    }
    let _one = one_model_at_a_time();
    let (_dir, wav) = voice();
    let mock = MockVllm::start(2);
    let entries = mock.entry("vo", 2, &format!("ref_audio = \"{}\"", wav.display()));
    frameworks_through_the_decider(entries, None, || {
        mock.with(|s| s.opened.iter().filter_map(|o| o["instructions"].as_str().map(String::from)).collect())
    });
}

/// The same on MiniCPM-o voices, the decider a chat worker of the gateway's own pool (the
/// reference backend, whose documented rule calls the tool whose name's last word was said).
#[test]
fn the_agent_frameworks_call_tools_on_a_minicpmo_voice_through_a_pool_decider() {
    if !needs(&[Need::Agents, Need::Models]) {
        return;
    }
    let _one = one_model_at_a_time();
    let (first, second) = (MockWorker::start(), MockWorker::start());
    let voice = |w: &MockWorker, name: &str| {
        format!(
            "[[workers]]\nname = \"{name}\"\nbackend = \"minicpmo-worker\"\nurl = \"{}\"\nmodes = [\"audio\"]\n",
            w.url()
        )
    };
    let entries = format!(
        "{}{}[[workers]]\nname = \"decider\"\nmodes = [\"chat\"]\n",
        voice(&first, "gpu0"),
        voice(&second, "gpu1")
    );
    let pool = "[delegation]\ndecider = \"pool\"\n".to_string();
    frameworks_through_the_decider(entries, Some(pool), || prepared_prompts(&[&first, &second]));
}

/// Every system prompt `workers` were prepared with.
fn prepared_prompts(workers: &[&MockWorker]) -> Vec<String> {
    workers
        .iter()
        .flat_map(|w| {
            w.with(|s| {
                s.prepares.iter().filter_map(|p| p["system_prompt"].as_str().map(String::from)).collect::<Vec<_>>()
            })
        })
        .collect()
}

/// The three frameworks' delegated cases against a gateway on `workers` with a decider (`section`,
/// else a chat-completions fake that calls by rule); `prompts` gives every system prompt the
/// voices were prepared with, oldest first.
fn frameworks_through_the_decider(workers: String, section: Option<String>, prompts: impl Fn() -> Vec<String>) {
    let rules = [("transfer", "transfer_to_spanishagent", "{}"), ("time", "get_time", "{}")];
    let rules = rules.iter().map(|(w, t, a)| (w.to_string(), t.to_string(), a.to_string())).collect();
    let decider = FakeDecider::start(Answer::Rules(rules));
    let pool = section.is_some();
    let section = section.unwrap_or_else(|| decider.section(""));
    let mut server = Server::ready(
        Setup::default()
            .auth(&format!("api_keys = [\"{KEY}\"]"))
            .recording("enabled = true")
            .limits("max_pending_chunks = 100")
            .workers(workers)
            .extra(&format!("{}{section}", transcription_section())),
    );
    let ws = server.url("/v1/realtime").replacen("http", "ws", 1);
    let agents = run("agents_sdk_case.py", &[&format!("{ws}?model=omni"), KEY, "--delegated"]);
    let pipecat = run("pipecat_case.py", &[&ws, KEY, "omni", "--delegated"]);
    let livekit = run("livekit_case.py", &[&ws, KEY, "omni", "--delegated"]);
    let sdk_steps = [
        "tool call",
        "tool result in the answer",
        "handoff",
        "the new agent's instructions",
        "the new agent's voice answers",
    ];
    for (out, steps) in [
        (&agents, &sdk_steps[..]),
        (&pipecat, &["first reply", "function call", "its result in the answer"][..]),
        (&livekit, &["function call", "its output in the next reply"][..]),
    ] {
        for step in steps {
            assert!(out.contains(&format!("ok {step}:")), "{step} missing:\n{out}");
        }
    }
    // The spoken question reached the decider as Whisper heard it, with the frameworks' tools.
    if pool {
        assert!(decider.requests().is_empty(), "the pool decided, not the fake");
        assert!(server.metric("omni_decisions_total{outcome=\"call\"}") >= 4.0, "the pool's calls");
    }
    let offers_get_time = |r: &serde_json::Value| {
        r["tools"].as_array().is_some_and(|t| t.iter().any(|t| t["function"]["name"] == "get_time"))
    };
    let asked: Vec<String> = decider
        .requests()
        .iter()
        .filter(|(_, r)| offers_get_time(r))
        .filter_map(|(_, r)| {
            r["messages"].as_array()?.iter().rev().find(|m| m["role"] == "user")?["content"]
                .as_str()
                .map(str::to_lowercase)
        })
        .collect();
    assert!(pool || asked.iter().any(|w| w.contains("what time is it")), "{asked:?}");
    // After the handoff, the voice was prepared with the new agent's instructions and the
    // conversation before it: the question, the call and its result.
    let prompts = prompts();
    let handed =
        prompts.iter().find(|p| p.starts_with("Responde siempre en espanol.")).expect("the new agent's prompt");
    assert!(handed.to_lowercase().contains("what time is it"), "{handed}");
    assert!(handed.contains("The tool get_time answered: It is 12:00 UTC."), "{handed}");
    assert!(server.metric("omni_function_calls_total") >= 4.0, "the calls are counted");
    server.check_invariants();
    let shapes = validate_events(&agents_python(), &server.dir().join("recordings"));
    assert!(shapes.contains("response.function_call_arguments.done"), "{shapes}");
}
