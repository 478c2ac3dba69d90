#!/usr/bin/env bash
# Every WGSL kernel family's best variant at Gemma 3 1B and Llama 3.2 1B shapes on
# a GPU adapter, against that adapter's copy bandwidth and FMA peak measured in the
# same run (`ktune bench-kernels`, release build). Prints the table and writes the
# JSON to $OUT (default target/bench-gpu/bench-kernels.json).
#
#   tools/bench_gpu.sh                         # the first hardware GPU (else the error says what there is)
#   tools/bench_gpu.sh --device llvmpipe       # lavapipe (software Vulkan), e.g. on a machine without a GPU
#   tools/bench_gpu.sh --quick --device llvmpipe   # default parameters only, short shapes: a minute or two on lavapipe
#
# Any further arguments go to `ktune bench-kernels` (--models, --op, --budget,
# --gpu-l2-bytes, --trusted-shaders, ...). Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/bench-gpu}
mkdir -p "$OUT"
cargo build --release --quiet
bin=target/release/ktune
# Exit 1 (a winner failed its parity check): still print what was measured.
rc=0
"$bin" bench-kernels --format json "$@" > "$OUT/bench-kernels.json" || rc=$?
if [ "$rc" -ge 2 ]; then exit "$rc"; fi
# A summary of the JSON, one line per shape.
python3 - "$OUT/bench-kernels.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
l = r["limits"]
print(f"device: {r['device']} ({r['backend']}), timing {r['timing']}")
print(f"limits: copy {l['copy_gbps']:.1f} GB/s, f32 FMA peak {l['fma_gflops']:.1f} GFLOP/s")
m = r["measurement"]
print(f"inputs rotated over {m['rotate_bytes'] >> 20} MiB (L2 {m['cache_bytes'] >> 20} MiB: {m['cache_source']})")
print(f"{'model':14} {'shape':24} {'dtype':6} {'best variant':44} {'us':>10} {'GB/s':>8} {'%bw':>5} {'GFLOP/s':>9} {'%peak':>6}  check")
for x in r["rows"]:
    print(f"{x['model']:14} {x['what']:24} {x['dtype']:6} {x['kernel'][:44]:44} {x['median_us']:10.1f} "
          f"{x['gbps']:8.1f} {x['pct_of_bandwidth']:5.0f} {x['gflops']:9.1f} {x['pct_of_peak_flops']:6.1f}  {x['check']}")
for s in r["skipped"]:
    print(f"no WGSL variant: {s}")
for s in r["errors"]:
    print(f"failed: {s}")
PY
echo "JSON: $OUT/bench-kernels.json"
exit "$rc"
