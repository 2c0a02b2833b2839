#!/usr/bin/env bash
# The gateway in front of vLLM-Omni against no gateway, beside the MiniCPM-o worker path, at
# each of SLOTS (4 40 200): a mock vLLM-Omni server with that many session slots
# (scripts/mock_vllm_omni.py, answering each one-second unit at once), the load generator
# talking to it directly (`loadgen --target vllm-omni`), then the same load through a gateway
# with `count = SLOTS` `vllm-omni` workers; then SLOTS mock MiniCPM-o workers
# (scripts/mock_worker.py) directly and through `minicpmo-worker` links. Sessions start over
# SLOTS/100 s and stream 1 s chunks at real time for DURATION s. The round trip of a unit less
# the direct one is what the gateway adds; the gateway's CPU is divided by the sessions.
# SERVER_BIN runs another build as the gateway.
#
#   scripts/vllm_omni_path.sh [DURATION] [SLOTS...]      # 30 4 40 200
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-30}
shift || true
slots=("$@")
[ ${#slots[@]} -gt 0 ] || slots=(4 40 200)
[ -x .venv/bin/python ] || { echo "needs .venv with websockets: run ./test.sh once first" >&2; exit 1; }
. scripts/lib.sh
build_release
dir=$(mktemp -d)
ulimit -n 65536 2>/dev/null || true
# The voice prompt every slot needs: a second of a quiet tone.
python3 - "$dir/voice.wav" <<'PY'
import math, struct, sys, wave
with wave.open(sys.argv[1], "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)
    w.writeframes(struct.pack("<16000h", *(int(3000 * math.sin(i * 0.05)) for i in range(16000))))
PY
pids=()
trap 'kill "${pids[@]}" ${server:-} 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT

ready() { # LOG: the ports a mock printed
    for _ in $(seq 100); do grep -q '^ready ' "$1" && break; sleep 0.1; done
    grep -q '^ready ' "$1" || { cat "$1" >&2; exit 1; }
    sed -n 's/^ready //p' "$1"
}

row() { # SLOTS PATH JSON SESSIONS
    python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
slots, path, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = json.load(open(out))
t, c = r["rtt_ms"], r["chunks"]
errors = sum(r["errors"].values())
cpu = r["cpu_percent"]["server"]
per = f"{10 * cpu / n:.2f} ms/s" if cpu is not None else "-"
print(f"| {slots} | {path} | {t['p50']:.2f} ms | {t['p90']:.2f} ms | {t['p99']:.2f} ms | {t['max']:.1f} ms | {per} | {c['answered']} | {c['dropped']} | {errors} |")
PY
}

gateway() { # SLOTS CONFIG NAME
    port=$(free_port)
    sed -i "1i [server]\nbind = \"127.0.0.1:$port\"\nmax_connections_per_ip = 0\nmax_waiting_per_ip = 0" "$2"
    start_server "$2" "$dir/server-$3.log" "$port"
    wait_idle "$port" "$1" || { echo "see $dir/server-$3.log" >&2; KEEP=1; exit 1; }
    "$bin" loadgen --url "ws://127.0.0.1:$port" --server-pid "$server" "${load[@]}" --json-out "$dir/$3.json" > /dev/null
    kill "$server"
    wait "$server" 2>/dev/null || true
    server=
}

echo "| slots | path | p50 | p90 | p99 | max | gateway CPU per session | units answered | dropped | errors |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in "${slots[@]}"; do
    ramp=$(python3 -c "print($n / 100)")
    load=(--sessions "$n" --ramp "$ramp" --duration "$duration" --quiet)

    .venv/bin/python scripts/mock_vllm_omni.py "$n" > "$dir/vllm-$n.log" 2>&1 &
    pids+=($!)
    vport=$(ready "$dir/vllm-$n.log")
    urls=$(python3 -c "print(','.join(['ws://127.0.0.1:$vport'] * $n))")
    "$bin" loadgen --target vllm-omni --url "$urls" "${load[@]}" --json-out "$dir/vllm-direct-$n.json" > /dev/null
    row "$n" "vLLM-Omni direct" "$dir/vllm-direct-$n.json" "$n"
    # The direct sessions closed theirs: every slot is free for the gateway's.
    printf '[[workers]]\nname = "vo"\nbackend = "vllm-omni"\nurl = "http://127.0.0.1:%s"\ncount = %s\nmodes = ["audio", "video"]\n[workers.options]\nref_audio = "%s"\n' \
        "$vport" "$n" "$dir/voice.wav" > "$dir/vllm-$n.toml"
    gateway "$n" "$dir/vllm-$n.toml" "vllm-gateway-$n"
    row "$n" "vLLM-Omni through the gateway" "$dir/vllm-gateway-$n.json" "$n"

    .venv/bin/python scripts/mock_worker.py "$n" > "$dir/workers-$n.log" 2>&1 &
    pids+=($!)
    read -r -a ports <<< "$(ready "$dir/workers-$n.log")"
    urls=$(printf 'ws://127.0.0.1:%s,' "${ports[@]}")
    "$bin" loadgen --target worker --url "${urls%,}" "${load[@]}" --json-out "$dir/worker-direct-$n.json" > /dev/null
    row "$n" "MiniCPM-o worker direct" "$dir/worker-direct-$n.json" "$n"
    : > "$dir/workers-$n.toml"
    for i in "${!ports[@]}"; do
        printf '[[workers]]\nname = "gpu%s"\nbackend = "minicpmo-worker"\nurl = "http://127.0.0.1:%s"\n' "$i" "${ports[$i]}" >> "$dir/workers-$n.toml"
    done
    gateway "$n" "$dir/workers-$n.toml" "worker-gateway-$n"
    row "$n" "MiniCPM-o worker through the gateway" "$dir/worker-gateway-$n.json" "$n"
done
