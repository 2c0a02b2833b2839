#!/usr/bin/env bash
# The security audit's attacks on calls, client secrets, keys and a node, re-run side by side
# against BASE's release build and this tree's (scripts/surface.py; docs/reliability.md, "The
# whole surface").
#
#   scripts/surface.sh [BASE]      (default 333752c: the release before the fourth audit's fixes)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
# (.venv's Python has aiortc, for real call offers)
python_side_by_side surface.py "${1:-333752c}"
