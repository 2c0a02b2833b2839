#!/usr/bin/env bash
# Runs the gateway's vLLM-Omni scenarios against a real vLLM-Omni server: starts a gateway on a
# free loopback port with SLOTS `vllm-omni` workers in front of URL (the voice prompt VOICE_WAV),
# then scripts/vllm_omni_check.py (a spoken question to each dialect, the queue in front of the
# slots, a force-listen, every slot released). QUESTION_WAV defaults to a question spoken by
# espeak-ng. OMNI_BIN runs that binary instead of building the release one. Needs .venv with
# websockets (python3 -m venv .venv && .venv/bin/pip install websockets). It takes every slot of
# the server for a minute or two: not for a server in use.
#
#   scripts/vllm_omni_check.sh URL SLOTS VOICE_WAV [QUESTION_WAV]
#   e.g. scripts/vllm_omni_check.sh http://gpu-a:8099 4 voices/default.wav
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
# Paths as the caller gave them, before moving to the repository.
url=$1 slots=$2 voice=$(realpath "$3") question=${4:+$(realpath "$4")}
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "needs .venv with websockets: python3 -m venv .venv && .venv/bin/pip install websockets" >&2; exit 1; }
. scripts/lib.sh
if [ -n "${OMNI_BIN:-}" ]; then bin=$OMNI_BIN; server_bin=$OMNI_BIN; else build_release; fi
dir=$(mktemp -d)
trap 'kill ${server:-} 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
if [ -z "$question" ]; then
    question=$dir/question.wav
    espeak-ng -w "$question" "What is the capital of France? Please answer in one short sentence."
fi
port=$(free_port)
cat > "$dir/config.toml" <<TOML
[server]
bind = "127.0.0.1:$port"

[[workers]]
name = "vo"
backend = "vllm-omni"
url = "$url"
count = $slots
modes = ["audio", "video"]
[workers.options]
ref_audio = "$voice"
TOML
start_server "$dir/config.toml" "$dir/server.log" "$port" || { KEEP=1; exit 1; }
wait_idle "$port" "$slots" || { echo "the gateway's workers did not open: see $dir/server.log" >&2; KEEP=1; exit 1; }
status=0
.venv/bin/python scripts/vllm_omni_check.py "http://127.0.0.1:$port" "$slots" "$question" || status=$?
[ "$status" = 0 ] || { echo "the gateway's log: $dir/server.log" >&2; KEEP=1; }
exit "$status"
