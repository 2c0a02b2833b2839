#!/usr/bin/env bash
# How a well-behaved session fares while the server is flooded: a release gateway with 4
# reference workers; one loadgen session streams real-time chunks for SECONDS, first alone,
# then during each flood of `omni-gateway flood` (repeated for the whole window), then during
# all of them at once. Prints the session's chunk round trip for each, and the ratio to the
# unloaded figure.
#
#   scripts/flood.sh [SECONDS] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
out=${2:-$(mktemp -d)}
. scripts/lib.sh
prepare "$out"
url="ws://127.0.0.1:$port"
floods=()
cleanup() {
    for f in "${floods[@]}"; do kill "$f" 2>/dev/null || true; done
    kill "$server" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT
cat > "$out/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
# every client of this script comes from 127.0.0.1
max_connections_per_ip = 0
max_waiting_per_ip = 0
[[workers]]
name = "w"
count = 4
TOML
start_server "$out/config.toml" "$out/server.log" "$port"

# One flood kind, again and again until killed.
repeat() {
    trap 'kill "$child" 2>/dev/null; exit 0' TERM
    while true; do
        "$bin" flood --url "$url" "$@" >> "$out/floods.jsonl" 2>/dev/null &
        child=$!
        wait "$child" || true
    done
}
start() {
    for kind in "$@"; do
        case $kind in
            connect-drop) repeat --kind connect-drop --count 1000 & ;;
            chunks) repeat --kind chunks --rate 100 --seconds "$seconds" & ;;
            tiny) repeat --kind tiny --rate 1000 --seconds "$seconds" & ;;
            oversize) repeat --kind oversize --bytes 4194304 & ;;
        esac
        floods+=($!)
    done
    sleep 2
}
stop() {
    for f in "${floods[@]}"; do
        kill "$f" 2>/dev/null || true
        wait "$f" 2>/dev/null || true
    done
    floods=()
    sleep 2
}
measure() {
    "$bin" loadgen --url "$url" --sessions 1 --duration "$seconds" --quiet --server-pid "$server" \
        --json-out "$out/$1.json" > /dev/null
}

measure unloaded
for kind in connect-drop chunks tiny oversize; do
    start "$kind"
    measure "$kind"
    stop
done
start connect-drop chunks tiny oversize
measure all
stop
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
base = json.load(open(f"{out}/unloaded.json"))["rtt_ms"]
print(f"{'flood':<14}{'p50 ms':>9}{'p90 ms':>9}{'max ms':>9}{'p50 x':>8}{'p90 x':>8}  answered  errors  server cpu %")
for name in ["unloaded", "connect-drop", "chunks", "tiny", "oversize", "all"]:
    r = json.load(open(f"{out}/{name}.json"))
    t = r["rtt_ms"]
    print(f"{name:<14}{t['p50']:>9.2f}{t['p90']:>9.2f}{t['max']:>9.2f}{t['p50'] / base['p50']:>8.2f}{t['p90'] / base['p90']:>8.2f}"
          f"  {r['chunks']['answered']}/{r['chunks']['sent']}  {r['errors'] or 0}  {r['cpu_percent']['server']:.0f}")
PY
