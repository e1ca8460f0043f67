#!/usr/bin/env bash
# scripts/carry_prebuilt.sh [BUILD_DIR [TARGET...]] — pack build-cuda/splitflow (or the TARGETs,
# paths under the build dir such as tests/test_backend_cuda; about 33 MB compressed each: the carry
# holds 64 MiB with the tree) stripped, and the shared
# libraries the GPU machine lacks (spdlog 1.10, fmt 9, PCRE2, cpp-httplib; this machine's Debian 12
# is older than its Ubuntu 24.04, so the binary's glibc and libstdc++ needs are met there) into
# .carry-prebuilt/prebuilt.tar.xz (git-ignored, about 33 MB). A GPU call then runs
# `PREBUILT=.carry-prebuilt/prebuilt.tar.xz scripts/gpu_tp.sh ...` with carry
# [".carry-prebuilt"] and skips its build (see gpu_common.sh; SPLITFLOW_TEST_FIXTURES_DIR points a
# prebuilt test binary at this checkout's fixtures).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
shift || true
targets=("${@:-splitflow}")
ninja -C "$build" "${targets[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" .carry-prebuilt
for target in "${targets[@]}"; do
  mkdir -p "$stage/$(dirname "$target")"
  strip -o "$stage/$target" "$build/$target"
  for lib in $(ldd "$build/$target" | awk '/spdlog|fmt|pcre2|httplib|brotli|gomp/ {print $3}'); do
    cp -L "$lib" "$stage/lib/"
  done
done
git rev-parse --short HEAD >"$stage/commit"
tar cJf .carry-prebuilt/prebuilt.tar.xz -C "$stage" .
ls -la .carry-prebuilt/prebuilt.tar.xz
