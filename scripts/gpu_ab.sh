#!/usr/bin/env bash
# scripts/gpu_ab.sh — A/B source trees on the GPU machine with alternating `bench latency` runs
# (the machine's ±3 % spread between sessions makes only same-machine alternation meaningful).
# $VARIANTS: "name=tree ..." (default "new=.carry/snap old=.carry/snap-old": the snapshot of
# scripts/gpu_snapshot.sh and `git archive REV | tar -x -C .carry/snap-old` made here). All build
# in parallel into /tmp/ab-<name> (SKIP_BUILD=1 reuses them while the machine stays warm);
# TESTS=1 first runs `ctest -L backend_cuda` on the first variant. Then for each case of $CASES
# ("config:batch[:input length]", default "llama-2-7b:1 llama-3-8b:1") it runs every variant in
# turn, $ROUNDS rounds (default 1), and prints each run's decode rate and fraction of the measured
# bandwidth; the JSON goes to $OUT/<name> (or the log folder). Run from the repository root with
# carry [".carry"].
set -uo pipefail
root=$PWD
variants=(${VARIANTS:-new=.carry/snap old=.carry/snap-old})
logs=${LOGS:-/tmp/splitflow-ab-logs}
mkdir -p "$logs"
nvidia-smi --query-gpu=name --format=csv,noheader

build() {  # source tree, build dir, extra targets
  local args=(-DSPLITFLOW_CUDA=ON)
  [[ -d $root/.carry/include ]] && args+=("-DSPLITFLOW_EXTRA_INCLUDE=$root/.carry/include")
  cmake -S "$1" -B "$2" -G Ninja "${args[@]}" >"$2.configure.log" 2>&1 &&
    cmake --build "$2" -j$((16 / ${#variants[@]})) --target splitflow ${3:-} >"$2.build.log" 2>&1 ||
    { grep -E "error" "$2.build.log" "$2.configure.log" | head -20; return 1; }
}
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  start=$SECONDS
  pids=()
  for i in "${!variants[@]}"; do
    extra=$([[ ${TESTS:-0} == 1 && $i == 0 ]] && echo test_backend_cuda)
    build "$root/${variants[$i]#*=}" "/tmp/ab-${variants[$i]%%=*}" "$extra" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || exit 1; done
  echo "builds: $((SECONDS - start)) s"
fi
first=${variants[0]%%=*}
if [[ ${TESTS:-0} == 1 ]]; then
  (cd "/tmp/ab-$first" && ctest -L backend_cuda --output-on-failure) >"$logs/ctest.log" 2>&1
  echo "ctest -L backend_cuda ($first) exit $?: $(grep -E 'tests passed|tests failed' "$logs/ctest.log")"
  grep -E '^\[  FAILED|Failed' "$logs/ctest.log" | head -20
fi
for case in ${CASES:-llama-2-7b:1 llama-3-8b:1}; do
  IFS=: read -r config batch input <<<"$case"
  for ((round = 0; round < ${ROUNDS:-1}; ++round)); do
    for variant in "${variants[@]}"; do
      name=${variant%%=*}
      log="$logs/$config-b$batch-$name-$round.log"
      # The JSON names the variant's commit (a snapshot's .source-commit), not the enclosing checkout's.
      SPLITFLOW_COMMIT=$(cat "${variant#*=}/.source-commit" 2>/dev/null) "/tmp/ab-$name/splitflow" bench latency --backend cuda --dummy-weights --config "${variant#*=}/bench/configs/$config.json" \
        --input-len "${input:-512}" --output-len 128 --batch "$batch" --results-dir "${OUT:-$logs}/$name" >"$log" 2>&1
      echo "$config b$batch $name: $(grep -E 'decode tokens/s|fraction of bandwidth|error' "$log" | tr -s ' ' | tr '\n' ' ')"
    done
  done
done
