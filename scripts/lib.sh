# Shared by the scripts in this directory: a release build, a free port, a server started
# on a config and waited for.

# Builds the release binary; sets $bin.
build_release() {
    cargo build --release --quiet
    bin=target/release/omni-gateway
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

# start_server CONFIG LOG PORT: starts the gateway in the background (log level from
# RUST_LOG, default warn), sets $server to its pid, and waits until /readyz answers.
start_server() {
    RUST_LOG=${RUST_LOG:-warn} "$bin" --config "$1" > "$2" 2>&1 &
    server=$!
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$3/readyz" > /dev/null && return 0
        sleep 0.1
    done
    echo "the server did not become ready; see $2" >&2
    return 1
}
