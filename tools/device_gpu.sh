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
#   decode.json, decode-raw.tar.gz   (step decode, below: ktune end to end against
#                    PyTorch's CUDA-graph decode and llama.cpp's Vulkan llama-bench
#                    on the same card, issue 31 section 7; docs/benchmarks.md)
#
# A lent machine returns at most 8 files from $OUT: name the steps a call needs,
# e.g. STEPS="devices decode" (about 8.5 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-target/device-gpu}
mkdir -p "$OUT"
B=${KTUNE:-target/release/ktune}
DEV=${DEVICE:-vulkan}
SCALE=${SCALE:-1}
MODEL=${MODEL:-gemma3-1b}
WDT=${WEIGHT_DTYPE:-q4_k}
STEPS=${STEPS:-devices decode logits eval verify kernels tune bench}
OPS=${OPS:-gemv gate_up qkv_proj norm_gemv gemm attention_decode attention_prefill rms_norm residual_rms_norm qk_norm_rope rope gated_act residual_add softmax layer_norm linear attention_full patch_embed avg_pool}
VERIFY_UNTIL=${VERIFY_UNTIL:-200}
EXTRA=${EXTRA:-}
BK_ARGS=${BK_ARGS:---budget $(python3 -c "print(max(1, int(45 * float('$SCALE'))))")s}
TUNE_BUDGET=${TUNE_BUDGET:-75}
LOG=$OUT/log.txt
T0=$(date +%s)
secs() { python3 -c "import sys; print(max(1, int(float(sys.argv[1]) * float(sys.argv[2]))))" "$1" "$SCALE"; }
step() { # step LIMIT_S NAME CMD... (stdout to the log; LIMIT_S scaled by SCALE)
  local lim; lim=$(secs "$1"); shift
  step_s "$lim" "$@"
}
step_s() { # step_s LIMIT_S NAME CMD... (LIMIT_S as given)
  local lim=$1; local name=$2; shift 2
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

# Decode end to end against two anchors on the same card, in one step of at most
# DECODE_LIMIT seconds (480, scaled): `ktune tune` (DECODE_TUNE_BUDGET s each) and
# `ktune bench` (tuned profile and runtime default, interleaved) of the
# Llama-3.2-1B-shaped model in Q4_K_M and f16, Gemma 3 1B in Q4_K and, when the
# file is on the machine, the published Gemma 3 270M Q4_K_M; PyTorch decoding the
# Llama shape in f16 with a static KV cache and CUDA graphs
# (tools/bench_torch_decode.py); llama.cpp's llama-bench with its Vulkan backend
# (.dev/llama-vulkan.tar.xz, tools/build_llamacpp_vulkan.sh) on the same GGUF
# files ktune reads, made here by tools/make_1b_gguf.py (random weights; gguf
# from .dev/whl/ when the machine's Python lacks it). Items run in the order of
# DECODE_ITEMS, most wanted first; one that no longer fits the step's time, or
# whose inputs are missing, is skipped with a line saying why (decode.json's
# "skipped"). Raw outputs go to $DECODE_WORK (not $OUT); $OUT/decode.json is the
# summary (tools/decode_summary.py, rewritten after every item) and
# $OUT/decode-raw.tar.gz the raw JSON, profiles and stderr. Knobs for dry runs:
#   DECODE_LAYERS=N           --layers N for the built-in models
#   DECODE_GGUF_ARGS="..."    a smaller shape for make_1b_gguf.py (--layers --hidden --ffn --heads --kv-heads --vocab)
#   DECODE_TORCH_ARGS="..."   the same for bench_torch_decode.py (--layers --hidden --vocab ...)
#   DECODE_PREFILL / DECODE_TOKENS / DECODE_ROUNDS (64 / 32 / 5), GEMMA_270M_GGUF=FILE
if has decode; then
DW=${DECODE_WORK:-${TMPDIR:-/tmp}/ktune-decode}
mkdir -p "$DW"
rm -f "$DW"/*.json "$DW"/*.yaml "$DW"/*.err "$DW"/*.txt
PY=${PYTHON:-python3}
DLIM=$(secs "${DECODE_LIMIT:-480}")
DT0=$(date +%s)
DP=${DECODE_PREFILL:-64}; DN=${DECODE_TOKENS:-32}; DR=${DECODE_ROUNDS:-5}
TBU=${DECODE_TUNE_BUDGET:-30}; TB=$(secs "$TBU")  # unscaled, scaled
DL=(); [[ -n "${DECODE_LAYERS:-}" ]] && DL=(--layers "$DECODE_LAYERS")
ITEMS=${DECODE_ITEMS:-llama-q4 torch llamacpp llama-f16 gemma3-1b gemma-270m llama-q4-builtin}
TO=(sh -c 'f=$1; shift; exec "$@" >"$f"' sh)  # TO FILE CMD...: CMD's stdout to FILE
skip() { echo "decode: $*" | tee -a "$LOG" >>"$DW/skipped.txt"; }
dstep() { # dstep LIMIT_S NAME CMD...: LIMIT_S (scaled) capped by what the step has left
  local lim; lim=$(secs "$1"); local name=$2; shift 2
  local left=$(( DLIM - ($(date +%s) - DT0) ))
  if (( left < $(secs 15) )); then skip "$name skipped: ${left}s left of the step's ${DLIM}s"; return 124; fi
  (( lim > left )) && lim=$left
  step_s "$lim" "$name" "$@"
}
summary() { python3 tools/decode_summary.py "$DW" >"$OUT/decode.json" 2>>"$LOG"; }
dhas() { [[ " $ITEMS " == *" $1 "* ]]; }
python3 - "$DW/settings.json" "$B" "$DEV" "$SCALE" "$DP" "$DN" "$DR" "$TB" "$DLIM" "$ITEMS" \
  "${DECODE_LAYERS:-}" "${DECODE_GGUF_ARGS:-}" "${DECODE_TORCH_ARGS:-}" <<'PY'
import json, subprocess, sys
a = sys.argv[1:]
try:
    ver = subprocess.run([a[1], "--version"], capture_output=True, text=True).stdout.strip()
except OSError as e:
    ver = f"{a[1]}: {e}"
keys = ["ktune", "device", "scale", "prefill_tokens", "decode_tokens", "rounds", "tune_budget_s", "limit_s", "items", "layers", "gguf_args", "torch_args"]
s = dict(zip(keys, a[1:]))
s["ktune_version"] = ver
json.dump(s, open(a[0], "w"), indent=1)
PY

# llama.cpp's Vulkan binaries (LLAMA_VK: a directory holding them, else the packed build)
LLAMA_VK=${LLAMA_VK:-}
if [[ -z "$LLAMA_VK" && -f .dev/llama-vulkan.tar.xz ]]; then
  mkdir -p "$DW/llama"
  if python3 -c "
import sys, tarfile
t = tarfile.open(sys.argv[1])
try:
    t.extractall(sys.argv[2], filter='data')
except TypeError:
    t.extractall(sys.argv[2])" .dev/llama-vulkan.tar.xz "$DW/llama" 2>>"$LOG"; then LLAMA_VK=$DW/llama; fi
fi
[[ -n "$LLAMA_VK" && -x "$LLAMA_VK/llama-bench" ]] || skip "llama.cpp Vulkan: no llama-bench (LLAMA_VK unset and no .dev/llama-vulkan.tar.xz; tools/build_llamacpp_vulkan.sh builds it)"

# The Llama-3.2-1B-shaped GGUF files (random weights), F16 and Q4_K_M
GDIR=$DW/gguf
GSTEM=llama-3.2-1b-shaped
[[ -n "${DECODE_GGUF_ARGS:-}" ]] && GSTEM=llama-small-$(echo "$DECODE_GGUF_ARGS" | cksum | cut -d' ' -f1)
GQ4=$GDIR/$GSTEM.Q4_K_M.gguf; GF16=$GDIR/$GSTEM.F16.gguf
if dhas llama-q4 || dhas llamacpp || dhas llama-f16; then
  if ! "$PY" -c "import gguf" 2>/dev/null; then
    whl=$(ls .dev/whl/gguf-*.whl 2>/dev/null | head -n 1)
    if [[ -n "$whl" ]] && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$DW/site" "$whl" >>"$LOG" 2>&1; then
      export PYTHONPATH=$DW/site${PYTHONPATH:+:$PYTHONPATH}
    fi
  fi
  if [[ -f "$GQ4" && -f "$GF16" ]]; then
    echo "decode: GGUF files already here: $GQ4 $GF16" >>"$LOG"
  elif ! "$PY" -c "import gguf, numpy" 2>>"$LOG"; then
    skip "GGUF files not made: $PY cannot import gguf and numpy (carry the gguf wheel in .dev/whl/)"
  elif [[ ! -x "${LLAMA_VK:-}/llama-quantize" ]]; then
    skip "GGUF files not made: no llama-quantize (it comes with the Vulkan build)"
  else
    # DECODE_GGUF_ARGS is word-split on purpose: a list of options
    # shellcheck disable=SC2086
    dstep 150 make-gguf "$PY" tools/make_1b_gguf.py --tokenizer tests/fixtures/gguf/smollm2-tiny-q8_0.gguf \
      --out-dir "$GDIR" --types Q4_K_M --keep-f16 --llama-quantize "$LLAMA_VK/llama-quantize" --stem "$GSTEM" ${DECODE_GGUF_ARGS:-}
  fi
  ls -la "$GDIR" >>"$LOG" 2>&1
fi

decode_ktune() { # decode_ktune [--no-tune] NAME MODEL_ARGS...: tune, then bench tuned and default
  local tune=1; [[ "$1" == --no-tune ]] && { tune=0; shift; }
  local name=$1; shift
  echo "$*" >"$DW/source-$name.txt"
  local prof=(--no-profile)  # a cached profile of an earlier run must not stand in for this one's
  if (( tune )); then
    dstep $(( TBU + 75 )) "tune-$name" "${TO[@]}" "$DW/tune-$name.json" "$B" tune --device "$DEV" "$@" \
      --budget "${TB}s" -o "$DW/$name.yaml" --force --format json $EXTRA
    if [[ -s "$DW/$name.yaml" ]]; then prof=(--profile "$DW/$name.yaml"); else skip "$name: no tuned profile (the tune failed or ran out of time): the runtime default only"; fi
  fi
  dstep 100 "bench-$name" "${TO[@]}" "$DW/bench-$name.json" "$B" bench --device "$DEV" "$@" "${prof[@]}" \
    --rounds "$DR" --prefill-tokens "$DP" --decode-tokens "$DN" --format json $EXTRA
  summary
}
llamabench() { # llamabench NAME FILE
  dstep 90 "llamabench-$1" sh -c 'f=$1; e=$2; shift 2; exec "$@" >"$f" 2>"$e"' sh "$DW/llamabench-$1.json" "$DW/llamabench-$1.err" \
    "$LLAMA_VK/llama-bench" -m "$2" -ngl 99 -p "$DP" -n "$DN" -r "$DR" -o json
  grep -E "ggml_vulkan: (Found|[0-9]+ =)" "$DW/llamabench-$1.err" >>"$LOG"
  summary
}
G270=""
for item in $ITEMS; do
  case $item in
    llama-q4)
      if [[ -f "$GQ4" ]]; then decode_ktune llama-q4_k_m --gguf "$GQ4"
      else decode_ktune llama-q4_k_m --model llama-3.2-1b --weight-dtype q4_k "${DL[@]}"; fi ;;
    llama-f16)
      if [[ -f "$GF16" ]]; then decode_ktune llama-f16 --gguf "$GF16"
      else decode_ktune llama-f16 --model llama-3.2-1b --weight-dtype f16 "${DL[@]}"; fi ;;
    llama-q4-builtin)  # docs/benchmarks.md's H200 end-to-end figures were taken on this one (every matrix Q4_K)
      decode_ktune --no-tune llama-q4_k-builtin --model llama-3.2-1b --weight-dtype q4_k "${DL[@]}" ;;
    gemma3-1b)
      decode_ktune gemma3-1b-q4_k --model gemma3-1b --weight-dtype q4_k "${DL[@]}" ;;
    torch)
      # DECODE_TORCH_ARGS is word-split on purpose: a list of options
      # shellcheck disable=SC2086
      dstep 180 torch-anchor "${TO[@]}" /dev/null env PYTHONUNBUFFERED=1 "$PY" tools/bench_torch_decode.py \
        --prefill-tokens "$DP" --decode-tokens "$DN" --rounds "$DR" --out "$DW/torch.json" ${DECODE_TORCH_ARGS:-}
      summary ;;
    llamacpp)
      if [[ -z "$LLAMA_VK" ]]; then :  # said above
      else
        for pair in "llama-q4_k_m:$GQ4" "llama-f16:$GF16"; do
          if [[ -f "${pair#*:}" ]]; then llamabench "${pair%%:*}" "${pair#*:}"; else skip "llama-bench ${pair%%:*}: no GGUF file (${pair#*:})"; fi
        done
      fi ;;
    gemma-270m)
      for f in "${GEMMA_270M_GGUF:-}" target/real/gemma-3-270m-q4_k_m.gguf .dev/gemma-3-270m-q4_k_m.gguf; do
        [[ -n "$f" && -f "$f" ]] && { G270=$f; break; }
      done
      # shellcheck disable=SC2046
      [[ -n "$G270" ]] || G270=$(timeout 10 find $(ls -d /root /home /opt /data /models /mnt /workspace /work 2>/dev/null) -maxdepth 6 \
        -iname 'gemma-3-270m*q4_k_m*.gguf' -print 2>/dev/null | head -n 1)
      if [[ -z "$G270" ]]; then
        skip "gemma-3-270m-q4_k_m: the published file is not on this machine (253 MB: over the 64 MiB a call carries, and nothing can be fetched there; GEMMA_270M_GGUF=FILE names one)"
      else
        decode_ktune gemma-3-270m-q4_k_m --gguf "$G270"
        [[ -n "$LLAMA_VK" ]] && llamabench gemma-3-270m-q4_k_m "$G270"
      fi ;;
    *) skip "unknown item $item" ;;
  esac
done
summary
tar -czf "$OUT/decode-raw.tar.gz" -C "$DW" --exclude=./gguf --exclude=./llama --exclude=./site . 2>>"$LOG"
echo "== decode: $(( $(date +%s) - DT0 ))s of ${DLIM}s; $OUT/decode.json" | tee -a "$LOG"
python3 - "$OUT/decode.json" <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for name, k in d["ktune"].items():
    for e, v in k["entries"].items():
        h = v.get("host_us_per_token_excl_wait")
        print(f"ktune {name:24s} {e:8s} prefill {v['prefill_tok_s'] or 0:9.1f} decode {v['decode_tok_s'] or 0:8.1f} tok/s" + (f"  host {h:.0f} us/token" if h is not None else ""))
t = d.get("pytorch") or {}
for m, r in (t.get("modes") or {}).items():
    print(f"pytorch {m:8s} " + (r.get("error", "")[:200] if "error" in r else f"prefill {r['prefill_tok_s']:9.1f} decode {r['decode_tok_s']:8.1f} tok/s (host-synced {r['decode_tok_s_sync']:.1f})"))
for name, l in d["llamacpp"].items():
    print(f"llama.cpp {name:22s} prefill {l.get('prefill_tok_s') or 0:9.1f} decode {l.get('decode_tok_s') or 0:8.1f} tok/s  {l.get('vulkan_devices')}")
for k, v in d["ratios"].items():
    print(f"ratio {k}: {v:.2f}")
for s in d["skipped"]:
    print(s)
PY
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
