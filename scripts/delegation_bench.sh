#!/usr/bin/env bash
# Delegation measured: the latency of a decided call and of the voice's re-preparation, and the
# gateway's CPU per session-second with the decider on and off (scripts/delegation_bench.py has
# what each figure is). Builds the release binary and the Whisper library; needs .venv (./test.sh
# makes it), espeak-ng and Whisper tiny.en (scripts/fetch-models.py).
#
#   scripts/delegation_bench.sh [ROUNDS] [SESSIONS] [SECONDS]      # 20 200 60
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
build_release
cargo build --release --quiet -p omni-asr-whisper
models=${OMNI_MODELS:-$HOME/.cache/omni-gateway/models}
ulimit -n 65536 2>/dev/null || true
.venv/bin/python scripts/delegation_bench.py "$server_bin" "$(realpath target/release/libomni_asr_whisper.so)" \
    "$models/ggml-tiny.en.bin" "${1:-20}" "${2:-200}" "${3:-60}"
