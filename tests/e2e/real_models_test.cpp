// End-to-end on the small real checkpoints in ../shared/models: the same trained stories260K
// weights as llama2.c .bin, HF safetensors and GGUF (f32 and f16) must reproduce the reference
// greedy outputs recorded there (llama2.c's own test expectation and a float64 NumPy reference).
#include "backend/backend.h"
#include "engine/generator.h"
#include "engine/model_loader.h"
#include "model/config.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace splitflow;

namespace {

nlohmann::json golden() { return read_json_file(test::shared_path("models/stories260K/golden.json")); }

struct LoadedRunner {
  LoadedModel model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ModelRunner> runner;
};

LoadedRunner load(const std::string& relative_path, int64_t max_tokens) {
  LoadedRunner result;
  ModelLoadOptions options;
  options.model_path = test::shared_path(relative_path);
  options.weight_dtype = DType::F32;
  result.model = load_model(options);
  result.backend = make_cpu_backend(0);
  const KvCacheConfig kv{blocks_for_tokens(max_tokens, 16), 16};
  result.runner = std::make_unique<ModelRunner>(result.model.spec, std::move(result.model.weights), *result.backend, kv);
  return result;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  return params;
}

class Stories260K : public ::testing::TestWithParam<std::string> {};

TEST_P(Stories260K, GreedyFromBosMatchesLlama2cExpectation) {
  LoadedRunner loaded = load(GetParam(), 201);
  const nlohmann::json expected = golden().at("greedy_from_bos");
  Generator generator(*loaded.runner, loaded.model.tokenizer.get());
  const GenerationResult result = generator.generate({1}, greedy(200));
  EXPECT_EQ(result.output_ids, expected.at("token_ids").get<std::vector<int32_t>>());
  EXPECT_EQ(result.text, test::read_file(test::shared_path("models/stories260K/expected_greedy_200.txt")));
}

TEST_P(Stories260K, PromptEncodesAndContinuesAsReference) {
  LoadedRunner loaded = load(GetParam(), 80);
  const nlohmann::json expected = golden().at("prompt_greedy");
  const std::vector<int32_t> prompt = loaded.model.tokenizer->encode(expected.at("prompt").get<std::string>(), true);
  EXPECT_EQ(prompt, expected.at("prompt_ids_with_bos").get<std::vector<int32_t>>());
  Generator generator(*loaded.runner, loaded.model.tokenizer.get());
  const GenerationResult result = generator.generate(prompt, greedy(64));
  EXPECT_EQ(result.output_ids, expected.at("generated_ids").get<std::vector<int32_t>>());
  EXPECT_EQ(result.text, expected.at("generated_text").get<std::string>());
}

TEST_P(Stories260K, BosLogitsMatchFloat64Reference) {
  LoadedRunner loaded = load(GetParam(), 16);
  const nlohmann::json expected = golden().at("first_step_logits_after_bos");
  ForwardBatch batch;
  batch.token_ids = {1};
  batch.spans.push_back({1, 0, {0}, true});
  const Tensor logits = loaded.runner->forward(batch);
  const float* row = logits.as<float>();
  const int64_t vocab = logits.dim(1);
  // f16 weights round every parameter, so the f16 GGUF gets a looser bound.
  const double tolerance = GetParam().find("f16") != std::string::npos ? 5e-2 : 1e-4;
  for (const auto& entry : expected.at("top10")) {
    const int32_t id = entry.at("id").get<int32_t>();
    EXPECT_NEAR(row[id], entry.at("logit").get<double>(), tolerance) << "token " << id;
  }
  const double sum = std::accumulate(row, row + vocab, 0.0);
  const double l2 = std::sqrt(std::inner_product(row, row + vocab, row, 0.0));
  EXPECT_NEAR(sum, expected.at("sum").get<double>(), tolerance * vocab);
  EXPECT_NEAR(l2, expected.at("l2_norm").get<double>(), tolerance * 10);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, Stories260K,
                         ::testing::Values("models/stories260K/stories260K.bin", "models/stories260K-hf",
                                           "models/stories260K-gguf/stories260K.gguf",
                                           "models/stories260K-gguf/stories260K-f16.gguf"),
                         [](const auto& info) {
                           std::string name = info.param.substr(info.param.rfind('/') + 1);
                           std::replace_if(name.begin(), name.end(), [](char c) { return !std::isalnum(c); }, '_');
                           return name;
                         });

TEST(Aidreams260K, GreedyFromBosMatchesRecordedText) {
  LoadedRunner loaded = load("models/aidreams260K/aidreams260K.bin", 129);
  Generator generator(*loaded.runner, loaded.model.tokenizer.get());
  const GenerationResult result = generator.generate({1}, greedy(128));
  EXPECT_EQ(result.text, test::read_file(test::shared_path("models/aidreams260K/expected_greedy_128.txt")));
}

}  // namespace
