// Encoder-decoder models on the CUDA backend (bf16 activations and KV, fp32 accumulation) against
// transformers' fp32 logits on the tiny T5 v1.0 / v1.1, BART and Marian fixtures of
// tests/fixtures/encdec (python/make_encdec_fixtures.py): both prompts encoded in one batch, the
// decoder teacher-forced over each prompt's tokens (self-attention with T5's causal bias, cross-
// attention over the encoder's K/V), every row within the single-GPU bf16 tolerance (relative L2
// <= 0.06, as tests/python/test_tensor_parallel.py), its argmax transformers' wherever the
// reference's top two logits are further apart than that error could move them; and greedy
// generation equal to transformers' generate up to the first step whose margin is that close.
// Skips without a GPU.
#include "backend_cuda/cuda_test_util.h"

#include "seq2seq/encdec_fixtures.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

using namespace splitflow;

namespace {

constexpr double kLogitsRelativeL2 = 0.06;

// Whether the reference row's argmax is clear: its top two logits further apart than twice the
// error bound's share of the row's largest magnitude.
bool clear_argmax(const float* want, int64_t vocab) {
  std::vector<float> row(want, want + vocab);
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
  const float scale = std::max(std::abs(*std::max_element(want, want + vocab)), std::abs(*std::min_element(want, want + vocab)));
  return row[0] - row[1] > 2 * kLogitsRelativeL2 * scale;
}

class CudaEncDecFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaEncDecFixture, LogitsAndGreedyMatchTransformers) {
  SF_REQUIRE_GPU();
  test::EncDecModel model = test::load_encdec(GetParam());
  const int64_t vocab = model.spec.vocab_size;
  auto backend = test::make_test_cuda_backend();
  const KvCacheConfig kv{48, 4};
  Seq2SeqRunner runner(model.spec, model.weights, *backend, kv);
  const test::EncDecPrompts fixture = test::encdec_prompts(model, kv);
  const int prompts = fixture.size();
  const auto& [encoder_ids, decoder_ids, greedy, tables] = fixture;
  test::encode_prompts(runner, fixture);

  double worst = 0;
  int compared = 0;
  for (int p = 0; p < prompts; ++p) {
    const Tensor& want = test::expected_tensor(*model.expected, "prompt" + std::to_string(p) + ".logits");
    const Tensor got = test::teacher_forced_logits(runner, fixture, p);
    ASSERT_EQ(got.dim(0), static_cast<int64_t>(decoder_ids[p].size()));
    for (int64_t i = 0; i < got.dim(0); ++i) {
      const float* row = got.as<float>() + i * vocab;
      const float* ref = want.as<float>() + i * vocab;
      const double error = test::relative_l2(row, ref, vocab);
      worst = std::max(worst, error);
      EXPECT_LE(error, kLogitsRelativeL2) << GetParam() << " prompt " << p << " row " << i;
      if (clear_argmax(ref, vocab)) {
        ++compared;
        EXPECT_EQ(std::max_element(row, row + vocab) - row, std::max_element(ref, ref + vocab) - ref)
            << GetParam() << " prompt " << p << " row " << i;
      }
    }
  }

  // Greedy generation: the decoder's rows for transformers' greedy tokens are the teacher-forced
  // ones above (decoder_tokens are the start token then the greedy tokens), so the comparison
  // stops at the first row whose reference argmax is not clear.
  for (int p = 0; p < prompts; ++p) {
    const Tensor& want = test::expected_tensor(*model.expected, "prompt" + std::to_string(p) + ".logits");
    size_t clear = 0;
    while (clear < greedy[p].size() && static_cast<int64_t>(clear) < want.dim(0) &&
           clear_argmax(want.as<float>() + clear * vocab, vocab))
      ++clear;
    if (clear == 0) continue;
    SamplingParams params;
    params.temperature = 0.0f;
    params.max_tokens = static_cast<int32_t>(clear);
    params.ignore_eos = true;
    const GenerationResult result = generate_seq2seq(runner, nullptr, encoder_ids[p], params);
    EXPECT_EQ(result.output_ids, std::vector<int32_t>(greedy[p].begin(), greedy[p].begin() + clear))
        << GetParam() << " prompt " << p;
  }
  std::printf("[ cuda fixture ] %s: worst row relative L2 %.3g, %d rows with a clear argmax compared\n",
              GetParam().c_str(), worst, compared);
}

// The same logits by other paths through the kernels: each prompt encoded alone (a batch of one,
// so no sequence offsets), and the decoder run one token a step over its KV cache (decode-shaped
// launches: one query row, a growing context) instead of one teacher-forced prefill. Each path's
// worst row is printed, so a failure of the test above names the path that breaks.
TEST_P(CudaEncDecFixture, EncodedAloneAndDecodedStepByStepMatchTransformers) {
  SF_REQUIRE_GPU();
  test::EncDecModel model = test::load_encdec(GetParam());
  const int64_t vocab = model.spec.vocab_size;
  auto backend = test::make_test_cuda_backend();
  const KvCacheConfig kv{48, 4};
  const test::EncDecPrompts all = test::encdec_prompts(model, kv);
  for (int p = 0; p < all.size(); ++p) {
    test::EncDecPrompts alone;
    alone.encoder_ids = {all.encoder_ids[p]};
    alone.decoder_ids = {all.decoder_ids[p]};
    alone.greedy = {all.greedy[p]};
    alone.tables = {all.tables[p]};
    const Tensor& want = test::expected_tensor(*model.expected, "prompt" + std::to_string(p) + ".logits");

    Seq2SeqRunner prefill_runner(model.spec, model.weights, *backend, kv);
    test::encode_prompts(prefill_runner, alone);
    const Tensor prefill = test::teacher_forced_logits(prefill_runner, alone, 0);
    double prefill_worst = 0;
    for (int64_t i = 0; i < prefill.dim(0); ++i) {
      const double error = test::relative_l2(prefill.as<float>() + i * vocab, want.as<float>() + i * vocab, vocab);
      prefill_worst = std::max(prefill_worst, error);
      EXPECT_LE(error, kLogitsRelativeL2) << GetParam() << " prompt " << p << " encoded alone, teacher-forced row " << i;
    }

    Seq2SeqRunner step_runner(model.spec, model.weights, *backend, kv);
    test::encode_prompts(step_runner, alone);
    double step_worst = 0;
    const std::vector<int32_t>& tokens = alone.decoder_ids[0];
    for (size_t i = 0; i < tokens.size(); ++i) {
      ForwardBatch step;
      step.token_ids = {tokens[i]};
      SequenceSpan span{1, static_cast<int32_t>(i), alone.tables[0], true};
      span.encoder_tokens = static_cast<int32_t>(alone.encoder_ids[0].size());
      step.spans.push_back(span);
      const Tensor logits = step_runner.decoder().forward(step);
      ASSERT_EQ(logits.dim(0), 1);
      const double error = test::relative_l2(logits.as<float>(), want.as<float>() + i * vocab, vocab);
      step_worst = std::max(step_worst, error);
      EXPECT_LE(error, kLogitsRelativeL2) << GetParam() << " prompt " << p << " decode step " << i;
    }

    // The encoder's output states against the CPU backend's (f32; its logits match transformers'
    // in tests/seq2seq): a wrong encoder shows here before it reaches the decoder.
    ForwardBatch encoder_batch;
    encoder_batch.token_ids = alone.encoder_ids[0];
    SequenceSpan encoder_span{static_cast<int32_t>(encoder_batch.token_ids.size()), 0, {}, false};
    for (int32_t b = 0; b * kv.block_size < encoder_span.num_tokens; ++b) encoder_span.block_table.push_back(b);
    encoder_batch.spans.push_back(encoder_span);
    const std::unique_ptr<Backend> cpu = make_cpu_backend(1);
    Seq2SeqRunner cpu_runner(model.spec, model.weights, *cpu, kv);
    const Tensor cpu_states = cpu_runner.encoder().forward_hidden(encoder_batch);
    const Tensor cuda_states = step_runner.encoder().forward_hidden(encoder_batch);
    ASSERT_EQ(cuda_states.shape, cpu_states.shape);
    const int64_t hidden = cpu_states.dim(1);
    double encoder_worst = 0;
    for (int64_t t = 0; t < cpu_states.dim(0); ++t) {
      const double error =
          test::relative_l2(cuda_states.as<float>() + t * hidden, cpu_states.as<float>() + t * hidden, hidden);
      encoder_worst = std::max(encoder_worst, error);
      EXPECT_LE(error, kLogitsRelativeL2) << GetParam() << " prompt " << p << " encoder state " << t;
    }
    std::printf("[ cuda fixture ] %s prompt %d (%zu encoder tokens): worst row relative L2 encoded alone %.3g, "
                "step by step %.3g, encoder states vs the CPU's %.3g\n",
                GetParam().c_str(), p, alone.encoder_ids[0].size(), prefill_worst, step_worst, encoder_worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEncDecFixture, ::testing::ValuesIn(test::encdec_fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
