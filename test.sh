#!/usr/bin/env bash
# Runs every test of the workspace. The end-to-end test of the official OpenAI and DashScope
# Python clients needs them in .venv: created here on first run from tests/sdk/requirements.txt.
# The pages' tests need chromium and chromium-driver, the CPU model backend cmake, g++, libclang
# and espeak-ng (apt-get install chromium chromium-driver cmake g++ libclang-dev espeak-ng).
set -euo pipefail
cd "$(dirname "$0")"
if ! .venv/bin/python -c "import openai, dashscope, websockets" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt
fi
cargo test --workspace "$@"
# The CPU model backend's end-to-end test needs its models (downloaded once, ~700 MB, into
# ~/.cache/omni-gateway or $OMNI_MODELS) and its two libraries.
python3 scripts/fetch-models.py > /dev/null
cargo build -p omni-cascade -p omni-asr-whisper
# The official SDK clients' test, the pages' tests in Chromium and the CPU model backend's test
# (ignored by plain `cargo test`, which may have no .venv, no browser and no models; the pages'
# tests need Debian's chromium and chromium-driver).
cargo test --test sdk_clients --test browser --test cascade "$@" -- --ignored
