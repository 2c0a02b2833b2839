#!/usr/bin/env bash
# The gateway against the floor (examples/floor.rs: only the protocol work any server of the
# MiniCPM-o dialect must do per chunk), under the project's load generator, interleaved in one
# session so that both see the same machine: per round, the floor, the gateway, the gateway with
# resumption off (resume_grace_s = 0), and with BASE set the BASE commit's gateway. Prints CPU per
# chunk (the server's CPU over the run divided by the chunks answered) and its ratio to the
# floor's, the round trip's p50 and p99, and the server's peak memory.
#
#   scripts/floorcheck.sh [SESSIONS...]                 # 3,000 sessions, 2 rounds
#   BASE=c5dff83 ROUNDS=2 scripts/floorcheck.sh 3000
#
# Each gateway runs as many unpaced reference workers as sessions (scripts/loadtest.sh); the
# sessions start over RAMP seconds (default SESSIONS/100) and stream 1 s chunks at real time for
# DURATION seconds (default 60). Nothing else should run on the machine meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(3000)
rounds=${ROUNDS:-2}
duration=${DURATION:-60}
out=$(mktemp -d)
trap 'if [ $? -eq 0 ]; then rm -rf "$out"; else echo "runs kept in $out" >&2; fi' EXIT
base_bin=""
[ -n "${BASE:-}" ] && base_bin=$(base_binary "$BASE")
build_release
cargo build --release --quiet --example floor
floor=target/release/examples/floor
ulimit -n 65536 2>/dev/null || true

floor_run() { # floor_run SESSIONS JSON
    local port pid
    port=$(free_port)
    "$floor" "$port" > "$out/floor.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
    "$bin" loadgen --url "ws://127.0.0.1:$port" --server-pid "$pid" --sessions "$1" \
        --ramp "${RAMP:-$(($1 / 100))}" --duration "$duration" --json-out "$2" > "$2.log" 2>&1
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

gateway_run() { # gateway_run LABEL SESSIONS JSON
    local env=()
    case "$1" in
        resume-off) env=(SERVER_TOML="resume_grace_s = 0") ;;
        base) env=(SERVER_BIN="$base_bin") ;;
    esac
    env "${env[@]}" scripts/loadtest.sh "$2" --sessions "$2" --ramp "${RAMP:-$(($2 / 100))}" \
        --duration "$duration" --json-out "$3" > "$3.log" 2>&1 || { tail -5 "$3.log" >&2; return 1; }
}

for n in "${sizes[@]}"; do
    for r in $(seq "$rounds"); do
        labels=(floor gateway resume-off)
        [ -n "$base_bin" ] && labels+=(base)
        for label in "${labels[@]}"; do
            echo "$(date +%T) $label: $n sessions, round $r" >&2
            json="$out/$label-$n-$r.json"
            if [ "$label" = floor ]; then floor_run "$n" "$json"; else gateway_run "$label" "$n" "$json"; fi
        done
    done
done

python3 - "$out" "$(git rev-parse --short HEAD)" "${BASE:-}" <<'PY'
import glob, json, os, sys
out, this, base = sys.argv[1:4]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    label, n, r = os.path.basename(f)[:-5].rsplit("-", 2)
    j = json.load(open(f))
    cpu_s = j["cpu_percent"]["server"] * j["elapsed_s"] / 100
    rss = j["server_rss_kib"]
    rows.setdefault(int(n), {}).setdefault(label, []).append({
        "us": 1e6 * cpu_s / max(j["chunks"]["answered"], 1),
        "p50": j["rtt_ms"]["p50"], "p99": j["rtt_ms"]["p99"],
        "peak_mb": (rss.get("peak") or 0) / 1024,
        "dropped": j["chunks"]["dropped"], "errors": j["errors"],
    })
names = {"floor": "floor", "gateway": f"gateway ({this})", "resume-off": f"gateway ({this}), resume_grace_s = 0",
         "base": f"gateway ({base})"}
for n, by in sorted(rows.items()):
    floor = sum(x["us"] for x in by.get("floor", [])) / max(len(by.get("floor", [])), 1)
    print(f"\n{n:,} sessions (floor: {floor:.0f} µs per chunk, mean of its runs)\n")
    print("| server | CPU per chunk | × floor | p50 | p99 | peak memory | dropped | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for label in ["floor", "gateway", "resume-off", "base"]:
        for x in by.get(label, []):
            print(f"| {names[label]} | {x['us']:.0f} µs | {x['us'] / floor:.2f} | {x['p50']:.2f} ms | {x['p99']:.2f} ms "
                  f"| {x['peak_mb']:.0f} MB | {x['dropped']} | {x['errors']} |")
PY
