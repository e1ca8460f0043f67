// bench/embedding_throughput.h on the tiny BERT fixture (CPU): the FLOP count against the shape's
// arithmetic done by hand, a run's figures consistent with its own timings, and the refusals.
#include "bench/embedding_throughput.h"

#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace splitflow::bench {
namespace {

LoadedModel tiny_bert() {
  ModelLoadOptions options;
  options.model_path = test::fixture_path("encoder/tiny_bert");
  return load_model(options);
}

TEST(EmbeddingBench, FlopsAreTheShapesArithmetic) {
  const LoadedModel model = tiny_bert();
  // hidden 32, intermediate 64 (GELU, not gated), 4 heads of 8, 2 layers: per token and layer
  // 2 x (32 x 96 + 32 x 32 + 32 x 64 + 64 x 32) for the matrices and 4 x 10 x 32 for attention
  // over 10 tokens; times 2 layers and 10 tokens.
  const double per_token_layer = 2.0 * (32 * 96 + 32 * 32 + 32 * 64 + 64 * 32) + 4.0 * 10 * 32;
  EXPECT_DOUBLE_EQ(embedding_flops_per_input(model.spec, 10), per_token_layer * 2 * 10);
}

TEST(EmbeddingBench, ReportsItsPassesAndRefusesWhatCannotRun) {
  auto backend = make_cpu_backend(1);
  EmbeddingBenchOptions options;
  options.num_inputs = 40;
  options.input_len = 12;
  options.max_batch_tokens = 128;
  options.max_seqs = 16;
  options.repetitions = 3;
  const nlohmann::json result = run_embedding_throughput(tiny_bert(), *backend, options, 0.5);
  ASSERT_EQ(result["pass_seconds"].size(), 3u);
  std::vector<double> passes = result["pass_seconds"].get<std::vector<double>>();
  std::sort(passes.begin(), passes.end());
  EXPECT_DOUBLE_EQ(result["median_pass_s"].get<double>(), passes[1]);
  EXPECT_NEAR(result["tokens_per_s"].get<double>(), 40.0 * 12 / passes[1], 1e-6 * 40 * 12 / passes[1]);
  EXPECT_EQ(result["inputs_per_step"].get<int>(), 10);  // 128 tokens / 12 per input
  EXPECT_NEAR(result["fraction_of_gemm"].get<double>(), result["achieved_tflops"].get<double>() / 0.5, 1e-12);

  options.input_len = 65;  // past the fixture's 64 positions
  options.max_batch_tokens = 256;
  try {
    run_embedding_throughput(tiny_bert(), *backend, options, 0);
    ADD_FAILURE() << "embedded inputs past the model's positions";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--input-len 65"), std::string::npos) << e.what();
  }
  ModelLoadOptions decoder;
  decoder.model_path = test::shared_path("models/stories260K-hf");
  options.input_len = 8;
  EXPECT_THROW(run_embedding_throughput(load_model(decoder), *backend, options, 0), Error);
}

}  // namespace
}  // namespace splitflow::bench
