#!/usr/bin/env python3
"""Embedding throughput of `splitflow embed` against sentence-transformers on the same texts, the
same threads and the same machine, in one run (issue 28's CPU target: >= 1.5x). Rounds alternate
the two so background load hits both alike; the report gives every round and the medians.

    python3 bench/embeddings_vs_st.py --model .cache/models/all-MiniLM-L6-v2 --binary build/splitflow

Workloads: `corpus` (tests/fixtures/encoder/corpus.json: 121 varied texts, 3 of them past the
256-token limit) and `short` (its texts of at most 32 tokens). sentence-transformers encodes with
its defaults (batch_size 32, length-sorted batches, padding to the batch's longest); splitflow
packs whole sequences into steps of --max-batch-tokens without padding. Tokens are counted once
(the ids are the same: test_embedding checks it). Writes bench/results/embeddings-<time>.json.
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import soak  # noqa: E402  (portable paths in results)


def splitflow_rate(binary, model, texts_file, threads, passes):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "embed", "--model", model, "--file", texts_file, "--threads", str(threads),
                          "--repeat", str(passes), "--format", "text"],
                         env=env, capture_output=True, text=True, check=True)
    match = re.search(r"(\d+) inputs, (\d+) tokens x (\d+) passes: ([\d.]+) s", out.stderr)
    inputs, tokens, passes, seconds = int(match[1]), int(match[2]), int(match[3]), float(match[4])
    return {"inputs_per_s": inputs * passes / seconds, "tokens_per_s": tokens * passes / seconds, "tokens": tokens}


def st_rate(model, texts, passes, tokens):
    model.encode(texts[:8])
    start = time.perf_counter()
    for _ in range(passes):
        model.encode(texts, batch_size=32)
    seconds = time.perf_counter() - start
    return {"inputs_per_s": len(texts) * passes / seconds, "tokens_per_s": tokens * passes / seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / ".cache/models/all-MiniLM-L6-v2"))
    parser.add_argument("--binary", default=str(REPO / "build/splitflow"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=2, help="timed passes over the texts per round")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import sentence_transformers
    import torch
    torch.set_num_threads(args.threads)
    st_model = sentence_transformers.SentenceTransformer(args.model, device="cpu")
    corpus = [t.replace("\n", " ") for t in json.loads((REPO / "tests/fixtures/encoder/corpus.json").read_text())]
    corpus = [t for t in corpus if t.strip()]
    lengths = [int(st_model.tokenize([t])["attention_mask"].sum()) for t in corpus]
    workloads = {"corpus": corpus, "short": [t for t, n in zip(corpus, lengths) if n <= 32]}

    report = {
        "benchmark": "embeddings: splitflow embed vs sentence-transformers (same texts, threads, machine, run)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "machine": {"cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor()),
                    "cores": os.cpu_count(), "threads_used": args.threads, "load_average_start": os.getloadavg()},
        "model": args.model,
        "versions": {"sentence_transformers": sentence_transformers.__version__, "torch": torch.__version__},
        "rounds": args.rounds, "passes_per_round": args.passes, "workloads": {},
    }
    for name, texts in workloads.items():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(texts) + "\n")
            texts_file = f.name
        rounds = []
        for r in range(args.rounds):
            ours = splitflow_rate(args.binary, args.model, texts_file, args.threads, args.passes)
            theirs = st_rate(st_model, texts, args.passes, ours["tokens"])
            rounds.append({"splitflow": ours, "sentence_transformers": theirs,
                           "speedup": ours["tokens_per_s"] / theirs["tokens_per_s"]})
            print(f"{name} round {r}: splitflow {ours['tokens_per_s']:.0f} tok/s, sentence-transformers "
                  f"{theirs['tokens_per_s']:.0f} tok/s, x{rounds[-1]['speedup']:.2f}", flush=True)
        os.unlink(texts_file)
        ours_median = statistics.median(x["splitflow"]["tokens_per_s"] for x in rounds)
        theirs_median = statistics.median(x["sentence_transformers"]["tokens_per_s"] for x in rounds)
        report["workloads"][name] = {
            "texts": len(texts), "tokens": rounds[0]["splitflow"]["tokens"], "rounds": rounds,
            "splitflow_tokens_per_s_median": ours_median, "sentence_transformers_tokens_per_s_median": theirs_median,
            "speedup_median": statistics.median(x["speedup"] for x in rounds)}
    report["machine"]["load_average_end"] = os.getloadavg()
    out = Path(args.out) if args.out else REPO / "bench/results" / (
        "embeddings-" + datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ") + ".json")
    out.write_text(json.dumps(soak.portable(report), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
