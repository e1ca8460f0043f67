#!/usr/bin/env python3
"""A random-weight GGUF of a Llama-family shape, written with llama.cpp's own tools, so that
splitflow and llama.cpp benchmark the same file (issue 31's peer runs, the GPU/CPU split's table).

The shape comes from a Hugging Face config.json (bench/configs/*.json: hidden_size, layers, heads,
KV heads, intermediate_size, vocab_size, rope_theta, rms_norm_eps). The file is written by gguf-py
(llama.cpp's Python writer: the sdist's copy under .cache/llama.cpp/gguf-py when present, else the
`gguf` package) in F32, F16 or BF16; any other type (Q8_0, Q4_0, Q4_K_M, ...) is then made by
llama.cpp's llama-quantize from the F16 file, as users make theirs.

Weights are N(0, 0.02) (norms 1): values only need the right bytes and no NaN, so every tensor is a
window of one shared pool of random numbers at its own offset, which keeps a 16 GB file to one
pool's memory and seconds of generation. The vocabulary is SentencePiece-style (<unk>, <s>, </s>, the
256 byte tokens, then "tok<i>") so llama.cpp and splitflow both load it.

  bench/make_gguf.py --config bench/configs/tinyllama-1.1b.json --type q4_0 --out .cache/gguf/tinyllama-q4_0.gguf
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_PY = os.path.join(ROOT, ".cache", "llama.cpp", "gguf-py")
if os.path.isdir(GGUF_PY):
    sys.path.insert(0, GGUF_PY)
import gguf  # noqa: E402

DIRECT_TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
                "bf16": gguf.GGMLQuantizationType.BF16}
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
              "bf16": gguf.LlamaFileType.MOSTLY_BF16}


class Pool:
    """Windows of one block of N(0, std) numbers in the file's float type."""

    def __init__(self, largest, dtype, seed, std=0.02, slack=1 << 20):
        rng = np.random.default_rng(seed)
        self.slack = slack
        values = rng.standard_normal(largest + slack, dtype=np.float32) * np.float32(std)
        if dtype == "bf16":  # round to nearest even, kept as the raw 16 bits gguf-py writes
            bits = values.view(np.uint32)
            self.values = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        else:
            self.values = values.astype(np.float16 if dtype == "f16" else np.float32)
        self.rng = rng

    def matrix(self, rows, cols):
        offset = int(self.rng.integers(0, self.slack))
        return self.values[offset:offset + rows * cols].reshape(rows, cols)


def write_float_gguf(config, dtype, path, seed):
    hidden = config["hidden_size"]
    layers = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    ffn = config["intermediate_size"]
    vocab = config["vocab_size"]
    if config.get("model_type", "llama") not in ("llama", "mistral"):
        raise SystemExit(f"make_gguf: model_type {config.get('model_type')!r}: only Llama-family shapes are written")

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(os.path.splitext(os.path.basename(path))[0])
    writer.add_context_length(config.get("max_position_embeddings", 4096))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    writer.add_vocab_size(vocab)
    writer.add_file_type(FILE_TYPES[dtype])

    specials = ["<unk>", "<s>", "</s>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    if vocab < len(tokens):
        raise SystemExit(f"make_gguf: vocab_size {vocab} is below the {len(tokens)} special and byte tokens")
    tokens += [f"tok{i}" for i in range(len(tokens), vocab)]
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] +
             [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (vocab - 259))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(vocab - 259)])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    largest = max(vocab * hidden, ffn * hidden, heads * head_dim * hidden)
    pool = Pool(largest, dtype, seed)
    raw = DIRECT_TYPES[dtype]

    def matrix(name, rows, cols):
        writer.add_tensor(name, pool.matrix(rows, cols), raw_dtype=raw)

    ones = np.ones(hidden, dtype=np.float32)
    matrix("token_embd.weight", vocab, hidden)
    for layer in range(layers):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        matrix(f"{block}.attn_q.weight", heads * head_dim, hidden)
        matrix(f"{block}.attn_k.weight", kv_heads * head_dim, hidden)
        matrix(f"{block}.attn_v.weight", kv_heads * head_dim, hidden)
        matrix(f"{block}.attn_output.weight", hidden, heads * head_dim)
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        matrix(f"{block}.ffn_gate.weight", ffn, hidden)
        matrix(f"{block}.ffn_up.weight", ffn, hidden)
        matrix(f"{block}.ffn_down.weight", hidden, ffn)
    writer.add_tensor("output_norm.weight", ones)
    if not config.get("tie_word_embeddings", False):
        matrix("output.weight", vocab, hidden)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a Hugging Face config.json (bench/configs/*.json)")
    parser.add_argument("--type", default="f16",
                        help="f32, f16, bf16, or a llama-quantize type (q8_0, q4_0, q4_k_m, ...)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llama-quantize", default=os.path.join(ROOT, ".cache", "llama.cpp", "build", "bin", "llama-quantize"))
    args = parser.parse_args()
    config = json.load(open(args.config))
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    kind = args.type.lower()
    if kind in DIRECT_TYPES:
        write_float_gguf(config, kind, args.out, args.seed)
    else:
        if not os.path.exists(args.llama_quantize):
            raise SystemExit(f"make_gguf: --type {args.type} needs llama-quantize; '{args.llama_quantize}' does not "
                             "exist (bench/build_llama_cpp.sh builds it)")
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            f16 = os.path.join(tmp, "f16.gguf")
            write_float_gguf(config, "f16", f16, args.seed)
            result = subprocess.run([args.llama_quantize, f16, args.out, args.type.upper()],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise SystemExit(f"make_gguf: llama-quantize {args.type} failed:\n{result.stderr[-2000:]}")
    print(f"{args.out}: {os.path.getsize(args.out) / 2**20:.1f} MiB ({args.type}, {args.config})")


if __name__ == "__main__":
    main()
