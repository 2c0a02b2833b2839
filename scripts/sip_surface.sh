#!/usr/bin/env bash
# The fifth security audit's attacks on the SIP port, the client-secret route and the queued
# clients' buffers, re-run side by side against BASE's release build and this tree's
# (scripts/sip_surface.py; docs/reliability.md, "The SIP port and the buffers").
#
#   scripts/sip_surface.sh [BASE]      (default c5dff83: a release before the fifth audit's fixes)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
# (.venv's Python has websockets, for the queued clients)
python_side_by_side sip_surface.py "${1:-c5dff83}"
