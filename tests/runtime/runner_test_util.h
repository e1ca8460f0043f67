// tests/runtime/runner_test_util.h — tiny random models and helpers to drive ModelRunner.
#pragma once

#include "core/dtype.h"
#include "model/spec.h"
#include "model/weights.h"
#include "runtime/batch.h"
#include "runtime/model_runner.h"

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace splitflow::test {

// A small Llama-shaped spec: RMSNorm, gated SiLU, RoPE (half), GQA 4:2, 2 layers.
inline ModelSpec tiny_spec() {
  ModelSpec spec;
  spec.name = "tiny";
  spec.hidden_size = 48;
  spec.num_layers = 2;
  spec.vocab_size = 97;
  spec.max_position = 64;
  spec.attention.num_heads = 4;
  spec.attention.num_kv_heads = 2;
  spec.attention.head_dim = 12;
  spec.mlp.intermediate_size = 72;
  return spec;
}

// Tensor names consistent with the spec's modules (make_dummy_weights validates the spec; the
// names themselves are never looked up).
inline ModelSpec named(ModelSpec spec) {
  TensorNames& t = spec.tensors;
  t.embed = "embed";
  t.final_norm = "final_norm";
  t.lm_head = "lm_head";
  t.pos_embed = spec.position == PositionType::Learned ? "pos_embed" : "";
  t.attn_norm = "{layer}.attn_norm";
  t.ffn_norm = spec.shared_layer_norm ? "" : "{layer}.ffn_norm";
  t.q = "{layer}.q";
  t.k = "{layer}.k";
  t.v = "{layer}.v";
  t.o = "{layer}.o";
  t.gate = spec.mlp.gated ? "{layer}.gate" : "";
  t.up = "{layer}.up";
  t.down = "{layer}.down";
  return spec;
}

// make_dummy_weights' shapes with values large enough that attention is far from uniform and
// every layer matters (std 0.02 would make the logits nearly constant): matrices 1.5/sqrt(fan_in)
// N(0,1), embeddings 0.5 N(0,1), norms 1 + 0.1 N(0,1), biases 0.1 N(0,1); matrices stored in
// `dtype`.
inline ModelWeights random_weights(const ModelSpec& spec, DType dtype, uint64_t seed) {
  const ModelSpec shapes = named(spec);
  ModelWeights weights = make_dummy_weights(shapes, DType::F32, seed);
  std::mt19937_64 rng(seed * 7 + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto fill = [&](Tensor& t, float mean, float std) {
    if (t.empty()) return;
    t = Tensor::zeros(DType::F32, t.shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = mean + std * normal(rng);
  };
  const auto matrix = [&](Tensor& t, float std) {
    if (t.empty()) return;
    fill(t, 0.0f, std);
    t = to_dtype(t, dtype);
  };
  const bool tied = shapes.tie_embeddings;
  matrix(weights.embed, 0.5f);
  weights.lm_head = tied ? weights.embed : weights.lm_head;
  if (!tied) matrix(weights.lm_head, 1.5f / std::sqrt(static_cast<float>(spec.hidden_size)));
  if (!weights.pos_embed.empty()) matrix(weights.pos_embed, 0.5f);
  fill(weights.final_norm, 1.0f, 0.1f);
  fill(weights.final_norm_bias, 0.0f, 0.1f);
  for (LayerWeights& layer : weights.layers) {
    fill(layer.attn_norm, 1.0f, 0.1f);
    fill(layer.attn_norm_bias, 0.0f, 0.1f);
    fill(layer.ffn_norm, 1.0f, 0.1f);
    fill(layer.ffn_norm_bias, 0.0f, 0.1f);
    for (Tensor* m : {&layer.wqkv, &layer.wo, &layer.w_gate_up, &layer.w_down})
      if (!m->empty()) matrix(*m, 1.5f / std::sqrt(static_cast<float>(m->dim(1))));
    for (Tensor* b : {&layer.bqkv, &layer.bo, &layer.b_gate_up, &layer.b_down}) fill(*b, 0.0f, 0.1f);
  }
  return weights;
}

inline std::vector<int32_t> random_tokens(std::mt19937_64& rng, int count, int vocab) {
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = dist(rng);
  return tokens;
}

inline std::vector<int32_t> iota_blocks(int count, int first = 0) {
  std::vector<int32_t> blocks(count);
  std::iota(blocks.begin(), blocks.end(), first);
  return blocks;
}

// One span of `tokens[begin, begin+count)` for a sequence with the given block table.
inline ForwardBatch single_span(const std::vector<int32_t>& tokens, int begin, int count,
                                const std::vector<int32_t>& block_table, LogitsMode mode) {
  ForwardBatch batch;
  batch.token_ids.assign(tokens.begin() + begin, tokens.begin() + begin + count);
  SequenceSpan span;
  span.num_tokens = count;
  span.start_position = begin;
  span.block_table = block_table;
  batch.spans.push_back(span);
  batch.logits_mode = mode;
  return batch;
}

}  // namespace splitflow::test
