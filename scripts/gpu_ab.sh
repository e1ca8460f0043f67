#!/usr/bin/env bash
# scripts/gpu_ab.sh — A/B two source trees on the GPU machine with alternating `bench latency`
# runs (the machine's ±3 % spread between sessions makes only same-machine alternation
# meaningful). Trees: $NEW (default .carry/snap, from scripts/gpu_snapshot.sh) and $OLD (default
# .carry/snap-old: `git archive REV | tar -x -C .carry/snap-old` here). Both build in parallel
# into /tmp (SKIP_BUILD=1 reuses them while the machine stays warm); TESTS=1 first runs
# `ctest -L backend_cuda` on the new build. Then for each case of $CASES ("config:batch[:input
# length]", default "llama-2-7b:1 llama-3-8b:1") it runs new, old, new, old... ($ROUNDS pairs,
# default 1) and prints each run's decode fraction of the measured bandwidth.
# Run from the repository root with carry [".carry"].
set -uo pipefail
root=$PWD
new=${NEW:-.carry/snap}
old=${OLD:-.carry/snap-old}
logs=${LOGS:-/tmp/splitflow-ab-logs}
mkdir -p "$logs"
nvidia-smi --query-gpu=name --format=csv,noheader

build() {  # source tree, build dir
  local args=(-DSPLITFLOW_CUDA=ON)
  [[ -d $root/.carry/include ]] && args+=("-DSPLITFLOW_EXTRA_INCLUDE=$root/.carry/include")
  cmake -S "$1" -B "$2" -G Ninja "${args[@]}" >"$2.configure.log" 2>&1 &&
    cmake --build "$2" -j8 --target splitflow ${3:-} >"$2.build.log" 2>&1 ||
    { grep -E "error" "$2.build.log" "$2.configure.log" | head -20; return 1; }
}
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  start=$SECONDS
  build "$new" /tmp/ab-new "$([[ ${TESTS:-0} == 1 ]] && echo test_backend_cuda)" & new_pid=$!
  build "$old" /tmp/ab-old & old_pid=$!
  wait $new_pid || exit 1
  wait $old_pid || exit 1
  echo "builds: $((SECONDS - start)) s"
fi
if [[ ${TESTS:-0} == 1 ]]; then
  (cd /tmp/ab-new && ctest -L backend_cuda --output-on-failure) >"$logs/ctest.log" 2>&1
  echo "ctest -L backend_cuda exit $?: $(grep -E 'tests passed|tests failed' "$logs/ctest.log")"
  grep -E '^\[  FAILED|Failed' "$logs/ctest.log" | head -20
fi
for case in ${CASES:-llama-2-7b:1 llama-3-8b:1}; do
  IFS=: read -r config batch input <<<"$case"
  for ((round = 0; round < ${ROUNDS:-1}; ++round)); do
    for side in new old; do
      log="$logs/$config-b$batch-$side-$round.log"
      /tmp/ab-$side/splitflow bench latency --backend cuda --dummy-weights --config "$root/${!side}/bench/configs/$config.json" \
        --input-len "${input:-512}" --output-len 128 --batch "$batch" --results-dir "$logs/json-$side" >"$log" 2>&1
      echo "$config b$batch $side: $(grep -E 'decode tokens/s|fraction of bandwidth|error' "$log" | tr -s ' ' | tr '\n' ' ')"
    done
  done
done
