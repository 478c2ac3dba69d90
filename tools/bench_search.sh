#!/usr/bin/env bash
# Quality of the search (issue: tuner §6): the `auto` strategy against `exhaustive`
# for one model on one device, in the same run: tuning time of each, then both
# profiles and the runtime default timed end to end by `ktune run`, alternating
# A/B/default rounds so drift hits all alike. Prints a JSON summary.
#
#   tools/bench_search.sh cpu smollm2-135m [auto-budget] [exhaustive-budget]
#   tools/bench_search.sh llvmpipe smollm2-135m 3m 60m
set -euo pipefail
dev="${1:-cpu}"; model="${2:-smollm2-135m}"; auto_budget="${3:-2m}"; ex_budget="${4:-60m}"
bin="${KTUNE_BIN:-target/release/ktune}"
out="${OUT_DIR:-bench-out}/search-$dev-$model"
mkdir -p "$out"
export KTUNE_CACHE_DIR="$out/cache"
common=(--device "$dev" --model "$model" --prefill-tokens 64 --context 512 --force --format json)
/usr/bin/time -f "%e" -o "$out/auto.time" "$bin" tune "${common[@]}" --strategy auto --budget "$auto_budget" -o "$out/auto.yaml" > "$out/auto.json"
/usr/bin/time -f "%e" -o "$out/exhaustive.time" "$bin" tune "${common[@]}" --strategy exhaustive --budget "$ex_budget" -o "$out/exhaustive.yaml" > "$out/exhaustive.json"
prompt=$(python3 -c "print(','.join(str((i*7919+13)%49152) for i in range(64)))")
for round in 1 2 3 4 5; do
  for p in auto exhaustive default; do
    prof=(); [ "$p" != default ] && prof=(--profile "$out/$p.yaml")
    "$bin" run --device "$dev" --model "$model" "${prof[@]}" --tokens "$prompt" --max-tokens 33 --format json > "$out/run-$p-$round.json"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys, pathlib
d = pathlib.Path(sys.argv[1])
res = {}
for p in ["auto", "exhaustive", "default"]:
    runs = [json.loads((d / f"run-{p}-{r}.json").read_text()) for r in range(1, 6)]
    res[p] = {
        "prefill_tok_s": statistics.median(x["prefill_tokens_per_sec"] for x in runs),
        "decode_tok_s": statistics.median(x["decode_tokens_per_sec"] for x in runs),
    }
for s in ["auto", "exhaustive"]:
    res[s]["tune_seconds"] = float((d / f"{s}.time").read_text().strip())
a, e = res["auto"], res["exhaustive"]
res["auto_vs_exhaustive"] = {
    "prefill_pct": (a["prefill_tok_s"] / e["prefill_tok_s"] - 1) * 100,
    "decode_pct": (a["decode_tok_s"] / e["decode_tok_s"] - 1) * 100,
    "time_pct": a["tune_seconds"] / e["tune_seconds"] * 100,
}
res["tuned_vs_default"] = {
    "prefill_pct": (a["prefill_tok_s"] / res["default"]["prefill_tok_s"] - 1) * 100,
    "decode_pct": (a["decode_tok_s"] / res["default"]["decode_tok_s"] - 1) * 100,
}
print(json.dumps(res, indent=2))
PY
