#!/usr/bin/env bash
# Packs all-MiniLM-L6-v2 (scripts/setup.sh's .cache/models copy, 88 MB of fp32) for the GPU
# machine, which cannot download it and takes 64 MiB of carried files: its matrices in bf16 (what
# the CUDA backend's upload() makes of them anyway; norms and biases stay fp32), xz-compressed
# into .carry-minilm-xz/minilm.tar.xz (~32 MB). On the GPU machine:
#   run(carry [".carry/include", ".carry-minilm-xz"]):
#     mkdir -p /tmp/mc && tar -C /tmp/mc -xJf .carry-minilm-xz/minilm.tar.xz &&
#     SPLITFLOW_MODEL_CACHE=/tmp/mc FILTER='*CudaEncoder*' TP_TEST=0 BENCH=0 scripts/gpu_tp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
src=.cache/models/all-MiniLM-L6-v2
[[ -f $src/model.safetensors ]] || { echo "carry_minilm: $src is absent (run scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/all-MiniLM-L6-v2" .carry-minilm-xz
python3 - "$src" "$work/all-MiniLM-L6-v2" <<'PY'
import os, shutil, sys
import torch
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
tensors = load_file(os.path.join(src, "model.safetensors"))
save_file({k: (v.to(torch.bfloat16) if v.dim() == 2 else v).contiguous() for k, v in tensors.items()},
          os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
for name in os.listdir(src):
    if name != "model.safetensors":
        path = os.path.join(src, name)
        (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, os.path.join(dst, name))
PY
tar -C "$work" -cf - all-MiniLM-L6-v2 | xz -T2 -6 >.carry-minilm-xz/minilm.tar.xz
echo "carry_minilm: $(du -h .carry-minilm-xz/minilm.tar.xz | cut -f1) in .carry-minilm-xz/minilm.tar.xz"
