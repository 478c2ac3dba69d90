#!/usr/bin/env bash
# Two or more ktune binaries end to end on the same GGUF file on the CPU, rounds
# interleaved (A B C A B C ...): each round one `ktune bench --no-profile` per
# binary (the runtime default; its own median of --rounds inner rounds), then per
# binary the median of the rounds' prefill and decode tok/s and their spread.
# What a change to a CPU kernel does to the whole model, the binaries' order
# rotating so none always runs first.
#
#   tools/bench_ab.sh FILE.gguf BIN_A BIN_B [BIN_C ...]
#   ROUNDS=5 RT=1 tools/bench_ab.sh target/real/SmolLM2-135M-Instruct.Q4_0.gguf base/ktune target/release/ktune
#
# RT=1 runs each bench at real-time priority (`chrt -f 50`, root): on a machine
# busy with other work (builds) its threads then preempt that work, so the
# figures approach a quiet machine's (memory bandwidth is still shared).
set -euo pipefail
file=$1; shift
rounds=${ROUNDS:-3}; inner=${INNER_ROUNDS:-5}; decode=${DECODE_TOKENS:-32}
prio=(); [[ "${RT:-0}" == 1 ]] && prio=(chrt -f 50)
out=$(mktemp -d)
bins=("$@"); n=${#bins[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    j=$(( (i + r) % n )); bin=${bins[$j]}
    "${prio[@]}" "$bin" --device cpu bench --gguf "$file" --no-profile --rounds "$inner" --decode-tokens "$decode" --format json > "$out/$j-$r.json"
  done
done
python3 - "$out" "$rounds" "$@" <<'PY'
import json, statistics, sys
out, rounds, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for j, b in enumerate(bins):
    rows = [json.load(open(f"{out}/{j}-{r}.json"))["entries"][0] for r in range(rounds)]
    s = {}
    for k in ["prefill_tok_s", "decode_tok_s"]:
        v = [e[k]["median"] for e in rows]
        s[k] = {"median": round(statistics.median(v), 1), "min": round(min(v), 1), "max": round(max(v), 1), "rounds": [round(x, 1) for x in v]}
    print(json.dumps({"binary": b, **s}))
PY
rm -rf "$out"
