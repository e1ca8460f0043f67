#!/usr/bin/env bash
# scripts/gpu_quant_models.sh — the real quantized GGUFs on the GPU machine (issue 23): logits
# against transformers (tests/python/test_gguf_logits.py --backend cuda), perplexity, decode speed
# against the same model dequantized to bf16 (and llama.cpp's llama-bench when PEER is set), and the
# quality table (bench/quant_quality.py) when QUALITY=1.
#
# The models do not fit one transfer (64 MiB): split them here into .cache/dev/<name>.partNN
# (`split -n 2 -d FILE .cache/dev/smol.part`), carry one part per call (the device keeps ignored
# files between calls while it stays warm), and run this with PARTS_ONLY=1 until the last one.
# The device lacks the gguf and accelerate packages: carry them in .carry/py (copied from pip with
# their *.dist-info: transformers checks the gguf version through its metadata).
#   MODELS="smol gemma" QUALITY=1 scripts/gpu_quant_models.sh
#   PPL_QUANTIZATIONS="fp8-weight-only fp8": also the bf16 requantization's perplexity with each.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
out=$logs
mkdir -p .cache/models "$out"
declare -A files=([smol]=SmolLM2-135M-Instruct.Q4_1.gguf [gemma]=gemma-3-270m-q4_k_m.gguf)
ls -la .cache/dev 2>/dev/null | tail -n +4 | awk '{print $5, $9}'
[[ ${PARTS_ONLY:-0} == 1 ]] && exit 0
for name in ${MODELS:-smol}; do
  file=.cache/models/${files[$name]}
  [[ -f $file ]] || cat .cache/dev/$name.part* > "$file"
  echo "$file: $(sha256sum "$file" | cut -c1-16) $(stat -c %s "$file") bytes"
done

gpu_build splitflow
bin=$build/splitflow
export PYTHONPATH=$root/.carry/py${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader

for name in ${MODELS:-smol}; do
  file=.cache/models/${files[$name]}
  extra=(); [[ $name == gemma ]] && extra=(--long-prompt 512)
  echo "=== $name: logits vs transformers on cuda"
  python3 tests/python/test_gguf_logits.py --splitflow "$bin" --models .cache/models --model "${files[$name]}" \
    --backend cuda "${extra[@]}" 2>&1 | grep -v "Converting\|Loading weights" | tee "$out/$name-logits.log" | tail -8
  echo "=== $name: perplexity (40 chunks of 512)"
  "$bin" perplexity --model "$file" --file .carry/shared/data/wiki.test.raw --ctx 512 --chunks 40 --backend cuda 2>&1 | tail -1
  echo "=== $name: decode speed, quantized vs the same weights in bf16"
  "$bin" quantize --model "$file" --type bf16 --out ".cache/models/$name-bf16.gguf" | tail -1
  # The same weights in bf16 quantized at load (PPL_QUANTIZATIONS, e.g. "fp8-weight-only fp8": FP8's
  # perplexity cost against the bf16 row).
  for quantization in ${PPL_QUANTIZATIONS:-}; do
    for q in none "$quantization"; do
      [[ $q == none && $quantization != "${PPL_QUANTIZATIONS%% *}" ]] && continue  # the bf16 row once
      args=(); [[ $q != none ]] && args=(--quantization "$q")
      echo "=== $name bf16 requant, --quantization $q: perplexity (40 chunks of 512)"
      "$bin" perplexity --model ".cache/models/$name-bf16.gguf" --file .carry/shared/data/wiki.test.raw --ctx 512 \
        --chunks 40 --backend cuda "${args[@]}" 2>&1 | tail -1
    done
  done
  for model in "$file" ".cache/models/$name-bf16.gguf"; do
    "$bin" bench latency --backend cuda --model "$model" --input-len 128 --output-len 128 --results-dir "$out/results" \
      ${PEER:+--llama-bench $PEER} 2>/dev/null | grep -E "decode tokens/s|prefill tokens/s|llama.cpp|result:"
  done
done
if [[ ${QUALITY:-0} == 1 ]]; then
  for name in ${MODELS:-smol}; do
    python3 bench/quant_quality.py --model ".cache/models/${files[$name]}" --splitflow "$bin" --backend cuda \
      --file .carry/shared/data/wiki.test.raw --chunks 40 --results-dir "$out/results" 2>&1 | tail -32
  done
fi
