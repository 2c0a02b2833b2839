#!/usr/bin/env bash
# Runs every test of the workspace. The end-to-end test of the official OpenAI and DashScope
# Python clients needs them in .venv: created here on first run from tests/sdk/requirements.txt.
set -euo pipefail
cd "$(dirname "$0")"
if ! .venv/bin/python -c "import openai, dashscope, websockets" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/sdk/requirements.txt
fi
cargo test --workspace "$@"
# The official SDK clients' test (ignored by plain `cargo test`, which has no .venv).
cargo test --test sdk_clients "$@" -- --ignored
