#!/usr/bin/env bash
# The fleet workflow (examples/fleet-tune.yml) on one machine: each device here
# plays one runner of the matrix with its own cache (CPU, lavapipe Vulkan,
# llvmpipe GL when present), tunes the model, exports a bundle; then the merge
# job's steps: merge the bundles, diff them against a reference bundle (the CPU
# one here) as markdown, import the merged bundle into a clean cache, and run
# the model, which uses the imported profile with no flag.
#
#   tools/fleet_local.sh                   # smollm2-135m, 2 layers, 20 s per device
#   DEVICES="cpu vulkan" MODEL=qwen2.5-0.5b BUDGET=1m tools/fleet_local.sh
#
# KTUNE picks the binary (default target/release/ktune, built when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
KTUNE=${KTUNE:-target/release/ktune}
[ -x "$KTUNE" ] || cargo build --release
MODEL=${MODEL:-smollm2-135m}
LAYERS=${LAYERS:-2}
BUDGET=${BUDGET:-20s}
DEVICES=${DEVICES:-cpu vulkan gl}
W=target/fleet
rm -rf "$W"
mkdir -p "$W"
for dev in $DEVICES; do
    echo "== runner $dev"
    KTUNE_CACHE_DIR="$W/cache-$dev" "$KTUNE" --device "$dev" tune --model "$MODEL" --layers "$LAYERS" --budget "$BUDGET" \
        --prefill-tokens 16 --context 64 --decode-tokens 16 > "$W/tune-$dev.txt"
    KTUNE_CACHE_DIR="$W/cache-$dev" "$KTUNE" profiles export -o "$W/bundle-$dev.tar.zst"
done
echo "== merge"
"$KTUNE" profiles merge "$W"/bundle-*.tar.zst -o "$W/fleet.tar.zst"
set +e
"$KTUNE" diff-profiles "$W/bundle-cpu.tar.zst" "$W/fleet.tar.zst" --format markdown > "$W/summary.md"
echo "diff-profiles exit: $?"
set -e
cat "$W/summary.md"
echo "== import into a clean cache, then run"
KTUNE_CACHE_DIR="$W/clean" "$KTUNE" profiles import "$W/fleet.tar.zst"
for dev in $DEVICES; do
    KTUNE_CACHE_DIR="$W/clean" "$KTUNE" --device "$dev" run --model "$MODEL" --layers "$LAYERS" --tokens 1,2,3 --max-tokens 4 | grep '^profile:'
done
