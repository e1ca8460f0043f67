// The engine's fp32 forward pass against HF transformers on tiny random-weight checkpoints of
// every architecture template (tests/fixtures/hf, made by python/make_hf_fixtures.py): the
// logits of every prefill position and of 8 cached decode steps within 1e-3 * max|logit|, and
// the same greedy tokens. Each fixture runs with matrices in f32 and in the checkpoint's dtype.
#include "backend/backend.h"
#include "engine/model_loader.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/block_allocator.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

using namespace splitflow;

namespace {

std::vector<std::string> fixture_names() {
  const nlohmann::json index = read_json_file(test::fixture_path("hf/index.json"));
  return index.at("fixtures").get<std::vector<std::string>>();
}

int32_t argmax(const float* row, int64_t count) { return static_cast<int32_t>(std::max_element(row, row + count) - row); }

// Compares `actual` [rows, vocab] with `expected`; returns the worst |diff| / max|expected| per row.
void expect_logits_close(const float* actual, const float* expected, int64_t rows, int64_t vocab,
                         const std::string& what) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = actual + r * vocab;
    const float* e = expected + r * vocab;
    double max_abs = 0, max_diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(e[v])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(a[v]) - e[v]));
    }
    EXPECT_LE(max_diff, 1e-3 * max_abs) << what << " row " << r << ": max |diff| " << max_diff << ", max |logit| " << max_abs;
  }
}

class HfFixture : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(HfFixture, MatchesTransformersLogitsAndGreedyTokens) {
  const auto& [name, keep_stored_dtype] = GetParam();
  const std::string dir = test::fixture_path("hf/" + name);
  std::unique_ptr<WeightSource> source = open_weights(dir);
  const ModelSpec spec = resolve_source_spec(*source, dir);
  const std::unique_ptr<WeightSource> expected = open_safetensors(dir + "/expected.safetensors");
  const nlohmann::json meta = read_json_file(dir + "/meta.json");
  const DType dtype = keep_stored_dtype ? dominant_matrix_dtype(*source) : DType::F32;

  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  const KvCacheConfig kv{16, 4};  // small blocks so every prompt spans several, in shuffled order
  ModelRunner runner(spec, bind_weights(spec, *source, dtype), *backend, kv);
  const int64_t vocab = spec.vocab_size;

  for (int p = 0; p < meta.at("num_prompts").get<int>(); ++p) {
    const std::string prefix = "prompt" + std::to_string(p) + ".";
    const Tensor& prompt = expected->find(prefix + "prompt_tokens")->tensor;
    const Tensor& prefill_logits = expected->find(prefix + "prefill_logits")->tensor;
    const Tensor& decode_tokens = expected->find(prefix + "decode_tokens")->tensor;
    const Tensor& decode_logits = expected->find(prefix + "decode_logits")->tensor;
    const int64_t prompt_len = prompt.numel(), steps = decode_tokens.numel();

    // Blocks handed out in reverse so the block table is not the identity.
    BlockAllocator allocator(kv.num_blocks);
    std::vector<int32_t> table;
    allocator.grow_table(table, prompt_len + steps, kv.block_size);
    std::reverse(table.begin(), table.end());

    ForwardBatch prefill;
    prefill.token_ids.assign(prompt.as<int32_t>(), prompt.as<int32_t>() + prompt_len);
    prefill.spans.push_back({static_cast<int32_t>(prompt_len), 0, table, true});
    prefill.logits_mode = LogitsMode::All;
    Tensor logits = runner.forward(prefill);
    expect_logits_close(logits.as<float>(), prefill_logits.as<float>(), prompt_len, vocab, name + " " + prefix + "prefill");
    int32_t next = argmax(logits.as<float>() + (prompt_len - 1) * vocab, vocab);
    ASSERT_EQ(next, decode_tokens.as<int32_t>()[0]) << name << " " << prefix << "first greedy token";

    for (int64_t step = 0; step < steps; ++step) {
      ForwardBatch decode;
      decode.token_ids = {decode_tokens.as<int32_t>()[step]};
      decode.spans.push_back({1, static_cast<int32_t>(prompt_len + step), table, true});
      logits = runner.forward(decode);
      expect_logits_close(logits.as<float>(), decode_logits.as<float>() + step * vocab, 1, vocab,
                          name + " " + prefix + "decode step " + std::to_string(step));
      next = argmax(logits.as<float>(), vocab);
      if (step + 1 < steps) ASSERT_EQ(next, decode_tokens.as<int32_t>()[step + 1]) << name << " " << prefix << "greedy token " << step + 1;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfFixture, ::testing::Combine(::testing::ValuesIn(fixture_names()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_stored_dtype" : "_f32");
                         });

}  // namespace
