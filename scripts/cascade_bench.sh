#!/usr/bin/env bash
# The CPU model backend's figures (docs/performance.md, "A real model on the CPU"): a release
# gateway with WORKERS cascade workers (or the reference backend with BACKEND=reference), and
# SESSIONS sessions asking QUESTIONS spoken questions each, in real time
# (scripts/cascade_bench.py). Prints the latency, compute and listen-step figures, then the
# resident memory of the gateway and of each worker process.
#
#   scripts/cascade_bench.sh [WORKERS] [SESSIONS] [QUESTIONS] [OUT_DIR]
#
# CASCADE_LIB=PATH runs another build of the backend (an earlier release's, for a side-by-side
# run), OPTIONS='key = value\n...' adds worker options, BENCH_ARGS='--facts --chunk-ms 250' is
# handed to the Python client (scripts/cascade_bench.py). CLIENT=page asks through the page in
# Chromium instead (scripts/page_bench.py; BENCH_ARGS='--transport websocket' for the WebSocket).
#
# Needs the models (scripts/fetch-models.py), espeak-ng, and .venv (./test.sh creates it).
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:-1}
sessions=${2:-$workers}
questions=${3:-4}
out=${4:-$(mktemp -d)}
. scripts/lib.sh
prepare "$out"
cargo build --release --quiet -p omni-cascade -p omni-asr-whisper
if [ "${BACKEND:-cascade}" = reference ]; then
  worker=$(printf '[[workers]]\nname = "ref"\ncount = %s\nisolation = "process"\nmodes = ["audio", "chat"]\n' "$workers")
else
  worker=$(printf '[[workers]]\nname = "cpu"\nbackend = "library"\nlibrary = "%s"\ncount = %s\nmodes = ["audio", "chat"]\n[workers.options]\ntemperature = 0\nthreads = %s\n%b\n' \
    "${CASCADE_LIB:-$PWD/target/release/libomni_cascade.so}" "$workers" "${THREADS:-2}" "${OPTIONS:-}")
fi
printf '[server]\nbind = "127.0.0.1:%s"\n[limits]\nstep_timeout_ms = 60000\n%s\n' "$port" "$worker" > "$out/config.toml"
start_server "$out/config.toml" "$out/server.log" "$port"
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if all(w["state"]=="idle" for w in s["workers"]) else 1)' && break
  sleep 0.2
done
if [ "${CLIENT:-probe}" = page ]; then
  # The page in Chromium: one fresh session per factual question (scripts/page_bench.py).
  python3 scripts/page_bench.py "http://127.0.0.1:$port" --questions "$questions" --json "$out/bench.json" ${BENCH_ARGS:-}
else
  .venv/bin/python scripts/cascade_bench.py "ws://127.0.0.1:$port" "$sessions" "$questions" --json "$out/bench.json" ${BENCH_ARGS:-}
fi
curl -sf "http://127.0.0.1:$port/status" | python3 -c '
import json, sys
def mb(pid, key):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    except OSError:
        return 0
s = json.load(sys.stdin)
print("gateway RSS %.0f MB (peak %.0f MB)" % (mb(sys.argv[1], "VmRSS:"), mb(sys.argv[1], "VmHWM:")))
for w in s["workers"]:
    p = w.get("process_id")
    if p:
        print("worker %s RSS %.0f MB (peak %.0f MB)" % (w["name"], mb(p, "VmRSS:"), mb(p, "VmHWM:")))
' "$server"
