#!/usr/bin/env bash
# The test command: sets up and builds (idempotent), then runs every test with ctest.
# GPU tests skip without a GPU. Extra arguments go to ctest (e.g. -L tokenizer, -R Sampler).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
