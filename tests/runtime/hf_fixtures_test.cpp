// ModelRunner against HF transformers on the tiny random-weight checkpoints in tests/fixtures/hf
// (python/make_hf_fixtures.py): prefill logits and 8 cached decode steps, |delta| <= 1e-3 x
// max|logit| per row, and the same greedy tokens. The checkpoints load through the model module
// (spec resolution from config.json, weight binding) exactly as `splitflow generate` loads them,
// with matrices kept in their stored dtype.
#include "runtime/model_runner.h"

#include "backend/backend.h"
#include "core/mapped_file.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

using namespace splitflow;
using nlohmann::json;

namespace {

std::vector<std::string> fixture_names() {
  const json index = json::parse(read_text_file(test::fixture_path("hf/index.json")));
  return index["fixtures"].get<std::vector<std::string>>();
}

const Tensor& expected_tensor(const WeightSource& expected, const std::string& name) {
  const TensorInfo* info = expected.find(name);
  SF_CHECK(info != nullptr, "expected.safetensors: no tensor {}", name);
  return info->tensor;
}

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

// Row `got_row` of got against row `want_row` of want: |delta| <= 1e-3 max|want row|.
void expect_logits_close(const Tensor& got, int64_t got_row, const Tensor& want, int64_t want_row, const std::string& what) {
  const int64_t vocab = want.dim(1);
  ASSERT_EQ(got.dim(1), vocab) << what;
  const float* g = got.as<float>() + got_row * vocab;
  const float* w = want.as<float>() + want_row * vocab;
  float scale = 0.0f, worst = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) scale = std::max(scale, std::abs(w[i]));
  for (int64_t i = 0; i < vocab; ++i) worst = std::max(worst, std::abs(g[i] - w[i]));
  EXPECT_LE(worst, 1e-3f * scale) << what << ": max |delta| " << worst << ", max |logit| " << scale;
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, PrefillAndDecodeMatchTransformers) {
  const std::string dir = test::fixture_path("hf/" + GetParam());
  const json meta = json::parse(read_text_file(dir + "/meta.json"));
  std::unique_ptr<WeightSource> source = open_weights(dir);
  const ModelSpec spec = resolve_source_spec(*source, dir);
  const DType dtype = parse_dtype(meta["weights_dtype"].get<std::string>());
  const ModelWeights weights = bind_weights(spec, *source, dtype);
  std::unique_ptr<WeightSource> expected = open_safetensors(dir + "/expected.safetensors");
  auto backend = make_cpu_backend(2);
  const int num_prompts = meta["num_prompts"];
  const KvCacheConfig kv{32, 4};
  for (int p = 0; p < num_prompts; ++p) {
    const std::string key = "prompt" + std::to_string(p);
    const std::vector<int32_t> prompt = meta["prompts"][p];
    const std::vector<int32_t> decode_tokens = meta["decode_tokens"][p];
    const Tensor& prefill_logits = expected_tensor(*expected, key + ".prefill_logits");
    const Tensor& decode_logits = expected_tensor(*expected, key + ".decode_logits");
    // A fresh runner per prompt, as the generator loads a fresh model (dynamic RoPE keeps state).
    ModelRunner runner(spec, weights, *backend, kv);
    std::vector<int32_t> table(kv.num_blocks);
    for (int b = 0; b < kv.num_blocks; ++b) table[b] = kv.num_blocks - 1 - b;  // any block order works

    ForwardBatch prefill;
    prefill.token_ids = prompt;
    prefill.spans = {{static_cast<int32_t>(prompt.size()), 0, table, true}};
    prefill.logits_mode = LogitsMode::All;
    const Tensor logits = runner.forward(prefill);
    ASSERT_EQ(logits.dim(0), static_cast<int64_t>(prompt.size()));
    for (size_t i = 0; i < prompt.size(); ++i)
      expect_logits_close(logits, i, prefill_logits, i, fmt::format("{} prefill row {}", key, i));
    EXPECT_EQ(argmax(logits.as<float>() + (prompt.size() - 1) * logits.dim(1), logits.dim(1)), decode_tokens[0])
        << key << " first greedy token";

    int32_t position = static_cast<int32_t>(prompt.size());
    for (size_t step = 0; step < decode_tokens.size(); ++step, ++position) {
      ForwardBatch decode;
      decode.token_ids = {decode_tokens[step]};
      decode.spans = {{1, position, table, true}};
      const Tensor row = runner.forward(decode);
      expect_logits_close(row, 0, decode_logits, step, fmt::format("{} decode step {}", key, step));
      if (step + 1 < decode_tokens.size()) {
        EXPECT_EQ(argmax(row.as<float>(), row.dim(1)), decode_tokens[step + 1]) << key << " greedy token " << step + 1;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfFixture, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
