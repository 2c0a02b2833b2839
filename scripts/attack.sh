#!/usr/bin/env bash
# Every buffer a client can make the gateway hold, attacked one at a time: a fresh release
# server (one reference worker, recording on, the shipped bounds, no per-address cap so
# that the buffers' own bounds are what is measured) per attack; its resident memory is
# read before the attack, after it, and at its peak (VmHWM). The table in
# docs/reliability.md comes from this script.
#
#   scripts/attack.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
. scripts/lib.sh
prepare "$out"
url="ws://127.0.0.1:$port"
server=""
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null || true' EXIT
cat > "$out/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
max_connections_per_ip = 0
max_waiting_per_ip = 0
[recording]
enabled = true
dir = "$out/recordings"
[[workers]]
name = "w"
[workers.options]
token_ms = 50
TOML

mem() { awk -v k="$1" '$1 == k":" {printf "%.0f", $2 / 1024}' "/proc/$server/status"; }

attack() {
    local name=$1; shift
    start_server "$out/config.toml" "$out/server-$name.log" "$port"
    sleep 0.5
    local before; before=$(mem VmRSS)
    "$bin" flood --url "$url" "$@" > "$out/$name.json" 2> "$out/$name.err" || true
    sleep 1
    local after peak; after=$(mem VmRSS); peak=$(mem VmHWM)
    kill "$server"; wait "$server" 2>/dev/null || true; server=""
    printf '%-14s %8s %8s %8s  %s\n' "$name" "$before" "$after" "$peak" "$(cat "$out/$name.json")"
}

printf '%-14s %8s %8s %8s  %s\n' attack "rss MB" after peak "what the client got"
attack wav-rate --kind wav-rate --count 10
attack items --kind items --count 80 --bytes 3000000
attack audio-buffer --kind audio-buffer --count 100 --bytes 2800000
attack images --kind images --count 80 --bytes 3000000
attack prelude --kind prelude --count 100 --bytes 3000000
attack turns --kind turns --count 100 --bytes 20
attack fragments --kind fragments --count 40 --bytes 4000000
