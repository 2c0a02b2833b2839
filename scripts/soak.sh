#!/usr/bin/env bash
# Soak: a release gateway with 480 reference workers (20 of them in child processes) and
# recording on, under 500 concurrent clients for MINUTES: clients stream 30 s sessions of
# speech and silence and rejoin the queue when done, every 7th chunk is force_listen, every
# 10th client vanishes mid-stream without a close frame (its session is held for a resume for
# resume_grace_s, then let go). Fails unless the run had no errors and no dropped chunks, the
# server ends (within the grace) with every worker idle, the queue empty and no session open, and every recording left on disk is intact. Prints the memory curve.
#
#   scripts/soak.sh MINUTES [SESSIONS] [OUT_DIR]
#   scripts/soak.sh 30                 # the run in docs/reliability.md
#   SOAK_RECORDING_GB=1 scripts/soak.sh 2 500 /tmp/soak    # the CI version
#
# Recordings are kept up to SOAK_RECORDING_GB (3) by the retention sweep: about 40 MB/s are
# recorded at 500 sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:?usage: scripts/soak.sh MINUTES [SESSIONS] [OUT_DIR]}
sessions=${2:-500}
out=${3:-$(mktemp -d)}
. scripts/lib.sh
prepare "$out"
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
threads=$((sessions * 92 / 100))
grace=30  # resume_grace_s, the default
cat > "$out/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
# every client of this script comes from 127.0.0.1
max_connections_per_ip = 0
max_waiting_per_ip = 0
resume_grace_s = $grace
[queue]
max_waiting = 5000
[recording]
enabled = true
dir = "recordings"
max_total_gb = ${SOAK_RECORDING_GB:-3}
sweep_interval_s = 10
[[workers]]
name = "t"
count = $threads
[[workers]]
name = "p"
count = $((sessions * 96 / 100 - threads))
isolation = "process"
TOML
rm -rf "$out/recordings"
start_server "$out/config.toml" "$out/server.log" "$port"
ulimit -n 65536 2>/dev/null || true
"$bin" loadgen --url "ws://127.0.0.1:$port" --server-pid "$server" --sessions "$sessions" --ramp 30 \
    --duration 30 --rejoin --total-time $((minutes * 60)) --force-listen-every 7 --vanish-every 10 \
    --max-wait 300 --json-out "$out/soak.json" ${SOAK_QUIET:+--quiet} || true  # judged below, from soak.json
# The vanished clients' sessions are held for a resume (resume_grace_s): the server is judged
# once they have been let go, or when the grace and 15 s more are over.
deadline=$((SECONDS + grace + 15))
while :; do
  curl -s "http://127.0.0.1:$port/status" > "$out/status.json"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if not s["sessions"]["open"] and not s["queue"]["length"] and all(w["state"] == "idle" for w in s["workers"]) else 1)' "$out/status.json" && break
  [ $SECONDS -ge $deadline ] && break
  sleep 0.5  # the next look at /status
done
kill -INT "$server"
wait "$server" || true
trap - EXIT
"$bin" check-recordings "$out/recordings" --chunk-samples 16000 | tee "$out/recordings.txt"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/soak.json"))
s = json.load(open(f"{out}/status.json"))
curve = r["server_rss_kib"]["curve"]
print("sessions", r["sessions"], "\nchunks", r["chunks"], "\nerrors", r["errors"])
print("rtt ms", {k: r["rtt_ms"].get(k) for k in ("p50", "p90", "p99", "max", "count")})
print("server cpu %", r["cpu_percent"]["server"])
print("rss MiB by minute:", " ".join(f"{kib / 1024:.0f}" for t, kib in curve if int(t) % 60 == 0 or t == curve[-1][0]))
half = [kib for t, kib in curve if t >= curve[-1][0] / 2]
warm = [kib for t, kib in curve if 60 <= t < curve[-1][0] / 2] or half
print(f"rss after warm-up: max of first half {max(warm) / 1024:.0f} MiB, max of second half {max(half) / 1024:.0f} MiB")
problems = []
if r["errors"]:
    problems.append(f"errors {r['errors']}")
if r["chunks"]["dropped"]:
    problems.append(f"{r['chunks']['dropped']} chunks dropped")
if r["sessions"]["connect_failures"] or r["sessions"]["gave_up_waiting"]:
    problems.append(f"sessions {r['sessions']}")
busy = [w["name"] for w in s["workers"] if w["state"] != "idle"]
if busy or s["queue"]["length"] or s["sessions"]["open"]:
    problems.append(f"not idle at the end: workers {busy[:5]}, queue {s['queue']['length']}, sessions {s['sessions']}")
if problems:
    sys.exit("soak failed: " + "; ".join(problems))
print("soak passed")
PY
