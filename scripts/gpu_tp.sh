#!/usr/bin/env bash
# scripts/gpu_tp.sh — models split over devices on the GPU machine: tensor parallelism (nvidia-h100-x2
# / -x4) and the GPU/CPU split of -ngl (one GPU). Builds splitflow and test_backend_cuda
# (scripts/gpu_common.sh), then
#   1. FILTER's single-GPU CUDA tests (default: the sampling rule, token masks, quantized GEMVs,
#      the encoder-decoder kernels and fixtures (gtest names: a leading * matches 'Fixtures/');
#      FILTER=none skips them),
#   2. tests/python/test_tensor_parallel.py (TP_TEST=1): every HF fixture (or those of ONLY) at TP 2
#      (and 4) when the GPUs allow, and every -ngl split, against transformers and one GPU's tokens,
#   3. BENCH=1: `bench latency` on CONFIG (default Llama-3-8B, dummy weights, bf16) at TP 1 and each
#      size of SIZES (default: 2, and 4 when 4 GPUs are visible), batch 1 and BATCH2 (default 32),
#   4. HYBRID=1: `bench latency` on HYBRID_CONFIG (default TinyLlama-1.1B, dummy weights) at each
#      -ngl of NGL (default "all 16 11 6"; all: the whole model on the GPU; auto: the engine's
#      pick), each with --offload-rows of OFFLOAD (default "32", the engine's default; "0 32" A/Bs
#      llama.cpp's op offload), HYBRID_INPUT / HYBRID_OUTPUT tokens (512 / 128), HYBRID_THREADS CPU threads (both
#      engines; default all cores); with GGUF=FILE and
#      LLAMA_BENCH=BIN, on that file with llama.cpp's llama-bench at the same split in each run.
#   5. EMBED=1: `bench embed` on the all-MiniLM-L6-v2 shape (dummy weights), 32- and 512-token inputs.
#   6. AUTO_CAP=F: `serve -ngl auto --gpu-memory-utilization F` on HYBRID_CONFIG (dummy weights): the
#      split the engine picks where the model does not fit that share, and one completion.
#   7. EMBED_SERVE=1: `serve` of the all-MiniLM-L6-v2 shape (dummy weights) and `bench serve
#      --endpoint embeddings` against it: EMBED_LENS-token inputs (default 32; "32 512" both),
#      EMBED_BATCH per request (default 64),
#      float and base64 answers, EMBED_CONCURRENCY requests in flight (default 64): the
#      /v1/embeddings throughput issue 28 asks for, HTTP and JSON included.
#   PEER_BUILD=1 first builds llama.cpp's llama-bench / llama-quantize with CUDA (bench/build_llama_cpp.sh;
#   the source carried as .carry/llama.cpp-src.tar.gz, unpacked into .cache/llama.cpp), and
#   MAKE_GGUF="CONFIG:TYPE ..." writes .cache/gguf/<config>-<type>.gguf with bench/make_gguf.py.
# Every ratio compares runs of one call on one machine; JSON in $OUT/tp-results. Logs go to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
nvidia-smi topo -m 2>/dev/null | head -8
gpu_build ${TARGETS:-splitflow test_backend_cuda}

if [[ ${PEER_BUILD:-0} == 1 ]]; then
  [[ -f .cache/llama.cpp/CMakeLists.txt ]] || { mkdir -p .cache && tar xzf "$carry/llama.cpp-src.tar.gz" -C .cache; }
  start=$SECONDS
  CUDA=1 bench/build_llama_cpp.sh >"$logs/llama_cpp_build.log" 2>&1 || { tail -20 "$logs/llama_cpp_build.log"; exit 1; }
  echo "llama.cpp build: $((SECONDS - start)) s"
fi
for item in ${MAKE_GGUF:-}; do
  out=.cache/gguf/$(basename "${item%%:*}" .json)-${item##*:}.gguf
  [[ -f $out ]] || python3 bench/make_gguf.py --config "bench/configs/${item%%:*}.json" --type "${item##*:}" --out "$out" \
    2>&1 | tail -2
done

rc=0
filter=${FILTER:-*SamplingRule*:*TokenMask*:*CudaQuant*:CudaKernels.Sample*:*CudaEncDec*:*RelativePositionBias*:*CrossAttention*:*CudaMatmulOffload*}
if [[ $filter != none ]]; then
  timeout 400 "$build/tests/test_backend_cuda" --gtest_filter="$filter" >"$logs/gpu_tests.log" 2>&1 || rc=1
  echo "tests ($filter): $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$logs/gpu_tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure" "$logs/gpu_tests.log" | head -30
fi

if [[ ${TP_TEST:-1} == 1 ]]; then
  sizes=""
  (( gpus >= 2 )) && sizes=2
  (( gpus >= 4 )) && sizes=2,4
  timeout 900 python3 tests/python/test_tensor_parallel.py --splitflow "$build/splitflow" --sizes "$sizes" --gpu-layers \
    ${ONLY:+--only "$ONLY"} \
    >"$logs/tp_test.log" 2>&1
  tp_rc=$?
  (( tp_rc != 0 )) && rc=1
  echo "test_tensor_parallel.py exit $tp_rc: $(tail -1 "$logs/tp_test.log")"
  grep -E "FAIL|rror" "$logs/tp_test.log" | head -20
  timeout 600 python3 tests/python/test_gpu_cpu_serve.py --splitflow "$build/splitflow" \
    --shared "${SPLITFLOW_SHARED_DIR:-$root/../shared}" >"$logs/gpu_cpu_serve.log" 2>&1
  serve_rc=$?
  (( serve_rc != 0 && serve_rc != 77 )) && rc=1
  echo "test_gpu_cpu_serve.py exit $serve_rc: $(tail -3 "$logs/gpu_cpu_serve.log" | tr '\n' ' ')"
fi

results=$logs/tp-results
mkdir -p "$results"
latency() {  # log name, then bench latency arguments
  local name=$1; shift
  timeout 300 "$build/splitflow" bench latency --backend cuda --results-dir "$results" "$@" >"$logs/latency-$name.log" 2>&1
  echo "=== $name (exit $?) ==="
  grep -E "TTFT|prefill tokens|decode tokens|fraction of band|llama.cpp|error" "$logs/latency-$name.log" | head -9
}
if [[ ${BENCH:-1} == 1 ]]; then
  config=${CONFIG:-bench/configs/llama-3-8b.json}
  sizes=${SIZES:-2}
  (( gpus >= 4 )) && sizes=${SIZES:-2 4}
  for batch in 1 ${BATCH2:-32}; do
    for tp in 1 $sizes; do
      latency "tp$tp-b$batch" --dummy-weights --config "$config" --input-len 512 --output-len 128 --batch "$batch" \
        --tensor-parallel-size "$tp"
    done
  done
fi
if [[ ${HYBRID:-0} == 1 ]]; then
  if [[ -n ${GGUF:-} ]]; then
    model=(--model "$GGUF" ${LLAMA_BENCH:+--llama-bench "$LLAMA_BENCH"})
  else
    model=(--dummy-weights --config "${HYBRID_CONFIG:-bench/configs/tinyllama-1.1b.json}")
  fi
  for ngl in ${NGL:-all 16 11 6}; do
    for rows in ${OFFLOAD:-32}; do
      [[ $ngl == all && $rows != 0 ]] && continue
      split=()
      [[ $ngl != all ]] && split=(-ngl "$ngl" --offload-rows "$rows")
      latency "ngl-$ngl-offload-$rows" "${model[@]}" --input-len "${HYBRID_INPUT:-512}" \
        --output-len "${HYBRID_OUTPUT:-128}" "${split[@]}" ${HYBRID_THREADS:+-t "$HYBRID_THREADS"}
    done
  done
fi
if [[ ${EMBED:-0} == 1 ]]; then
  # Embedding throughput (issue 28's target: >= 1M tok/s for MiniLM at short inputs on one H100);
  # dummy weights of its shape (bench/configs/all-minilm-l6-v2.json), short and 512-token inputs.
  for len in 32 512; do
    timeout 300 "$build/splitflow" bench embed --device cuda --dummy-weights --config bench/configs/all-minilm-l6-v2.json \
      --input-len "$len" --num-inputs $((len == 32 ? 131072 : 8192)) --max-batch-tokens 65536 --max-seqs 2048 \
      --results-dir "$results" >"$logs/embed-$len.log" 2>&1
    echo "=== bench embed, $len-token inputs (exit $?) ==="
    grep -E "tokens/s|inputs/s|fraction|error" "$logs/embed-$len.log" | head -4
  done
fi
if [[ -n ${AUTO_CAP:-} ]]; then
  # -ngl auto on a GPU capped to a share of its memory the model does not fit: the engine picks the
  # split from what it measures, then serves a completion.
  timeout 120 "$build/splitflow" serve --dummy-weights --config "${HYBRID_CONFIG:-bench/configs/tinyllama-1.1b.json}" \
    --device cuda -ngl auto --gpu-memory-utilization "$AUTO_CAP" --max-model-len 2048 --max-seqs 4 --port 18123 \
    ${OFFLOAD_ROWS:+--offload-rows "$OFFLOAD_ROWS"} >"$logs/auto_cap.log" 2>&1 &
  for _ in $(seq 100); do curl -sf localhost:18123/health >/dev/null && break; sleep 1; done
  curl -s -m 60 localhost:18123/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 16, "temperature": 0}' >"$logs/auto_cap_reply.json"
  pkill -INT -f "splitflow serve --dummy-weights" ; sleep 3
  echo "=== -ngl auto at --gpu-memory-utilization $AUTO_CAP ==="
  grep -E "ngl auto|GPU/CPU split|kv cache" "$logs/auto_cap.log" | head -4
  head -c 300 "$logs/auto_cap_reply.json"; echo
fi
if [[ ${EMBED_SERVE:-0} == 1 ]]; then
  "$build/splitflow" serve --dummy-weights --config bench/configs/all-minilm-l6-v2.json --device cuda --port 18124 \
    --max-batch-tokens 65536 --max-seqs 2048 --max-queue 65536 >"$logs/embed_serve.log" 2>&1 &
  for _ in $(seq 100); do curl -sf localhost:18124/health >/dev/null && break; sleep 1; done
  batch=${EMBED_BATCH:-64}
  for len in ${EMBED_LENS:-32}; do
    for format in float base64; do
      # As many inputs as 8M tokens (32-token inputs: 4,096 requests of 64).
      timeout 200 "$build/splitflow" bench serve --url http://127.0.0.1:18124 --endpoint embeddings --rate 100000 \
        --num-requests $((8388608 / len / batch)) --input-len "$len" --inputs-per-request "$batch" --prompt-vocab 30000 \
        --encoding-format "$format" --max-concurrency "${EMBED_CONCURRENCY:-64}" --label "embeddings-$len-$format" \
        --results-dir "$results" >"$logs/embed_serve_${len}_$format.log" 2>&1
      echo "=== /v1/embeddings, $len-token inputs, $batch a request, $format (exit $?) ==="
      grep -E "failed|error" "$logs/embed_serve_${len}_$format.log" | head -3
      python3 -c "import json,glob; d=json.load(open(sorted(glob.glob('$results/serve-*.json'))[-1])); s=d['runs'][0]['summary']; print({k: s.get(k) for k in ('num_completed','num_failed','duration_s','request_throughput_rps','total_token_throughput_tps')})"
    done
  done
  pkill -INT -f "splitflow serve --dummy-weights --config bench/configs/all-minilm" ; sleep 3
fi
exit $rc
