#!/usr/bin/env bash
# scripts/gpu_profile.sh — where a batch-1 decode step's time goes, on the GPU machine. Builds the
# working tree and, when $BASELINE_KERNELS names an older kernels.cu, a second tree with it (both
# in parallel); runs the CUDA kernel tests on the working tree; profiles 3 decode steps of the
# 4-layer Llama-2-7B shape under ncu (one gpu__time_duration per launch, clocks and caches as
# found); then runs the full bench for each tree. Logs and tables go to $OUT (else ./profile-out).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
carry=${CARRY_DIR:-.carry}
out=${OUT:-$root/profile-out}
mkdir -p "$out"
args=(-DSPLITFLOW_CUDA=ON)
[[ -d $carry/include ]] && args+=("-DSPLITFLOW_EXTRA_INCLUDE=$root/$carry/include")
[[ -d $carry/shared ]] && { export SPLITFLOW_SHARED_DIR=$root/$carry/shared; args+=("-DSPLITFLOW_SHARED_DIR=$SPLITFLOW_SHARED_DIR"); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

build() {  # tree build-dir log targets...
  local tree=$1 dir=$2 log=$3; shift 3
  (cd "$tree" && cmake -S . -B "$dir" -G Ninja "${args[@]}" && cmake --build "$dir" -j8 --target "$@") >"$log" 2>&1 ||
    { grep -E "error" "$log" | head -20; return 1; }
}
start=$SECONDS
trees=(new)
build "$root" build-gpu "$out/build-new.log" splitflow test_backend_cuda &
if [[ -n ${BASELINE_KERNELS:-} ]]; then
  base=/tmp/splitflow-base
  rm -rf "$base" && mkdir -p "$base"
  tar --exclude=./build-gpu --exclude='./build*' -cf - . | tar -xf - -C "$base"
  cp "$BASELINE_KERNELS" "$base/src/backend/cuda/kernels.cu"
  build "$base" build-gpu "$out/build-base.log" splitflow &
  trees=(base new)
fi
wait
echo "builds: $((SECONDS - start)) s"

build-gpu/tests/test_backend_cuda >"$out/test_backend_cuda.log" 2>&1
echo "test_backend_cuda exit $?: $(grep -E '^\[  (PASSED|FAILED)' "$out/test_backend_cuda.log" | tr '\n' ' ')"

steps=3
for t in "${trees[@]}"; do
  bin=$root/build-gpu/splitflow; [[ $t == base ]] && bin=$base/build-gpu/splitflow
  timeout 150 ncu --metrics gpu__time_duration.sum --csv --page raw --clock-control none --cache-control none \
    --log-file "$out/ncu-$t.csv" "$bin" bench latency --backend cuda --config bench/configs/llama-2-7b-4l.json \
    --dummy-weights --input-len 512 --output-len $((steps + 1)) --batch 1 --results-dir /tmp/ncu-results-$t \
    >"$out/ncu-$t.log" 2>&1
  echo "=== ncu $t (exit $?): 4-layer Llama-2-7B shape, last $steps decode steps, context ~513 ==="
  python3 scripts/decode_kernel_table.py "$out/ncu-$t.csv" $steps | tee "$out/table-$t.txt"
done
for t in "${trees[@]}"; do
  bin=$root/build-gpu/splitflow; [[ $t == base ]] && bin=$base/build-gpu/splitflow
  mkdir -p "$out/results-$t"
  "$bin" bench latency --backend cuda --config bench/configs/llama-2-7b.json --dummy-weights --input-len 512 \
    --output-len 128 --batch 1 --results-dir "$out/results-$t" >"$out/bench-$t.log" 2>&1
  echo "=== bench $t (exit $?) ==="; grep -h -E '"(tpot_ms|decode_tokens_per_s|fraction_of_bandwidth)"' "$out/results-$t"/*.json
done
