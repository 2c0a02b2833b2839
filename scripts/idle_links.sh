#!/usr/bin/env bash
# What an idle MiniCPM-o worker link costs the gateway: resident memory and threads with one
# link and with N (`backend = "minicpmo-worker"`), to a stand-in worker that answers only
# /health (healthy, idle), read once every link is open and again after a round of health checks
# (12 s). SERVER_BIN=PATH measures another build (the previous release's) the same way.
#
#   scripts/idle_links.sh [N] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-300}
out=${2:-$(mktemp -d)}
. scripts/lib.sh
prepare "$out"
worker_port=$(free_port)
python3 - "$worker_port" <<'PY' &
import http.server, sys

class Health(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = b'{"status": "healthy", "worker_status": "idle"}'
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, address):
        pass  # a client that hung up after its answer

Server(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
PY
worker=$!
trap 'kill $worker ${server:-} 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$worker_port/health" > /dev/null && break; sleep 0.1; done

status() { # FIELD: VmRSS in MB, or Threads
    awk -v f="$1:" '$1 == f { print ($1 == "VmRSS:" ? $2 / 1024 : $2) }' "/proc/$server/status"
}

echo "| links | resident memory, open | threads, open | resident memory, after a round of checks | threads, after |"
echo "|---|---|---|---|---|"
for links in 1 "$n"; do
    port=$(free_port)
    {
        printf '[server]\nbind = "127.0.0.1:%s"\n' "$port"
        for i in $(seq "$links"); do
            printf '[[workers]]\nname = "gpu%s"\nbackend = "minicpmo-worker"\nurl = "http://127.0.0.1:%s"\n' "$i" "$worker_port"
        done
    } > "$out/config-$links.toml"
    start_server "$out/config-$links.toml" "$out/server-$links.log" "$port"
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if len(s["workers"]) == int(sys.argv[1]) and all(w["state"] == "idle" for w in s["workers"]) else 1)' "$links" && break
        sleep 0.2
    done
    open_rss=$(status VmRSS) open_threads=$(status Threads)
    sleep 12 # one round of health checks (every 10 s)
    printf '| %s | %.1f MB | %s | %.1f MB | %s |\n' "$links" "$open_rss" "$open_threads" "$(status VmRSS)" "$(status Threads)"
    kill "$server"
    wait "$server" 2>/dev/null || true
done
