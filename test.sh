#!/usr/bin/env bash
# Runs every test of the workspace. The end-to-end tests of the official OpenAI and DashScope
# Python clients, and of WebRTC calls from aiortc, need them in .venv, and those of the voice-agent
# frameworks need them in .venv-agents: both created here on first run (tests/sdk/requirements.txt,
# tests/agents/requirements.txt).
# The pages' tests need chromium and chromium-driver, the CPU model backend cmake, g++, libclang
# and espeak-ng, the replicas' tests redis-server, the tools' tests sox, the SIP tests baresip
# (apt-get install chromium chromium-driver cmake g++ libclang-dev espeak-ng redis-server sox
# baresip-core).
set -euo pipefail
cd "$(dirname "$0")"
if ! .venv/bin/python -c "import openai, dashscope, websockets, aiortc" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt
fi
# The voice-agent frameworks (OpenAI Agents SDK, Pipecat, LiveKit Agents) in a venv of their own.
if ! .venv-agents/bin/python -c "import agents.realtime, pipecat, livekit.plugins.openai" 2>/dev/null; then
  python3 -m venv .venv-agents
  .venv-agents/bin/pip install --quiet --disable-pip-version-check -r tests/agents/requirements.txt
fi
# The CPU model backend's end-to-end test needs its models (downloaded once, ~700 MB, into
# ~/.cache/omni-gateway or $OMNI_MODELS).
python3 scripts/fetch-models.py > /dev/null
# One build of the whole workspace: the tests and the backend's two libraries, with one feature
# set, so that llama.cpp and whisper.cpp are compiled once (every command below says --workspace
# for the same reason: a narrower selection unifies features differently and rebuilds them).
cargo build --workspace --all-targets
# Every test, the ones that need the SDKs, Chromium, the models and redis-server included: a plain
# `cargo test --workspace` skips those when the machine lacks what they need; here a missing one
# fails (tests/it/common/needs.rs).
OMNI_REQUIRE_ALL=1 cargo test --workspace "$@"
