#!/usr/bin/env bash
# scripts/gpu_serve_bench.sh — issue 4's serving benchmarks on the GPU machine (docs/bench-serving.md):
# configures with -DSPLITFLOW_CUDA=ON like scripts/gpu_bench.sh (the same .carry/include handling:
# pcre2.h, xxhash.h and the header-only httplib.h, see docs/serving.md), builds only the splitflow
# target, then runs the parts named in $PARTS (default: all four, in this order):
#   throughput   `bench throughput`: 1000 requests of 1000 in / 1000 out, all at once
#   splitfuse    `splitflow serve` (Dynamic SplitFuse) + `bench serve --sweep` at 2048 in / 256 out
#   nosplitfuse  the same sweep against `splitflow serve --no-splitfuse`
#   trace        `splitflow serve` + `bench serve --trace` (Azure conversation trace at its own rate)
# Each server is `splitflow serve --backend cuda --config $CONFIG --dummy-weights`, started in the
# background, waited for on /health and stopped with SIGTERM after its part.
# Each part fits one 10-minute device command with the defaults, e.g. PARTS=throughput first
# (it also builds), then PARTS=splitfuse, PARTS=nosplitfuse, PARTS=trace on the warm machine.
#
# Only result files go to $OUT (at most 8: throughput JSON; JSON + CSV per sweep and for the
# trace; the SplitFuse vs prefill-first plot when gnuplot is there); logs go to $LOGS. Without
# $OUT the results go to bench/results/serve/.
# Knobs: CONFIG (bench/configs/llama-3-8b.json), KV_CACHE_GB (54), MAX_SEQS (224: 1000+1000 tokens each fit the 54 GiB),
# MAX_BATCH_TOKENS (2048, the SplitFuse budget), RATES (2,4,6,8,10,12,14,16), DURATION (30 s of
# arrivals per rate), TRACE (.carry/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv),
# TRACE_DURATION (300 s of the trace), PORT (8391), THROUGHPUT_NAME (1000x1000: the throughput
# JSON is throughput-$THROUGHPUT_NAME.json).
# A dry run on the CPU (checks the script, not the numbers): CUDA=OFF BACKEND=cpu
# MODEL_ARGS="--model ../shared/models/stories260K-hf" THROUGHPUT_LENS="--num-requests 16 --input-len 64
# --output-len 32" SWEEP_LENS="--input-len 64 --output-len 32" RATES=5,10 DURATION=2 TRACE_DURATION=3.
set -uo pipefail
LOGS=${LOGS:-/tmp/splitflow-serve-logs}  # kept out of $OUT: the device tool returns few files
source "$(dirname "$0")/gpu_common.sh"
out=${OUT:-$root/bench/results/serve}
work=$logs/results
parts=${PARTS:-"throughput splitfuse nosplitfuse trace"}
config=${CONFIG:-bench/configs/llama-3-8b.json}
kv_cache_gb=${KV_CACHE_GB:-54}
max_seqs=${MAX_SEQS:-224}
max_batch_tokens=${MAX_BATCH_TOKENS:-2048}
rates=${RATES:-2,4,6,8,10,12,14,16}
duration=${DURATION:-30}
trace=${TRACE:-$carry/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv}
trace_duration=${TRACE_DURATION:-300}
port=${PORT:-8391}
backend=${BACKEND:-cuda}
read -r -a model_args <<<"${MODEL_ARGS:-"--config $config --dummy-weights"}"
read -r -a throughput_lens <<<"${THROUGHPUT_LENS:-"--num-requests 1000 --input-len 1000 --output-len 1000"}"
read -r -a sweep_lens <<<"${SWEEP_LENS:-"--input-len 2048 --output-len 256"}"
url=http://127.0.0.1:$port
mkdir -p "$out" "$logs" "$work"

gpu_configure_check() {
  if grep -q "Boost.Beast not found\|cpp-httplib not found" "$logs/configure.log"; then
    echo "Boost or cpp-httplib missing: run scripts/carry_boost.sh and carry httplib.h in $carry/include (docs/serving.md)"
    exit 1
  fi
}
gpu_build splitflow
splitflow=$build/splitflow
rc=0

# The SM clock and board power while a part runs (sampled every 500 ms by nvidia-smi): a step
# that streams HBM next to busy tensor cores can hold the board at its power limit, and the clock
# it drops to is part of why a step sits above its byte roofline.
telemetry_start() {
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv,noheader,nounits -lms 500 \
    >"$logs/telemetry-$1.csv" 2>/dev/null &
  telemetry_pid=$!
}
telemetry_stop() {
  [[ -n ${telemetry_pid:-} ]] || return 0
  kill "$telemetry_pid" 2>/dev/null; wait "$telemetry_pid" 2>/dev/null; telemetry_pid=
  awk -F', *' '$3 > 0.8 * $4 { n++; clock += $1; power += $3; max = $2; limit = $4 }
    END { if (n) printf "telemetry: %d samples at > 80%% of the power limit: SM clock %.0f of %d MHz, power %.0f of %.0f W\n",
          n, clock / n, max, power / n, limit; else print "telemetry: no sample above 80% of the power limit" }' \
    "$logs/telemetry-$1.csv"
}

# GET /health over bash's /dev/tcp (no curl needed): 0 once the server answers 200.
healthy() {
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  local status
  read -r -t 5 status <&3
  exec 3<&- 3>&-
  [[ $status == *" 200"* ]]
}

server_pid=
start_server() {  # log name, then extra `splitflow serve` arguments
  local name=$1; shift
  "$splitflow" serve --backend "$backend" "${model_args[@]}" --port "$port" --max-seqs "$max_seqs" \
    --max-batch-tokens "$max_batch_tokens" --kv-cache-gb "$kv_cache_gb" --served-model-name llama-3-8b "$@" \
    >"$logs/server-$name.log" 2>&1 &
  server_pid=$!
  local waited=0
  until healthy 2>/dev/null; do
    if ! kill -0 "$server_pid" 2>/dev/null || ((waited >= 300)); then
      echo "server ($name) did not come up after $waited s:"; tail -20 "$logs/server-$name.log"
      stop_server
      return 1
    fi
    sleep 1; ((waited++))
  done
  echo "server ($name) up after $waited s: $(grep -m1 'KV cache' "$logs/server-$name.log" | sed 's/^ *//')"
}
stop_server() {
  [[ -n $server_pid ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null
  wait "$server_pid" 2>/dev/null
  server_pid=
}
trap stop_server EXIT

newest() { ls -t "$1"/*."$2" 2>/dev/null | head -1; }  # dir, extension

run_sweep() {  # name, label, extra `splitflow serve` arguments
  local name=$1 label=$2; shift 2
  echo "=== sweep $name: $rates req/s, $duration s each, ${sweep_lens[*]} ==="
  start_server "$name" "$@" || { rc=1; return; }
  rm -rf "${work:?}/$name"
  local run_start=$SECONDS
  "$splitflow" bench serve --url "$url" --sweep "$rates" --duration "$duration" "${sweep_lens[@]}" \
    --stop-after-misses 2 --no-plot --label "$label" --results-dir "$work/$name" 2>"$logs/bench-$name.log"
  local status=$?
  [[ $status -ne 0 ]] && { rc=$status; tail -5 "$logs/bench-$name.log"; }
  echo "exit $status after $((SECONDS - run_start)) s"
  stop_server
  cp "$(newest "$work/$name" json)" "$out/serve-sweep-$name.json" && cp "$(newest "$work/$name" csv)" "$out/serve-sweep-$name.csv"
}

for part in $parts; do
  case $part in
    throughput)
      echo "=== throughput: ${throughput_lens[*]} ==="
      rm -rf "${work:?}/throughput"
      run_start=$SECONDS
      telemetry_start throughput
      "$splitflow" bench throughput --backend "$backend" "${model_args[@]}" "${throughput_lens[@]}" \
        --max-seqs "$max_seqs" --max-batch-tokens "$max_batch_tokens" \
        --kv-cache-gb "$kv_cache_gb" --results-dir "$work/throughput" 2>"$logs/throughput.log"
      status=$?
      telemetry_stop throughput
      [[ $status -ne 0 ]] && { rc=$status; tail -5 "$logs/throughput.log"; }
      echo "exit $status after $((SECONDS - run_start)) s"
      cp "$(newest "$work/throughput" json)" "$out/throughput-${THROUGHPUT_NAME:-1000x1000}.json"
      ;;
    splitfuse) run_sweep splitfuse "SplitFuse, budget $max_batch_tokens" ;;
    nosplitfuse) run_sweep nosplitfuse "prefill-first" --no-splitfuse ;;
    trace)
      echo "=== Azure conversation trace, first $trace_duration s at its own rate ==="
      if [[ ! -f $trace ]]; then
        echo "no trace at $trace: carry it (cp ../shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv $carry/shared/traces/azure_llm_2023/)"
        rc=1; continue
      fi
      start_server trace || { rc=1; continue; }
      rm -rf "${work:?}/trace"
      run_start=$SECONDS
      "$splitflow" bench serve --url "$url" --trace "$trace" --duration "$trace_duration" \
        --label "conv trace, SplitFuse budget $max_batch_tokens" --results-dir "$work/trace" 2>"$logs/bench-trace.log"
      status=$?
      [[ $status -ne 0 ]] && { rc=$status; tail -5 "$logs/bench-trace.log"; }
      echo "exit $status after $((SECONDS - run_start)) s"
      stop_server
      cp "$(newest "$work/trace" json)" "$out/serve-trace-conv.json" && cp "$(newest "$work/trace" csv)" "$out/serve-trace-conv.csv"
      ;;
    *) echo "unknown part '$part' (throughput, splitfuse, nosplitfuse, trace)"; rc=2 ;;
  esac
done

# The comparison plot, once both sweeps are there (here or, without gnuplot, where the CSVs land).
if [[ -f $out/serve-sweep-splitfuse.csv && -f $out/serve-sweep-nosplitfuse.csv ]]; then
  if command -v gnuplot >/dev/null; then
    gnuplot -c scripts/plot_latency_vs_rate.gnuplot "$out/serve-sweep-2048in-256out.svg" 2000 250 \
      "$out/serve-sweep-splitfuse.csv" "SplitFuse" "$out/serve-sweep-nosplitfuse.csv" "prefill-first" 2>/dev/null \
      && echo "plot: $out/serve-sweep-2048in-256out.svg"
  else
    echo "gnuplot not here: draw the plot where the CSVs land (docs/bench-serving.md)"
  fi
fi
exit $rc
