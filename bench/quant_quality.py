#!/usr/bin/env python3
"""The quality table of issue 23: perplexity of every quantized type made from the same source
weights. The source GGUF's matrices are dequantized to f32 and quantized to each type by
`splitflow quantize`; each file's perplexity is measured by `splitflow perplexity` (llama.cpp's
method) on the same text, chunks and context. With --llama-perplexity, llama.cpp's tool scores the
source file and every type llama.cpp runs in the same run, next to splitflow's number.

  bench/quant_quality.py --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --chunks 40
  bench/quant_quality.py --model M --backend cuda --types q8_0 q4_k q3h_b64   # on the GPU machine

Writes bench/results/quant/quality-<model>-<backend>-<date>.json and prints a markdown table.
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
LLAMA_TYPES = {"f32", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1", "q4_0", "q3_k", "q2_k"}
DEFAULT_TYPES = ["f32", "q8_0", "q6_k", "q5_k", "q4_k", "q4_0", "q3_k", "q2_k",
                 "q8_b32", "q6_b32", "q5_b32", "q4_b32", "q3_b32", "q2_b32",
                 "q8_b64", "q6_b64", "q5_b64", "q4_b64", "q3_b64", "q2_b64",
                 "q3h_b64", "f8_channel", "f8_g128"]
PPL = re.compile(r"PPL = ([0-9.]+) \+/- ([0-9.]+).*?([0-9.]+) tokens/s")
LLAMA_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def commit():
    if os.environ.get("SPLITFLOW_COMMIT"):
        return os.environ["SPLITFLOW_COMMIT"]
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def device(backend):
    if backend == "cuda":
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, check=True).stdout.strip().splitlines()[0]
        except (subprocess.CalledProcessError, FileNotFoundError):
            return "cuda"
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.processor())
    return f"{model} x{os.cpu_count()}"


def splitflow_ppl(args, model):
    cmd = [args.splitflow, "perplexity", "--model", str(model), "--file", args.file, "--ctx", str(args.ctx),
           "--chunks", str(args.chunks), "--backend", args.backend, "--max-batch-tokens", str(args.ctx)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    match = PPL.search(run.stdout)
    if run.returncode != 0 or not match:
        raise RuntimeError(f"{' '.join(cmd)} failed: {run.stderr[-600:]}")
    return {"ppl": float(match.group(1)), "stderr": float(match.group(2)), "tokens_per_s": float(match.group(3))}


def llama_ppl(args, model):
    cmd = [args.llama_perplexity, "-m", str(model), "-f", args.file, "-c", str(args.ctx), "--chunks", str(args.chunks),
           "-b", str(args.ctx)]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    if args.backend == "cuda":
        cmd += ["-ngl", "99"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    match = LLAMA_PPL.search(run.stdout + run.stderr)
    if run.returncode != 0 or not match:
        raise RuntimeError(f"{' '.join(cmd)} failed: {(run.stdout + run.stderr)[-600:]}")
    return {"ppl": float(match.group(1)), "stderr": float(match.group(2))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--splitflow", default=str(REPO / "build" / "splitflow"))
    parser.add_argument("--llama-perplexity", default="")
    parser.add_argument("--file", default=str(REPO.parent / "shared" / "data" / "wiki.test.raw"))
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--types", nargs="*", default=DEFAULT_TYPES)
    parser.add_argument("--results-dir", default=str(REPO / "bench" / "results" / "quant"))
    args = parser.parse_args()

    model = pathlib.Path(args.model)
    rows = []
    source = {"type": "source", "file_mib": model.stat().st_size / 2**20, "splitflow": splitflow_ppl(args, model)}
    if args.llama_perplexity:
        source["llama_cpp"] = llama_ppl(args, model)
    rows.append(source)
    print(json.dumps(source), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for qtype in args.types:
            out = pathlib.Path(tmp) / f"{qtype}.gguf"
            subprocess.run([args.splitflow, "quantize", "--model", str(model), "--type", qtype, "--out", str(out)],
                           check=True, capture_output=True)
            row = {"type": qtype, "file_mib": out.stat().st_size / 2**20, "splitflow": splitflow_ppl(args, out)}
            if args.llama_perplexity and qtype in LLAMA_TYPES:
                row["llama_cpp"] = llama_ppl(args, out)
            rows.append(row)
            print(json.dumps(row), flush=True)
            out.unlink()

    result = {"benchmark": "quant_quality", "model": model.name, "file": pathlib.Path(args.file).name,
              "ctx": args.ctx, "chunks": args.chunks, "backend": args.backend, "device": device(args.backend),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "commit": commit(), "rows": rows}
    results = pathlib.Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"quality-{model.stem}-{args.backend}-{result['date'].replace(':', '-')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")

    print(f"\n{model.name}, {args.chunks} chunks of {args.ctx} ({args.backend}, {result['device']}, {result['commit']})\n")
    print("| type | MiB | splitflow PPL | llama.cpp PPL | ratio |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        ours = row["splitflow"]
        peer = row.get("llama_cpp")
        print(f"| {row['type']} | {row['file_mib']:.1f} | {ours['ppl']:.4f} +/- {ours['stderr']:.4f} | "
              + (f"{peer['ppl']:.4f} | {ours['ppl'] / peer['ppl']:.4f} |" if peer else "- | - |"))
    print(f"\nresult: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
