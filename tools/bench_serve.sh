#!/usr/bin/env bash
# Many clients at once, ktune serve against llama-server on the same file, the
# same threads and context, interleaved rounds: for each round and each number
# of clients C, `ktune serve --parallel C` (C = 1: one request at a time, as
# without the flag) and `llama-server -np C` (continuous batching, one unified
# KV cache) in turn, each loaded by tools/load_serve.py (streamed; one JSON line
# a run, prefixed with the server and the round).
#
#   tools/bench_serve.sh MODEL.gguf                   # clients 1 8 16, 3 rounds
#   CLIENTS="1 2 4 8 16" ROUNDS=5 TOKENS=32 tools/bench_serve.sh MODEL.gguf
#   LOAD_ARGS="--system-tokens 400 --mixed" tools/bench_serve.sh MODEL.gguf
#   KTUNE_ARGS="--profile tuned.yaml" BASE_BIN=/old/ktune tools/bench_serve.sh MODEL.gguf
#   DEVICE=vulkan NO_LLAMA=1 KTUNE_ARGS="--weight-dtype q4_0" tools/bench_serve.sh MODEL_DIR
#   PER_CLIENT=12 tools/bench_serve.sh MODEL.gguf     # longer runs, steadier rates
#
# KTUNE_ARGS: more flags for `ktune serve` (a profile); BASE_BIN (and
# BASE_ARGS): a second ktune build, run as `ktune-base` in the same rounds (a
# before/after); NO_LLAMA=1 leaves llama-server out; PARALLEL=P serves every
# number of clients with `--parallel P` (one client on a server of many
# sequences) instead of C; DEVICE: ktune's --device (default cpu); KTUNE_BIN:
# the ktune build (default target/release/ktune); PER_CLIENT: requests a client
# sends in a run (default 4, at least 8 in all: a run of 8 clients then lasts
# about 2 s on a 2-core CPU, short enough for one busy second of the machine to
# move its rate by a tenth). A directory MODEL is a Hugging
# Face model directory (--model-dir; llama-server needs a GGUF: NO_LLAMA=1), e.g.
# tools/make_serve_model.py's.
#
# Needs target/release/ktune and llama.cpp's llama-server (tools/build_llamacpp.sh
# with LLAMACPP_TARGETS=llama-server; $LLAMACPP_BUILD as there). Nothing else
# should run: the two share the machine's cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?give a GGUF file}
CLIENTS=${CLIENTS:-1 8 16}
ROUNDS=${ROUNDS:-3}
TOKENS=${TOKENS:-32}
THREADS=${THREADS:-$(nproc)}
CONTEXT=${CONTEXT:-4096}
LOAD_ARGS=${LOAD_ARGS:-}
KTUNE_ARGS=${KTUNE_ARGS:-}
BASE_BIN=${BASE_BIN:-}
BASE_ARGS=${BASE_ARGS:-}
NO_LLAMA=${NO_LLAMA:-}
PARALLEL=${PARALLEL:-}
BUILD=${LLAMACPP_BUILD:-target/llama.cpp-build}
PORT=${PORT:-18200}
DEVICE=${DEVICE:-cpu}
KTUNE_BIN=${KTUNE_BIN:-target/release/ktune}
PER_CLIENT=${PER_CLIENT:-4}
if [ -d "$MODEL" ]; then SOURCE=--model-dir; else SOURCE=--gguf; fi
LOG=$(mktemp)
trap 'rm -f "$LOG"; kill %% 2>/dev/null || true' EXIT

wait_ready() {
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "server did not start: $(tail -5 "$LOG")" >&2
    return 1
}

load() { # server round clients
    local n=$(($3 * PER_CLIENT < 8 ? 8 : $3 * PER_CLIENT))
    python3 tools/load_serve.py --url "http://127.0.0.1:$PORT" --pid "$pid" -n "$n" -c "$3" --max-tokens "$TOKENS" --stream $LOAD_ARGS \
        | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(server='$1', round=$2); print(json.dumps(d))"
}

ktune_serve() { # label round clients binary args...
    local label=$1 round=$2 c=$3 bin=$4
    shift 4
    # shellcheck disable=SC2068 # the extra flags split into words on purpose
    "$bin" serve "$SOURCE" "$MODEL" --device "$DEVICE" --port "$PORT" --parallel "${PARALLEL:-$c}" --context "$CONTEXT" \
        --queue 64 --ignore-eos $@ >"$LOG" 2>&1 &
    local pid=$!
    wait_ready && load "$label" "$round" "$c"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
    for c in $CLIENTS; do
        ktune_serve ktune "$round" "$c" "$KTUNE_BIN" $KTUNE_ARGS
        if [ -n "$BASE_BIN" ]; then
            ktune_serve ktune-base "$round" "$c" "$BASE_BIN" $BASE_ARGS
        fi
        if [ -z "$NO_LLAMA" ]; then
            "$BUILD/bin/llama-server" -m "$MODEL" --port "$PORT" -np "$c" -t "$THREADS" -c $((CONTEXT * c)) -cb -kvu \
                >"$LOG" 2>&1 &
            pid=$!
            wait_ready && load llama-server "$round" "$c"
            kill "$pid"; wait "$pid" 2>/dev/null || true
        fi
    done
done
