#!/usr/bin/env python3
"""`splitflow serve --device cuda -ngl N`: the GPU/CPU split behind the OpenAI server.

stories260K (5 layers) served with its first layers on the CPU and the rest on the GPU, for each N
of 1..4 and `-ngl auto` (which keeps every layer on the GPU for a model this small): greedy
/v1/completions of several prompts, sent concurrently so the engine batches them, must equal
`splitflow generate` with the same split and prompt (tests/python/test_tensor_parallel.py checks
generate's splits against transformers), and the server must say how it split the model.

Exit status 77 (skipped) without a GPU or without the model.
Usage: test_gpu_cpu_serve.py --splitflow BIN --shared DIR
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

from serve_process import ServeProcess

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day"]
MAX_TOKENS = 24


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def complete(server, prompt):
    status, text = server.post_json("/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                         "ignore_eos": True})
    if status != 200:
        raise RuntimeError(f"status {status}: {text[:400]}")
    return json.loads(text)["choices"][0]["text"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    parser.add_argument("--shared", required=True)
    args = parser.parse_args()
    model = os.path.join(args.shared, "models", "stories260K-hf")
    if gpu_count() < 1:
        print("skipped: no GPU")
        return 77
    if not os.path.isdir(model):
        print(f"skipped: {model} is missing")
        return 77
    failures = []
    for ngl in ["1", "2", "3", "4", "auto"]:
        split = ["--device", "cuda", "-ngl", ngl]
        want = {}
        for prompt in PROMPTS:
            result = subprocess.run([args.splitflow, "generate", "--model", model, "--prompt", prompt, "--max-tokens",
                                     str(MAX_TOKENS), "--temperature", "0", "--ignore-eos"] + split,
                                    capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                failures.append(f"-ngl {ngl} generate: {result.stderr[-1500:]}")
                break
            want[prompt] = result.stdout.rstrip("\n")
        if len(want) != len(PROMPTS):
            continue
        server = ServeProcess([args.splitflow, "serve", "--model", model, "--port", "0", "--max-seqs", "8"] + split)
        try:
            with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
                got = dict(zip(PROMPTS, pool.map(lambda prompt: complete(server, prompt), PROMPTS)))
        except Exception as error:  # noqa: BLE001 (any failure is the test's)
            failures.append(f"-ngl {ngl} serve: {error}\n{''.join(server.log[-30:])}")
            server.stop()
            continue
        server.stop()
        log = "".join(server.log)
        said_split = "GPU/CPU split" in log
        if ngl != "auto" and not said_split:
            failures.append(f"-ngl {ngl}: the server did not log its split")
        for prompt in PROMPTS:
            if got[prompt] != want[prompt] or not got[prompt]:
                failures.append(f"-ngl {ngl} {prompt!r}: serve {got[prompt]!r}, generate {want[prompt]!r}")
        print(f"-ngl {ngl}: {len(PROMPTS)} concurrent completions checked{' (split logged)' if said_split else ''}")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
