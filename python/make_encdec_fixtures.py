#!/usr/bin/env python3
"""Tiny random-weight encoder-decoder checkpoints (T5 v1.0 and v1.1, BART, Marian) and transformers' fp32
outputs on them: the oracle for splitflow's encoder-decoder path (issue 28 item 4).

    python3 python/make_encdec_fixtures.py --out tests/fixtures/encdec [--only NAME ...]

Each fixture directory holds config.json (hub style, as the google/t5-* checkpoints write it),
model.safetensors (shared embedding stored once as `shared.weight`, as save_pretrained does; an
untied head as `lm_head.weight`), meta.json and expected.safetensors with, per prompt p:
  prompt{p}.encoder_tokens  [n] i32   the encoder input (the prompt)
  prompt{p}.decoder_tokens  [m] i32   decoder_start_token_id, then transformers' greedy tokens
  prompt{p}.logits          [m, vocab] f32  the decoder's logits for decoder_tokens (one forward)
  prompt{p}.greedy          [m] i32   argmax of each logits row (greedy[i] = decoder_tokens[i+1])
Greedy tokens come from transformers' own `generate` (do_sample False, no EOS stop), checked
against the argmax of the one-forward logits. A seed is kept only when every greedy step wins by
more than MIN_RELATIVE_MARGIN of max|logit| (so a 1e-3 relative error cannot flip a token), and
when rounding the matrices to bf16 moves no logits row by more than MAX_BF16_DRIFT (relative L2):
the CUDA backend keeps weights in bf16, and a fixture whose outputs that rounding alone moves
further could not tell a kernel bug from its own ill-conditioning (meta.json records the drift).

T5 scales no attention score by 1/sqrt(d_kv) (its own init folds that factor into q's weights)
and never normalizes its residual stream: with BART's wide random weights the tiny T5 models'
outputs moved by up to 0.2 under bf16 weights alone, so T5's q, k and MLP matrices are narrower
(t5_width).

transformers 5 ties T5's lm_head to the embedding whatever the config says; the v1.1 fixture
unties it after construction (a separate random lm_head, as google/t5-v1_1-* checkpoints ship),
so its reference is T5ForConditionalGeneration's forward with an untied head and without the
d_model**-0.5 rescale (config `tie_word_embeddings: false`, which transformers reads as
`scale_decoder_outputs = False`).

Marian's sinusoidal position tables are left out of its checkpoint (hub checkpoints do not store
them: the model computes them), and its final_logits_bias gets random values (hub checkpoints may
carry zeros) so the logits bias is exercised.
"""

import argparse
import copy
import json
import zlib
from pathlib import Path

import safetensors.torch
import torch
import transformers
from transformers import (BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel, T5Config,
                          T5ForConditionalGeneration)

PROMPT_LENGTHS = (7, 23)
DECODE_STEPS = 10
MIN_RELATIVE_MARGIN = 4e-3
MAX_SEED_ATTEMPTS = 64
MAX_BF16_DRIFT = 0.02

FIXTURES = {
    # T5 v1.0: ReLU MLP, head tied to the embedding with the d_model**-0.5 rescale. Few buckets and
    # a short max_distance so the 23-token prompt reaches the logarithmic buckets both ways; more
    # decoder layers than encoder layers (num_decoder_layers).
    "t5_v1_0": dict(
        description="T5 v1.0: relu MLP, tied head rescaled by d_model**-0.5, 8 buckets up to distance 20, "
                    "2 encoder and 3 decoder layers",
        config=dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20, feed_forward_proj="relu",
                    layer_norm_epsilon=1e-6, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                    is_encoder_decoder=True),
        untied_head=False,
    ),
    # T5 v1.1: gated-GELU (gelu_new) MLP, untied head, no rescale, d_kv * heads != d_model.
    "t5_v1_1": dict(
        description="T5 v1.1: gated-gelu MLP, untied lm_head without rescale, inner dim 48 != d_model 32, "
                    "16 buckets up to distance 12",
        config=dict(vocab_size=128, d_model=32, d_kv=12, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=16, relative_attention_max_distance=12,
                    feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, decoder_start_token_id=0,
                    pad_token_id=0, eos_token_id=1, is_encoder_decoder=True, tie_word_embeddings=False),
        untied_head=True,
    ),
    # BART: post-norm layers (LayerNorm after each residual add, the cross-attention's included),
    # learned positions read from row p + 2, a LayerNorm over the embeddings, GELU, biases everywhere,
    # head tied to the shared embedding, decoding from the EOS id. final_logits_bias stays zero.
    "bart": dict(
        description="BART: post-norm, learned positions (offset 2), embedding LayerNorm, erf GELU, biases, tied head, "
                    "2 encoder and 3 decoder layers, decoder_start_token_id 2",
        family="bart",
        config=dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64,
                    activation_function="gelu", scale_embedding=False, pad_token_id=1, bos_token_id=0,
                    eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None, forced_bos_token_id=None,
                    is_encoder_decoder=True),
        untied_head=False,
    ),
    # Marian (MarianMTModel, as the opus-mt checkpoints): post-norm like BART but without an embedding
    # LayerNorm, sinusoidal positions (sines in the first half of each row, cosines in the second, no
    # offset), embeddings scaled by sqrt(d_model), swish, tied head plus final_logits_bias, decoding
    # from the pad token.
    "marian": dict(
        description="Marian: post-norm, sinusoidal positions (halves), embeddings x sqrt(d_model), swish, tied head "
                    "with a random final_logits_bias, 2 encoder and 3 decoder layers, decoder_start_token_id = pad 127",
        family="marian",
        config=dict(vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64,
                    activation_function="swish", scale_embedding=True, pad_token_id=127, eos_token_id=0,
                    decoder_start_token_id=127, forced_eos_token_id=None, share_encoder_decoder_embeddings=True,
                    is_encoder_decoder=True),
        untied_head=False,
    ),
}

ARCHITECTURES = {"t5": "T5ForConditionalGeneration", "bart": "BartForConditionalGeneration",
                 "marian": "MarianMTModel"}
CLASSES = {"t5": (T5Config, T5ForConditionalGeneration), "bart": (BartConfig, BartForConditionalGeneration),
           "marian": (MarianConfig, MarianMTModel)}
# Computed by the model, absent from hub checkpoints.
COMPUTED = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
# Copies of the shared embedding that save_pretrained leaves out.
TIED_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "model.encoder.embed_tokens.weight",
               "model.decoder.embed_tokens.weight")


def hub_config(spec: dict) -> dict:
    family = spec.get("family", "t5")
    return {"architectures": [ARCHITECTURES[family]], "model_type": family, **spec["config"]}


def t5_width(param_name: str, config) -> float:
    """T5's factor on the wide init: q takes the 1/sqrt(d_kv) its attention never applies, k and the
    MLP half of it (the residual stream is never normalized, only each block's input)."""
    if param_name.endswith(".q.weight"):
        return config.d_kv ** -0.5
    if param_name.endswith(".k.weight") or ".wi" in param_name or param_name.endswith(".wo.weight"):
        return 0.5
    return 1.0


def build(name: str, spec: dict, seed: int):
    torch.manual_seed(seed)
    config_class, model_class = CLASSES[spec.get("family", "t5")]
    config = config_class(**spec["config"])
    model = model_class(config).eval()
    with torch.no_grad():
        # Wider weights than T5's init so the tiny model's logits are not all near-ties.
        for param_name, param in model.named_parameters():
            if "embed_positions" in param_name and spec.get("family") == "marian":
                continue  # the sinusoidal table, not a weight
            if param.dim() == 2:
                param.normal_(0.0, 0.5 if "relative_attention_bias" in param_name else 0.3)
                if spec.get("family", "t5") == "t5":
                    param.mul_(t5_width(param_name, config))
            elif "norm" in param_name and param_name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)  # biases
        if hasattr(model, "final_logits_bias") and spec.get("family") == "marian":
            model.final_logits_bias.normal_(0.0, 0.5)
        if spec["untied_head"]:
            model.lm_head.weight = torch.nn.Parameter(torch.randn(config.vocab_size, config.d_model) * 0.3)
    if spec.get("family", "t5") == "t5":
        assert model.config.scale_decoder_outputs == (not spec["untied_head"]), model.config.scale_decoder_outputs
    return model


def references(model, prompts):
    out = {}
    margins = []
    for p, prompt in enumerate(prompts):
        encoder_ids = torch.tensor([prompt])
        generated = model.generate(input_ids=encoder_ids, attention_mask=torch.ones_like(encoder_ids),
                                   max_new_tokens=DECODE_STEPS, min_new_tokens=DECODE_STEPS, do_sample=False,
                                   num_beams=1, eos_token_id=None, use_cache=False, no_repeat_ngram_size=0,
                                   forced_bos_token_id=None, forced_eos_token_id=None, repetition_penalty=1.0)
        decoder_ids = generated[:, :-1]
        with torch.no_grad():
            logits = model(input_ids=encoder_ids, decoder_input_ids=decoder_ids).logits[0]
        greedy = logits.argmax(-1)
        assert torch.equal(greedy, generated[0, 1:]), (greedy, generated)
        top2 = logits.topk(2, dim=-1).values
        margins.append(((top2[:, 0] - top2[:, 1]) / logits.abs().max()).min().item())
        out[f"prompt{p}.encoder_tokens"] = encoder_ids[0].to(torch.int32)
        out[f"prompt{p}.decoder_tokens"] = decoder_ids[0].to(torch.int32).contiguous()
        out[f"prompt{p}.logits"] = logits.to(torch.float32).contiguous()
        out[f"prompt{p}.greedy"] = greedy.to(torch.int32).contiguous()
    return out, min(margins)


def bf16_drift(model, expected, prompts) -> float:
    """The largest relative L2 change of a logits row when every matrix is rounded to bf16."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for param in rounded.parameters():
            if param.dim() == 2:
                param.copy_(param.to(torch.bfloat16).to(torch.float32))
        drift = 0.0
        for p, prompt in enumerate(prompts):
            want = expected[f"prompt{p}.logits"]
            got = rounded(input_ids=torch.tensor([prompt]),
                          decoder_input_ids=expected[f"prompt{p}.decoder_tokens"][None].long()).logits[0]
            drift = max(drift, ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item())
    return drift


def save_checkpoint(model, spec, directory: Path):
    state = model.state_dict()
    tensors = {}
    for key, value in state.items():
        if key in TIED_COPIES:
            continue  # tied to the shared embedding, stored once as save_pretrained does
        if key in COMPUTED and spec.get("family") == "marian":
            continue  # Marian's sinusoidal tables (BART's positions under the same names are learned)
        if key == "lm_head.weight" and not spec["untied_head"]:
            continue
        tensors[key] = value.detach().clone().contiguous()
    safetensors.torch.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hub_config(spec), indent=2) + "\n")
    if spec.get("family", "t5") == "t5":  # the reloaded config must say what the reference ran with
        assert T5Config.from_pretrained(directory).scale_decoder_outputs == (not spec["untied_head"])


def make(name: str, spec: dict, out: Path):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    vocab = spec["config"]["vocab_size"]
    for attempt in range(MAX_SEED_ATTEMPTS):
        seed = zlib.crc32(name.encode()) + attempt
        generator = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(2, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]
        model = build(name, spec, seed)
        expected, margin = references(model, prompts)
        if margin < MIN_RELATIVE_MARGIN:
            continue
        drift = bf16_drift(model, expected, prompts)
        if drift <= MAX_BF16_DRIFT:
            break
    else:
        raise SystemExit(f"{name}: no seed with greedy margins >= {MIN_RELATIVE_MARGIN} and bf16 drift <= "
                         f"{MAX_BF16_DRIFT}")
    directory = out / name
    directory.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, spec, directory)
    safetensors.torch.save_file(expected, directory / "expected.safetensors")
    meta = {"description": spec["description"], "seed": seed, "num_prompts": len(PROMPT_LENGTHS),
            "decode_steps": DECODE_STEPS, "min_relative_margin": margin, "bf16_weight_drift": drift}
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{name}: seed {seed}, min greedy margin {margin:.4f}, bf16 weight drift {drift:.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/encdec"))
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    names = args.only or list(FIXTURES)
    for name in names:
        make(name, FIXTURES[name], args.out)
    index = {"fixtures": list(FIXTURES), "generator": "python/make_encdec_fixtures.py",
             "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    (args.out / "index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main()
