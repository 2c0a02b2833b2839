#!/usr/bin/env bash
# Replicas on Redis against one gateway, side by side in one run (docs/performance.md,
# "Replicas on Redis"). Both setups use the same node (reference workers, step_ms = 0) and the
# same load; only the queue differs: one gateway with the node under [[nodes]], or three
# replicas sharing a Redis ([cluster]) with the node in the cluster.
#
#   scripts/clusterbench.sh [WAITING] [WORKERS] [OUT_DIR]
#
# 1. WAITING clients wait behind one busy worker (spread over the replicas): resident memory
#    per waiting client (all gateway processes together), and, when the worker is released,
#    how long the first lower position took to reach each waiting client.
# 2. WAITING clients served in turn by WORKERS workers, 1 s sessions: the time from a session's
#    session.close to the next client's session.queue_done (the hand-over), and, from the
#    replicas' and the node's logs, how long each stage of it took (scripts/handover_stages.py).
# 3. WAITING clients keep waiting while 8 workers hand over one 1 s session after another for
#    80 s: the hand-over with that many waiting throughout (in 2. the queue drains).
# SERVER_BIN runs another build as the replicas, the gateway and the node, under this build's
# load generator.
set -euo pipefail
cd "$(dirname "$0")/.."
waiting=${1:-2000}
workers=${2:-40}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
. scripts/lib.sh
build_release
command -v redis-server > /dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
ulimit -n 65536 2>/dev/null || true
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
token=$(python3 -c "import secrets; print(secrets.token_urlsafe(32))")

# replica_secret NAME: the [cluster] line replica NAME proves itself with: its own credential
# (issued from a node's config), or, with a build from before credentials, the nodes' token.
replica_secret() {
    printf '[node]\nbind = "127.0.0.1:1"\ntoken = "%s"\n[[workers]]\n' "$token" > "$dir/issuer.toml"
    if credential=$("$server_bin" --config "$dir/issuer.toml" replica-credential "$1" 2>/dev/null); then
        echo "credential = \"$credential\""
    else
        echo "token = \"$token\""
    fi
}

# node NAME PORT COUNT CLUSTER_TOML: starts a node; sets $node.
node() {
    cat > "$dir/$1.toml" <<TOML
[node]
bind = "127.0.0.1:$2"
token = "$token"
[[workers]]
name = "w"
count = $3
[workers.options]
step_ms = 0
$4
TOML
    RUST_LOG=$log "$server_bin" --config "$dir/$1.toml" node > "$dir/$1.log" 2>&1 &
    node=$!
    pids+=("$node")
}

# gateway NAME PORT TOML: starts a gateway or replica; sets $server.
gateway() {
    cat > "$dir/$1.toml" <<TOML
[server]
bind = "127.0.0.1:$2"
max_connections_per_ip = 0
max_waiting_per_ip = 0
[queue]
max_waiting = 20000
$3
TOML
    RUST_LOG=$log start_server "$dir/$1.toml" "$dir/$1.log" "$2"
    pids+=("$server")
}

# wait_idle PORT COUNT: until the gateway's /status shows COUNT idle workers.
wait_idle() {
    for _ in $(seq 600); do
        idle=$(curl -s "http://127.0.0.1:$1/status" | python3 -c 'import json,sys; print(sum(w["state"] == "idle" for w in json.load(sys.stdin)["workers"]))' 2>/dev/null || echo 0)
        [ "$idle" = "$2" ] && return 0
        sleep 0.1
    done
    echo "workers never idle on port $1" >&2
    return 1
}

run() { # NAME URLS PIDS loadgen options...
    local name=$1 urls=$2 server_pids=$3
    shift 3
    "$bin" loadgen --url "$urls" --server-pid "$server_pids" --quiet --json-out "$out/$name.json" "$@" > "$out/$name.txt" 2>&1 || true
    echo "$name done" >&2
}

stop_all() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }

# KINDS picks the phases run (all three by default); the summary needs all three.
for kind in ${KINDS:-wait handover steady}; do
    case $kind in
    wait)
        count=1 log=warn
        load=(--sessions $((waiting + 1)) --ramp 20 --duration 25 --run-time 30) ;;
    handover)
        # Logs at info (the default), with µs timestamps: the hand-over's stages are read from them.
        count=$workers log=info
        load=(--sessions "$waiting" --ramp 10 --duration 1) ;;
    steady)
        # WAITING clients keep waiting while 8 workers hand over, one 1 s session after another.
        count=8 log=info
        load=(--sessions $((waiting + 8)) --ramp 20 --duration 1 --run-time 80) ;;
    esac
    # One gateway, its workers on a node ([[nodes]]).
    np=$(free_port); gp=$(free_port)
    node single-node "$np" "$count" ""
    gateway single "$gp" "[[nodes]]
name = \"n1\"
address = \"127.0.0.1:$np\"
token = \"$token\""
    wait_idle "$gp" "$count"
    run "single-$kind" "ws://127.0.0.1:$gp" "$server" "${load[@]}"
    stop_all

    # Three replicas on Redis, the node in the cluster.
    rp=$(free_port)
    redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" > "$dir/redis.log" 2>&1 &
    pids+=("$!")
    sleep 0.3
    cluster="[cluster]
engine = \"redis\"
url = \"redis://127.0.0.1:$rp/0\""
    np=$(free_port)
    node cluster-node "$np" "$count" "$cluster
name = \"n1\""
    urls=() ; gpids=() ; ports=()
    for r in 1 2 3; do
        gp=$(free_port)
        gateway "replica$r" "$gp" "$cluster
name = \"g$r\"
$(replica_secret "g$r")"
        urls+=("ws://127.0.0.1:$gp"); gpids+=("$server"); ports+=("$gp")
    done
    wait_idle "${gp}" "$count"
    run "cluster-$kind" "$(IFS=,; echo "${urls[*]}")" "$(IFS=,; echo "${gpids[*]}")" "${load[@]}"
    if [ "$kind" = handover ]; then
        cp "$dir/cluster-node.log" "$dir"/replica*.log "$out/"
        for p in "${ports[@]}"; do curl -s "http://127.0.0.1:$p/metrics"; done | grep '^omni_node_attaches_total' > "$out/attaches.txt" || true
    fi
    stop_all
done

# A run of some phases only (KINDS) leaves its JSON in OUT_DIR for its caller.
[ -n "${KINDS:-}" ] && exit 0

python3 - "$out" "$waiting" <<'PY'
import json, sys
out, waiting = sys.argv[1], int(sys.argv[2])
def load(n): return json.load(open(f"{out}/{n}.json"))
print("| | one gateway | three replicas on Redis |")
print("|---|---|---|")
rows = []
w = {k: load(f"{k}-wait") for k in ("single", "cluster")}
h = {k: load(f"{k}-handover") for k in ("single", "cluster")}
st = {k: load(f"{k}-steady") for k in ("single", "cluster")}
def mem(r):
    m = r.get("server_rss_kib") or {}
    start, peak = m.get("start"), m.get("peak")
    return f"{(peak - start) / waiting:.1f} KB ({start / 1024:.0f} → {peak / 1024:.0f} MB)" if start and peak else "-"
def ms(d, k): return f"{d[k]:.2f} ms" if d and d.get(k) is not None else "-"
print(f"| memory per waiting client (all gateway processes) | {mem(w['single'])} | {mem(w['cluster'])} |")
for label, key in (("position change reaches every waiting client, p50", "p50"), ("... p99", "p99"), ("... max", "max")):
    print(f"| {label} | {ms(w['single']['position_update_latency_ms'], key)} | {ms(w['cluster']['position_update_latency_ms'], key)} |")
for label, key in (("hand-over (close → next queue_done), p50", "p50"), ("... p90", "p90"), ("... p99", "p99"), ("... max", "max")):
    print(f"| {label} | {ms(h['single']['release_to_queue_done_ms'], key)} | {ms(h['cluster']['release_to_queue_done_ms'], key)} |")
for label, key in (("hand-over with WAITING waiting (8 workers), p50", "p50"), ("... p90", "p90"), ("... p99", "p99"), ("... max", "max")):
    print(f"| {label.replace('WAITING', str(waiting))} | {ms(st['single']['release_to_queue_done_ms'], key)} | {ms(st['cluster']['release_to_queue_done_ms'], key)} |")
for k in ("single", "cluster"):
    for kind, r in (("wait", w[k]), ("handover", h[k]), ("steady", st[k])):
        s = r["sessions"]
        print(f"{k} {kind}: {s['finished']} of {s['started']} sessions finished, {s['told_position']} told a position, "
              f"{s['connect_failures']} connect failures, errors {r['errors']}, server CPU {r['cpu_percent']['server']:.0f} %")
PY
python3 scripts/handover_stages.py "$out"
python3 - "$out" <<'PY'
import re, sys
counts = {}
for line in open(f"{sys.argv[1]}/attaches.txt"):
    m = re.search(r'link="(\w+)".* ([0-9.e+]+)$', line)
    if m:
        counts[m.group(1)] = counts.get(m.group(1), 0) + float(m.group(2))
print("granted workers attached (three replicas): " + ", ".join(f"{int(v)} on {k} links" for k, v in sorted(counts.items())))
PY
