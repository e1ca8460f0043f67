#!/usr/bin/env bash
# scripts/gpu_quant.sh — quantized weights on the GPU machine: builds test_backend_cuda (and, with
# BENCH_LATENCY=1, splitflow) like scripts/gpu_test.sh (carry .carry/include/{pcre2,xxhash}.h; or
# PREBUILT, gpu_common.sh), runs the CUDA quantized-weight tests (*CudaQuant*: every GEMV path, plus
# FILTER, default the bf16 matmul/embed tests next to them), the matmul micro-benchmark of every
# quantized type against bf16 (CudaQuantBench, "[quant bench]" lines: time, GB/s of packed bytes,
# speedup over bf16, on the default path and with fp32 x; SPEED_SHOW: a regex of the lines to
# print), and with BENCH_LATENCY=1 `splitflow bench latency --dummy-weights --quantization TYPE` on
# CONFIG for TYPES (INPUT_LEN, OUTPUT_LEN, BATCHES; TYPES may name fp8 (W8A8) and fp8-weight-only:
# TYPES="fp8 fp8-weight-only" PATHS=1 INPUT_LEN=2048 CONFIG=bench/configs/llama-3-8b.json is issue
# 25's prefill comparison), bf16 beside them, each quantized type with
# int8 activations (fp16 for FP8; the default) and fp32 ones (SPLITFLOW_CUDA_Q8_ACTIVATIONS=0
# SPLITFLOW_CUDA_F16_ACTIVATIONS=0); PATHS=1: the default path only. TESTS=0 skips the tests,
# SPEED=0 the micro-benchmark. With OUT set and LOGS elsewhere, the logs and the latency JSON are
# packed into $OUT/quant.tgz (the device tool brings back few files).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
targets=(test_backend_cuda)
[[ ${BENCH_LATENCY:-0} == 1 ]] && targets+=(splitflow)
gpu_build "${targets[@]}"

rc=0
if [[ ${TESTS:-1} == 1 ]]; then
filter="*CudaQuant*:${FILTER:-CudaKernels.Matmul*:CudaKernels.Embed*:CudaKernels.*Gated*}"
timeout 300 "$build/tests/test_backend_cuda" --gtest_filter="$filter" >"$logs/quant_tests.log" 2>&1
rc=$?
echo "tests ($filter) exit $rc: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/quant_tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure|Expected|Which is|actual|m [0-9]+ k|error" "$logs/quant_tests.log" | head -60
fi

if [[ ${SPEED:-1} == 1 ]]; then
  timeout 300 "$build/tests/test_backend_cuda" --gtest_also_run_disabled_tests --gtest_filter='*QuantGemvSpeed*' \
    >"$logs/quant_bench.log" 2>&1
  echo "speed exit $?"
  grep "\[quant bench\]" "$logs/quant_bench.log" | sed "s/^\[quant bench\] //" | grep -E "${SPEED_SHOW:-.}"
fi

if [[ ${BENCH_LATENCY:-0} == 1 ]]; then
  config=${CONFIG:-bench/configs/tinyllama-1.1b.json}
  for batch in ${BATCHES:-1}; do
    for type in bf16 ${TYPES:-q4_0 q4_k q8_0 f8_channel}; do
      for q8 in ${PATHS:-1 0}; do
        quant=()
        [[ $type != bf16 ]] && quant=(--quantization "$type")
        [[ $type == bf16 || $type == q3h* ]] && [[ $q8 == 0 ]] && continue  # no int8 / fp16-x path
        SPLITFLOW_CUDA_Q8_ACTIVATIONS=$q8 SPLITFLOW_CUDA_F16_ACTIVATIONS=$q8 timeout 240 "$build/splitflow" bench latency --backend cuda --dummy-weights \
          --config "$config" --input-len "${INPUT_LEN:-128}" --output-len "${OUTPUT_LEN:-64}" --batch "$batch" \
          --results-dir "$logs/results/q8x-$q8" "${quant[@]}" >"$logs/latency-$type-b$batch-q8x$q8.log" 2>&1
        echo "=== $type batch $batch int8-x $q8 (exit $?) ==="
        grep -E "prefill tokens|decode tokens|fraction of bandwidth|load \(s\)|rror" "$logs/latency-$type-b$batch-q8x$q8.log" | tr -s " |" " " | tr "\n" ";"; echo
      done
    done
  done
fi
if [[ -n ${OUT:-} && $logs != "$OUT" ]]; then
  tar czf "$OUT/quant.tgz" -C "$logs" . && echo "logs and results: quant.tgz"
fi
exit $rc
