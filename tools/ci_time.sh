#!/usr/bin/env bash
# Times CI's run as CI sees it: a fresh clone of REV (default HEAD) of this
# repository, `.ci/run` with a cold Mesa shader cache and a target directory of
# its own, every output line stamped with the seconds since the start, and the
# peak resident memory of each test binary (sampled every 2 s). Run it on an
# otherwise idle machine; results in $OUT (default target/ci-time/).
#
#   tools/ci_time.sh            # HEAD
#   tools/ci_time.sh 49e1b1b    # another commit
#
# $OUT/log.txt: the stamped log, ending with `total N s` and the five largest
# peak RSS figures (KB, binary).
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
REV=${1:-HEAD}
OUT=${OUT:-$REPO/target/ci-time}
D=$OUT/clone
rm -rf "$D" "$OUT/mesa" && mkdir -p "$OUT/mesa"
git clone -q "$REPO" "$D" && git -C "$D" checkout -q "$REV" || exit 2
rm -f "$OUT/rss.txt"
start=$(date +%s)
( while true; do
    ps -eo rss=,args= | awk -v d="$D/target/debug/deps/" 'index($2, d) == 1 {n = split($2, a, "/"); print $1, a[n]}' >> "$OUT/rss.txt"
    sleep 2
  done ) &
sampler=$!
( cd "$D" && MESA_SHADER_CACHE_DIR="$OUT/mesa" CARGO_TARGET_DIR="$D/target" bash .ci/run 2>&1; echo "RC=$?" ) |
    while IFS= read -r line; do printf '%6d %s\n' $(( $(date +%s) - start )) "$line"; done > "$OUT/log.txt"
echo "total $(( $(date +%s) - start )) s" >> "$OUT/log.txt"
kill "$sampler"
awk '{ if ($1 > m[$2]) m[$2] = $1 } END { for (k in m) print m[k], k }' "$OUT/rss.txt" | sort -n | tail -5 >> "$OUT/log.txt"
tail -7 "$OUT/log.txt"
