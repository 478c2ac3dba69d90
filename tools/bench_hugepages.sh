#!/usr/bin/env bash
# Decode with the weights in huge pages (the runtime's default) against 4 KiB
# pages (KTUNE_NO_HUGEPAGES=1), processes alternating so a drift of the machine's
# bandwidth hits both alike. Each line is one `ktune bench` of the runtime default
# (3 rounds, 32 decode steps): its decode tok/s and the read bound of that run.
#
#     cargo build --release
#     tools/bench_hugepages.sh [GGUF_FILE] [PAIRS]
#
# Without a file: the built-in llama-3.2-1b with q4_k weights quantized on load.
set -euo pipefail
cd "$(dirname "$0")/.."
KTUNE=${KTUNE:-target/release/ktune}
src=(--model llama-3.2-1b --weight-dtype q4_k)
[ $# -ge 1 ] && [ -n "$1" ] && src=(--gguf "$1")
pairs=${2:-6}
for i in $(seq 1 "$pairs"); do
  for mode in huge 4k; do
    if [ "$mode" = 4k ]; then export KTUNE_NO_HUGEPAGES=1; else unset KTUNE_NO_HUGEPAGES; fi
    out=$("$KTUNE" bench "${src[@]}" --no-profile --rounds 3 --prefill-tokens 4 --decode-tokens 32 --format json)
    python3 -c 'import json,sys
d = json.loads(sys.argv[2])
e = d["entries"][0]
print("%-5s decode %.2f tok/s  read bound %.1f GB/s" % (sys.argv[1], e["decode_tok_s"]["median"], d["read_gbps"]["median"]))' "$mode" "$out"
  done
done
