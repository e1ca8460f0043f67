// Encoder-only models on the CUDA backend (bf16 activations and KV, fp32 accumulation) against
// the CPU backend and the references: the tiny BERT / RoBERTa fixtures against transformers'
// fp32 states (head_dim 8: the generic attention kernel), a dummy-weight BERT of head_dim 64
// against the CPU backend on the same generated weights (sequences long enough for the
// tensor-core prefill kernel, bidirectional), and all-MiniLM-L6-v2 against sentence-transformers
// (cosine >= 0.999, the CUDA bound) when the model cache holds it. Skips without a GPU.
#include "backend_cuda/cuda_test_util.h"

#include "embedding/embedding_engine.h"
#include "embedding/embedding_input.h"
#include "engine/model_loader.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/block_allocator.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace splitflow;

namespace {

// bf16 rounding of every matmul input and of the residual stream over a few post-norm layers.
constexpr double kStatesRelativeL2 = 3e-2;

// Every sequence as one span of one forward, blocks handed out in reverse.
ForwardBatch whole_sequences(const std::vector<std::vector<int32_t>>& sequences, int32_t num_blocks, int32_t block_size) {
  BlockAllocator allocator(num_blocks);
  ForwardBatch batch;
  for (const auto& ids : sequences) {
    std::vector<int32_t> table;
    allocator.grow_table(table, static_cast<int64_t>(ids.size()), block_size);
    std::reverse(table.begin(), table.end());
    batch.token_ids.insert(batch.token_ids.end(), ids.begin(), ids.end());
    batch.spans.push_back({static_cast<int32_t>(ids.size()), 0, table, false});
  }
  return batch;
}

class CudaEncoderFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEncoderFixture, StatesMatchTransformers) {
  SF_REQUIRE_GPU();
  const std::string dir = test::fixture_path("encoder/" + GetParam());
  const ModelSpec spec = resolve_hf_spec(dir);
  const auto expected = open_safetensors(dir + "/expected.safetensors");
  const int prompts = read_json_file(dir + "/meta.json").at("num_prompts").get<int>();
  std::vector<std::vector<int32_t>> sequences;
  for (int p = 0; p < prompts; ++p) {
    const Tensor& tokens = expected->find(fmt::format("prompt{}.tokens", p))->tensor;
    sequences.emplace_back(tokens.as<int32_t>(), tokens.as<int32_t>() + tokens.numel());
  }
  const std::unique_ptr<Backend> cuda = test::make_test_cuda_backend();
  ModelRunner runner(spec, bind_weights(spec, *open_weights(dir), DType::BF16), *cuda, KvCacheConfig{64, 16},
                     RunnerLimits{256, 8});
  const Tensor states = runner.forward_hidden(whole_sequences(sequences, 64, 16));
  int64_t row = 0;
  for (int p = 0; p < prompts; ++p) {
    const int64_t count = static_cast<int64_t>(sequences[p].size()) * spec.hidden_size;
    const float* reference = expected->find(fmt::format("prompt{}.last_hidden_state", p))->tensor.as<float>();
    const double error = test::relative_l2(states.as<float>() + row, reference, count);
    std::printf("%s prompt %d (%zu tokens) on CUDA: relative L2 error %.3g\n", GetParam().c_str(), p,
                sequences[p].size(), error);
    EXPECT_LE(error, kStatesRelativeL2) << GetParam() << " prompt " << p;
    row += count;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEncoderFixture, ::testing::Values("tiny_bert", "tiny_roberta"));

// head_dim 64 and spans of 70-200 tokens: the tensor-core prefill kernel, bidirectional, beside
// one-token spans (which a causal batch would hand to the decode kernel).
TEST(CudaEncoder, TensorCorePrefillIsBidirectional) {
  SF_REQUIRE_GPU();
  nlohmann::json config = read_json_file(test::fixture_path("encoder/tiny_bert/config.json"));
  config["hidden_size"] = 256;
  config["num_attention_heads"] = 4;
  config["intermediate_size"] = 512;
  config["max_position_embeddings"] = 256;
  const std::string path = (std::filesystem::temp_directory_path() / "splitflow_cuda_encoder_config.json").string();
  { std::ofstream(path) << config.dump(); }
  const ModelSpec spec = resolve_config_spec(path);
  ASSERT_EQ(spec.attention.head_dim, 64);
  std::vector<std::vector<int32_t>> sequences = {std::vector<int32_t>(200), {7}, std::vector<int32_t>(70), {9}};
  for (auto& ids : sequences)
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + ids.size()) % 96);
  const std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::unique_ptr<Backend> cuda = test::make_test_cuda_backend();
  ModelRunner cpu_runner(spec, make_dummy_weights(spec, DType::BF16, 7), *cpu, KvCacheConfig{32, 16}, RunnerLimits{512, 8});
  ModelRunner cuda_runner(spec, make_dummy_weights(spec, DType::BF16, 7), *cuda, KvCacheConfig{32, 16},
                          RunnerLimits{512, 8});
  const ForwardBatch batch = whole_sequences(sequences, 32, 16);
  const Tensor expected = cpu_runner.forward_hidden(batch);
  const Tensor actual = cuda_runner.forward_hidden(batch);
  int64_t row = 0;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const int64_t count = static_cast<int64_t>(sequences[s].size()) * spec.hidden_size;
    const double error = test::relative_l2(actual.as<float>() + row, expected.as<float>() + row, count);
    std::printf("dummy BERT (head_dim 64) span %zu (%zu tokens), CUDA vs CPU: relative L2 %.3g\n", s,
                sequences[s].size(), error);
    EXPECT_LE(error, kStatesRelativeL2) << "span " << s;
    row += count;
  }
}

TEST(CudaEncoder, AllMiniLmL6V2MatchesSentenceTransformers) {
  SF_REQUIRE_GPU();
  const char* env = std::getenv("SPLITFLOW_MODEL_CACHE");
  const std::string dir = (env ? std::string(env) : test::fixture_path("../../.cache/models")) + "/all-MiniLM-L6-v2";
  if (!std::filesystem::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " is absent (scripts/setup.sh)";
  const std::vector<std::string> texts =
      read_json_file(test::fixture_path("encoder/corpus.json")).get<std::vector<std::string>>();
  const auto reference = open_safetensors(test::fixture_path("encoder/all-minilm-l6-v2.reference.safetensors"));
  const float* expected = reference->find("embeddings")->tensor.as<float>();
  ModelLoadOptions options;
  options.model_path = dir;
  LoadedModel model = load_model(options);
  const SpecialFrame frame = special_frame(*model.tokenizer);
  std::vector<std::vector<int32_t>> inputs;
  for (const std::string& text : texts)
    inputs.push_back(encode_for_embedding(*model.tokenizer, frame, text, model.spec.embedding.max_tokens));
  const std::unique_ptr<Backend> cuda = test::make_test_cuda_backend();
  const EmbeddingEngineConfig config{4096, 128};
  ModelRunner runner(model.spec, std::move(model.weights), *cuda, KvCacheConfig{embedding_cache_blocks(config, 16), 16},
                     RunnerLimits{config.max_batch_tokens, config.max_seqs, false});
  EmbeddingEngine engine(runner, config);
  const auto embeddings = engine.embed(inputs);
  const int64_t dim = model.spec.hidden_size;
  double worst = 1.0;
  for (size_t i = 0; i < embeddings.size(); ++i) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t d = 0; d < dim; ++d) {
      dot += static_cast<double>(embeddings[i][d]) * expected[i * dim + d];
      na += static_cast<double>(embeddings[i][d]) * embeddings[i][d];
      nb += static_cast<double>(expected[i * dim + d]) * expected[i * dim + d];
    }
    const double cosine = dot / std::sqrt(na * nb);
    worst = std::min(worst, cosine);
    EXPECT_GE(cosine, 0.999) << "text " << i;
  }
  std::printf("all-MiniLM-L6-v2 on CUDA vs sentence-transformers, %zu texts: worst cosine %.6f\n", embeddings.size(),
              worst);
}

}  // namespace
