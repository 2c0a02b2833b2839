#!/usr/bin/env bash
# Starts a release build of the gateway with WORKERS reference workers (step_ms = 0) on a
# free port and runs the load generator against it, sampling the server's CPU and memory.
#
#   scripts/loadtest.sh WORKERS [loadgen options...]
#   scripts/loadtest.sh 2000 --sessions 2000 --ramp 40 --duration 60 --json-out /tmp/l2000.json
#
# ISOLATION=process runs every backend in a worker-host child process instead of a thread.
# The figures in docs/performance.md and docs/reliability.md come from this script.
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:?usage: scripts/loadtest.sh WORKERS [loadgen options...]}
shift
. scripts/lib.sh
build_release
port=$(free_port)
dir=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT
cat > "$dir/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
# every client of this script comes from 127.0.0.1
max_connections_per_ip = 0
max_waiting_per_ip = 0
[queue]
max_waiting = 20000
[[workers]]
name = "w"
count = $workers
isolation = "${ISOLATION:-thread}"
[workers.options]
step_ms = 0
TOML
start_server "$dir/config.toml" "$dir/server.log" "$port"
ulimit -n 65536 2>/dev/null || true
"$bin" loadgen --url "ws://127.0.0.1:$port" --server-pid "$server" "$@"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^omni_worker_handover_seconds_(bucket|count)' > "$dir/handover.txt" || true
echo "server-side hand-over (omni_worker_handover_seconds):"
sed 's/omni_worker_handover_seconds_//' "$dir/handover.txt" | tr '\n' ' '
echo
