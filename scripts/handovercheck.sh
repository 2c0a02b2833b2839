#!/usr/bin/env bash
# The hand-over with WAITING clients waiting throughout (8 workers hand over one 1 s session
# after another for 80 s), on one gateway and on three replicas on Redis: other builds and this
# tree side by side, interleaved (base1, base2, ..., this, then again), each under this tree's
# load generator (scripts/clusterbench.sh, its "steady" phase). Nothing else should run on the
# machine meanwhile.
#
#   ROUNDS=3 scripts/handovercheck.sh WAITING BASE...
#   ROUNDS=3 scripts/handovercheck.sh 2000 35db8e1 333752c
#
# Each BASE is a commit, built once in a worktree under target/perfcheck/ (as perfcheck.sh
# does).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
waiting=${1:-2000}
shift || true
bases=("$@")
rounds=${ROUNDS:-1}
out=$(mktemp -d)
trap 'if [ $? -eq 0 ]; then rm -rf "$out"; else echo "runs kept in $out" >&2; fi' EXIT

side_by_side "" "${bases[@]}"

for r in $(seq "$rounds"); do
    for i in "${!labels[@]}"; do
        echo "$(date +%T) ${labels[$i]}: $waiting waiting, round $r" >&2
        SERVER_BIN=${bins[$i]} KINDS=steady scripts/clusterbench.sh "$waiting" 8 "$out/${labels[$i]}-$r" > "$out/${labels[$i]}-$r.log" 2>&1 \
            || { tail -5 "$out/${labels[$i]}-$r.log" >&2; exit 1; }
    done
done

python3 - "$out" "${labels[@]}" <<'PY'
import json, os, sys
out, labels = sys.argv[1], sys.argv[2:]
def mean(xs): return sum(xs) / len(xs) if xs else float("nan")
print("| build | one gateway: hand-over p50 / p99 (each round) | three replicas: p50 / p99 (each round) | mean p99, gateway / replicas |")
print("|---|---|---|---|")
for label in labels:
    runs = sorted(d for d in os.listdir(out) if d.startswith(label + "-") and os.path.isdir(os.path.join(out, d)))
    cells, p99s = {}, {}
    for kind in ("single", "cluster"):
        cells[kind], p99s[kind] = [], []
        for d in runs:
            j = json.load(open(os.path.join(out, d, f"{kind}-steady.json")))
            h = j["release_to_queue_done_ms"]
            cells[kind].append(f"{h['p50']:.2f} / {h['p99']:.2f}")
            p99s[kind].append(h["p99"])
    print(f"| {label} | {'; '.join(cells['single'])} ms | {'; '.join(cells['cluster'])} ms | "
          f"{mean(p99s['single']):.2f} / {mean(p99s['cluster']):.2f} ms |")
PY
