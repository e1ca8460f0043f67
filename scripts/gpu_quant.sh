#!/usr/bin/env bash
# scripts/gpu_quant.sh — quantized weights on the GPU machine: builds test_backend_cuda (and, with
# BENCH_LATENCY=1, splitflow) like scripts/gpu_test.sh (carry .carry/include/{pcre2,xxhash}.h),
# runs the CUDA quantized-weight tests (*CudaQuant*: both GEMV paths, plus FILTER, default the bf16 matmul/embed
# tests next to them), the decode-GEMV micro-benchmark of every quantized type against bf16
# (CudaQuantBench, "[quant bench]" lines: time, GB/s of packed bytes, speedup over bf16), and with
# BENCH_LATENCY=1 `splitflow bench latency --dummy-weights --quantization TYPE` on CONFIG for TYPES.
# Logs go to $OUT when set.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
targets=(test_backend_cuda)
[[ ${BENCH_LATENCY:-0} == 1 ]] && targets+=(splitflow)
gpu_build "${targets[@]}"

rc=0
filter="*CudaQuant*:${FILTER:-CudaKernels.Matmul*:CudaKernels.Embed*:CudaKernels.*Gated*}"
timeout 300 "$build/tests/test_backend_cuda" --gtest_filter="$filter" >"$logs/quant_tests.log" 2>&1
rc=$?
echo "tests ($filter) exit $rc: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/quant_tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure|Expected|Which is|actual|m [0-9]+ k|error" "$logs/quant_tests.log" | head -60

if [[ ${SPEED:-1} == 1 ]]; then
  timeout 300 "$build/tests/test_backend_cuda" --gtest_also_run_disabled_tests --gtest_filter='*QuantGemvSpeed*' \
    >"$logs/quant_bench.log" 2>&1
  echo "speed exit $?"
  grep "\[quant bench\]" "$logs/quant_bench.log" | sed 's/^\[quant bench\] //'
fi

if [[ ${BENCH_LATENCY:-0} == 1 ]]; then
  config=${CONFIG:-bench/configs/tinyllama-1.1b.json}
  for type in bf16 ${TYPES:-q4_0 q4_k q8_0 f8_channel}; do
    quant=()
    [[ $type != bf16 ]] && quant=(--quantization "$type")
    timeout 150 "$build/splitflow" bench latency --backend cuda --dummy-weights --config "$config" --input-len 128 \
      --output-len 64 --batch 1 --results-dir /tmp/quant-results "${quant[@]}" >"$logs/latency-$type.log" 2>&1
    echo "=== $type (exit $?) ==="
    grep -E "load|decode tokens|TPOT|error" "$logs/latency-$type.log" | head -6
  done
fi
exit $rc
