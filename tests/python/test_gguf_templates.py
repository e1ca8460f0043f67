#!/usr/bin/env python3
"""The GGUF templates (models/gguf_qwen2.json, gguf_qwen3.json, gguf_phi3.json) on tiny GGUF files
written from the random-weight HF fixtures (tests/fixtures/hf/<name>) the way llama.cpp's
converter writes them: tensor names from gguf-py's tensor map (llama.cpp's own table), its metadata
keys, no Q/K permutation for these architectures, f32 tensors. transformers loads the same GGUF
(`from_pretrained(dir, gguf_file=...)`, its own GGUF-to-HF mapping) as the reference: each greedy
step's logits within 1e-3 x max|logit| (teacher forcing, as test_gguf_logits.py), and the same
greedy tokens up to a near-tie.

Usage: test_gguf_templates.py --splitflow BIN. Exit status 77 when torch / transformers / gguf are
missing.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import gguf
    import accelerate  # noqa: F401  (transformers needs it to load a GGUF)
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as error:
    print(f"SKIP: a reference package is missing ({error})")
    sys.exit(77)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RELATIVE_TOLERANCE = 1e-3
STEPS = 8
ARCHES = {"qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3, "phi3": gguf.MODEL_ARCH.PHI3}


def fixture_model(arch):
    """The fixture's model; for qwen3 its config with head_dim 128 and seeded random weights:
    transformers' GGUF loader does not read qwen3.attention.key_length and takes Qwen3's default
    head_dim (128) whatever the file says."""
    directory = os.path.join(REPO, "tests", "fixtures", "hf", arch)
    config = json.load(open(os.path.join(directory, "config.json")))
    if arch != "qwen3":
        return config, AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    config["head_dim"] = 128
    with tempfile.TemporaryDirectory() as scratch:
        json.dump(config, open(os.path.join(scratch, "config.json"), "w"))
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(scratch), dtype=torch.float32)
    generator = torch.Generator().manual_seed(23)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            noise = torch.randn(tensor.shape, generator=generator)
            if "norm" in name:
                tensor.copy_(1.0 + 0.1 * noise)
            elif "embed" in name:
                tensor.copy_(0.3 * noise)
            else:
                tensor.copy_(1.5 * noise / tensor.shape[-1] ** 0.5)
    return config, model


def write_gguf(arch, path):
    """The fixture's config and weights as llama.cpp's converter would write them (f32)."""
    config, model = fixture_model(arch)
    writer = gguf.GGUFWriter(path, arch)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    if arch == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "phi3":
        writer.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 1.0)))
        writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
        writer.add_sliding_window(config.get("sliding_window") or 0)
    vocab = config["vocab_size"]
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>" for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([1] * vocab)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config.get("pad_token_id") or 0)
    names = gguf.get_tensor_name_map(ARCHES[arch], config["num_hidden_layers"])
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, f"{fixture}: gguf-py maps no name to {name}"
        writer.add_tensor(mapped, tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splitflow", required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as scratch:
        for arch in ARCHES:
            name = f"{arch}.gguf"
            write_gguf(arch, os.path.join(scratch, name))
            meta = json.load(open(os.path.join(REPO, "tests", "fixtures", "hf", arch, "meta.json")))
            model = AutoModelForCausalLM.from_pretrained(scratch, gguf_file=name, dtype=torch.float32)
            model.eval()
            for index, ids in enumerate(meta["prompts"]):
                logits_path = os.path.join(scratch, f"{arch}{index}.npy")
                result = subprocess.run([args.splitflow, "generate", "--model", os.path.join(scratch, name),
                                         "--prompt-ids", ",".join(map(str, ids)), "--temperature", "0",
                                         "--max-tokens", str(STEPS), "--logits-out", logits_path],
                                        capture_output=True, text=True)
                if result.returncode != 0:
                    failures.append(f"{arch}: splitflow generate failed: {result.stderr[-2000:]}")
                    break
                ours = np.load(logits_path)
                tokens = ours.argmax(axis=1)
                with torch.no_grad():
                    hf = model(torch.tensor([ids + tokens[:-1].tolist()])).logits[0, len(ids) - 1:].double().numpy()
                worst, tied = 0.0, False
                for step in range(len(tokens)):
                    scale = np.abs(hf[step]).max()
                    ratio = np.abs(ours[step] - hf[step]).max() / scale
                    worst = max(worst, ratio)
                    if ratio > RELATIVE_TOLERANCE:
                        failures.append(f"{arch} prompt {index} step {step}: max |dlogit| / max |logit| = {ratio:.3g}")
                    top2 = np.sort(hf[step])[-2:]
                    tied = tied or top2[1] - top2[0] <= 2 * RELATIVE_TOLERANCE * scale
                    if not tied and tokens[step] != hf[step].argmax():
                        failures.append(f"{arch} prompt {index} step {step}: splitflow chose {tokens[step]}, "
                                        f"transformers {hf[step].argmax()}")
                print(f"{arch} prompt {index}: {len(ids)} tokens, {len(tokens)} steps, worst ratio {worst:.3g}")
    if failures:
        print("FAIL:\n" + "\n".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
