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
#   WARM=1 ROUNDS=8 tools/bench_serve.sh MODEL.gguf   # servers kept up, runs alternated
#   PAIRED=1 NO_LLAMA=1 BASE_BIN=/old/ktune CLIENTS=1 ROUNDS=10 tools/bench_serve.sh MODEL.gguf  # request by request
#   PAIRED=1 CLIENTS=8 ROUNDS=6 BLOCK=4 tools/bench_serve.sh MODEL.gguf  # waves of 8, ktune against llama-server
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
# tools/make_serve_model.py's. WARM=1 starts every server of a number of
# clients once (each on its own port, one untimed warm-up run each) and then
# alternates their runs round by round, the order reversed every other round
# (ABC CBA ...): each run of one server sits next to the others', seconds
# apart, so a drift of the machine's speed (these VMs move by 30% between
# states) falls on all of them instead of on whichever ran in the slow minute.
# An idle server waits on its socket; the prompts are the same in every round
# either way (a server's prefix cache holds them after the first run, as it
# does within a run). PAIRED=1 (exactly two servers: ktune and ktune-base, or
# ktune and llama-server) goes finer: the servers kept up, waves of C requests
# at once, each wave sent to both in turn (tools/load_serve.py --alternate),
# ROUNDS blocks of BLOCK waves (default 16) for each C; one JSON object a C
# with each server's rate and the blocks' ratios (ktune's over the other's).
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
trap 'rm -f "$LOG" "$LOG".*; kill $(jobs -p) 2>/dev/null || true' EXIT

wait_ready() { # port log
    for _ in $(seq 600); do
        if curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "server did not start: $(tail -5 "$2")" >&2
    return 1
}

load() { # server round clients port pid [requests]
    local n=${6:-$(($3 * PER_CLIENT < 8 ? 8 : $3 * PER_CLIENT))}
    python3 tools/load_serve.py --url "http://127.0.0.1:$4" --pid "$5" -n "$n" -c "$3" --max-tokens "$TOKENS" --stream $LOAD_ARGS \
        | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(server='$1', round=$2); print(json.dumps(d))"
}

start() { # label clients port log: starts the server, its pid in $pid
    local label=$1 c=$2 port=$3 log=$4 bin args
    case $label in
    llama-server)
        "$BUILD/bin/llama-server" -m "$MODEL" --port "$port" -np "$c" -t "$THREADS" -c $((CONTEXT * c)) -cb -kvu \
            >"$log" 2>&1 &
        ;;
    *)
        if [ "$label" = ktune ]; then bin=$KTUNE_BIN args=$KTUNE_ARGS; else bin=$BASE_BIN args=$BASE_ARGS; fi
        # shellcheck disable=SC2086 # the extra flags split into words on purpose
        "$bin" serve "$SOURCE" "$MODEL" --device "$DEVICE" --port "$port" --parallel "${PARALLEL:-$c}" --context "$CONTEXT" \
            --queue 64 --ignore-eos $args >"$log" 2>&1 &
        ;;
    esac
    pid=$!
}

SERVERS=ktune
if [ -n "$BASE_BIN" ]; then SERVERS="$SERVERS ktune-base"; fi
if [ -z "$NO_LLAMA" ]; then SERVERS="$SERVERS llama-server"; fi
declare -A PIDS=() PORTS=()

up() { # clients: every server started on its own port and warmed by one untimed run of C requests
    local i=0 s
    for s in $SERVERS; do
        PORTS[$s]=$((PORT + i)) i=$((i + 1))
        start "$s" "$1" "${PORTS[$s]}" "$LOG.$s"
        PIDS[$s]=$pid
    done
    for s in $SERVERS; do
        wait_ready "${PORTS[$s]}" "$LOG.$s"
        load "$s" 0 "$1" "${PORTS[$s]}" "${PIDS[$s]}" "$1" >/dev/null
    done
}

down() { # the servers of `up` stopped
    local s
    for s in $SERVERS; do kill "${PIDS[$s]}"; wait "${PIDS[$s]}" 2>/dev/null || true; done
    rm -f "$LOG".*
}

if [ -n "${PAIRED:-}" ]; then
    read -r -a both <<<"$SERVERS"
    if [ "${#both[@]}" != 2 ]; then
        echo "PAIRED=1 compares two servers: give BASE_BIN with NO_LLAMA=1, or neither" >&2
        exit 2
    fi
    BLOCK=${BLOCK:-16}
    for c in $CLIENTS; do
        up "$c"
        python3 tools/load_serve.py --url "http://127.0.0.1:${PORTS[${both[0]}]}" --alternate "http://127.0.0.1:${PORTS[${both[1]}]}" \
            -c "$c" -n $((ROUNDS * BLOCK * c)) --block "$BLOCK" --max-tokens "$TOKENS" --stream $LOAD_ARGS \
            | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(servers='${both[*]}'); print(json.dumps(d))"
        down
    done
    exit 0
fi

if [ -n "${WARM:-}" ]; then
    for c in $CLIENTS; do
        up "$c"
        order=$SERVERS
        for round in $(seq "$ROUNDS"); do
            for s in $order; do load "$s" "$round" "$c" "${PORTS[$s]}" "${PIDS[$s]}"; done
            order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
        done
        down
    done
    exit 0
fi

for round in $(seq "$ROUNDS"); do
    for c in $CLIENTS; do
        for s in $SERVERS; do
            start "$s" "$c" "$PORT" "$LOG"
            wait_ready "$PORT" "$LOG" && load "$s" "$round" "$c" "$PORT" "$pid"
            kill "$pid"; wait "$pid" 2>/dev/null || true
        done
    done
done
