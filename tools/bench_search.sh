#!/usr/bin/env bash
# Quality of the search (issue: tuner §6): the `auto` strategy against `exhaustive`
# for one model on one device: the tuning time of each, then both profiles and the
# runtime default measured end to end by `ktune bench` in one process (interleaved
# rounds, per-round paired ratios against the exhaustive profile). Prints a JSON
# summary; everything it ran is left in $OUT_DIR/search-DEVICE-MODEL.
#
#   tools/bench_search.sh cpu smollm2-135m [auto-budget] [exhaustive-budget] [extra tune flags...]
#   ROUNDS=15 DECODE_STEPS=8 tools/bench_search.sh llvmpipe smollm2-135m 10m 75m --prefill-tokens 16 --context 64 --layers 4
set -euo pipefail
dev="${1:-cpu}"; model="${2:-smollm2-135m}"; auto_budget="${3:-2m}"; ex_budget="${4:-60m}"
shift $(( $# < 4 ? $# : 4 ))
bin="${KTUNE_BIN:-target/release/ktune}"
rounds="${ROUNDS:-21}"
out="${OUT_DIR:-bench-out}/search-$dev-$model"
mkdir -p "$out"
export KTUNE_CACHE_DIR="$out/cache"
prefill=64; context=512; layers=()
# Extra flags: the prefill length, the context, and --layers N (kept for bench too).
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --prefill-tokens) prefill="${args[$((i + 1))]}" ;;
    --context) context="${args[$((i + 1))]}" ;;
    --layers) layers=(--layers "${args[$((i + 1))]}") ;;
  esac
done
common=(--device "$dev" --model "$model" --prefill-tokens "$prefill" --context "$context" "${layers[@]}" --force --format json)
/usr/bin/time -f "%e" -o "$out/auto.time" "$bin" tune "${common[@]}" --strategy auto --budget "$auto_budget" -o "$out/auto.yaml" > "$out/auto.json"
/usr/bin/time -f "%e" -o "$out/exhaustive.time" "$bin" tune "${common[@]}" --strategy exhaustive --budget "$ex_budget" -o "$out/exhaustive.yaml" > "$out/exhaustive.json"
"$bin" bench --device "$dev" --model "$model" --profile "$out/exhaustive.yaml" --profile "$out/auto.yaml" \
  --prefill-tokens "$prefill" --decode-tokens "${DECODE_STEPS:-16}" --rounds "$rounds" "${layers[@]}" --format json > "$out/bench.json"
python3 - "$out" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
b = json.loads((d / "bench.json").read_text())
ex, auto, default = b["entries"]
t = {s: float((d / f"{s}.time").read_text().strip()) for s in ["auto", "exhaustive"]}
r = lambda e: {"median": round(e["median"], 2), "ci95": [round(x, 2) for x in e["ci"]]}
print(json.dumps({
    "device": b["device"], "model": b["model"], "rounds": b["rounds"],
    "tune_seconds": t,
    "tune_time_pct": round(t["auto"] / t["exhaustive"] * 100, 1),
    "tok_s": {n: {"prefill": r(e["prefill_tok_s"]), "decode": r(e["decode_tok_s"])}
              for n, e in [("exhaustive", ex), ("auto", auto), ("default", default)]},
    "auto_vs_exhaustive_pct": {"prefill": r(auto["prefill_vs_first_pct"]), "decode": r(auto["decode_vs_first_pct"])},
    "default_vs_exhaustive_pct": {"prefill": r(default["prefill_vs_first_pct"]), "decode": r(default["decode_vs_first_pct"])},
}, indent=2))
PY
