#!/usr/bin/env bash
# scripts/gpu_bench.sh — `splitflow bench latency --backend cuda` on the GPU machine: configures
# with -DSPLITFLOW_CUDA=ON like scripts/gpu_test.sh (the same .carry/include handling), builds only
# the splitflow target, and runs batch-1 512-in / 128-out latency for the shapes in $CONFIGS
# (default: Llama-2-7B and Llama-3-8B, dummy weights) at each batch size in $BATCHES (default 1);
# PREFILL=1 adds a 2048-token prefill run per shape. Result JSON goes to $OUT when set, packed into
# one latency-results.tar.gz (the device tool brings back only a few files; unpack it into
# bench/results/ with `tar -xzf ... -C bench/results`), else to bench/results/; logs to $LOGS
# (default /tmp/splitflow-gpu-logs).
# TESTS=1: also build test_backend_cuda and run `ctest -L backend_cuda` first (log ctest.log).
set -uo pipefail
LOGS=${LOGS:-/tmp/splitflow-gpu-logs}  # kept out of $OUT: the device tool returns few files
source "$(dirname "$0")/gpu_common.sh"
results=${OUT:-$root/bench/results}
configs=${CONFIGS:-"llama-2-7b llama-3-8b"}
mkdir -p "$results"
targets=(splitflow)
[[ ${TESTS:-0} == 1 ]] && targets+=(test_backend_cuda)
gpu_build "${targets[@]}"

rc=0
if [[ ${TESTS:-0} == 1 ]]; then
  (cd "$build" && ctest -L backend_cuda --output-on-failure) >"$logs/ctest.log" 2>&1
  rc=$?
  echo "ctest -L backend_cuda exit $rc: $(grep -E 'tests passed|tests failed' "$logs/ctest.log")"
  grep -E 'Failed|FAILED' "$logs/ctest.log" | head -20
fi
run_bench() {  # log name, then bench latency arguments
  local name=$1; shift
  echo "=== $name ==="
  local run_start=$SECONDS
  "$build/splitflow" bench latency --backend cuda --dummy-weights --results-dir "$results" "$@" >"$logs/$name.log" 2>&1
  local status=$?
  [[ $status -ne 0 ]] && rc=$status
  echo "exit $status after $((SECONDS - run_start)) s"
  grep -E "load|TTFT|decode tokens|fraction|error" "$logs/$name.log"
}
for config in $configs; do
  for batch in ${BATCHES:-1}; do
    run_bench "$config-b$batch" --config "bench/configs/$config.json" --input-len 512 --output-len 128 --batch "$batch"
  done
  if [[ ${PREFILL:-0} == 1 ]]; then
    run_bench "$config-prefill2048" --config "bench/configs/$config.json" --input-len 2048 --output-len 2 --batch 1
  fi
done
if [[ -n ${OUT:-} ]] && compgen -G "$results/latency-*.json" >/dev/null; then
  (cd "$results" && tar -czf latency-results.tar.gz latency-*.json && rm -f latency-*.json)
  echo "result JSON packed in $results/latency-results.tar.gz"
fi
exit $rc
