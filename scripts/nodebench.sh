#!/usr/bin/env bash
# What a node costs: the same load through workers in worker-host child processes on the
# gateway's host (isolation = "process") and through an `omni-gateway node` on loopback
# ([[nodes]]), one after the other in one run, at 1 and at 500 sessions. Prints the chunk
# round trip and the CPU per step on each side, as the table in docs/performance.md.
#
#   scripts/nodebench.sh [DURATION_S] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-30}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
run() { # NAME SESSIONS RAMP ENV...
    local name=$1 sessions=$2 ramp=$3
    shift 3
    env "$@" scripts/loadtest.sh "$sessions" --sessions "$sessions" --ramp "$ramp" --duration "$duration" \
        --quiet --json-out "$out/$name.json" > "$out/$name.txt" 2>&1
    echo "$name done" >&2
}
run process-1 1 1 ISOLATION=process
run node-1 1 1 VIA=node
run process-500 500 20 ISOLATION=process
run node-500 500 20 VIA=node
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
print("| setup | sessions | p50 | p90 | p99 | chunks answered | errors | CPU per step: gateway | CPU per step: node or children |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ["process-1", "node-1", "process-500", "node-500"]:
    r = json.load(open(f"{out}/{name}.json"))
    text = open(f"{out}/{name}.txt").read()
    m = re.search(r"before ([\d. ]+), after ([\d. ]+)", text)
    before = [float(x) for x in m.group(1).split()]
    after = [float(x) for x in m.group(2).split()]
    steps = max(r["chunks"]["answered"], 1)
    gateway_us = (after[0] - before[0]) / steps * 1e6
    other = f"{(after[1] - before[1]) / steps * 1e6:.0f} µs" if len(after) > 1 else "(in the gateway's figure)"
    rtt = r["rtt_ms"]
    kind, sessions = name.split("-")
    print(f"| {'process isolation' if kind == 'process' else 'node on loopback'} | {sessions} | {rtt['p50']:.2f} ms | {rtt['p90']:.2f} ms | {rtt['p99']:.2f} ms "
          f"| {r['chunks']['answered']} | {sum(r['errors'].values())} | {gateway_us:.0f} µs | {other} |")
PY
