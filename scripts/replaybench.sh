#!/usr/bin/env bash
# What an instructions change costs a conversation (scripts/replaybench.py), on other builds
# and this tree side by side: one gateway each, one reference-backend worker, OpenAI dialect.
# A build before the conversation was kept (333752c and older) reset the backend and lost the
# conversation; this one replays it to the backend.
#
#   scripts/replaybench.sh [ROUNDS] BASE...
#   scripts/replaybench.sh 20 333752c
#
# Each BASE is built once in a worktree under target/perfcheck/ (as perfcheck.sh does). The
# client runs in .venv-agents (./test.sh makes it), or OMNI_AGENTS_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
rounds=${1:-20}
shift || true
python=${OMNI_AGENTS_PYTHON:-.venv-agents/bin/python}
out=$(mktemp -d)
trap 'kill "${server:-}" 2> /dev/null || true; rm -rf "$out"' EXIT

side_by_side "-p omni-gateway" "$@"
bin=$(realpath target/release/omni-gateway)

for i in "${!labels[@]}"; do
    port=$(free_port)
    printf '[server]\nbind = "127.0.0.1:%s"\n[[workers]]\nname = "sim"\nbackend = "builtin"\n' "$port" > "$out/gw.toml"
    server_bin=${bins[$i]}
    start_server "$out/gw.toml" "$out/server.log" "$port"
    echo "## ${labels[$i]}"
    "$python" scripts/replaybench.py "ws://127.0.0.1:$port/v1/realtime" "$rounds"
    echo "replays: $(curl -s "http://127.0.0.1:$port/metrics" | awk '/^omni_conversation_replays_total/ {print $2}')"
    kill "$server"
    wait "$server" 2> /dev/null || true
done
