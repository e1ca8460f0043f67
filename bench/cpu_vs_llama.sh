#!/usr/bin/env bash
# bench/cpu_vs_llama.sh — issue 31's CPU table in one invocation: `splitflow bench latency` with
# llama.cpp's llama-bench as the peer (same GGUF, threads, prompt and output lengths, minutes apart)
# for each model and thread count, then a markdown table of both engines' speeds, their ratio and
# the bandwidth / FMA-peak fractions measured in the same run. The load average is printed before
# each pair: ratios taken while other jobs run are not the engines' (docs/cpu.md, "Load").
#   bench/cpu_vs_llama.sh [MODEL.gguf ...]
# Environment: SPLITFLOW (build-cpu/splitflow), LLAMA_BENCH (.cache/llama.cpp/build/bin/llama-bench,
# built by bench/build_llama_cpp.sh), THREADS ("2 1"), INPUT / OUTPUT (64 / 64), ROUNDS (1: pairs
# of runs per model and thread count, then their median ratios too),
# RESULTS (bench/results/cpu). Default models: the TinyLlama-shape GGUFs of bench/make_gguf.py, the
# K-quant files made from its F16 one (for t in Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K; do
#   .cache/llama.cpp/build/bin/llama-quantize .cache/gguf/tinyllama-f16.gguf
#   .cache/gguf/tinyllama-${t,,}.gguf $t 2; done) and the two real GGUFs of scripts/fetch_models.py,
# those present.
set -uo pipefail
cd "$(dirname "$0")/.."
splitflow=${SPLITFLOW:-build-cpu/splitflow}
llama_bench=${LLAMA_BENCH:-.cache/llama.cpp/build/bin/llama-bench}
results=${RESULTS:-bench/results/cpu}
[[ -x $splitflow ]] || { echo "no splitflow binary at $splitflow (set SPLITFLOW)" >&2; exit 2; }
[[ -x $llama_bench ]] || { echo "no llama-bench at $llama_bench: run bench/build_llama_cpp.sh (or set LLAMA_BENCH)" >&2; exit 2; }

models=("$@")
if (( ${#models[@]} == 0 )); then
  for file in .cache/gguf/tinyllama-{f16,q8_0,q4_0,q2_k,q3_k_m,q4_k_m,q5_k_m,q6_k}.gguf \
              .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf .cache/models/gemma-3-270m-q4_k_m.gguf; do
    [[ -f $file ]] && models+=("$file")
  done
fi
(( ${#models[@]} > 0 )) || { echo "no GGUF found: run bench/make_gguf.py and scripts/fetch_models.py" >&2; exit 2; }

mkdir -p "$results"
written=()
for threads in ${THREADS:-2 1}; do
  for model in "${models[@]}"; do
    for round in $(seq "${ROUNDS:-1}"); do
      echo "== $(basename "$model"), $threads thread(s), round $round, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
      log=$("$splitflow" bench latency --model "$model" -t "$threads" --input-len "${INPUT:-64}" \
            --output-len "${OUTPUT:-64}" --llama-bench "$llama_bench" --results-dir "$results" 2>&1)
      file=$(sed -n 's/^result: //p' <<<"$log")
      [[ -n $file ]] || { echo "$log" | tail -5 >&2; continue; }
      written+=("$file")
    done
  done
done

python3 - "${written[@]}" <<'EOF'
import json, os, statistics, sys
rows = [json.load(open(path)) for path in sys.argv[1:]]
print("| model | threads | prefill tok/s sf / llama | ratio | decode tok/s sf / llama | ratio "
      "| bw GB/s | decode bw fraction sf / llama | peak GFLOP/s | prefill peak fraction sf / llama |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    p = r.get("peer") or {}
    name = os.path.basename(r["model"].split(" ")[0])
    print(f"| {name} | {p.get('threads', '?')} "
          f"| {r['prefill_tokens_per_s']:.1f} / {p.get('prefill_tokens_per_s', float('nan')):.1f} "
          f"| {r.get('prefill_vs_peer', float('nan')):.2f} "
          f"| {r['decode_tokens_per_s']:.2f} / {p.get('decode_tokens_per_s', float('nan')):.2f} "
          f"| {r.get('decode_vs_peer', float('nan')):.2f} | {r['bandwidth_gbps']:.1f} "
          f"| {r['fraction_of_bandwidth']:.2f} / {p.get('fraction_of_bandwidth', float('nan')):.2f} "
          f"| {r['gemm_tflops'] * 1000:.0f} "
          f"| {r['prefill_fraction_of_gemm']:.2f} / {p.get('prefill_fraction_of_gemm', float('nan')):.2f} |")
# ROUNDS > 1: each (model, threads)'s median ratios over its rounds (pairs run back to back, so a
# drift of the machine's bandwidth between pairs does not decide the ratio).
groups = {}
for r in rows:
    groups.setdefault((os.path.basename(r["model"].split(" ")[0]), (r.get("peer") or {}).get("threads", "?")), []).append(r)
if any(len(g) > 1 for g in groups.values()):
    print("\n| model | threads | rounds | median prefill ratio | median decode ratio |")
    print("|---|---:|---:|---:|---:|")
    for (name, threads), g in groups.items():
        print(f"| {name} | {threads} | {len(g)} | {statistics.median(r.get('prefill_vs_peer', float('nan')) for r in g):.2f} "
              f"| {statistics.median(r.get('decode_vs_peer', float('nan')) for r in g):.2f} |")
print("\nresults: " + " ".join(sys.argv[1:]))
EOF
