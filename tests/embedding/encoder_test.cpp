// Encoder-only models against transformers: tiny random-weight BERT and RoBERTa checkpoints
// (python/make_encoder_fixtures.py), every prompt's last hidden states within 1e-3 of
// transformers' fp32 ones relative to their largest magnitude, the prompts run together in one
// batched forward as the embedding engine runs them; plus the spec and runner rules encoders add.
#include "embedding/embedding_engine.h"
#include "embedding/embedding_input.h"
#include "embedding/pooling.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/block_allocator.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace splitflow {
namespace {

struct EncoderFixture {
  ModelSpec spec;
  std::unique_ptr<WeightSource> checkpoint;
  std::unique_ptr<WeightSource> expected;
  int num_prompts = 0;

  explicit EncoderFixture(const std::string& name) {
    const std::string dir = test::fixture_path("encoder/" + name);
    spec = resolve_hf_spec(dir);
    checkpoint = open_weights(dir);
    expected = open_safetensors(dir + "/expected.safetensors");
    num_prompts = read_json_file(dir + "/meta.json").at("num_prompts").get<int>();
  }
  const Tensor& tokens(int p) const { return expected->find(fmt::format("prompt{}.tokens", p))->tensor; }
  const Tensor& states(int p) const { return expected->find(fmt::format("prompt{}.last_hidden_state", p))->tensor; }
};

// max |a - e| / max |e| over one prompt's states.
double relative_error(const float* actual, const float* expected, int64_t count) {
  double diff = 0.0, scale = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(actual[i] - expected[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(expected[i])));
  }
  return diff / scale;
}

class EncoderFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EncoderFixtureTest, BatchedHiddenStatesMatchTransformers) {
  const EncoderFixture fixture(GetParam());
  ASSERT_EQ(fixture.spec.network, NetworkType::EncoderOnly);
  const std::unique_ptr<Backend> backend = make_cpu_backend(2);
  ModelRunner runner(fixture.spec, bind_weights(fixture.spec, *fixture.checkpoint, DType::F32), *backend,
                     KvCacheConfig{64, 4}, RunnerLimits{256, 8});
  // Every prompt in one forward, blocks handed out in reverse so no table is the identity.
  BlockAllocator allocator(64);
  ForwardBatch batch;
  for (int p = 0; p < fixture.num_prompts; ++p) {
    const Tensor& tokens = fixture.tokens(p);
    std::vector<int32_t> table;
    allocator.grow_table(table, tokens.numel(), 4);
    std::reverse(table.begin(), table.end());
    batch.token_ids.insert(batch.token_ids.end(), tokens.as<int32_t>(), tokens.as<int32_t>() + tokens.numel());
    batch.spans.push_back({static_cast<int32_t>(tokens.numel()), 0, table, false});
  }
  const Tensor states = runner.forward_hidden(batch);
  const int64_t hidden = fixture.spec.hidden_size;
  int64_t row = 0;
  for (int p = 0; p < fixture.num_prompts; ++p) {
    const Tensor& expected = fixture.states(p);
    const int64_t tokens = fixture.tokens(p).numel();
    const double error = relative_error(states.as<float>() + row * hidden, expected.as<float>(), tokens * hidden);
    std::printf("%s prompt %d (%lld tokens): max relative error %.3g\n", GetParam().c_str(), p,
                static_cast<long long>(tokens), error);
    EXPECT_LE(error, 1e-3) << GetParam() << " prompt " << p;
    row += tokens;
  }
}

TEST_P(EncoderFixtureTest, EmbeddingEnginePoolsEachInputAlone) {
  const EncoderFixture fixture(GetParam());
  ModelSpec spec = fixture.spec;
  spec.embedding.pooling = Pooling::Mean;
  spec.embedding.normalize = true;
  const std::unique_ptr<Backend> backend = make_cpu_backend(2);
  // Small steps: the inputs spread over several forwards, which must not change any of them.
  ModelRunner runner(spec, bind_weights(spec, *fixture.checkpoint, DType::F32), *backend, KvCacheConfig{16, 4},
                     RunnerLimits{32, 3});
  EmbeddingEngine engine(runner, EmbeddingEngineConfig{32, 3});
  std::vector<std::vector<int32_t>> inputs;
  for (int p = 0; p < fixture.num_prompts; ++p)
    inputs.emplace_back(fixture.tokens(p).as<int32_t>(), fixture.tokens(p).as<int32_t>() + fixture.tokens(p).numel());
  const std::vector<std::vector<float>> embeddings = engine.embed(inputs);
  ASSERT_EQ(embeddings.size(), inputs.size());
  const int64_t hidden = spec.hidden_size;
  for (int p = 0; p < fixture.num_prompts; ++p) {
    const Tensor& states = fixture.states(p);
    const int64_t tokens = fixture.tokens(p).numel();
    std::vector<float> reference = pool_states({states.as<float>(), static_cast<size_t>(tokens * hidden)}, tokens,
                                               hidden, Pooling::Mean);
    l2_normalize(reference);
    double dot = 0.0;
    for (int64_t i = 0; i < hidden; ++i) dot += static_cast<double>(reference[i]) * embeddings[p][i];
    EXPECT_GE(dot, 0.99999) << "prompt " << p;
  }
  EXPECT_FALSE(engine.has_unfinished());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EncoderFixtureTest, ::testing::Values("tiny_bert", "tiny_roberta"));

TEST(EncoderSpec, TemplatesResolveEncoderFields) {
  const ModelSpec bert = resolve_hf_spec(test::fixture_path("encoder/tiny_bert"));
  EXPECT_EQ(bert.norm.placement, NormPlacement::Post);
  EXPECT_FALSE(bert.attention.causal);
  EXPECT_TRUE(bert.embedding_norm);
  EXPECT_EQ(bert.token_types, 2);
  EXPECT_EQ(bert.position_offset, 0);
  EXPECT_EQ(bert.embedding.pooling, Pooling::Cls);  // no sentence-transformers files
  const ModelSpec roberta = resolve_hf_spec(test::fixture_path("encoder/tiny_roberta"));
  EXPECT_EQ(roberta.position_offset, 2);   // pad_token_id + 1
  EXPECT_EQ(roberta.max_position, 64);     // 66 rows, two before the first position
  EXPECT_EQ(spec_from_json(spec_to_json(roberta)), roberta);
}

TEST(EncoderSpec, RefusesBidirectionalDecoders) {
  nlohmann::json spec = spec_to_json(resolve_hf_spec(test::fixture_path("encoder/tiny_bert")));
  spec["network"] = "decoder_only";
  spec["tensors"]["lm_head"] = "lm_head";
  try {
    spec_from_json(spec);
    FAIL() << "a decoder with bidirectional attention was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention.causal"), std::string::npos) << e.what();
  }
}

TEST(EncoderRunner, HasNoLogits) {
  const EncoderFixture fixture("tiny_bert");
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  ModelRunner runner(fixture.spec, bind_weights(fixture.spec, *fixture.checkpoint, DType::F32), *backend,
                     KvCacheConfig{8, 4}, RunnerLimits{32, 2});
  ForwardBatch batch;
  batch.token_ids = {3, 4, 5};
  batch.spans.push_back({3, 0, {0}, true});
  EXPECT_THROW(runner.forward(batch), Error);
  // Bidirectional attention needs the whole sequence in one step.
  batch.spans[0].start_position = 1;
  batch.spans[0].block_table = {0};
  try {
    runner.forward_hidden(batch);
    FAIL() << "a partial span of a bidirectional encoder ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("whole sequence"), std::string::npos) << e.what();
  }
}

TEST(EmbeddingEngine, RefusesGenerativeModelsAndLongInputs) {
  const EncoderFixture fixture("tiny_bert");
  const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  ModelRunner runner(fixture.spec, bind_weights(fixture.spec, *fixture.checkpoint, DType::F32), *backend,
                     KvCacheConfig{8, 4}, RunnerLimits{16, 2});
  EmbeddingEngine engine(runner, EmbeddingEngineConfig{16, 2});
  EXPECT_EQ(engine.max_input_tokens(), 16);  // one step's tokens
  EXPECT_THROW(engine.check_input(std::vector<int32_t>(17, 3)), Error);
  EXPECT_THROW(engine.check_input(std::vector<int32_t>{}), Error);
  EXPECT_THROW(engine.check_input(std::vector<int32_t>{96}), Error);

  const ModelSpec decoder = resolve_hf_spec(test::fixture_path("hf/llama"));
  const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
  ModelRunner generative(decoder, make_dummy_weights(decoder, DType::F32, 1), *cpu, KvCacheConfig{8, 4},
                         RunnerLimits{16, 2});
  EXPECT_THROW(EmbeddingEngine(generative, EmbeddingEngineConfig{16, 2}), Error);
}

// transformers' truncation of a single text: its tokens cut from the right, [CLS] and [SEP] kept.
TEST(EmbeddingInput, TruncationKeepsTheSpecialTokens) {
  const std::unique_ptr<Tokenizer> tokenizer = load_hf_tokenizer(test::fixture_path("encoder/tiny_bert/tokenizer.json"));
  const SpecialFrame frame = special_frame(*tokenizer);
  EXPECT_EQ(frame.prefix, std::vector<int32_t>{2});  // [CLS]
  EXPECT_EQ(frame.suffix, std::vector<int32_t>{3});  // [SEP]
  const std::vector<int32_t> whole = encode_for_embedding(*tokenizer, frame, "the cat sat on the mat", 64);
  ASSERT_EQ(whole.size(), 8u);
  const std::vector<int32_t> cut = encode_for_embedding(*tokenizer, frame, "the cat sat on the mat", 5);
  EXPECT_EQ(cut, (std::vector<int32_t>{whole[0], whole[1], whole[2], whole[3], 3}));
  EXPECT_EQ(encode_for_embedding(*tokenizer, frame, "", 5), (std::vector<int32_t>{2, 3}));
  EXPECT_THROW(encode_for_embedding(*tokenizer, frame, "the cat", 2), Error);  // no room for text
}

TEST(Pooling, ModesAndNormalization) {
  const std::vector<float> states = {1, 2, 3, 4, 5, 6};  // [3 tokens, 2]
  EXPECT_EQ(pool_states(states, 3, 2, Pooling::Cls), (std::vector<float>{1, 2}));
  EXPECT_EQ(pool_states(states, 3, 2, Pooling::Last), (std::vector<float>{5, 6}));
  EXPECT_EQ(pool_states(states, 3, 2, Pooling::Mean), (std::vector<float>{3, 4}));
  std::vector<float> v = {3, 4};
  l2_normalize(v);
  EXPECT_FLOAT_EQ(v[0], 0.6f);
  EXPECT_FLOAT_EQ(v[1], 0.8f);
  const std::vector<float> truncated = truncate_dimensions(std::vector<float>{3, 4, 12}, 2);
  EXPECT_FLOAT_EQ(truncated[0], 0.6f);
  EXPECT_THROW(truncate_dimensions(std::vector<float>{1, 2}, 3), Error);
  EXPECT_THROW(truncate_dimensions(std::vector<float>{1, 2}, 0), Error);
}

}  // namespace
}  // namespace splitflow
