#!/usr/bin/env bash
# scripts/gpu_tp.sh — tensor parallelism on a multi-GPU machine (nvidia-h100-x2 / -x4): builds
# splitflow and test_backend_cuda like scripts/gpu_test.sh (carry .carry/include), then
#   1. FILTER's single-GPU CUDA tests (default: the sampling rule, token masks, quantized GEMVs),
#   2. tests/python/test_tensor_parallel.py (every HF fixture at TP 2 and 4, against transformers
#      and one GPU's greedy tokens),
#   3. `bench latency` on CONFIG (default Llama-3-8B, dummy weights, bf16) at TP 1 and each size of
#      SIZES (default: 2, and 4 when 4 GPUs are visible), batch 1 and BATCH2 (default 32), in one
#      call so every ratio compares runs on the same machine; JSON in $OUT/tp-results.
# Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD_DIR:-build-gpu}
carry=${CARRY_DIR:-.carry}
logs=${OUT:-$root/$build}
mkdir -p "$logs"
args=(-DSPLITFLOW_CUDA=ON)
[[ -d $carry/include ]] && args+=("-DSPLITFLOW_EXTRA_INCLUDE=$root/$carry/include")
export SPLITFLOW_COMMIT=${SPLITFLOW_COMMIT:-$(cat .source-commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "nvidia-smi: no GPU visible"
nvidia-smi topo -m 2>/dev/null | head -8
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
start=$SECONDS
cmake -S . -B "$build" -G Ninja "${args[@]}" >"$logs/configure.log" 2>&1 || { tail -40 "$logs/configure.log"; exit 1; }
if ! cmake --build "$build" -j"$(nproc)" --target splitflow test_backend_cuda >"$logs/build.log" 2>&1; then
  grep -E "error|Error" "$logs/build.log" | head -40
  exit 1
fi
echo "configure + build: $((SECONDS - start)) s"

rc=0
filter=${FILTER:-*SamplingRule*:*TokenMask*:*CudaQuant*:CudaKernels.Sample*}
if [[ $filter != none ]]; then
  timeout 400 "$build/tests/test_backend_cuda" --gtest_filter="$filter" >"$logs/gpu_tests.log" 2>&1 || rc=1
  echo "tests ($filter): $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/gpu_tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure" "$logs/gpu_tests.log" | head -30
fi

if [[ ${TP_TEST:-1} == 1 ]]; then
  sizes=2
  (( gpus >= 4 )) && sizes=2,4
  timeout 900 python3 tests/python/test_tensor_parallel.py --splitflow "$build/splitflow" --sizes "$sizes" \
    >"$logs/tp_test.log" 2>&1
  tp_rc=$?
  (( tp_rc != 0 )) && rc=1
  echo "test_tensor_parallel.py exit $tp_rc: $(tail -1 "$logs/tp_test.log")"
  grep -E "FAIL|error" "$logs/tp_test.log" | head -20
fi

if [[ ${BENCH:-1} == 1 ]]; then
  config=${CONFIG:-bench/configs/llama-3-8b.json}
  results=$logs/tp-results
  mkdir -p "$results"
  sizes=${SIZES:-2}
  (( gpus >= 4 )) && sizes=${SIZES:-2 4}
  for batch in 1 ${BATCH2:-32}; do
    for tp in 1 $sizes; do
      timeout 240 "$build/splitflow" bench latency --backend cuda --dummy-weights --config "$config" --input-len 512 \
        --output-len 128 --batch "$batch" --tensor-parallel-size "$tp" --results-dir "$results" \
        >"$logs/latency-tp$tp-b$batch.log" 2>&1
      echo "=== tp $tp batch $batch (exit $?) ==="
      grep -E "TTFT|prefill tokens|time per output|decode tokens|fraction|error" "$logs/latency-tp$tp-b$batch.log" | head -8
    done
  done
fi
exit $rc
