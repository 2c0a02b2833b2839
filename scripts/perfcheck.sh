#!/usr/bin/env bash
# The previous release and this tree side by side, under this tree's load generator: CPU per
# chunk, round trip p50/p99 and memory per session at each size, the two builds interleaved
# (base, this, base, this...) so both see the same machine. Run it whenever a change touches
# the session, worker or queue path, and put its table in docs/performance.md.
#
#   scripts/perfcheck.sh [BASE] [SESSIONS...]
#   scripts/perfcheck.sh                      # d0f470e (the first release) at 2,000 and 4,000
#   ROUNDS=2 scripts/perfcheck.sh 5177c5a 2000 4000
#
# BASE is a commit; it is built once in a worktree under target/perfcheck/. Each run starts
# SESSIONS reference workers (step_ms = 0) and as many sessions over RAMP seconds (default
# SESSIONS/100), streaming 1 s chunks at real time for DURATION seconds (default 60). Nothing
# else should run on the machine meanwhile (a compile beside it doubles the tail).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
base=${1:-d0f470e}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(2000 4000)
rounds=${ROUNDS:-1}
duration=${DURATION:-60}
out=$(mktemp -d)
# Kept when a run fails: its log says why.
trap 'if [ $? -eq 0 ]; then rm -rf "$out"; else echo "runs kept in $out" >&2; fi' EXIT

rev=$(git rev-parse --short "$base")
base_bin=$(base_binary "$base")
cargo build --release --quiet

run() { # run LABEL SESSIONS ROUND
    local json="$out/$1-$2-$3.json" ramp=${RAMP:-$(($2 / 100))}
    local server=()
    [ "$1" = base ] && server=(env SERVER_BIN="$base_bin")
    echo "$(date +%T) $1 ($([ "$1" = base ] && echo "$rev" || git rev-parse --short HEAD)): $2 sessions, round $3" >&2
    "${server[@]}" scripts/loadtest.sh "$2" --sessions "$2" --ramp "$ramp" --duration "$duration" \
        --json-out "$json" > "$out/$1-$2-$3.log" 2>&1 || { tail -5 "$out/$1-$2-$3.log" >&2; return 1; }
}

for n in "${sizes[@]}"; do
    for r in $(seq "$rounds"); do
        run base "$n" "$r"
        run this "$n" "$r"
    done
done

python3 - "$out" "$rev" "$(git rev-parse --short HEAD)" <<'PY'
import glob, json, os, sys
out, base, this = sys.argv[1:4]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    label, n, r = os.path.basename(f)[:-5].split("-")
    j = json.load(open(f))
    cpu_s = j["cpu_percent"]["server"] * j["elapsed_s"] / 100
    chunks = j["chunks"]["answered"]
    rss = j["server_rss_kib"]
    rows.setdefault(int(n), {}).setdefault(label, []).append({
        "us_per_chunk": 1e6 * cpu_s / max(chunks, 1),
        "p50": j["rtt_ms"]["p50"], "p99": j["rtt_ms"]["p99"],
        "kb_per_session": (rss["peak"] - rss["start"]) / int(n),
        "dropped": j["chunks"]["dropped"], "errors": sum(j["errors"].values()) if isinstance(j["errors"], dict) else 0,
    })
def mean(xs): return sum(xs) / len(xs)
print(f"\n| sessions | build | CPU per chunk | p50 | p99 | memory per session | dropped | errors |")
print("|---|---|---|---|---|---|---|---|")
for n in sorted(rows):
    for label, name in (("base", base), ("this", this)):
        for x in rows[n].get(label, []):
            print(f"| {n:,} | {name} | {x['us_per_chunk']:.0f} µs | {x['p50']:.2f} ms | {x['p99']:.2f} ms | "
                  f"{x['kb_per_session']:.0f} KB | {x['dropped']} | {x['errors']} |")
print()
for n in sorted(rows):
    b, t = rows[n].get("base"), rows[n].get("this")
    if b and t:
        cpu = mean([x["us_per_chunk"] for x in t]) / mean([x["us_per_chunk"] for x in b])
        p99 = mean([x["p99"] for x in t]) / mean([x["p99"] for x in b])
        print(f"{n} sessions: this/base CPU per chunk {cpu:.2f}, p99 {p99:.2f}")
PY
