#!/usr/bin/env bash
# Starts a release build of the gateway with WORKERS reference workers (step_ms = 0) on a
# free port and runs the load generator against it, sampling the server's CPU and memory.
#
#   scripts/loadtest.sh WORKERS [loadgen options...]
#   scripts/loadtest.sh 2000 --sessions 2000 --ramp 40 --duration 60 --json-out /tmp/l2000.json
#
# ISOLATION=process runs every backend in a worker-host child process instead of a thread.
# VIA=node runs the workers in an `omni-gateway node` on the same machine instead, which the
# gateway reaches over loopback TCP ([[nodes]]); the node's CPU is reported too.
# EXTRA_TOML is appended to the gateway's config (e.g. [usage], [[webhooks]]); SERVER_TOML goes
# under its [server] (e.g. resume_grace_s = 0).
# SERVER_BIN runs another build as the server (and node), under this build's load generator.
# The figures in docs/performance.md and docs/reliability.md come from this script.
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:?usage: scripts/loadtest.sh WORKERS [loadgen options...]}
shift
. scripts/lib.sh
build_release
port=$(free_port)
dir=$(mktemp -d)
ulimit -n 65536 2>/dev/null || true
workers_toml="[[workers]]
name = \"w\"
count = $workers
isolation = \"${ISOLATION:-thread}\"
[workers.options]
step_ms = 0"
nodes_toml=""
node=""
if [ "${VIA:-}" = node ]; then
    node_port=$(free_port)
    token=$(python3 -c "import secrets; print(secrets.token_urlsafe(32))")
    cat > "$dir/node.toml" <<TOML
[node]
bind = "127.0.0.1:$node_port"
token = "$token"
$workers_toml
TOML
    RUST_LOG=${RUST_LOG:-warn} "$server_bin" --config "$dir/node.toml" node > "$dir/node.log" 2>&1 &
    node=$!
    nodes_toml="[[nodes]]
name = \"node\"
address = \"127.0.0.1:$node_port\"
token = \"$token\""
    workers_toml=""
fi
trap 'kill "$server" ${node:+"$node"} 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
cat > "$dir/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
# every client of this script comes from 127.0.0.1
max_connections_per_ip = 0
max_waiting_per_ip = 0
${SERVER_TOML:-}
[queue]
max_waiting = 20000
$workers_toml
$nodes_toml
${EXTRA_TOML:-}
TOML
start_server "$dir/config.toml" "$dir/server.log" "$port"
wait_idle "$port" "$workers" || echo "(measuring anyway: some sessions will wait)" >&2
cpu_before=$(cpu_seconds "$server" ${node:+"$node"})
"$bin" loadgen --url "ws://127.0.0.1:$port" --server-pid "$server" "$@"
cpu_after=$(cpu_seconds "$server" ${node:+"$node"})
echo "CPU seconds over the run, each process with its children (gateway${node:+, node}): before $cpu_before, after $cpu_after"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^omni_worker_handover_seconds_(bucket|count)' > "$dir/handover.txt" || true
echo "server-side hand-over (omni_worker_handover_seconds):"
sed 's/omni_worker_handover_seconds_//' "$dir/handover.txt" | tr '\n' ' '
echo
