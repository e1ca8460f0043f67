#!/usr/bin/env python3
"""Tiny random-weight HF checkpoints and transformers' fp32 outputs on them: the oracle for the
engine's forward pass (issue 2, item 8). The file format is described in python/README.md.

    python3 python/make_hf_fixtures.py --out tests/fixtures/hf [--only NAME ...]

Deterministic: weights and prompts come from numpy's PCG64 seeded by the fixture name, torch runs
on one thread with deterministic algorithms, and every file is rewritten whole, so a second run on
the same torch/transformers versions reproduces the same bytes.
"""

import argparse
import json
import math
import shutil
import sys
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.pytorch_utils import Conv1D

PROMPT_LENGTHS = (7, 13)
DECODE_STEPS = 8
# A greedy step is only a fair test when the winning logit beats the runner-up by more than the
# engine's allowed error (|dlogit| <= 1e-3 * max|logit|); the seed is advanced until it does.
MIN_RELATIVE_MARGIN = 4e-3
MAX_SEED_ATTEMPTS = 64
# Decoding that repeats one token would leave cache-position bugs to the logits comparison alone.
MIN_DISTINCT_DECODE_TOKENS = 3
# Cached decode must equal a full-sequence forward pass up to fp32 noise, except where HF's RoPE
# itself depends on the length of the forward call (dynamic NTK).
CACHE_CONSISTENCY_TOLERANCE = 1e-4
# The feature a fixture is about must move its logits: switching it off (Fixture.ablation) has to
# change some prefill logit by at least this fraction of max|logit|.
MIN_FEATURE_EFFECT = 1e-2

STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Fixture:
    name: str
    description: str
    weights_dtype: str                  # key of STORAGE_DTYPES
    config: dict                        # written verbatim as config.json (hub style)
    # Extra checks of how transformers parsed config.json: attribute path -> expected value.
    expect_config: dict = field(default_factory=dict)
    # dynamic NTK recomputes frequencies per forward call from its length, so a full-sequence pass
    # differs from cached decode and a padded batch differs from a single sequence.
    length_dependent_rope: bool = False
    # Written with transformers' own serializer (rope_parameters) instead of the hub-style dict.
    native_v5_config: bool = False
    # config.json overrides that switch off the feature under test; see MIN_FEATURE_EFFECT.
    ablation: dict = field(default_factory=dict)
    notes: str = ""
    # Projections (`*_proj.weight`) stored as an FP8 checkpoint the way llm-compressor writes one
    # (F8_E4M3 weights, a per-channel f32 `weight_scale`, `quantization_config`), see fp8_checkpoint().
    fp8_weights: bool = False


def llama(vocab=256, hidden=32, heads=4, kv_heads=4, intermediate=64, **extra):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    config.update(extra)
    return config


def phi3(vocab=256, hidden=32, heads=4, kv_heads=4, intermediate=64, **extra):
    config = {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    config.update(extra)
    return config


def gpt_neox(parallel_residual, rotary_pct, **extra):
    config = {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": 256,
        "hidden_size": 32,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "hidden_act": "gelu",
        "max_position_embeddings": 64,
        "layer_norm_eps": 1e-5,
        "rotary_pct": rotary_pct,
        "rotary_emb_base": 10000,
        "use_parallel_residual": parallel_residual,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    config.update(extra)
    return config


def gemma3(vocab=256, hidden=32, heads=4, kv_heads=2, head_dim=16, intermediate=64, **extra):
    """Gemma 3 text model with 3 layers: sliding_window_pattern 3 makes layers 0, 1 slide (window 4,
    below every prompt length) and layer 2 attend fully, each with its own RoPE base."""
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 3,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 100.0,
        "rope_scaling": None,
        "sliding_window": 4,
        "sliding_window_pattern": 3,
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }
    config.update(extra)
    return config


def ramp(count, low, high):
    return [round(low + (high - low) * i / (count - 1), 4) for i in range(count)]


FIXTURES = [
    Fixture("llama", "Llama, multi-head attention, untied lm_head, no biases", "float32", llama()),
    Fixture("llama_fp8", "Llama, GQA 4/2, projections stored as an FP8 (e4m3) checkpoint with per-channel "
            "scales as llm-compressor writes it; expected outputs from the exactly equal fp32 weights",
            "float32", llama(kv_heads=2), fp8_weights=True),
    Fixture("llama_gqa_tied", "Llama, grouped-query attention 8 heads / 2 kv heads, tied embeddings",
            "float16", llama(vocab=320, hidden=64, heads=8, kv_heads=2, intermediate=128,
                             tie_word_embeddings=True)),
    Fixture("llama_mqa", "Llama, multi-query attention (one kv head)", "float16",
            llama(kv_heads=1)),
    Fixture("llama_bias", "Llama with attention_bias (q/k/v/o biases) and mlp_bias (gate/up/down biases)",
            "float16", llama(attention_bias=True, mlp_bias=True)),
    Fixture("llama_head_dim", "Llama with explicit head_dim 16 != hidden/heads 8 (q/o projections 64 wide), GQA 4/2",
            "float16", llama(kv_heads=2, head_dim=16)),
    Fixture("llama3_scaled",
            "Llama 3.1 rope scaling (rope_type llama3): with head_dim 16 and theta 5e5 the wavelengths "
            "fall in all three bands (kept below 16, smoothed between 16 and 64, divided by 8 above 64)",
            "bfloat16",
            llama(heads=2, kv_heads=1, max_position_embeddings=512, rope_theta=500000.0,
                  rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64, "rope_type": "llama3"}),
            expect_config={"rope_parameters.rope_type": "llama3"},
            ablation={"rope_scaling": None}),
    Fixture("llama3_rope_parameters",
            "Same scaling as llama3_scaled, but config.json in transformers>=5 form: rope_parameters "
            "(rope_type, rope_theta, factor, ...) instead of rope_scaling + rope_theta",
            "float16",
            llama(heads=2, kv_heads=2, max_position_embeddings=512, rope_theta=500000.0,
                  rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64, "rope_type": "llama3"}),
            expect_config={"rope_parameters.rope_type": "llama3"}, native_v5_config=True,
            ablation={"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    Fixture("llama_linear", "Llama, linear rope scaling factor 4 (legacy key \"type\")", "float16",
            llama(heads=2, kv_heads=2, max_position_embeddings=256,
                  rope_scaling={"type": "linear", "factor": 4.0}),
            expect_config={"rope_parameters.rope_type": "linear"},
            ablation={"rope_scaling": None}),
    Fixture("llama_dynamic",
            "Llama, dynamic NTK rope scaling factor 2 with max_position_embeddings 10: prompt0 crosses "
            "it during decode, prompt1 already in prefill",
            "float16",
            llama(heads=2, kv_heads=2, max_position_embeddings=10,
                  rope_scaling={"type": "dynamic", "factor": 2.0}),
            expect_config={"rope_parameters.rope_type": "dynamic"}, length_dependent_rope=True,
            ablation={"rope_scaling": None},
            notes="max_position_embeddings (10) is below the sequence lengths used (up to 21): with "
                  "dynamic NTK it is the length beyond which frequencies are rescaled, not a hard limit. "
                  "HF recomputes the frequencies at every forward call from "
                  "seq_len = max(max_position_embeddings, last position in the call + 1): "
                  "base' = theta * (factor * seq_len / max_position_embeddings - (factor - 1)) ** (d / (d - 2)), "
                  "d = rotary dim; keys already in the KV cache keep the rotation they were given when "
                  "they were computed."),
    Fixture("llama_yarn",
            "Llama, YaRN rope scaling factor 4, original_max_position_embeddings 256 (ramp over "
            "dims 0..4 of 8, attention factor 0.1 ln 4 + 1 applied to cos/sin)",
            "float16",
            llama(heads=2, kv_heads=2, max_position_embeddings=1024,
                  rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),
            expect_config={"rope_parameters.rope_type": "yarn"},
            ablation={"rope_scaling": None}),
    Fixture("mistral", "Mistral, GQA 4/2, sliding_window 5 (smaller than every prompt)", "float16",
            dict(llama(kv_heads=2, sliding_window=5), architectures=["MistralForCausalLM"],
                 model_type="mistral"),
            expect_config={"sliding_window": 5}, ablation={"sliding_window": None}),
    Fixture("qwen2",
            "Qwen2, q/k/v biases (no o bias), GQA 4/2; sliding_window 4 present but "
            "use_sliding_window false, so attention is full",
            "bfloat16",
            {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 384,
             "hidden_size": 32, "intermediate_size": 96, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
             "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
             "rope_scaling": None, "use_sliding_window": False, "sliding_window": 4,
             "max_window_layers": 1, "tie_word_embeddings": False, "bos_token_id": 1,
             "eos_token_id": 2},
            expect_config={"sliding_window": None},
            # Proves the trap is live: an engine that applied the window would fail.
            ablation={"use_sliding_window": True}),
    Fixture("qwen2_sliding",
            "Qwen2 with use_sliding_window, sliding_window 4 and max_window_layers 1: layer 0 full, "
            "layer 1 sliding (transformers' serializer writes layer_types)",
            "float16",
            {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 384,
             "hidden_size": 32, "intermediate_size": 96, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu",
             "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
             "rope_scaling": None, "use_sliding_window": True, "sliding_window": 4,
             "max_window_layers": 1, "tie_word_embeddings": False, "bos_token_id": 1,
             "eos_token_id": 2},
            native_v5_config=True,
            expect_config={"layer_types": ["full_attention", "sliding_attention"]},
            ablation={"layer_types": ["full_attention", "full_attention"]}),
    Fixture("phi3", "Phi-3, fused qkv_proj [q;k;v] and gate_up_proj [gate;up]", "float16", phi3()),
    Fixture("phi3_partial",
            "Phi-3 with partial_rotary_factor 0.75 (head_dim 16, rotary dim 12), one kv head, tied "
            "embeddings (Phi-4-mini style)",
            "float16", phi3(heads=2, kv_heads=1, partial_rotary_factor=0.75, tie_word_embeddings=True),
            expect_config={"rope_parameters.partial_rotary_factor": 0.75},
            ablation={"partial_rotary_factor": 1.0}),
    Fixture("phi3_longrope",
            "Phi-3 longrope, original_max_position_embeddings 4 (top level, as Phi-3 writes it), "
            "max_position_embeddings 32: every forward call is longer than 4, so the long factors "
            "apply at every position; attention factor sqrt(1 + ln 8 / ln 4) scales cos/sin",
            "float16",
            phi3(heads=2, kv_heads=2, max_position_embeddings=32, original_max_position_embeddings=4,
                 rope_scaling={"type": "longrope", "short_factor": ramp(8, 1.0, 1.3),
                               "long_factor": ramp(8, 1.0, 9.0)}),
            expect_config={"rope_parameters.rope_type": "longrope"},
            ablation={"rope_scaling": None},
            notes="HF picks short or long factors per forward call from its last position; with "
                  "original_max_position_embeddings 4 every call (prefill >= 7 tokens, decode "
                  "positions >= 7) uses long_factor. A sequence that crosses the boundary during "
                  "decode is deliberately not covered: transformers' generate() then recomputes the "
                  "whole cache with the long factors."),
    Fixture("phi3_longrope_short",
            "Phi-3 longrope, original_max_position_embeddings 32 > every sequence here, so the short "
            "factors apply; attention factor sqrt(1 + ln 4 / ln 32) (max_position_embeddings 128)",
            "float16",
            phi3(heads=2, kv_heads=2, max_position_embeddings=128, original_max_position_embeddings=32,
                 rope_scaling={"type": "longrope", "short_factor": ramp(8, 1.0, 3.0),
                               "long_factor": ramp(8, 2.0, 20.0)}),
            expect_config={"rope_parameters.rope_type": "longrope"},
            ablation={"rope_scaling": None}),
    Fixture("gemma3",
            "Gemma 3 (hub-style config): QK-norm, (1 + w) RMSNorms, sandwich post-attention/post-FFN "
            "norms, sqrt(hidden) embedding scale, query_pre_attn_scalar 24 (softmax scale 24^-1/2, not "
            "head_dim 16's), layers 0-1 sliding window 4 at RoPE base 100, layer 2 global at base 1e6 "
            "with linear scaling 2, GQA 4/2, gelu_tanh, tied embeddings",
            "float32", gemma3(rope_scaling={"rope_type": "linear", "factor": 2.0}),
            expect_config={"layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
                           "rope_parameters.sliding_attention.rope_theta": 100.0,
                           "rope_parameters.full_attention.rope_type": "linear"},
            ablation={"sliding_window_pattern": 1}),
    Fixture("gemma3_softcap",
            "Gemma 3 written by transformers' serializer (rope_parameters per layer type, layer_types "
            "sliding/full/sliding) with final logit soft-capping 10; attn_logit_softcapping 4 is set but "
            "transformers' Gemma3 attention ignores it, so an engine must too",
            "bfloat16",
            gemma3(sliding_window=5, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   attn_logit_softcapping=4.0, final_logit_softcapping=10.0),
            native_v5_config=True,
            expect_config={"final_logit_softcapping": 10.0, "attn_logit_softcapping": 4.0},
            ablation={"final_logit_softcapping": None}),
    Fixture("gemma2",
            "Gemma 2: sandwich norms, (1 + w) RMSNorms, query_pre_attn_scalar 24, layer 0 sliding "
            "window 4 and layer 1 global (every 2nd), attention logit soft-capping 2 and final logit "
            "soft-capping 12, GQA 4/2, tied embeddings",
            "float16",
            dict(gemma3(num_hidden_layers=2, rope_theta=10000.0, attn_logit_softcapping=2.0,
                        final_logit_softcapping=12.0),
                 architectures=["Gemma2ForCausalLM"], model_type="gemma2"),
            expect_config={"layer_types": ["sliding_attention", "full_attention"]},
            ablation={"attn_logit_softcapping": None}),
    Fixture("qwen3",
            "Qwen3: per-head q_norm/k_norm before RoPE, explicit head_dim 16 != hidden/heads 8, GQA 4/2, "
            "no biases, untied lm_head",
            "bfloat16",
            {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 384,
             "hidden_size": 32, "intermediate_size": 96, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
             "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
             "rope_scaling": None, "attention_bias": False, "use_sliding_window": False,
             "sliding_window": None, "max_window_layers": 2, "tie_word_embeddings": False,
             "bos_token_id": 1, "eos_token_id": 2}),
    Fixture("gpt2", "GPT-2: learned positions, Conv1D weights stored [in, out], fused c_attn, "
            "gelu_new, LayerNorm with bias, tied lm_head", "float16",
            {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 300,
             "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": None,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
             "scale_attn_weights": True, "tie_word_embeddings": True, "bos_token_id": 299,
             "eos_token_id": 299}),
    Fixture("gpt_neox", "GPT-NeoX: rotary_pct 0.25 (rotary dim 4 of head_dim 16), parallel "
            "residual, fused per-head query_key_value, exact gelu, untied embed_out", "float16",
            gpt_neox(parallel_residual=True, rotary_pct=0.25),
            expect_config={"rope_parameters.partial_rotary_factor": 0.25},
            ablation={"use_parallel_residual": False}),
    Fixture("gpt_neox_serial", "GPT-NeoX with use_parallel_residual false (serial residual), "
            "rotary_pct 0.5", "float32",
            gpt_neox(parallel_residual=False, rotary_pct=0.5),
            expect_config={"rope_parameters.partial_rotary_factor": 0.5},
            ablation={"use_parallel_residual": True}),
]


def seed_for(name, attempt):
    return (zlib.crc32(name.encode()) + 7919 * attempt) & 0xFFFFFFFF


def load_model(model_dir):
    """A fresh model per use: dynamic/longrope RoPE keep state between forward calls."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def random_state_dict(model, rng):
    """Weights scaled so activations stay O(1) and logits spread enough for clear greedy choices."""
    conv1d_weights = {f"{name}.weight" for name, module in model.named_modules()
                      if isinstance(module, Conv1D)}
    embedding_weights = {f"{name}.weight" for name, module in model.named_modules()
                         if isinstance(module, torch.nn.Embedding)}
    norm_weights = {f"{name}.weight" for name, module in model.named_modules()
                    if isinstance(module, torch.nn.LayerNorm) or "RMSNorm" in type(module).__name__}
    state = {}
    for name, tensor in model.state_dict().items():
        shape = tuple(tensor.shape)
        if name in norm_weights:
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name in embedding_weights:
            # Small next to the blocks' outputs: with unit embeddings a tied lm_head mostly
            # predicts the current token again and greedy decoding repeats one token.
            values = 0.3 * rng.standard_normal(shape)
        elif len(shape) == 1:
            values = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 2:
            fan_in = shape[0] if name in conv1d_weights else shape[1]
            values = 1.5 * rng.standard_normal(shape) / math.sqrt(fan_in)
        else:
            raise ValueError(f"{name}: unexpected parameter shape {shape}")
        state[name] = torch.from_numpy(values.astype(np.float32))
    return state


def fp8_scales(weight):
    """Per-output-channel scales, powers of two just above absmax / 448, so e4m3 * scale is exact in fp32."""
    absmax = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    return torch.exp2(torch.ceil(torch.log2(absmax / 448.0)))


def fp8_representable(weight):
    """The weight rounded to what an FP8 checkpoint stores: e4m3(w / scale) * scale, exactly."""
    scale = fp8_scales(weight)
    return (weight / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale


def fp8_checkpoint(model_dir):
    """Rewrites model_dir's fp32 checkpoint (projections already fp8_representable) as
    llm-compressor's compressed-tensors FP8 format: F8_E4M3 `*_proj.weight` with an f32
    `weight_scale` [out, 1], `quantization_config` in config.json. transformers computed the expected
    logits from the fp32 twin, whose weights are exactly e4m3 * scale."""
    tensors = safetensors.torch.load_file(model_dir / "model.safetensors")
    out = {}
    for name, values in tensors.items():
        if name.endswith("_proj.weight"):
            scale = fp8_scales(values)
            codes = (values / scale).to(torch.float8_e4m3fn)
            assert torch.equal(codes.to(torch.float32) * scale, values), f"{name} is not fp8-representable"
            out[name] = codes.contiguous()
            out[name[:-len("weight")] + "weight_scale"] = scale.to(torch.float32).contiguous()
        else:
            out[name] = values
    safetensors.torch.save_file(out, model_dir / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                  "symmetric": True, "dynamic": False}}},
        "ignore": ["lm_head"]}
    write_json(model_dir / "config.json", config)


def tied_duplicates(model):
    """Names of tensors that share storage with an earlier one (tied lm_head): not stored."""
    seen, duplicates = {}, []
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key in seen:
            duplicates.append(name)
        else:
            seen[key] = name
    return duplicates


def to_json(value, indent=0):
    """json.dumps(indent=2), except that lists of scalars (prompts, tokens) stay on one line."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(key)}: {to_json(item, indent + 2)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(item, (list, dict)) for item in value):
        items = [inner + to_json(item, indent + 2) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(value)


def write_json(path, value):
    path.write_text(to_json(value) + "\n")


def write_checkpoint(fixture, model_dir, rng):
    """config.json + model.safetensors in model_dir; returns the parsed config."""
    model_dir.mkdir(parents=True)
    config_json = dict(fixture.config, torch_dtype=fixture.weights_dtype)
    write_json(model_dir / "config.json", config_json)
    config = AutoConfig.from_pretrained(model_dir)
    if fixture.native_v5_config:
        native = json.loads(config.to_json_string(use_diff=False))
        # Versions live in meta.json; the source path is this run's temp dir.
        native.pop("transformers_version", None)
        native.pop("_name_or_path", None)
        assert "rope_parameters" in native and "rope_scaling" not in native, native.keys()
        write_json(model_dir / "config.json", native)
        config = AutoConfig.from_pretrained(model_dir)

    skeleton = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    skip = set(tied_duplicates(skeleton))
    storage = STORAGE_DTYPES[fixture.weights_dtype]
    tensors = {name: values.to(storage).contiguous()
               for name, values in random_state_dict(skeleton, rng).items() if name not in skip}
    if fixture.fp8_weights:
        tensors = {name: fp8_representable(values) if name.endswith("_proj.weight") else values
                   for name, values in tensors.items()}
    safetensors.torch.save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})

    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {key: value for key, value in info.items() if value}
    assert not problems, f"{fixture.name}: checkpoint does not load cleanly: {problems}"
    loaded = model.state_dict()
    for name, stored in tensors.items():
        assert torch.equal(loaded[name], stored.to(torch.float32)), f"{fixture.name}: {name} changed on load"
    for attribute, expected in fixture.expect_config.items():
        value = model.config
        for part in attribute.split("."):
            value = value[part] if isinstance(value, dict) else getattr(value, part)
        assert value == expected, f"{fixture.name}: config {attribute} = {value!r}, expected {expected!r}"
    return model.config


def relative_margin(logits_row):
    top2 = torch.topk(logits_row, 2).values
    return float((top2[0] - top2[1]) / logits_row.abs().max())


def cached_greedy(model_dir, prompt):
    """Prefill the prompt, then DECODE_STEPS one-token steps through the KV cache, each feeding
    the argmax of the previous logits. Returns prefill [T,V], decode [S,V] logits, S tokens fed."""
    model = load_model(model_dir)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        prefill_logits = out.logits[0].clone()
        cache = out.past_key_values
        next_token = int(prefill_logits[-1].argmax())
        tokens, decode_logits = [], []
        for _ in range(DECODE_STEPS):
            tokens.append(next_token)
            out = model(input_ids=torch.tensor([[next_token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            decode_logits.append(out.logits[0, -1].clone())
            next_token = int(decode_logits[-1].argmax())
    return prefill_logits, torch.stack(decode_logits), tokens


def greedy_generate(model, input_ids, attention_mask):
    """generate() for DECODE_STEPS new tokens with no EOS stop: the model's own generation
    config (which carries eos_token_id from config.json) is replaced, not merged."""
    model.generation_config = GenerationConfig(
        do_sample=False, max_new_tokens=DECODE_STEPS, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    out = model.generate(input_ids, attention_mask=attention_mask)
    assert out.shape[1] == input_ids.shape[1] + DECODE_STEPS, f"generate() stopped early: {out.tolist()}"
    return out


def generate_single(model_dir, prompt):
    model = load_model(model_dir)
    with torch.no_grad():
        out = greedy_generate(model, torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def generate_batched(model_dir, prompts):
    """Both prompts in one left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    model = load_model(model_dir)
    with torch.no_grad():
        out = greedy_generate(model, ids, mask)
    return [row[width:].tolist() for row in out]


def full_forward_logits(model_dir, sequence):
    model = load_model(model_dir)
    with torch.no_grad():
        return model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0]


def feature_effect(model_dir, overrides, prompts, results):
    """Largest relative change of the prefill logits when config.json gets `overrides`."""
    ablated_dir = model_dir.parent / (model_dir.name + ".ablated")
    shutil.copytree(model_dir, ablated_dir)
    config_json = json.loads((model_dir / "config.json").read_text())
    write_json(ablated_dir / "config.json", dict(config_json, **overrides))
    return max(float((cached_greedy(ablated_dir, prompt)[0] - prefill).abs().max() / prefill.abs().max())
               for prompt, (prefill, _, _) in zip(prompts, results))


def build_fixture(fixture, out_dir, work_dir):
    for attempt in range(MAX_SEED_ATTEMPTS):
        seed = seed_for(fixture.name, attempt)
        rng = np.random.default_rng(seed)
        model_dir = work_dir / f"{fixture.name}.{attempt}"
        config = write_checkpoint(fixture, model_dir, rng)
        vocab = config.vocab_size
        # Prompt ids avoid 0..2 (pad/bos/eos in most configs) only to look like text; nothing depends on it.
        prompts = [rng.integers(3, vocab, size=length).tolist() for length in PROMPT_LENGTHS]
        results = [cached_greedy(model_dir, prompt) for prompt in prompts]
        margins = [relative_margin(row) for prefill, decode, _ in results
                   for row in [prefill[-1], *decode]]
        distinct = min(len(set(tokens)) for _, _, tokens in results)
        if min(margins) >= MIN_RELATIVE_MARGIN and distinct >= MIN_DISTINCT_DECODE_TOKENS:
            break
        print(f"  {fixture.name}: seed {seed}: greedy margin {min(margins):.2e}, "
              f"{distinct} distinct decode tokens; reseeding")
    else:
        raise RuntimeError(f"{fixture.name}: no seed in {MAX_SEED_ATTEMPTS} gives clear, varied greedy tokens")

    decode_tokens = [tokens for _, _, tokens in results]
    for prompt, tokens in zip(prompts, decode_tokens):
        generated = generate_single(model_dir, prompt)
        assert generated == tokens, f"{fixture.name}: generate() {generated} != cached decode {tokens}"
    batched = generate_batched(model_dir, prompts)
    batched_matches = batched == decode_tokens
    assert batched_matches or fixture.length_dependent_rope, \
        f"{fixture.name}: batched generate() {batched} != cached decode {decode_tokens}"

    cache_diffs = []
    for prompt, (prefill, decode, tokens) in zip(prompts, results):
        full = full_forward_logits(model_dir, prompt + tokens)
        cached = torch.cat([prefill, decode])
        cache_diffs.append(float((full - cached).abs().max() / full.abs().max()))
    assert fixture.length_dependent_rope or max(cache_diffs) <= CACHE_CONSISTENCY_TOLERANCE, \
        f"{fixture.name}: cached decode differs from a full forward pass by {max(cache_diffs):.2e}"

    effect = None
    if fixture.ablation:
        effect = feature_effect(model_dir, fixture.ablation, prompts, results)
        assert effect >= MIN_FEATURE_EFFECT, \
            f"{fixture.name}: overriding {fixture.ablation} changes prefill logits by only {effect:.2e}"
    config_json = json.loads((model_dir / "config.json").read_text())

    expected = {}
    for index, (prompt, (prefill, decode, tokens)) in enumerate(zip(prompts, results)):
        expected[f"prompt{index}.prompt_tokens"] = torch.tensor(prompt, dtype=torch.int32)
        expected[f"prompt{index}.prefill_logits"] = prefill.to(torch.float32).contiguous()
        expected[f"prompt{index}.decode_logits"] = decode.to(torch.float32).contiguous()
        expected[f"prompt{index}.decode_tokens"] = torch.tensor(tokens, dtype=torch.int32)
    # One metadata key only: safetensors writes metadata in hash order, which varies run to run.
    safetensors.torch.save_file(expected, model_dir / "expected.safetensors", metadata={"format": "pt"})

    meta = {
        "name": fixture.name,
        "description": fixture.description,
        "architectures": config_json["architectures"],
        "model_type": config_json["model_type"],
        "weights_dtype": fixture.weights_dtype,
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "seed": seed,
        "vocab_size": vocab,
        "num_prompts": len(prompts),
        "decode_steps": DECODE_STEPS,
        "prompts": prompts,
        "decode_tokens": decode_tokens,
        "generate_matches_cached_decode": True,
        "batched_generate_tokens": batched,
        "batched_generate_matches": batched_matches,
        "min_greedy_margin_relative": round(min(margins), 6),
        "cache_vs_full_forward_max_relative_diff": float(f"{max(cache_diffs):.3e}"),
        "ablation": None if effect is None else {
            "config_overrides": fixture.ablation,
            "prefill_logits_max_relative_change": float(f"{effect:.3e}"),
        },
        "notes": fixture.notes,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "numpy": np.__version__,
        },
    }
    write_json(model_dir / "meta.json", meta)

    target = out_dir / fixture.name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if fixture.fp8_weights:
        fp8_checkpoint(model_dir)
    for file_name in ("config.json", "model.safetensors", "expected.safetensors", "meta.json"):
        shutil.copyfile(model_dir / file_name, target / file_name)
    return meta


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="fixture root, e.g. tests/fixtures/hf")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="rebuild only these fixtures")
    args = parser.parse_args()

    names = [fixture.name for fixture in FIXTURES]
    unknown = set(args.only or []) - set(names)
    if unknown:
        parser.error(f"unknown fixture(s) {sorted(unknown)}; known: {names}")
    selected = [f for f in FIXTURES if not args.only or f.name in args.only]

    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for fixture in selected:
            meta = build_fixture(fixture, args.out, Path(work))
            print(f"{fixture.name}: {meta['weights_dtype']}, tokens {meta['decode_tokens']}, "
                  f"margin {meta['min_greedy_margin_relative']:.3g}, "
                  f"batched match {meta['batched_generate_matches']}")

    write_json(args.out / "index.json", {
        "fixtures": names,
        "generator": "python/make_hf_fixtures.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    })
    stale = [p.name for p in args.out.iterdir() if p.is_dir() and p.name not in names]
    if stale:
        print(f"warning: directories not produced by this script: {stale}", file=sys.stderr)


if __name__ == "__main__":
    main()
