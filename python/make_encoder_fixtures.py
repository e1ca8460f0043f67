#!/usr/bin/env python3
"""Tiny random-weight encoder checkpoints (BERT, RoBERTa) and transformers' fp32 last hidden
states on them: the oracle for splitflow's encoder-only forward pass (issue 28, item 1).

    python3 python/make_encoder_fixtures.py --out tests/fixtures/encoder

Each fixture directory holds config.json, model.safetensors (the checkpoint, as save_pretrained
writes it) and expected.safetensors: for prompt i, `prompt{i}.tokens` (int32 [n]) and
`prompt{i}.last_hidden_state` (float32 [n, hidden]) from the HF model run on that prompt alone
(no padding, token types 0, eval mode). meta.json names the prompts.

Every parameter (LayerNorm weights and biases, token-type rows included) is drawn from numpy's
PCG64 seeded by the fixture name, so a missing bias, a misplaced norm or a dropped token-type row
moves the states. RoBERTa prompts avoid the padding id: transformers gives a pad token inside a
sequence the padding position.

tiny_bert also gets a WordPiece tokenizer.json over its 96 ids (BERT's normalizer,
pre-tokenizer and [CLS] $A [SEP] template), so `splitflow embed --text` runs on it.
"""

import argparse
import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import safetensors.numpy
import tokenizers
import torch
import transformers

PROMPT_LENGTHS = (1, 7, 13, 30)

FIXTURES = {
    "tiny_bert": {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": 96,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "hidden_act": "gelu",
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
    "tiny_roberta": {
        "architectures": ["RobertaModel"],
        "model_type": "roberta",
        "vocab_size": 96,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "hidden_act": "gelu",
        "max_position_embeddings": 66,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
}


def tiny_wordpiece(vocab_size):
    """A BERT-style WordPiece tokenizer with vocab_size ids: specials, letters, ##letters, words."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens += letters + ["##" + c for c in letters]
    tokens += [".", ",", "!", "?", "the", "cat", "dog", "sat", "on", "mat", "a", "is", "was", "ran", "and", "##s",
               "##ed", "##ing", "hello", "world", "embed", "##ding", "model", "text", "one", "two", "three", "red",
               "blue", "green", "sun", "moon"]
    tokens = list(dict.fromkeys(tokens))[:vocab_size]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = tokenizers.decoders.WordPiece()
    for special in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]:
        tok.add_special_tokens([tokenizers.AddedToken(special, special=True)])
    return tok


def randomize(model, rng):
    with torch.no_grad():
        for name, param in model.named_parameters():
            shape = tuple(param.shape)
            if "LayerNorm.weight" in name:
                values = 1.0 + 0.2 * rng.standard_normal(shape)
            elif name.endswith(".bias") or "LayerNorm.bias" in name:
                values = 0.1 * rng.standard_normal(shape)
            else:
                values = 0.15 * rng.standard_normal(shape)
            param.copy_(torch.from_numpy(values.astype(np.float32)))


def make(name, config_dict, out_dir):
    rng = np.random.Generator(np.random.PCG64(zlib.crc32(name.encode())))
    config = transformers.AutoConfig.for_model(**config_dict)
    model = transformers.AutoModel.from_config(config, add_pooling_layer=False).eval()
    randomize(model, rng)
    target = out_dir / name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items() if v.dtype == torch.float32}
    safetensors.numpy.save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")

    avoid = {config_dict["pad_token_id"]} if config_dict["model_type"] == "roberta" else set()
    allowed = np.array([t for t in range(config_dict["vocab_size"]) if t not in avoid])
    expected = {}
    for i, length in enumerate(PROMPT_LENGTHS):
        tokens = rng.choice(allowed, size=length).astype(np.int32)
        with torch.no_grad():
            ids = torch.from_numpy(tokens.astype(np.int64))[None, :]
            states = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           token_type_ids=torch.zeros_like(ids)).last_hidden_state[0]
        expected[f"prompt{i}.tokens"] = tokens
        expected[f"prompt{i}.last_hidden_state"] = states.numpy().astype(np.float32)
    safetensors.numpy.save_file(expected, str(target / "expected.safetensors"))
    meta = {"num_prompts": len(PROMPT_LENGTHS), "prompt_lengths": list(PROMPT_LENGTHS),
            "torch": torch.__version__, "transformers": transformers.__version__}
    (target / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    if config_dict["model_type"] == "bert":
        tiny_wordpiece(config_dict["vocab_size"]).save(str(target / "tokenizer.json"))
    print(f"{name}: {sum(v.size for v in state.values())} parameters, prompts {PROMPT_LENGTHS}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/encoder")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, config in FIXTURES.items():
        make(name, config, args.out)


if __name__ == "__main__":
    main()
