# Shared by the scripts in this directory: a release build, a free port, a server started
# on a config and waited for.

# Builds the release binary; sets $bin (the tools: loadgen, probe) and $server_bin (what runs as
# the server, its nodes and replicas: $bin, or SERVER_BIN to measure another build, such as the
# previous release, under the same load generator).
build_release() {
    cargo build --release --quiet
    bin=target/release/omni-gateway
    server_bin=${SERVER_BIN:-$bin}
}

# base_binary REV [CARGO_ARGS...]: the release binary of commit REV, built once in a worktree
# under target/perfcheck/ (CARGO_ARGS narrow the build, e.g. -p omni-gateway); prints its path.
base_binary() {
    local rev tree
    rev=$(git rev-parse --short "$1")
    shift
    tree=target/perfcheck/$rev
    if [ ! -x "$tree/target/release/omni-gateway" ]; then
        echo "building $rev in $tree (once)" >&2
        [ -d "$tree" ] || git worktree add --detach "$tree" "$rev" > /dev/null
        (cd "$tree" && cargo build --release --quiet "$@")
    fi
    realpath "$tree/target/release/omni-gateway"
}

# side_by_side "CARGO_ARGS" BASE...: sets labels and bins: each BASE's release binary
# (base_binary), then this tree's, all built with CARGO_ARGS (empty: the whole workspace).
side_by_side() {
    local args=$1 base
    shift
    labels=() bins=()
    for base in "$@"; do
        # shellcheck disable=SC2086 # (CARGO_ARGS are words)
        labels+=("$(git rev-parse --short "$base")") bins+=("$(base_binary "$base" $args)")
    done
    # shellcheck disable=SC2086
    cargo build --release --quiet $args
    labels+=("$(git rev-parse --short HEAD)") bins+=("$(realpath target/release/omni-gateway)")
}

# prepare OUT_DIR: creates it, builds the release binary, sets $port to a free port.
prepare() {
    mkdir -p "$1"
    build_release
    port=$(free_port)
}

# Prints a free TCP port on 127.0.0.1.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# older_config CONFIG: when the server is another build (SERVER_BIN, such as the previous
# release), removes from CONFIG each key that build's check-config calls unknown, and says so:
# both builds then run on what they have in common.
older_config() {
    [ "$server_bin" = "$bin" ] && return 0
    local out key
    for _ in $(seq 20); do
        out=$("$server_bin" --config "$1" check-config 2>&1) && return 0
        key=$(printf '%s\n' "$out" | sed -n 's/.*[.]\([a-z_]*\): unknown key.*/\1/p' | head -1)
        [ -n "$key" ] || { printf '%s\n' "$out" >&2; return 1; }
        echo "($server_bin does not know $key: left out of its config)" >&2
        sed -i "/^$key *=/d" "$1"
    done
    echo "$server_bin still refuses $1: $out" >&2
    return 1
}

# start_server CONFIG LOG PORT: starts the gateway in the background (log level from
# RUST_LOG, default warn), sets $server to its pid, and waits until /readyz answers.
start_server() {
    older_config "$1"
    RUST_LOG=${RUST_LOG:-warn} "$server_bin" --config "$1" > "$2" 2>&1 &
    server=$!
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$3/readyz" > /dev/null && return 0
        sleep 0.1
    done
    echo "the server did not become ready; see $2" >&2
    return 1
}

# wait_idle PORT N: waits (up to 60 s) until the server on PORT has N workers open and idle
# (a node's join after the gateway reaches it); fails if it never has.
wait_idle() {
    local idle=0
    for _ in $(seq 600); do
        idle=$(curl -s "http://127.0.0.1:$1/metrics" | awk '/^omni_workers\{state="idle"\}/ {print $2}')
        [ "${idle:-0}" = "$2" ] && return 0
        sleep 0.1
    done
    echo "only ${idle:-0} of $2 workers idle after 60 s" >&2
    return 1
}

# cpu_seconds PID...: the CPU time (user + system, seconds) of each process and all its
# descendants (worker-host children included), space-separated.
cpu_seconds() {
    python3 - "$@" <<'PY'
import os, sys
tick = os.sysconf("SC_CLK_TCK")
stat = {}
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            stat[int(p)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        except OSError:
            pass
def total(pid):
    return stat.get(pid, (0, 0))[1] + sum(total(c) for c, (pp, _) in stat.items() if pp == pid)
print(" ".join(f"{total(int(p)):.2f}" for p in sys.argv[1:]))
PY
}

# python_side_by_side SCRIPT BASE: SCRIPT (a Python script under scripts/) run with LABEL=BINARY
# for BASE's release build and this tree's (side_by_side); .venv's Python when there is one.
python_side_by_side() {
    local script=$1 python=python3 pairs=() i
    side_by_side "" "$2"
    [ -x .venv/bin/python ] && python=.venv/bin/python
    for i in "${!labels[@]}"; do pairs+=("${labels[$i]}=${bins[$i]}"); done
    "$python" "scripts/$script" "${pairs[@]}"
}
