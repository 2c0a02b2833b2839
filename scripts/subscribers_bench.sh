#!/usr/bin/env bash
# What subscribers cost a session: the chunk round trip at SESSIONS sessions with no
# subscriber, with usage accounting, and with a webhook on every session event whose
# receiver fails every attempt (HTTP 501) or never answers. Prints the table in
# docs/performance.md.
#
#   scripts/subscribers_bench.sh [SESSIONS] [DURATION_S] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
sessions=${1:-100}
duration=${2:-30}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
. scripts/lib.sh
failing=$(free_port)
silent=$(free_port)
# A receiver that refuses every POST (501), and one that accepts connections and never answers.
python3 -m http.server "$failing" --bind 127.0.0.1 > /dev/null 2>&1 &
refusing=$!
python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $silent)); s.listen(1000)
held = []
while True:
    c, _ = s.accept(); held.append(c)
" &
hanging=$!
trap 'kill $refusing $hanging 2>/dev/null || true' EXIT
hook() { # URL
    printf '[[webhooks]]\nname = "bench"\nurl = "%s"\nevents = ["session.queued", "session.assigned", "session.started", "session.error", "session.closed"]\nsecret = "bench-secret-0123456789"\nretry_base_s = 0.1\ntimeout_s = 30\n' "$1"
}
run() { # NAME EXTRA_TOML
    EXTRA_TOML="$2" scripts/loadtest.sh "$sessions" --sessions "$sessions" --ramp 5 --duration "$duration" \
        --quiet --json-out "$out/$1.json" > "$out/$1.txt" 2>&1
    echo "$1 done" >&2
}
run none ""
run usage "$(printf '[usage]\nenabled = true\ndir = "%s/usage"\n' "$out")"
run webhook-failing "$(hook "http://127.0.0.1:$failing/hook")"
run webhook-silent "$(hook "http://127.0.0.1:$silent/hook")"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| subscribers | p50 | p90 | p99 | max | chunks answered | errors | server CPU |")
print("|---|---|---|---|---|---|---|---|")
names = {"none": "none", "usage": "usage accounting", "webhook-failing": "a webhook whose receiver refuses every attempt",
         "webhook-silent": "a webhook whose receiver never answers"}
for key, label in names.items():
    r = json.load(open(f"{out}/{key}.json"))
    t = r["rtt_ms"]
    print(f"| {label} | {t['p50']:.2f} ms | {t['p90']:.2f} ms | {t['p99']:.2f} ms | {t['max']:.2f} ms | {r['chunks']['answered']} "
          f"| {sum(r['errors'].values())} | {r['cpu_percent']['server']:.0f} % |")
PY
