//! What some tests need from the machine (Redis, Chromium, the CPU model's files, the official
//! Python SDKs). A plain `cargo test --workspace` runs what the machine can: a test whose need
//! is missing returns at once, and the first such test of each need says so in one line.
//! `./test.sh` (and so CI) sets `OMNI_REQUIRE_ALL=1`, which turns a missing need into a failure:
//! there, nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Once;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Debian's `redis-server` (the replicas' tests start their own).
    Redis,
    /// Debian's `chromium` and `chromium-driver` (the pages' tests).
    Browser,
    /// The CPU model backend's two libraries, built by the workspace.
    CascadeLibraries,
    /// The CPU model's files (`scripts/fetch-models.py`), and its libraries.
    Models,
    /// The official OpenAI and DashScope Python clients, and aiortc, in `.venv` (`./test.sh`
    /// makes it).
    Sdks,
    /// Debian's `sox` (`soxi` reads the WAVs the tools write).
    Sox,
    /// The voice-agent frameworks (OpenAI Agents SDK, Pipecat, LiveKit Agents) in
    /// `.venv-agents` (`./test.sh` makes it).
    Agents,
    /// Debian's `baresip-core`, a SIP user agent (the SIP edge's tests call with it).
    Baresip,
}

impl Need {
    fn what(self) -> &'static str {
        match self {
            Need::Redis => "redis-server (apt-get install redis-server)",
            Need::Browser => "chromium and chromedriver (apt-get install chromium chromium-driver)",
            Need::CascadeLibraries => "the CPU model backend's libraries (cargo build --workspace)",
            Need::Models => "the CPU model's files (python3 scripts/fetch-models.py)",
            Need::Sdks => "the official Python SDKs and aiortc in .venv (./test.sh creates it)",
            Need::Sox => "sox (apt-get install sox)",
            Need::Agents => "the agent frameworks in .venv-agents (./test.sh creates it)",
            Need::Baresip => "baresip (apt-get install baresip-core)",
        }
    }

    fn met(self) -> bool {
        match self {
            Need::Redis => on_path("redis-server"),
            Need::Browser => Path::new(super::browser::CHROMIUM).is_file() && on_path(super::browser::CHROMEDRIVER),
            Need::CascadeLibraries => {
                let dir = target_dir();
                dir.join("libomni_cascade.so").is_file() && dir.join("libomni_asr_whisper.so").is_file()
            }
            Need::Models => {
                ["ggml-tiny.en.bin", "silero_vad.onnx", "en_US-joe-medium.onnx"]
                    .iter()
                    .all(|f| models_dir().join(f).is_file())
                    && Need::CascadeLibraries.met()
                    && target_dir().join("examples/speak").is_file()
            }
            Need::Sdks => Command::new(sdk_python())
                .args(["-c", "import openai, dashscope, websockets, aiortc"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            Need::Sox => on_path("soxi"),
            Need::Agents => Command::new(agents_python())
                .args(["-c", "import agents.realtime, pipecat, livekit.plugins.openai"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            Need::Baresip => on_path("baresip"),
        }
    }

    fn once(self) -> &'static Once {
        static ONCE: [Once; 8] =
            [Once::new(), Once::new(), Once::new(), Once::new(), Once::new(), Once::new(), Once::new(), Once::new()];
        &ONCE[self as usize]
    }
}

/// Whether the machine has everything in `needs`. When it does not, the test skips (returns)
/// unless `OMNI_REQUIRE_ALL` is set, which fails it.
pub(crate) fn needs(needs: &[Need]) -> bool {
    let missing: Vec<Need> = needs.iter().copied().filter(|n| !n.met()).collect();
    let Some(first) = missing.first() else { return true };
    let what: Vec<&str> = missing.iter().map(|n| n.what()).collect();
    if std::env::var_os("OMNI_REQUIRE_ALL").is_some_and(|v| v == "1") {
        panic!("OMNI_REQUIRE_ALL is set, and this test needs {}", what.join(" and "));
    }
    // Straight to stderr: the test harness captures `eprintln!` of tests that pass.
    first.once().call_once(|| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: the tests that need {}", what.join(" and "));
    });
    false
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Where cargo put the workspace's libraries.
pub(crate) fn target_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/debug")
}

/// The CPU model's files: `OMNI_MODELS`, or `~/.cache/omni-gateway/models`.
pub(crate) fn models_dir() -> PathBuf {
    std::env::var_os("OMNI_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/omni-gateway/models"))
}

/// The Python with the official SDKs: `OMNI_SDK_PYTHON`, or `.venv`'s.
pub(crate) fn sdk_python() -> PathBuf {
    std::env::var_os("OMNI_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"))
}

/// The Python with the voice-agent frameworks: `OMNI_AGENTS_PYTHON`, or `.venv-agents`'.
pub(crate) fn agents_python() -> PathBuf {
    std::env::var_os("OMNI_AGENTS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-agents/bin/python"))
}

/// One CPU model at a time: two 2-thread workers on 2 cores slow each other several times over
/// (docs/performance.md). Every test that runs a model holds this while it runs, and so does
/// any other test that takes both cores for long (the agent frameworks' test).
pub(crate) fn one_model_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static MODEL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MODEL.lock().unwrap_or_else(|p| p.into_inner())
}
