#!/usr/bin/env bash
# The gateway in front of MiniCPM-o model workers against no gateway: N mock workers
# (scripts/mock_worker.py, one per port, each answering at once), then, ROUNDS times, the load
# generator talking to them directly (`loadgen --target worker`: their own prepare and
# audio_chunk) and the same load through a gateway with N `minicpmo-worker` links, one after
# the other. Sessions start over N/100 s and stream 1 s chunks at real time for DURATION s; the
# round trip's p99 over the run is the start-up tail (every session's first steps) the issue of
# the worker path is about. SERVER_BIN runs another build as the gateway.
#
#   scripts/worker_path.sh [N] [ROUNDS] [DURATION]      # 300 2 30
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-300}
rounds=${2:-2}
duration=${3:-30}
[ -x .venv/bin/python ] || { echo "needs .venv with websockets: run ./test.sh once first" >&2; exit 1; }
. scripts/lib.sh
build_release
dir=$(mktemp -d)
ulimit -n 65536 2>/dev/null || true
.venv/bin/python scripts/mock_worker.py "$n" > "$dir/workers.log" 2>&1 &
workers=$!
trap 'kill "$workers" ${server:-} 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
for _ in $(seq 100); do grep -q '^ready ' "$dir/workers.log" && break; sleep 0.1; done
grep -q '^ready ' "$dir/workers.log" || { cat "$dir/workers.log" >&2; exit 1; }
read -r -a ports <<< "$(sed -n 's/^ready //p' "$dir/workers.log")"

port=$(free_port)
{
    printf '[server]\nbind = "127.0.0.1:%s"\nmax_connections_per_ip = 0\nmax_waiting_per_ip = 0\n' "$port"
    for i in "${!ports[@]}"; do
        printf '[[workers]]\nname = "gpu%s"\nbackend = "minicpmo-worker"\nurl = "http://127.0.0.1:%s"\n' "$i" "${ports[$i]}"
    done
} > "$dir/config.toml"
urls=$(printf 'ws://127.0.0.1:%s,' "${ports[@]}")
ramp=$(python3 -c "print($n / 100)")
load=(--sessions "$n" --ramp "$ramp" --duration "$duration" --quiet)

row() { # PATH JSON
    python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
t, c = r["rtt_ms"], r["chunks"]
errors = sum(r["errors"].values())
print(f"| {sys.argv[1]} | {t['p50']:.2f} ms | {t['p90']:.2f} ms | {t['p99']:.2f} ms | {t['max']:.1f} ms | {c['answered']} | {c['dropped']} | {errors} |")
PY
}

echo "| path | p50 | p90 | p99 | max | chunks answered | dropped | errors |"
echo "|---|---|---|---|---|---|---|---|"
for round in $(seq "$rounds"); do
    "$bin" loadgen --target worker --url "${urls%,}" "${load[@]}" --json-out "$dir/direct-$round.json" > /dev/null
    row "direct" "$dir/direct-$round.json"
    start_server "$dir/config.toml" "$dir/server-$round.log" "$port"
    wait_idle "$port" "$n" || { echo "see $dir/server-$round.log" >&2; KEEP=1; exit 1; }
    "$bin" loadgen --url "ws://127.0.0.1:$port" --server-pid "$server" "${load[@]}" \
        --json-out "$dir/gateway-$round.json" > /dev/null
    row "gateway" "$dir/gateway-$round.json"
    kill "$server"
    wait "$server" 2>/dev/null || true
    server=""
done
