// `splitflow embed` end to end: token-id and text inputs of the tiny BERT fixture in JSON and
// text form, the vectors equal to the engine's, and the errors a user meets (a generative
// model, --dimensions on a model not trained for it, no inputs).
#include "embedding/embedding_engine.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "splitflow_command.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>

namespace splitflow {
namespace {

using test::run_splitflow;

const std::string kTinyBert = test::fixture_path("encoder/tiny_bert");

TEST(EmbedCommand, PrintsTheEnginesVectors) {
  const test::CommandResult result =
      run_splitflow({"embed", "--model", kTinyBert, "--ids", "5,9,3", "--ids", "7", "--threads", "1"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json body = nlohmann::json::parse(result.out);
  ASSERT_EQ(body["data"].size(), 2u);
  EXPECT_EQ(body["data"][0]["num_tokens"], 3);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);

  const ModelSpec spec = resolve_hf_spec(kTinyBert);
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  ModelRunner runner(spec, bind_weights(spec, *open_weights(kTinyBert), DType::F32), *backend, KvCacheConfig{16, 16},
                     RunnerLimits{64, 4});
  EmbeddingEngine engine(runner, EmbeddingEngineConfig{64, 4});
  const auto expected = engine.embed({{5, 9, 3}, {7}});
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto values = body["data"][i]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(values.size(), expected[i].size());
    for (size_t d = 0; d < values.size(); ++d) EXPECT_NEAR(values[d], expected[i][d], 1e-5) << i << " " << d;
  }

  const test::CommandResult text = run_splitflow({"embed", "--model", kTinyBert, "--ids", "5,9,3", "--format", "text"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  std::istringstream numbers(text.out);
  size_t count = 0;
  for (float value; numbers >> value;) ++count;
  EXPECT_EQ(count, 32u);  // hidden_size numbers on one line

  // Texts go through the fixture's WordPiece tokenizer, [CLS] and [SEP] added.
  const test::CommandResult texts = run_splitflow({"embed", "--model", kTinyBert, "--text", "The cat sat", "--text", "dog"});
  ASSERT_EQ(texts.exit_code, 0) << texts.err;
  const nlohmann::json text_body = nlohmann::json::parse(texts.out);
  EXPECT_EQ(text_body["data"][0]["num_tokens"], 5);
  EXPECT_EQ(text_body["data"][1]["num_tokens"], 3);
}

TEST(EmbedCommand, ExplainsWhatItCannotDo) {
  test::expect_command_error(run_splitflow({"embed", "--model", test::shared_path("models/stories260K-hf"), "--text", "hi"}),
                             "is a generative (decoder_only) model");
  test::expect_command_error(run_splitflow({"embed", "--model", kTinyBert, "--ids", "5", "--dimensions", "8"}),
                             "--dimensions: this model was not trained for shorter embeddings");
  test::expect_command_error(run_splitflow({"embed", "--model", kTinyBert}), "give the inputs");
}

}  // namespace
}  // namespace splitflow
