#!/usr/bin/env bash
# The fifth security audit's attacks on the SIP port, the client-secret route and the queued
# clients' buffers, re-run side by side against BASE's release build and this tree's
# (scripts/sip_surface.py; docs/reliability.md, "The SIP port and the buffers").
#
#   scripts/sip_surface.sh [BASE]      (default c5dff83: a release before the fifth audit's fixes)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
side_by_side "" "${1:-c5dff83}"
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python   # websockets, for the queued clients
pairs=()
for i in "${!labels[@]}"; do pairs+=("${labels[$i]}=${bins[$i]}"); done
"$python" scripts/sip_surface.py "${pairs[@]}"
