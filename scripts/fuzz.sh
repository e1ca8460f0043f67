#!/usr/bin/env bash
# scripts/fuzz.sh — builds the libFuzzer harnesses (build-fuzz: clang, -DSPLITFLOW_FUZZ=ON) and runs
# each in turn on one core, then prints a table: harness, executions, exec/s, crashes.
#   scripts/fuzz.sh [SECONDS | --runs N] [HARNESS...]
# SECONDS per harness (default 60), or --runs N executions each; no harness names: all of them.
# Each run reads fuzz/corpus/<harness> (the seeds, in git) and fuzz/work/corpus/<harness> (what
# runs discover, git-ignored; new inputs go there), with fuzz/dict/<harness>.dict when it exists.
# A crash, OOM or timeout input lands in fuzz/work/artifacts/<harness>/: minimize it
# (build-fuzz/fuzz/fuzz_<harness> -minimize_crash=1 -runs=10000 FILE), fix, and keep it under
# fuzz/crashes/<harness>/ with a descriptive name (docs/fuzzing.md).
# Environment: BUILD_DIR (build-fuzz), LOG_DIR (fuzz/work/logs), SUMMARY (a file each finished
# harness's row is appended to), MAX_SECONDS (with --runs: stop a harness after this long too),
# RSS_LIMIT_MB (2048), NICE (19), JOBS (build jobs, 2).
set -uo pipefail
cd "$(dirname "$0")/.."

all_harnesses=(safetensors gguf llama2c llama2c_tokenizer hf_tokenizer chat_template openai_request pickle grammar step_command
               kv_frames)
declare -A max_len=([safetensors]=8192 [gguf]=20000 [llama2c]=8192 [llama2c_tokenizer]=8192
                    [hf_tokenizer]=16384 [chat_template]=8192 [openai_request]=4096 [pickle]=16384
                    [grammar]=4096 [step_command]=4096 [kv_frames]=4096)

limit=(-max_total_time=60)
if [[ ${1:-} == --runs ]]; then
  limit=(-runs="$2"); shift 2
  [[ -n ${MAX_SECONDS:-} ]] && limit+=(-max_total_time="$MAX_SECONDS")
elif [[ ${1:-} =~ ^[0-9]+$ ]]; then
  limit=(-max_total_time="$1"); shift
fi
harnesses=("$@")
[[ ${#harnesses[@]} -eq 0 ]] && harnesses=("${all_harnesses[@]}")
for harness in "${harnesses[@]}"; do
  [[ -n ${max_len[$harness]:-} ]] || { echo "unknown harness '$harness' (known: ${all_harnesses[*]})" >&2; exit 2; }
done

build_dir=${BUILD_DIR:-build-fuzz}
log_dir=${LOG_DIR:-fuzz/work/logs}
if [[ ! -f $build_dir/build.ninja ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPLITFLOW_CUDA=OFF \
    -DSPLITFLOW_FUZZ=ON -DSPLITFLOW_BUILD_TESTS=OFF >/dev/null || exit 1
fi
cmake --build "$build_dir" -j "${JOBS:-2}" --target "${harnesses[@]/#/fuzz_}" >/dev/null || {
  echo "build failed: cmake --build $build_dir --target ${harnesses[*]/#/fuzz_}" >&2; exit 1; }

mkdir -p "$log_dir"
printf '%-18s %14s %9s %8s\n' harness executions exec/s crashes
for harness in "${harnesses[@]}"; do
  work=fuzz/work/corpus/$harness artifacts=fuzz/work/artifacts/$harness
  mkdir -p "$work" "$artifacts"
  dict=() && [[ -f fuzz/dict/$harness.dict ]] && dict=(-dict="fuzz/dict/$harness.dict")
  # Failures only: crash-, oom-, timeout- and leak- files (a slow-unit- file is a unit past 10 s,
  # reported, not a failure; a fuzzer paused with SIGSTOP leaves one).
  failures() { ls "$artifacts" | grep -cE '^(crash|oom|timeout|leak)-'; }
  before=$(failures)
  log=$log_dir/$harness.log
  # One process, one core: libFuzzer's main loop is single-threaded.
  nice -n "${NICE:-19}" "$build_dir/fuzz/fuzz_$harness" "${limit[@]}" -max_len="${max_len[$harness]}" \
    -rss_limit_mb="${RSS_LIMIT_MB:-2048}" -malloc_limit_mb="${RSS_LIMIT_MB:-2048}" -timeout=30 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" "$work" "fuzz/corpus/$harness" >"$log" 2>&1
  executions=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  if [[ -z $executions ]]; then  # stopped by a crash: the last status line has the count
    executions=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    rate=$(grep -o 'exec/s: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  fi
  crashes=$(( $(failures) - before ))
  row=$(printf '%-18s %14s %9s %8s' "$harness" "${executions:-?}" "${rate:-?}" "$crashes")
  echo "$row"
  [[ -n ${SUMMARY:-} ]] && echo "$row  $(date -u +%FT%TZ) ${limit[*]}" >>"$SUMMARY"
done
