#!/usr/bin/env bash
# The queue's wait estimates against the waits clients then had, side by side: this tree's
# rules and BASE's (default 333752c), the same simulated day (actors/benches/eta.rs, copied into
# BASE's worktree under target/perfcheck/). docs/performance.md, "Wait estimates".
#
#   scripts/etabench.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(git rev-parse --short "${1:-333752c}")
tree=target/perfcheck/$base
[ -d "$tree" ] || git worktree add --detach "$tree" "$base" > /dev/null
cp actors/benches/eta.rs "$tree/actors/benches/eta.rs"
git -C "$tree" checkout -q -- actors/Cargo.toml   # as the release has it, the bench added below
features=(--features testing)
if ! grep -q '^testing' "$tree/actors/Cargo.toml"; then
    # Releases before the `testing` feature exposed the queue's rules as `queue::state`.
    sed -i 's/use omni_actors::queue::{JoinOutcome, ModeSet, QueueState};/use omni_actors::queue::state::{JoinOutcome, ModeSet, QueueState};/' \
        "$tree/actors/benches/eta.rs"
    features=()
fi
printf '\n[[bench]]\nname = "eta"\nharness = false\n' >> "$tree/actors/Cargo.toml"
echo "== $base"
(cd "$tree" && cargo bench -q -p omni-actors "${features[@]}" --bench eta 2>/dev/null)
echo "== this tree ($(git rev-parse --short HEAD)$(git diff --quiet || echo " + changes"))"
cargo bench -q -p omni-actors --features testing --bench eta 2>/dev/null
