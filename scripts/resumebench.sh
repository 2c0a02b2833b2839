#!/usr/bin/env bash
# Clients dropping their connections under load (scripts/resumebench.py), on other builds and this
# tree side by side: SESSIONS duplex sessions streaming in real time on as many reference workers,
# 10 % of them losing their TCP connection each minute and coming back 0.5-3 s later with their
# resume token. A build before resumable sessions (333752c and older) loses each dropped session.
#
#   scripts/resumebench.sh SESSIONS MINUTES BASE...
#   scripts/resumebench.sh 500 3 333752c      # the figures in docs/reliability.md
#
# Each BASE is built once in a worktree under target/perfcheck/. The clients run in .venv
# (./test.sh makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
sessions=${1:?usage: scripts/resumebench.sh SESSIONS MINUTES BASE...}
minutes=${2:?usage: scripts/resumebench.sh SESSIONS MINUTES BASE...}
shift 2
out=$(mktemp -d)
trap 'kill "${server:-}" 2> /dev/null || true; rm -rf "$out"' EXIT
ulimit -n 65536 2> /dev/null || true

side_by_side "" "$@"
bin=$(realpath target/release/omni-gateway)

for i in "${!labels[@]}"; do
    port=$(free_port)
    cat > "$out/gw.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
max_connections_per_ip = 0
max_waiting_per_ip = 0
resume_grace_s = 30
[queue]
max_waiting = 5000
[[workers]]
name = "sim"
count = $sessions
TOML
    server_bin=${bins[$i]}
    start_server "$out/gw.toml" "$out/server.log" "$port"
    echo "## ${labels[$i]}"
    .venv/bin/python scripts/resumebench.py "ws://127.0.0.1:$port/v1/realtime" "$sessions" "$minutes"
    metrics=$(curl -s "http://127.0.0.1:$port/metrics")
    echo "server: $(printf '%s\n' "$metrics" | grep -E '^omni_(resumes_total|sessions_closed_total)' | tr '\n' ' ')"
    echo "peak memory: $(awk '/VmHWM/ {print $2 / 1024 " MB"}' "/proc/$server/status")"
    kill "$server"
    wait "$server" 2> /dev/null || true
done
