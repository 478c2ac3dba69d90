#!/usr/bin/env bash
# One call's worth of checks and figures on a real GPU (a lent device machine, or
# any machine with a GPU): the adapter's fingerprint, every WGSL family's parity
# check, the GPU runtime against the CPU on the same model (logits and greedy ids),
# `bench-kernels` against the measured copy bandwidth and FMA peak, then a tune and
# an interleaved `bench` of the tuned profile against the runtime default.
#
#   KTUNE=target/release/ktune tools/device_gpu.sh            # results under $OUT
#   DEVICE=llvmpipe SCALE=0.2 tools/device_gpu.sh              # a dry run on lavapipe
#   STEPS="verify kernels" OPS="gemv gemm" EXTRA=--trusted-shaders tools/device_gpu.sh
#   STEPS=kernels BK_ARGS="--op gemv,gate_up --models gemma3-4b --budget 90s" tools/device_gpu.sh
#   STEPS=ab KTUNE_B=.dev/ktune-skv AB_ARGS="--op attention_decode --budget 20s" tools/device_gpu.sh
#
# Every step has its own time limit (scaled by SCALE) and appends to $OUT/log.txt
# as it goes, so a call cut short still returns what it measured. Steps, in order
# of what a first look at a new GPU needs most:
#   devices.json     list-devices
#   logits.txt       run on the GPU and on the CPU, prompt logits compared
#   eval.json        ktune eval of the tiny GGUF fixtures on the GPU against the CPU's
#                    f32 reference (KL divergence, top-1, logit error; issue 35: <= 1e-4)
#   verify.txt       kernels --verify, one op at a time
#   bench-kernels.json
#   ab-a1.json ab-b1.json ab-a2.json ab-b2.json   (step ab, when KTUNE_B names a second
#                    binary: the same bench-kernels rows from both, alternated twice,
#                    so a change is timed against its base on the same warm card)
#   tune.json, profile.yaml, bench.json
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/device-gpu}
mkdir -p "$OUT"
B=${KTUNE:-target/release/ktune}
DEV=${DEVICE:-vulkan}
SCALE=${SCALE:-1}
MODEL=${MODEL:-gemma3-1b}
WDT=${WEIGHT_DTYPE:-q4_k}
STEPS=${STEPS:-devices logits eval verify kernels tune bench}
OPS=${OPS:-gemv gate_up qkv_proj norm_gemv gemm attention_decode attention_prefill rms_norm residual_rms_norm qk_norm_rope rope gated_act residual_add softmax layer_norm linear attention_full patch_embed avg_pool}
VERIFY_UNTIL=${VERIFY_UNTIL:-200}
EXTRA=${EXTRA:-}
BK_ARGS=${BK_ARGS:---budget $(python3 -c "print(max(1, int(45 * float('$SCALE'))))")s}
TUNE_BUDGET=${TUNE_BUDGET:-75}
LOG=$OUT/log.txt
T0=$(date +%s)
secs() { python3 -c "import sys; print(max(1, int(float(sys.argv[1]) * float(sys.argv[2]))))" "$1" "$SCALE"; }
step() { # step LIMIT_S NAME CMD... (stdout to the log)
  local lim; lim=$(secs "$1"); local name=$2; shift 2
  local s; s=$(date +%s)
  echo "== [$(( s - T0 ))s] $name (limit ${lim}s): $*" >>"$LOG"
  timeout "$lim" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: rc=$rc after $(( $(date +%s) - s ))s" | tee -a "$LOG"
  return $rc
}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv 2>&1 || true
  nproc; uname -r; } >>"$LOG"
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has devices; then
step 30 list-devices sh -c "$B list-devices --format json > $OUT/devices.json"
$B list-devices >>"$LOG" 2>&1
fi

# The runtime on the GPU against the CPU: same synthetic weights, same prompt.
if has logits; then
TOK=$(python3 -c "print(','.join(str(2 + (i * 37) % 1000) for i in range(8)))")
step 60 run-gpu "$B" run --device "$DEV" --model "$MODEL" --weight-dtype "$WDT" --no-profile $EXTRA \
  --tokens "$TOK" --max-tokens 16 --ignore-eos --dump-logits "$OUT/logits-gpu.json"
step 60 run-cpu "$B" run --device cpu --model "$MODEL" --weight-dtype "$WDT" --no-profile \
  --tokens "$TOK" --max-tokens 16 --ignore-eos --dump-logits "$OUT/logits-cpu.json"
python3 - "$OUT/logits-gpu.json" "$OUT/logits-cpu.json" >"$OUT/logits.txt" 2>&1 <<'PY'
import json, math, sys
g, c = (json.load(open(p)) for p in sys.argv[1:3])
def flat(x):
    return [v for row in x for v in (flat(row) if isinstance(row[0], list) else row)] if isinstance(x[0], list) else x
lg, lc = flat(g["logits"]), flat(c["logits"])
num = sum((a - b) ** 2 for a, b in zip(lg, lc)); den = sum(b * b for b in lc)
print(f"prompt logits: {len(lg)} values, relative L2 error GPU vs CPU {math.sqrt(num / max(den, 1e-30)):.3e}, max abs {max(abs(a - b) for a, b in zip(lg, lc)):.3e}")
gi, ci = g.get("generated"), c.get("generated")
print(f"greedy ids GPU {gi}\ngreedy ids CPU {ci}\nidentical: {gi == ci}")
PY
cat "$OUT/logits.txt" >>"$LOG"
rm -f "$OUT/logits-gpu.json" "$OUT/logits-cpu.json"  # a vocabulary's logits per token: too big to keep
fi

# The GPU path's divergence from the CPU's f32 reference on the fixtures' texts.
if has eval; then
for f in smollm2-tiny-q8_0 llama-k-q4_k_m; do
  [[ -f tests/fixtures/gguf/$f.gguf ]] || continue
  step 60 "eval-$f" sh -c "$B eval --device $DEV --gguf tests/fixtures/gguf/$f.gguf --file tests/data/eval.txt --ctx 128 --reference f32 $EXTRA --json > $OUT/eval-$f.json"
done
fi

# Parity of every WGSL kernel on this adapter, one op at a time.
if has verify; then
for op in $OPS; do
  if (( $(date +%s) - T0 > $(secs "$VERIFY_UNTIL") )); then echo "verify: no time left for $op" >>"$OUT/verify.txt"; continue; fi
  echo "### $op" >>"$OUT/verify.txt"
  timeout "$(secs 60)" "$B" kernels --device "$DEV" --verify --op "$op" $EXTRA >>"$OUT/verify.txt" 2>&1
  echo "### $op rc=$?" >>"$OUT/verify.txt"
done
grep -E "^### .* rc=" "$OUT/verify.txt" | tr '\n' ' ' | tee -a "$LOG"; echo | tee -a "$LOG"
fi

if has ab && [[ -n "${KTUNE_B:-}" ]]; then
for round in 1 2; do
  for side in a b; do
    bin=$B; [[ $side == b ]] && bin=$KTUNE_B
    step "${AB_LIMIT:-45}" "ab-$side$round" sh -c "$bin bench-kernels --device $DEV ${AB_ARGS:---op attention_decode --budget 20s} $EXTRA --format json > $OUT/ab-$side$round.json"
  done
done
fi

has kernels && step "${BK_LIMIT:-90}" bench-kernels sh -c "$B bench-kernels --device $DEV $BK_ARGS $EXTRA --format json > $OUT/bench-kernels.json"
has tune && step 140 tune sh -c "$B tune --device $DEV --model $MODEL --weight-dtype $WDT --budget $(secs "$TUNE_BUDGET")s -o $OUT/profile.yaml --force --format json > $OUT/tune.json"
has bench && step 70 bench sh -c "$B bench --device $DEV --model $MODEL --weight-dtype $WDT --profile $OUT/profile.yaml --rounds 3 --format json > $OUT/bench.json"
echo "== done after $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
