// What the CUDA ModelRunner tests share: a small GQA model (head_dim 64, KV heads shared by two
// query heads) and five sequences of different lengths decoded together, so a step's batch hits
// different recording buckets as sequences join and leave.
#pragma once

#include "backend_cuda/cuda_test_util.h"

#include "runtime/model_runner.h"
#include "runtime/runner_test_util.h"

#include <algorithm>
#include <initializer_list>

namespace splitflow::test {

inline ModelSpec decode_runner_spec() {
  ModelSpec spec = tiny_spec();
  spec.hidden_size = 256;
  spec.attention.num_heads = 4;
  spec.attention.num_kv_heads = 2;
  spec.attention.head_dim = 64;
  spec.mlp.intermediate_size = 512;
  spec.vocab_size = 1000;
  spec.max_position = 1024;
  return spec;
}

inline int64_t argmax_row(const Tensor& logits, int64_t row) {
  const float* r = logits.as<float>() + row * logits.dim(1);
  return std::max_element(r, r + logits.dim(1)) - r;
}

// kSeqs sequences with prompts of 3, 17, 40, 1 and 64 tokens, each in its own kBlocksPerSeq
// blocks (sequence 0 owns block 0); `next` holds each one's next token.
struct DecodingSequences {
  static constexpr int kSeqs = 5, kBlocksPerSeq = 8, kBlockSize = 16;
  std::vector<std::vector<int32_t>> tables = std::vector<std::vector<int32_t>>(kSeqs);
  std::vector<int32_t> lengths = {3, 17, 40, 1, 64};
  std::vector<int32_t> next = std::vector<int32_t>(kSeqs);

  static KvCacheConfig kv_config() { return {kSeqs * kBlocksPerSeq, kBlockSize}; }

  // Runs every prompt on `reference` (its argmax is the next token) and on each of `others`.
  void prefill(ModelRunner& reference, std::initializer_list<ModelRunner*> others, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int s = 0; s < kSeqs; ++s) {
      tables[s] = iota_blocks(kBlocksPerSeq, s * kBlocksPerSeq);
      const std::vector<int32_t> prompt = random_tokens(rng, lengths[s], reference.spec().vocab_size);
      const ForwardBatch batch = single_span(prompt, 0, lengths[s], tables[s], LogitsMode::Last);
      next[s] = static_cast<int32_t>(argmax_row(reference.forward(batch), 0));
      for (ModelRunner* other : others) other->forward(batch);
    }
  }

  // One decode token of the first `active` sequences.
  ForwardBatch decode_batch(int active) const {
    ForwardBatch batch;
    for (int s = 0; s < active; ++s) {
      batch.token_ids.push_back(next[s]);
      batch.spans.push_back({1, lengths[s], tables[s], true});
    }
    return batch;
  }

  // The first rows of `logits` decoded: their argmax is the next token.
  void advance(const Tensor& logits, int active) {
    for (int s = 0; s < active; ++s) {
      next[s] = static_cast<int32_t>(argmax_row(logits, s));
      ++lengths[s];
    }
  }
};

// forward_sample with greedy rows picks forward()'s argmax for the first three sequences.
inline void expect_greedy_sampling_is_argmax(ModelRunner& runner, const DecodingSequences& seqs) {
  const ForwardBatch batch = seqs.decode_batch(3);
  const Tensor logits = runner.forward(batch);
  const std::vector<int32_t> sampled = runner.forward_sample(batch, std::vector<SamplingRow>(3));
  for (int s = 0; s < 3; ++s) EXPECT_EQ(sampled[s], argmax_row(logits, s)) << "sequence " << s;
}

}  // namespace splitflow::test
