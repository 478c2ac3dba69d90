#!/usr/bin/env bash
# Decode throughput on the CPU against the memory-bandwidth bound, in one go:
#
#   1. read bandwidth: the membw probe of crates/ktune-bench/benches/kernels.rs (a parallel sum over
#      512 MiB, criterion; its median from target/criterion/.../estimates.json)
#   2. `ktune run` (release build) on each built-in model, f32 weights, --device cpu,
#      RUNS times (median)
#   3. PyTorch eager f32 on the same shapes (tools/bench_decode.py)
#
# then prints, per model and engine: decode tokens/s, weight bytes read per token,
# bound tokens/s = read bandwidth / weight bytes per token, and % of that bound.
# Everything lands in $OUT (default target/bench-decode/): membw.json,
# ktune-MODEL-N.json, torch.json, summary.json.
#
#   tools/bench_decode.sh                                   # the full benchmark (quiet machine!)
#   MODELS=smollm2-135m MAX_TOKENS=4 RUNS=1 tools/bench_decode.sh   # a quick check that it works
#
# Knobs (environment): MODELS (space separated; default "smollm2-135m gemma3-1b"),
# MAX_TOKENS (generated tokens, default 32), PROMPT_TOKENS (default 8), RUNS
# (default 5), THREADS (rayon and torch threads, default 2), PYTHON (with torch and
# transformers; default target/venv-py/bin/python, the tools venv of
# tools/requirements.txt, if present, else python3),
# OUT.
#
# Run it on a quiet machine: with other work on the cores, PyTorch's OpenMP threads
# spin at barriers while descheduled (seen here: 2 threads 4x slower than 1) and the
# bandwidth probe reads low, so neither the rates nor the bound mean anything.
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=${MODELS:-smollm2-135m gemma3-1b}
MAX_TOKENS=${MAX_TOKENS:-32}
PROMPT_TOKENS=${PROMPT_TOKENS:-8}
RUNS=${RUNS:-5}
THREADS=${THREADS:-2}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${OUT:-$TARGET/bench-decode}
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x target/venv-py/bin/python ]]; then PYTHON=target/venv-py/bin/python; else PYTHON=python3; fi
fi
if (( MAX_TOKENS < 2 )); then
    echo "bench_decode.sh: MAX_TOKENS must be at least 2 (decode steps follow the prefill's token)" >&2
    exit 2
fi
"$PYTHON" -c 'import torch, transformers' 2>/dev/null || {
    echo "bench_decode.sh: $PYTHON cannot import torch and transformers; set PYTHON" >&2
    exit 2
}
mkdir -p "$OUT"
export RAYON_NUM_THREADS=$THREADS
TOKENS=$(seq -s, 1 "$PROMPT_TOKENS")

echo "== build (release)" >&2
cargo build --release --quiet --bin ktune
KTUNE="$TARGET/release/ktune"

echo "== read bandwidth (cargo bench -p ktune-bench --bench kernels -- membw/dram, $THREADS threads)" >&2
KTUNE_BENCH_GPU=0 cargo bench --quiet -p ktune-bench --bench kernels -- 'membw/dram' >&2
EST="$TARGET/criterion/membw/dram_512MiB/new/estimates.json"
python3 - "$EST" >"$OUT/membw.json" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))
ns = e["median"]["point_estimate"]  # nanoseconds per iteration (one pass over 512 MiB)
print(json.dumps({"bytes": 512 << 20, "median_ns": ns, "read_gbps": (512 << 20) / ns, "source": sys.argv[1]}))
EOF

for m in $MODELS; do
    for i in $(seq 1 "$RUNS"); do
        echo "== ktune run --model $m ($i/$RUNS)" >&2
        "$KTUNE" run --model "$m" --tokens "$TOKENS" --max-tokens "$MAX_TOKENS" --device cpu --format json >"$OUT/ktune-$m-$i.json"
    done
done

echo "== PyTorch eager ($PYTHON)" >&2
"$PYTHON" tools/bench_decode.py --threads "$THREADS" --runs "$RUNS" --new-tokens "$MAX_TOKENS" \
    --prompt-tokens "$PROMPT_TOKENS" --models "$(echo $MODELS | tr ' ' ',')" >"$OUT/torch.json"

python3 - "$OUT" "$RUNS" $MODELS <<'EOF'
import json, statistics, sys
from pathlib import Path

out, runs, models = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
bw = json.loads((out / "membw.json").read_text())["read_gbps"] * 1e9
torch_runs = {r["model"]: r for r in json.loads((out / "torch.json").read_text())["models"]}
rows = []
for m in models:
    k = [json.loads((out / f"ktune-{m}-{i}.json").read_text()) for i in range(1, runs + 1)]
    rows.append({
        "model": m,
        "engine": "ktune",
        "decode_tokens_per_sec": statistics.median(r["decode_tokens_per_sec"] for r in k),
        "runs": [r["decode_tokens_per_sec"] for r in k],
        "weight_bytes": k[0]["weight_bytes"],
    })
    t = torch_runs[m]
    rows.append({
        "model": m,
        "engine": "pytorch eager",
        "decode_tokens_per_sec": t["decode_tokens_per_sec"],
        "runs": [r["decode_tokens_per_sec"] for r in t["runs"]],
        "weight_bytes": t["weight_bytes"],
    })
for r in rows:
    r["bound_tokens_per_sec"] = bw / r["weight_bytes"]
    r["percent_of_bound"] = 100 * r["decode_tokens_per_sec"] / r["bound_tokens_per_sec"]
(out / "summary.json").write_text(json.dumps({"read_gbps": bw / 1e9, "rows": rows}, indent=1) + "\n")
print(f"read bandwidth (membw probe): {bw / 1e9:.1f} GB/s; decode f32, median of {runs} runs")
print(f"{'model':<14} {'engine':<14} {'tok/s':>8} {'MB/token':>9} {'bound tok/s':>11} {'% of bound':>10}")
for r in rows:
    print(f"{r['model']:<14} {r['engine']:<14} {r['decode_tokens_per_sec']:>8.2f} {r['weight_bytes'] / 1e6:>9.1f} "
          f"{r['bound_tokens_per_sec']:>11.2f} {r['percent_of_bound']:>9.1f}%")
print(f"(files in {out})")
EOF
