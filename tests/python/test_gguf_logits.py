#!/usr/bin/env python3
"""splitflow on a real quantized GGUF against transformers loading the same file.

transformers (`from_pretrained(dir, gguf_file=name, dtype=float32)`) dequantizes the GGUF with the
`gguf` package and runs the model in fp32; splitflow runs it on the CPU backend with its matrices
still packed (fused dequantize-dot kernels). For each prompt:
  - tokenization: `splitflow tokenize --add-special` must give the ids of transformers' tokenizer
    built from the same GGUF (a few extra strings too: unicode, digits, special tokens);
  - `splitflow generate --temperature 0 --max-tokens 32 --logits-out` gives every step's logits;
    transformers runs the prompt plus splitflow's tokens in one forward (teacher forcing), and at
    every step max |logit_splitflow - logit_hf| <= 1e-3 * max |logit_hf|;
  - greedy continuation: splitflow's token is transformers' argmax at every step up to the first
    near-tie (transformers' top two within 2e-3 * max |logit|, the tolerance above doubled).
Prompts cover the GEMV path (a 5-token prompt, decode) and the GEMM path (a long prompt), plain
text and the GGUF's chat template.

On CUDA (--backend cuda: bf16 activations, so fp32 logits are out of reach) the logits must stay
within --tolerance (default 0.1) x max |logit|, and at every step where transformers' top-two
margin exceeds twice the step's max |dlogit| (an error that small cannot reorder them) splitflow's
token must be transformers' argmax; since transformers is teacher-forced on splitflow's tokens,
every step is checked, not only those before a first divergence.

Usage: test_gguf_logits.py --splitflow BIN [--models DIR] [--model NAME] [--backend cuda]
DIR defaults to $SPLITFLOW_MODEL_CACHE, else <repo>/.cache/models. Exit status 77 (skipped) when
torch / transformers / gguf / accelerate are missing or the model file is absent.
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import transformers  # noqa: F401
    import gguf  # noqa: F401
    import accelerate  # noqa: F401  (transformers needs it to load a GGUF)
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as error:
    print(f"SKIP: a reference package is missing ({error}); pip install torch transformers gguf accelerate")
    sys.exit(77)

RELATIVE_TOLERANCE = 1e-3
STEPS = 32
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who "
    "repaired every clock in the valley. One winter morning a child knocked on his door carrying a broken "
    "pocket watch that had belonged to her grandmother. The clockmaker opened the case and found",
]
CHAT = [{"role": "user", "content": "Write a haiku about the sea."}]
EXTRA_TOKENIZATION = ["Hello world, <|im_start|>user\nhi<|im_end|>", "naïve café 北京 🙂 3.14159 x=[1,2];",
                      "   leading spaces\tand\ttabs\n\nnew lines"]


def splitflow(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True, encoding="utf-8")
    if result.returncode != 0:
        raise RuntimeError(f"splitflow {' '.join(args[:3])} ... failed: {result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--models", default=os.environ.get("SPLITFLOW_MODEL_CACHE", os.path.join(REPO, ".cache", "models")))
    parser.add_argument("--model", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    # Adds a prompt of more than N tokens (the long prompt repeated): past a sliding window of N.
    parser.add_argument("--long-prompt", type=int, default=0, metavar="N")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--tolerance", type=float, default=None)
    args = parser.parse_args()
    on_cuda = args.backend != "cpu"
    tolerance = args.tolerance if args.tolerance is not None else (0.1 if on_cuda else RELATIVE_TOLERANCE)
    path = os.path.join(args.models, args.model)
    if not os.path.exists(path):
        print(f"SKIP: {path} is absent (set SPLITFLOW_MODEL_CACHE or put the GGUF in .cache/models)")
        sys.exit(77)

    tokenizer = AutoTokenizer.from_pretrained(args.models, gguf_file=args.model)
    model = AutoModelForCausalLM.from_pretrained(args.models, gguf_file=args.model, dtype=torch.float32)
    model.eval()
    failures = []

    # A GGUF without tokenizer.chat_template (Gemma 3 270M) has no chat prompt.
    chat = [tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)] if tokenizer.chat_template else []
    texts = PROMPTS + chat
    if args.long_prompt > 0:
        long_text = PROMPTS[1]
        while len(tokenizer(long_text)["input_ids"]) <= args.long_prompt:
            long_text += " " + PROMPTS[1]
        texts.append(long_text)
    # Tokenization does not depend on the backend: the CPU run (CI, with setup.sh's transformers)
    # checks it. A CUDA run compares logits only, on transformers' ids: the GPU machine's
    # transformers converts Gemma's GGUF tokenizer differently (no BOS, other merges), so its ids
    # are not splitflow's there, but both engines get the same ones.
    for text in (texts + EXTRA_TOKENIZATION) if not on_cuda else []:
        ours = [int(t) for t in splitflow(args.splitflow, "tokenize", "--model", path, "--text", text,
                                          "--add-special").split()]
        want = tokenizer(text)["input_ids"]
        if ours != want:
            failures.append(f"tokenization of {text!r}:\n  hf   {want}\n  ours {ours}")

    worst = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        for index, text in enumerate(texts):
            ids = tokenizer(text)["input_ids"]
            logits_path = os.path.join(scratch, f"logits{index}.npy")
            splitflow(args.splitflow, "generate", "--model", path, "--prompt-ids", ",".join(map(str, ids)),
                      "--temperature", "0", "--max-tokens", str(STEPS), "--logits-out", logits_path,
                      "--backend", args.backend)
            ours = np.load(logits_path)
            tokens = ours.argmax(axis=1)  # greedy: the tokens splitflow sampled
            with torch.no_grad():
                hf = model(torch.tensor([ids + tokens[:-1].tolist()])).logits[0, len(ids) - 1:].double().numpy()
            if hf.shape != ours.shape:
                failures.append(f"prompt {index}: logits shape {ours.shape}, transformers {hf.shape}")
                continue
            tied = False
            for step in range(len(tokens)):
                scale = np.abs(hf[step]).max()
                delta = np.abs(ours[step] - hf[step]).max()
                ratio = delta / scale
                worst = max(worst, ratio)
                if ratio > tolerance:
                    failures.append(f"prompt {index} step {step}: max |dlogit| / max |logit| = {ratio:.3g}")
                top2 = np.sort(hf[step])[-2:]
                if on_cuda:
                    tied = top2[1] - top2[0] <= 2 * delta
                else:
                    tied = tied or top2[1] - top2[0] <= 2 * RELATIVE_TOLERANCE * scale
                if not tied and tokens[step] != hf[step].argmax():
                    failures.append(f"prompt {index} step {step}: splitflow chose {tokens[step]}, "
                                    f"transformers {hf[step].argmax()}")
            print(f"prompt {index}: {len(ids)} tokens, {len(tokens)} steps, "
                  f"continuation {tokenizer.decode(tokens.tolist())!r}")

    print(f"max over steps of max |dlogit| / max |logit|: {worst:.3g} (tolerance {tolerance}, {args.backend})")
    if failures:
        print("FAIL:\n" + "\n".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
