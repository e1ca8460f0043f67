#!/usr/bin/env bash
# scripts/carry_prebuilt.sh [BUILD_DIR] — pack build-cuda/splitflow (stripped) and the shared
# libraries the GPU machine lacks (spdlog 1.10, fmt 9, PCRE2, cpp-httplib; this machine's Debian 12
# is older than its Ubuntu 24.04, so the binary's glibc and libstdc++ needs are met there) into
# .carry-prebuilt/prebuilt.tar.xz (git-ignored, about 33 MB). A GPU call then runs
# `PREBUILT=.carry-prebuilt/prebuilt.tar.xz scripts/gpu_tp.sh ...` with carry [".carry/include",
# ".carry-prebuilt"] and skips its build (see gpu_common.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
ninja -C "$build" splitflow
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" .carry-prebuilt
strip -o "$stage/splitflow" "$build/splitflow"
git rev-parse --short HEAD >"$stage/commit"
for lib in $(ldd "$build/splitflow" | awk '/spdlog|fmt|pcre2|httplib|brotli|gomp/ {print $3}'); do
  cp -L "$lib" "$stage/lib/"
done
tar cJf .carry-prebuilt/prebuilt.tar.xz -C "$stage" .
ls -la .carry-prebuilt/prebuilt.tar.xz
