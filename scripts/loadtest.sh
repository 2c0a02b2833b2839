#!/usr/bin/env bash
# Starts a release build of the gateway with WORKERS reference workers (step_ms = 0) on a
# free port and runs the load generator against it, sampling the server's CPU and memory.
#
#   scripts/loadtest.sh WORKERS [loadgen options...]
#   scripts/loadtest.sh 2000 --sessions 2000 --ramp 40 --duration 60 --json-out /tmp/l2000.json
#
# The figures in docs/performance.md and docs/reliability.md come from this script.
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:?usage: scripts/loadtest.sh WORKERS [loadgen options...]}
shift
cargo build --release --quiet
bin=target/release/omni-gateway
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT
cat > "$dir/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
[queue]
max_waiting = 20000
[[workers]]
name = "w"
count = $workers
[workers.options]
step_ms = 0
TOML
RUST_LOG=${RUST_LOG:-warn} "$bin" --config "$dir/config.toml" > "$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/readyz" > /dev/null && break
    sleep 0.1
done
ulimit -n 65536 2>/dev/null || true
"$bin" loadgen --url "ws://127.0.0.1:$port" --server-pid "$server" "$@"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^omni_worker_handover_seconds_(bucket|count)' > "$dir/handover.txt" || true
echo "server-side hand-over (omni_worker_handover_seconds):"
sed 's/omni_worker_handover_seconds_//' "$dir/handover.txt" | tr '\n' ' '
echo
