#!/usr/bin/env bash
# Voice sessions over WebRTC calls, WebSockets, Twilio Media Streams and SIP calls, side by side
# on one release build of the gateway: SESSIONS concurrent sessions of each transport in turn (a
# fresh server each), every
# one talking in real time for DURATION seconds (a 1.5 s tone, then 3.5 s of silence, answered
# by the reference backend's voice). Prints `omni-gateway callload`'s figures per transport and
# the server's CPU per session-second.
#
#   scripts/callbench.sh SESSIONS [DURATION]
#   scripts/callbench.sh 50 30
#   TRANSPORTS=webrtc scripts/callbench.sh 300 30     # one transport only
#   TRANSPORTS="twilio sip" scripts/callbench.sh 200 30
#
# The figures in docs/performance.md ("WebRTC calls", "Phone calls") come from this script.
set -euo pipefail
cd "$(dirname "$0")/.."
sessions=${1:?usage: scripts/callbench.sh SESSIONS [DURATION]}
duration=${2:-30}
. scripts/lib.sh
build_release
ulimit -n 65536 2>/dev/null || true
dir=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
for transport in ${TRANSPORTS:-webrtc websocket twilio sip}; do
    port=$(free_port)
    sip=$(python3 -c 'import socket; s=socket.socket(type=socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cat > "$dir/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"
# every client of this script comes from 127.0.0.1
max_connections_per_ip = 0
max_waiting_per_ip = 0
[queue]
max_waiting = 20000
[webrtc]
ports = [40000, 49999]
# every call of this script comes from 127.0.0.1, all of them being set up at once
max_unconnected_calls_per_ip = 10000
max_unconnected_calls_per_key = 10000
[sip]
enabled = true
bind = "127.0.0.1:$sip"
rtp_ports = [30000, 30999]
[[workers]]
name = "w"
count = $sessions
TOML
    start_server "$dir/config.toml" "$dir/server-$transport.log" "$port"
    cpu_before=$(cpu_seconds "$server")
    "$bin" callload --url "http://127.0.0.1:$port" --transport "$transport" --sip "127.0.0.1:$sip" --sessions "$sessions" \
        --duration "$duration" --ramp 5 --tone 1.5 --silence 3.5 --json-out "$dir/$transport.json" > /dev/null
    cpu_after=$(cpu_seconds "$server")
    kill "$server"
    wait "$server" 2>/dev/null || true
    python3 - "$dir/$transport.json" "$cpu_before" "$cpu_after" "$sessions" "$duration" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cpu = float(sys.argv[3]) - float(sys.argv[2])
sessions, duration = int(sys.argv[4]), float(sys.argv[5])
per = cpu / (sessions * duration) * 1000
e, f = r["end_of_speech_to_voice"], r["frame_delay"]
print(f"{r['transport']:9} sessions {r['sessions_ok']}/{r['sessions']}  up {r['bytes_up_per_s']/1000:.1f} KB/s  "
      f"down {r['bytes_down_per_s']/1000:.1f} KB/s  server CPU {per:.2f} ms per session-second ({cpu:.1f} s)  "
      f"end of speech to voice p50 {e['p50_ms']} p99 {e['p99_ms']} ms ({r['answered']}/{r['turns']} turns)  "
      f"frame delay p50 {f['p50_ms']} p99 {f['p99_ms']} max {f['max_ms']} ms")
if r["failures"]:
    print("  failures:", r["failures"][:3])
PY
done
