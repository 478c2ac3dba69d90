#!/usr/bin/env bash
# The libFuzzer targets of fuzz/ (cargo-fuzz, the nightly toolchain): build,
# a short smoke run, a long run with a table of executions, peak RSS and
# findings, and the seed corpora. Each target is one function of
# src/fuzzing.rs; docs/fuzzing.md describes them and records the long run.
#
#   tools/fuzz.sh build                      # cargo +nightly fuzz build -s none -a
#   tools/fuzz.sh smoke [SECONDS] [TARGET…]  # each target SECONDS (default 8)
#   tools/fuzz.sh long [RUNS] [TARGET…]      # each target RUNS executions (default 10000000), nice 19;
#                                            # FUZZ_MAX_SECONDS=S also stops each after S seconds
#   tools/fuzz.sh seeds                      # rewrite fuzz/seeds/ from the test fixtures
#
# Targets run one at a time from fuzz/corpus/T (ignored, grows), fuzz/seeds/T
# and fuzz/regressions/T, with -rss_limit_mb=2048 -malloc_limit_mb=2048
# -timeout=10. A crash, OOM or timeout input lands in fuzz/artifacts/T/: fix the
# reader, then move the input to fuzz/regressions/T/ (the smoke test of the
# normal suite, tests/it/fuzz_smoke.rs, runs every regression input).
# `-s none`: no AddressSanitizer (the readers are safe Rust; several times
# faster); `-a`: debug assertions and overflow checks on, so an arithmetic
# overflow is a finding too. Logs: target/fuzz-logs/MODE-T.log.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGETS=(gguf safetensors profile bundle tokenizer chat cli logits)
BIN=fuzz/target/x86_64-unknown-linux-gnu/release
LOGS=target/fuzz-logs
LIMITS=(-rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -print_final_stats=1)
# Inputs at most this long, where a target's seeds are small models (libFuzzer's
# default grows to its largest corpus input; whole models run ~300 a second).
declare -A MAX_LEN=([gguf]=32768 [tokenizer]=32768 [safetensors]=131072)

build() {
    (cd fuzz && cargo +nightly fuzz build -s none -a)
}

# run MODE LIMIT TARGET: one libFuzzer run; LIMIT is a libFuzzer flag.
run() {
    local mode=$1 limit=$2 t=$3
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t" "fuzz/regressions/$t" "$LOGS"
    local log="$LOGS/$mode-$t.log"
    local rc=0
    local len=()
    [ -z "${MAX_LEN[$t]:-}" ] || len=(-max_len="${MAX_LEN[$t]}")
    nice -n 19 "$BIN/$t" "${LIMITS[@]}" "${len[@]}" "$limit" -artifact_prefix="fuzz/artifacts/$t/" \
        "fuzz/corpus/$t" "fuzz/seeds/$t" "fuzz/regressions/$t" >"$log" 2>&1 || rc=$?
    local execs rss speed findings
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    findings=$(find "fuzz/artifacts/$t" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' -o -name 'leak-*' \) | wc -l)
    printf '| %s | %s | %s | %s | %s | %s |\n' "$t" "${execs:-?}" "${speed:-?}" "${rss:-?}" "$findings" "$rc"
    [ "$rc" = 0 ]
}

table() {
    local mode=$1 limit=$2
    shift 2
    local fail=0
    echo "| target | executions | exec/s | peak RSS (MB) | findings | exit |"
    echo "|---|---|---|---|---|---|"
    for t in "$@"; do
        run "$mode" "$limit" "$t" || fail=1
    done
    return $fail
}

mode=${1:-}
shift || true
case "$mode" in
build) build ;;
smoke)
    secs=${1:-8}
    shift || true
    [ $# -gt 0 ] || set -- "${TARGETS[@]}"
    build
    table smoke "-max_total_time=$secs" "$@"
    ;;
long)
    runs=${1:-10000000}
    shift || true
    [ $# -gt 0 ] || set -- "${TARGETS[@]}"
    build
    [ -z "${FUZZ_MAX_SECONDS:-}" ] || LIMITS+=("-max_total_time=$FUZZ_MAX_SECONDS")
    table long "-runs=$runs" "$@"
    ;;
seeds)
    python3 tools/fuzz_seeds.py
    du -sh fuzz/seeds/*
    ;;
*)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
