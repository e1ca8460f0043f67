// Encoder-decoder models against HF transformers on the tiny random-weight T5, BART and Marian checkpoints in
// tests/fixtures/encdec (python/make_encdec_fixtures.py): the decoder's logits for transformers'
// greedy tokens, one forward (teacher forcing) and one cached step at a time with both prompts
// batched, within 1e-3 x max|logit| per row; and generate_seq2seq's greedy continuation equal to
// transformers' generate. Loaded as `splitflow generate` loads them (spec from config.json through
// models/t5.json, models/bart.json and models/marian.json, weights bound in f32).
#include "seq2seq/encdec_fixtures.h"
#include "seq2seq/seq2seq_generator.h"
#include "seq2seq/seq2seq_runner.h"

#include "backend/backend.h"
#include "core/mapped_file.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/layer_plan.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace splitflow;
using nlohmann::json;

namespace {

// max |delta| / max |logit| of one row (the bar is 1e-3).
double row_error(const float* got, const float* want, int64_t vocab) {
  float scale = 0.0f, worst = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) scale = std::max(scale, std::abs(want[i]));
  for (int64_t i = 0; i < vocab; ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  return worst / scale;
}

using Loaded = test::EncDecModel;
Loaded load(const std::string& name) { return test::load_encdec(name); }

class EncDecFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EncDecFixture, LogitsAndGreedyMatchTransformers) {
  Loaded model = load(GetParam());
  const int64_t vocab = model.spec.vocab_size;
  auto backend = make_cpu_backend(2);
  const KvCacheConfig kv{48, 4};
  Seq2SeqRunner runner(model.spec, model.weights, *backend, kv);
  const test::EncDecPrompts fixture = test::encdec_prompts(model, kv);
  const int prompts = fixture.size();
  const auto& [encoder_ids, decoder_ids, greedy, tables] = fixture;
  double worst = 0.0;

  test::encode_prompts(runner, fixture);  // both prompts encoded in one batch

  // Teacher forcing: every decoder token of a prompt in one forward.
  for (int p = 0; p < prompts; ++p) {
    const Tensor& want = test::expected_tensor(*model.expected, "prompt" + std::to_string(p) + ".logits");
    const Tensor got = test::teacher_forced_logits(runner, fixture, p);
    ASSERT_EQ(got.dim(0), static_cast<int64_t>(decoder_ids[p].size()));
    for (int64_t i = 0; i < got.dim(0); ++i) {
      const double error = row_error(got.as<float>() + i * vocab, want.as<float>() + i * vocab, vocab);
      worst = std::max(worst, error);
      EXPECT_LE(error, 1e-3) << GetParam() << " prompt " << p << " row " << i;
      const float* row = got.as<float>() + i * vocab;
      EXPECT_EQ(std::max_element(row, row + vocab) - row, greedy[p][i]) << GetParam() << " prompt " << p << " row " << i;
    }
  }

  // Cached decode, the two sequences batched, one token each per step (rewriting the same K/V).
  const size_t steps = decoder_ids[0].size();
  for (size_t i = 0; i < steps; ++i) {
    ForwardBatch batch;
    for (int p = 0; p < prompts; ++p) {
      batch.token_ids.push_back(decoder_ids[p][i]);
      SequenceSpan span{1, static_cast<int32_t>(i), tables[p], true};
      span.encoder_tokens = static_cast<int32_t>(encoder_ids[p].size());
      batch.spans.push_back(span);
    }
    const Tensor got = runner.decoder().forward(batch);
    for (int p = 0; p < prompts; ++p) {
      const Tensor& want = test::expected_tensor(*model.expected, "prompt" + std::to_string(p) + ".logits");
      const double error = row_error(got.as<float>() + p * vocab, want.as<float>() + i * vocab, vocab);
      worst = std::max(worst, error);
      EXPECT_LE(error, 1e-3) << GetParam() << " prompt " << p << " decode step " << i;
    }
  }

  // generate: the prompt is the encoder's input; greedy tokens as transformers' generate.
  for (int p = 0; p < prompts; ++p) {
    SamplingParams params;
    params.temperature = 0.0f;
    params.max_tokens = static_cast<int32_t>(greedy[p].size());
    params.ignore_eos = true;
    const GenerationResult result = generate_seq2seq(runner, nullptr, encoder_ids[p], params);
    EXPECT_EQ(result.output_ids, greedy[p]) << GetParam() << " prompt " << p;
  }
  std::printf("[ fixture ] %s: max |delta| / max |logit| %.3g over %d prompts (teacher-forced and cached rows)\n",
              GetParam().c_str(), worst, prompts);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EncDecFixture, ::testing::ValuesIn(test::encdec_fixture_names()),
                         [](const auto& info) { return info.param; });

TEST(EncDecSpec, T5TemplateResolvesBothStacks) {
  const Loaded v10 = load("t5_v1_0");
  EXPECT_EQ(v10.spec.network, NetworkType::EncoderDecoder);
  EXPECT_EQ(v10.spec.num_layers, 3);
  EXPECT_EQ(v10.spec.encoder_spec().num_layers, 2);
  EXPECT_FALSE(v10.spec.encoder_spec().attention.causal);
  EXPECT_EQ(v10.spec.position, PositionType::Relative);
  EXPECT_EQ(v10.spec.mlp.activation, Activation::ReLU);
  EXPECT_FALSE(v10.spec.mlp.gated);
  EXPECT_NEAR(v10.spec.logits_multiplier, 1.0 / std::sqrt(32.0), 1e-12);
  const Loaded v11 = load("t5_v1_1");
  EXPECT_TRUE(v11.spec.mlp.gated);
  EXPECT_EQ(v11.spec.mlp.activation, Activation::GELUTanh);
  EXPECT_EQ(v11.spec.logits_multiplier, 1.0);
  EXPECT_EQ(v11.spec.attention.head_dim, 12);
  // The spec survives a JSON round trip, the encoder stack included.
  EXPECT_EQ(spec_from_json(spec_to_json(v11.spec)), v11.spec);
  // The decoder's plan has the cross-attention block; the self-attention adds the position bias.
  const std::string plan = build_layer_plan(v11.spec).describe();
  EXPECT_NE(plan.find("cross_attention: cross_q -> attn_out"), std::string::npos) << plan;
  EXPECT_NE(plan.find("attention position_bias: qkv -> attn_out"), std::string::npos) << plan;
}

// transformers 5 writes the rescale as scale_decoder_outputs (and always tie_word_embeddings true);
// hub configs say tie_word_embeddings (absent: tied and rescaled).
TEST(EncDecSpec, T5RescaleFollowsTheConfigSpelling) {
  json config = json::parse(read_text_file(test::fixture_path("encdec/t5_v1_1/config.json")));
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "splitflow_t5_rescale_test";
  std::filesystem::create_directories(dir);
  const auto multiplier = [&](const json& c) {
    std::ofstream(dir / "config.json") << c.dump();
    return resolve_hf_spec(dir.string()).logits_multiplier;
  };
  config["tie_word_embeddings"] = true;
  config["scale_decoder_outputs"] = false;
  EXPECT_EQ(multiplier(config), 1.0);
  config["scale_decoder_outputs"] = true;
  EXPECT_NEAR(multiplier(config), 1.0 / std::sqrt(32.0), 1e-12);
  config.erase("scale_decoder_outputs");
  config.erase("tie_word_embeddings");
  EXPECT_NEAR(multiplier(config), 1.0 / std::sqrt(32.0), 1e-12);
  config["tie_word_embeddings"] = false;
  EXPECT_EQ(multiplier(config), 1.0);
  config["feed_forward_proj"] = "gated-swish";
  EXPECT_THROW(multiplier(config), Error);
  std::filesystem::remove_all(dir);
}

TEST(EncDecSpec, BartTemplateIsPostNormWithOffsetPositions) {
  const Loaded bart = load("bart");
  EXPECT_EQ(bart.spec.norm.placement, NormPlacement::Post);
  EXPECT_EQ(bart.spec.position, PositionType::Learned);
  EXPECT_EQ(bart.spec.position_offset, 2);
  EXPECT_EQ(bart.spec.decoder_start_token_id, 2);
  EXPECT_TRUE(bart.spec.tensors.final_norm.empty());
  EXPECT_EQ(bart.spec.encoder_spec().mlp.intermediate_size, 64);
  EXPECT_EQ(bart.spec.mlp.intermediate_size, 48);
  const std::string plan = build_layer_plan(bart.spec).describe();
  EXPECT_NE(plan.find("cross_attention: cross_q -> attn_out\nlinear cross_o+bias: attn_out ->+ hidden\n"
                      "norm cross_attn_norm+bias: hidden\n"),
            std::string::npos)
      << plan;
}

TEST(EncDecSpec, MarianTemplateHasSinusoidalHalvesScaledEmbeddingsAndALogitsBias) {
  const Loaded marian = load("marian");
  EXPECT_EQ(marian.spec.position, PositionType::Sinusoidal);
  EXPECT_EQ(marian.spec.sinusoid_layout, SinusoidLayout::Halves);
  EXPECT_EQ(marian.spec.encoder_spec().position, PositionType::Sinusoidal);
  EXPECT_EQ(marian.spec.encoder_spec().sinusoid_layout, SinusoidLayout::Halves);
  EXPECT_NEAR(marian.spec.embedding_multiplier, std::sqrt(32.0), 1e-12);
  EXPECT_FALSE(marian.spec.embedding_norm);
  EXPECT_EQ(marian.spec.mlp.activation, Activation::SiLU);
  EXPECT_EQ(marian.spec.decoder_start_token_id, 127);
  EXPECT_EQ(marian.spec.eos_token_ids, std::vector<int>{0});
  EXPECT_EQ(marian.spec.tensors.logits_bias, "final_logits_bias");
  EXPECT_TRUE(marian.spec.encoder_spec().tensors.logits_bias.empty());
  ASSERT_EQ(marian.weights.logits_bias.shape, (Shape{128}));
  EXPECT_TRUE(marian.weights.pos_embed.empty());  // computed, not read
  EXPECT_EQ(spec_from_json(spec_to_json(marian.spec)), marian.spec);
  // A decoder vocabulary of its own is refused, naming the key.
  json config = json::parse(read_text_file(test::fixture_path("encdec/marian/config.json")));
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "splitflow_marian_vocab_test";
  std::filesystem::create_directories(dir);
  config["decoder_vocab_size"] = 100;
  std::ofstream(dir / "config.json") << config.dump();
  try {
    resolve_hf_spec(dir.string());
    ADD_FAILURE() << "a separate decoder vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decoder_vocab_size"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(EncDecSpec, RefusesWhatItCannotRun) {
  Loaded model = load("t5_v1_0");
  json spec = spec_to_json(model.spec);
  spec["tensors"]["cross_q"] = "";
  EXPECT_THROW(spec_from_json(spec), Error);
  json no_encoder = spec_to_json(model.spec);
  no_encoder.erase("encoder");
  EXPECT_THROW(spec_from_json(no_encoder), Error);
  // Parallel layouts are refused by the runner.
  auto backend = make_cpu_backend(1);
  RunnerPartition partition;
  partition.pipeline.next = 1;
  ModelWeights weights = model.weights;
  try {
    ModelRunner runner(model.spec, weights, *backend, KvCacheConfig{8, 4}, {}, partition);
    ADD_FAILURE() << "a pipeline stage of an encoder_decoder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one rank"), std::string::npos) << e.what();
  }
}

}  // namespace
