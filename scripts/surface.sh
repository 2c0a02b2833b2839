#!/usr/bin/env bash
# The security audit's attacks on calls, client secrets, keys and a node, re-run side by side
# against BASE's release build and this tree's (scripts/surface.py; docs/reliability.md, "The
# whole surface").
#
#   scripts/surface.sh [BASE]      (default 333752c: the release before the fourth audit's fixes)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
side_by_side "" "${1:-333752c}"
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python   # aiortc, for real call offers
pairs=()
for i in "${!labels[@]}"; do pairs+=("${labels[$i]}=${bins[$i]}"); done
"$python" scripts/surface.py "${pairs[@]}"
