#!/usr/bin/env python3
"""Models split over devices, end to end through the CLI: tensor parallelism on GPUs (one process
per GPU, rank 0 leading) and the GPU/CPU split of llama.cpp's -ngl (one process, one GPU).

For every HF fixture (tests/fixtures/hf: tiny random-weight checkpoints with transformers' fp32
logits) and every layout the GPUs allow: each tensor-parallel size of --sizes the model's heads
divide into (`--tensor-parallel-size N`, N GPUs), two pipeline stages (`--pipeline-parallel-size
2`) when --sizes allows 2 GPUs, the 2 x 2 grid (Inferflow's hybrid partition: each stage's
tensor-parallel group of its own) when it allows 4, and with --gpu-layers every split of its layers
(`-ngl k`, k = 1 .. layers - 1: the last k layers and the head on the GPU, the first ones on the
CPU in f32): `splitflow generate --device cuda ... --prompt-ids P --temperature 0 --logits-out F`
on each fixture prompt. The logits of every step (the prefill's last row, then
the decode steps fed the reference's greedy tokens are not available through generate, so the run
decodes its own greedy tokens) are compared with transformers' at the positions where both
continuations still agree: relative L2 error <= 0.06, the single-GPU tolerance of
tests/backend_cuda/cuda_fixtures_test.cpp (bf16 weights, activations and KV cache). The greedy
tokens of a layout must equal those of one GPU up to the first step whose top-two margin (one
GPU's logits) is under 5% of max |logit| (bf16 sums in another order may flip a near tie).

Exit status 77 (skipped) without numpy, or with no layout the GPUs allow (tensor parallelism needs
2 GPUs, the GPU/CPU split 1).
Usage: test_tensor_parallel.py --splitflow BIN [--fixtures DIR] [--sizes 2,4] [--gpu-layers] [--only a,b]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as error:
    print(f"skipped: {error}")
    sys.exit(77)


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def generate(binary, fixture_dir, prompt, steps, layout_flags, logits_path):
    command = [binary, "generate", "--device", "cuda", "--model", fixture_dir, "--prompt-ids",
               ",".join(map(str, prompt)), "--max-tokens", str(steps), "--temperature", "0",
               "--block-size", "4", "--logits-out", logits_path] + layout_flags
    # The fixtures are tiny (seconds): a run past 90 s hangs, and must not take the whole call's time.
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as hung:
        stderr = hung.stderr.decode(errors="replace") if isinstance(hung.stderr, bytes) else (hung.stderr or "")
        raise RuntimeError(f"{' '.join(command)} hung (no exit in 90 s):\n{stderr[-3000:]}")
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    tokens = [int(t) for t in result.stdout.split()]
    return tokens, np.load(logits_path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf"))
    parser.add_argument("--sizes", default="2,4", help="tensor-parallel sizes ('' for none)")
    parser.add_argument("--gpu-layers", action="store_true", help="also every GPU/CPU split (-ngl k)")
    parser.add_argument("--only", default="", help="comma-separated fixture names (default: every fixture)")
    args = parser.parse_args()
    gpus = gpu_count()
    sizes = [s for s in map(int, filter(None, args.sizes.split(","))) if s <= gpus]
    if not sizes and not (args.gpu_layers and gpus >= 1):
        print(f"skipped: {gpus} GPU(s); tensor parallelism needs 2, the GPU/CPU split 1")
        return 77
    index = json.load(open(os.path.join(args.fixtures, "index.json")))
    failures, runs = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in index["fixtures"]:
            if args.only and name not in args.only.split(","):
                continue
            fixture = os.path.join(args.fixtures, name)
            config = json.load(open(os.path.join(fixture, "config.json")))
            heads = config.get("num_attention_heads", config.get("n_head"))
            kv_heads = config.get("num_key_value_heads") or heads
            layers = config.get("num_hidden_layers", config.get("n_layer"))
            layouts = [(f"tp{size}", ["--tensor-parallel-size", str(size)]) for size in sizes
                       if not (heads % size or (kv_heads % size and size % kv_heads))]
            if sizes and layers >= 2:  # pipeline stages, and the grid of both once 4 GPUs allow
                layouts.append(("pp2", ["--pipeline-parallel-size", "2"]))
                if 4 in sizes and any(label == "tp2" for label, _ in layouts):
                    layouts.append(("tp2pp2", ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]))
            if args.gpu_layers:
                layouts += [(f"ngl{k}", ["-ngl", str(k)]) for k in range(1, layers)]
            meta = json.load(open(os.path.join(fixture, "meta.json")))
            expected = load_file(os.path.join(fixture, "expected.safetensors"))
            for p, prompt in enumerate(meta["prompts"]):
                steps = meta["decode_steps"]
                reference_tokens = meta["decode_tokens"][p]
                # transformers' logits after the prompt, then after each of its greedy tokens
                reference = np.concatenate([expected[f"prompt{p}.prefill_logits"][-1:],
                                            expected[f"prompt{p}.decode_logits"]])
                one_tokens, one_logits = generate(args.splitflow, fixture, prompt, steps, [], f"{tmp}/one.npy")
                for label, layout_flags in layouts:
                    runs += 1
                    what = f"{name} prompt {p} {label}"
                    try:
                        tokens, logits = generate(args.splitflow, fixture, prompt, steps, layout_flags, f"{tmp}/split.npy")
                    except RuntimeError as error:
                        failures.append(f"{what}: {error}")
                        continue
                    # Steps where this run's context is still the reference's.
                    agree = 1
                    while agree < len(tokens) and tokens[agree - 1] == reference_tokens[agree - 1]:
                        agree += 1
                    a, e = logits[:agree].astype(np.float64), reference[:agree].astype(np.float64)
                    rel_l2 = float(np.linalg.norm(a - e) / np.linalg.norm(e))
                    if rel_l2 > 0.06:
                        failures.append(f"{what}: relative L2 {rel_l2:.4f} over {agree} steps vs transformers")
                    # Greedy tokens against one GPU up to its first near tie.
                    for step, (got, want) in enumerate(zip(tokens, one_tokens)):
                        row = np.sort(one_logits[step])[::-1]
                        if row[0] - row[1] < 0.05 * np.abs(one_logits[step]).max():
                            break
                        if got != want:
                            failures.append(f"{what}: step {step} token {got}, one GPU {want}")
                            break
                    print(f"{what}: {len(tokens)} tokens, relative L2 {rel_l2:.4f} over {agree} steps")
    print(f"{runs} split runs, {len(failures)} failures")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures or runs == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
