#!/usr/bin/env bash
# How well `ktune tune` keeps its `--budget` on the CPU: for each model and each
# budget, `ktune tune --device cpu --model M --budget B` with a fresh temporary
# cache (nothing resumed, nothing served from the cache), its wall time measured
# around the process; rounds interleaved (every model × budget once a round, the
# order rotating), then per model and budget the median of wall / budget over
# the rounds, its spread (min–max), and the tool's own account of the last round
# (used_s, its stages and what it cut to fit, from the JSON report's `budget`).
#
#   tools/bench_budget.sh [BIN]          (default: target/release/ktune)
#   ROUNDS=3 MODELS="gemma3-1b llama-3.2-3b" BUDGETS="30s 1m 2m" tools/bench_budget.sh
#   WEIGHT_DTYPE=q8_0 tools/bench_budget.sh     (a quantized --weight-dtype, where f32
#                                               weights do not fit the machine's memory)
#   MODELS="gemma3-1b llama-3.2-3b:q4_k"        (MODEL:DTYPE: that model's --weight-dtype)
#
# The budget counts from the command's start, the model's load included; the
# promise is wall / budget <= 1.10. Check `free -g` before a 3B model in f32
# (about 13 GB of weights, twice that while the end-to-end stage holds a second
# engine's layouts).
set -euo pipefail
bin=${1:-target/release/ktune}
rounds=${ROUNDS:-3}
read -r -a models <<< "${MODELS:-gemma3-1b llama-3.2-3b}"
read -r -a budgets <<< "${BUDGETS:-30s 1m 2m}"
dtype=(); [[ -n "${WEIGHT_DTYPE:-}" ]] && dtype=(--weight-dtype "$WEIGHT_DTYPE")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
runs=()
for m in "${models[@]}"; do for b in "${budgets[@]}"; do runs+=("$m|$b"); done; done
n=${#runs[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    j=$(( (i + r) % n )); m=${runs[$j]%|*}; b=${runs[$j]#*|}
    cache=$(mktemp -d "$out/cache.XXXX")
    t0=$(date +%s.%N)
    md=("${dtype[@]}"); [[ "$m" == *:* ]] && md=(--weight-dtype "${m#*:}")
    KTUNE_CACHE_DIR=$cache "$bin" tune --device cpu --model "${m%%:*}" --budget "$b" "${md[@]}" --format json \
      > "$out/$j-$r.json" 2> "$out/$j-$r.err" || echo "round $r: $m $b failed: $(tail -1 "$out/$j-$r.err")" >&2
    t1=$(date +%s.%N)
    echo "$t0 $t1" > "$out/$j-$r.wall"
    rm -rf "$cache"
    echo "round $r: $m --budget $b: $(awk '{printf "%.1f s", $2 - $1}' "$out/$j-$r.wall")" >&2
  done
done
python3 - "$out" "$rounds" "${runs[@]}" <<'PY'
import json, statistics, sys
out, rounds, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for j, run in enumerate(runs):
    model, budget = run.split("|")
    ratios, last = [], None
    for r in range(rounds):
        t0, t1 = map(float, open(f"{out}/{j}-{r}.wall").read().split())
        try:
            rep = json.load(open(f"{out}/{j}-{r}.json"))
        except (ValueError, OSError):
            continue
        b = rep.get("budget") or {}
        if b.get("budget_s"):
            ratios.append((t1 - t0) / b["budget_s"])
            last = b
    row = {"model": model, "budget": budget, "rounds": len(ratios)}
    if ratios:
        row.update({
            "wall_over_budget": {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
                                 "max": round(max(ratios), 3), "rounds": [round(x, 3) for x in ratios]},
            "last": {"used_s": round(last["used_s"], 1),
                     "stages": {s["stage"]: round(s["seconds"], 1) for s in last["stages"]}, "cuts": last["cuts"]},
        })
    print(json.dumps(row))
PY
