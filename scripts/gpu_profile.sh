#!/usr/bin/env bash
# scripts/gpu_profile.sh — where a decode step's time goes, per kernel, on the GPU machine: builds
# splitflow like scripts/gpu_bench.sh, then runs `bench latency` under Nsight Compute with only
# the decode steps collected (bench latency marks them with Backend::profile_region) and prints
# the kernels by total time: name and grid, launches, mean and total µs, share of the profiled time.
# Each case in $CASES is config:batch:input_len[:kv_cache_dtype] (default llama-3-8b:1:512
# llama-3-8b:64:512; the cache dtype defaults to auto; a config ending in .gguf is a model file,
# run as it is instead of bench/configs/<config>.json with dummy weights);
# $STEPS decode steps are collected per case (default 2); PHASE=prefill collects the prompt's
# prefill instead (input_len tokens in chunks of the 2048-token budget). ncu times each kernel
# alone (serialized, caches flushed between launches: --cache-control all), so the total is above
# the graph replay's step time; the shares are what to read. DETAIL=regex adds ncu's sections
# (throughput, occupancy, scheduler, warp stalls) for the first matching kernel.
set -uo pipefail
LOGS=${LOGS:-/tmp/splitflow-gpu-logs}
source "$(dirname "$0")/gpu_common.sh"
cases=${CASES:-"llama-3-8b:1:512 llama-3-8b:64:512"}
steps=${STEPS:-2}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -x $ncu ]] || { echo "ncu not found"; exit 1; }
gpu_build splitflow

rc=0
for c in $cases; do
  IFS=: read -r config batch input_len kv_dtype <<<"$c"
  kv_dtype=${kv_dtype:-auto}
  source_args=(--dummy-weights --config "bench/configs/$config.json")
  [[ $config == *.gguf ]] && source_args=(--model "$config")
  name=$(basename "$config" .gguf)-b$batch-in$input_len-kv$kv_dtype
  phase_args=()
  if [[ ${PHASE:-decode} == prefill ]]; then
    phase_args=(--profile-prefill); name=$name-prefill
    echo "=== $name: prefill of $input_len tokens ==="
  else
    echo "=== $name: $steps decode steps ==="
  fi
  # The output length leaves one warm-up step (recording the graph) before the collected ones.
  "$ncu" --profile-from-start off --clock-control none --cache-control all --metrics gpu__time_duration.sum \
    --csv --page raw "$build/splitflow" bench latency --backend cuda "${source_args[@]}" --batch "$batch" --input-len "$input_len" --output-len $((steps + 1)) --kv-cache-dtype "$kv_dtype" \
    "${phase_args[@]}" --results-dir "$logs/results" >"$logs/$name.csv" 2>"$logs/$name.err" || { rc=1; tail -5 "$logs/$name.err"; continue; }
  python3 - "$logs/$name.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
name_col, time_col = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
grid_col = cols.index("Grid Size") if "Grid Size" in cols else None
unit = rows[head + 1][time_col]
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1.0)
total, count = collections.Counter(), collections.Counter()
for r in rows[head + 2:]:
    if len(r) <= time_col: continue
    try: t = float(r[time_col].replace(",", "")) * scale
    except ValueError: continue
    n = r[name_col].split("(")[0][:44] + (" " + r[grid_col] if grid_col is not None else "")
    total[n] += t; count[n] += 1
all_us = sum(total.values())
print(f"{'kernel':60} {'launches':>8} {'mean us':>9} {'total us':>10} {'share':>6}")
for n, t in total.most_common(14):
    print(f"{n:60} {count[n]:8d} {t / count[n]:9.2f} {t:10.1f} {t / all_us:6.1%}")
print(f"{'all kernels':60} {sum(count.values()):8d} {'':9} {all_us:10.1f}")
PY
  # DETAIL=regex: ncu's throughput, occupancy, scheduler and stall sections for the first collected
  # launch of each kernel whose name matches.
  if [[ -n ${DETAIL:-} ]]; then
    "$ncu" --profile-from-start off -k "regex:$DETAIL" --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section LaunchStats "$build/splitflow" bench latency \
      --backend cuda "${source_args[@]}" --batch "$batch" --input-len "$input_len" \
      --output-len $((steps + 1)) --kv-cache-dtype "$kv_dtype" "${phase_args[@]}" --results-dir "$logs/results" \
      2>"$logs/$name-detail.err" | grep -E "^ +[A-Z][^-]* {2,}[^ ]+ {2,}[0-9.,]+$|stall" | cut -c1-200 | head -90
  fi
done
exit $rc
