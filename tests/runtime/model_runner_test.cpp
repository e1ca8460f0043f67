// ModelRunner: one execution path. On tiny random models of several module combinations, a full
// prefill, a chunked prefill (chunks 1, 3, 5, ...), token-by-token decode and two sequences batched
// together with interleaved block tables all give the same logits; LogitsMode::All rows equal the
// per-step rows. Bad batches and weights get errors naming what is wrong.
#include "runtime/model_runner.h"

#include "backend/backend.h"
#include "core/error.h"
#include "runtime/block_allocator.h"
#include "runtime/runner_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace splitflow;
using namespace splitflow::test;

namespace {

struct Variant {
  const char* name;
  ModelSpec spec;
  DType dtype;
};

std::vector<Variant> variants() {
  std::vector<Variant> out;
  out.push_back({"llama_gqa_f32", tiny_spec(), DType::F32});

  ModelSpec neox = tiny_spec();  // parallel residual, LayerNorm with bias, partial interleaved RoPE, biases
  neox.parallel_residual = true;
  neox.norm = {NormType::LayerNorm, 1e-5, true, 0.0};
  neox.attention.num_kv_heads = 4;
  neox.attention.q_bias = neox.attention.k_bias = neox.attention.v_bias = neox.attention.o_bias = true;
  neox.rope.partial_factor = 0.5;
  neox.rope.style = RopeStyle::Interleaved;
  neox.mlp.gated = false;
  neox.mlp.activation = Activation::GELU;
  neox.mlp.up_bias = neox.mlp.down_bias = true;
  out.push_back({"neox_parallel_f16", neox, DType::F16});

  ModelSpec falcon = tiny_spec();  // shared norm, multi-query attention
  falcon.parallel_residual = falcon.shared_layer_norm = true;
  falcon.norm = {NormType::LayerNorm, 1e-5, true, 0.0};
  falcon.attention.num_kv_heads = 1;
  falcon.mlp.gated = false;
  falcon.mlp.activation = Activation::GELU;
  out.push_back({"falcon_shared_mqa_bf16", falcon, DType::BF16});

  ModelSpec gpt2 = tiny_spec();  // learned positions, tied embeddings
  gpt2.position = PositionType::Learned;
  gpt2.tie_embeddings = true;
  gpt2.norm = {NormType::LayerNorm, 1e-5, true, 0.0};
  gpt2.attention.num_kv_heads = 4;
  gpt2.attention.q_bias = gpt2.attention.k_bias = gpt2.attention.v_bias = gpt2.attention.o_bias = true;
  gpt2.mlp.gated = false;
  gpt2.mlp.activation = Activation::GELUTanh;
  gpt2.mlp.up_bias = gpt2.mlp.down_bias = true;
  out.push_back({"gpt2_learned_tied_f32", gpt2, DType::F32});

  ModelSpec mistral = tiny_spec();  // sliding window shorter than the sequence, GQA 4:1
  mistral.attention.num_kv_heads = 1;
  mistral.attention.sliding_window = 5;
  mistral.rope.theta = 1e6;
  out.push_back({"mistral_window_f16", mistral, DType::F16});

  ModelSpec misc = tiny_spec();  // sinusoidal positions, ReLU gated, embedding multiplier, norm offset
  misc.position = PositionType::Sinusoidal;
  misc.mlp.activation = Activation::ReLU;
  misc.embedding_multiplier = 2.0;
  misc.norm.weight_offset = 1.0;
  misc.attention.softmax_scale = 0.2;
  out.push_back({"sinusoidal_relu_bf16", misc, DType::BF16});
  return out;
}

constexpr int kBlockSize = 4;
constexpr int kSeqLen = 23;

// |got - want| <= 1e-5 * max|want row| per row.
void expect_rows_close(const Tensor& got, int64_t got_row, const Tensor& want, int64_t want_row, const std::string& what) {
  const int64_t vocab = want.dim(1);
  ASSERT_EQ(got.dim(1), vocab) << what;
  const float* g = got.as<float>() + got_row * vocab;
  const float* w = want.as<float>() + want_row * vocab;
  float scale = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) scale = std::max(scale, std::abs(w[i]));
  ASSERT_GT(scale, 0.1f) << what << ": reference logits are degenerate";
  for (int64_t i = 0; i < vocab; ++i)
    ASSERT_NEAR(g[i], w[i], 1e-5f * scale) << what << " row " << want_row << " logit " << i;
}

class RunnerEquivalence : public ::testing::TestWithParam<int> {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
};

TEST_P(RunnerEquivalence, PrefillChunksDecodeAndBatchingAgree) {
  const Variant variant = variants()[GetParam()];
  SCOPED_TRACE(variant.name);
  const ModelWeights weights = random_weights(variant.spec, variant.dtype, 42);
  std::mt19937_64 rng(7);
  const std::vector<int32_t> tokens_a = random_tokens(rng, kSeqLen, variant.spec.vocab_size);
  const std::vector<int32_t> tokens_b = random_tokens(rng, kSeqLen - 6, variant.spec.vocab_size);
  const KvCacheConfig kv{16, kBlockSize};
  const int blocks_a = (kSeqLen + kBlockSize - 1) / kBlockSize;

  // Reference: the whole sequence in one prefill, every row's logits.
  ModelRunner full(variant.spec, weights, *backend, kv);
  const Tensor reference = full.forward(single_span(tokens_a, 0, kSeqLen, iota_blocks(blocks_a), LogitsMode::All));
  ASSERT_EQ(reference.shape, Shape({kSeqLen, variant.spec.vocab_size}));

  {  // Last mode of the same prefill returns the last row.
    ModelRunner runner(variant.spec, weights, *backend, kv);
    const Tensor last = runner.forward(single_span(tokens_a, 0, kSeqLen, iota_blocks(blocks_a), LogitsMode::Last));
    ASSERT_EQ(last.shape, Shape({1, variant.spec.vocab_size}));
    expect_rows_close(last, 0, reference, kSeqLen - 1, "last-mode prefill");
  }
  {  // Chunked prefill, chunks of 1, 3, 5, ... tokens, blocks in reverse order.
    ModelRunner runner(variant.spec, weights, *backend, kv);
    std::vector<int32_t> table = iota_blocks(blocks_a, 16 - blocks_a);
    std::reverse(table.begin(), table.end());
    for (int begin = 0, chunk = 1; begin < kSeqLen; begin += chunk, chunk += 2) {
      const int count = std::min(chunk, kSeqLen - begin);
      const Tensor rows = runner.forward(single_span(tokens_a, begin, count, table, LogitsMode::All));
      ASSERT_EQ(rows.dim(0), count);
      for (int i = 0; i < count; ++i) expect_rows_close(rows, i, reference, begin + i, "chunked prefill");
    }
  }
  {  // Token-by-token decode.
    ModelRunner runner(variant.spec, weights, *backend, kv);
    for (int t = 0; t < kSeqLen; ++t) {
      const Tensor row = runner.forward(single_span(tokens_a, t, 1, iota_blocks(blocks_a), LogitsMode::Last));
      expect_rows_close(row, 0, reference, t, "decode");
    }
  }
  {  // Two sequences in every step, blocks interleaved (a: even ids, b: odd ids), spans of
     // different shapes in one batch: a prefill chunk beside a decode token, and so on.
    ModelRunner reference_b_runner(variant.spec, weights, *backend, kv);
    const int len_b = static_cast<int>(tokens_b.size());
    const Tensor reference_b = reference_b_runner.forward(
        single_span(tokens_b, 0, len_b, iota_blocks((len_b + kBlockSize - 1) / kBlockSize), LogitsMode::All));
    ModelRunner runner(variant.spec, weights, *backend, kv);
    std::vector<int32_t> table_a, table_b;
    for (int b = 0; b < 8; ++b) (b % 2 == 0 ? table_b : table_a).push_back(b == 0 ? 14 : b);  // a: 1,3,5,7; b: 14,2,4,6
    table_a.push_back(15);
    table_a.push_back(9);
    table_b.push_back(11);
    const std::vector<std::pair<int, int>> steps = {{7, 2}, {1, 9}, {6, 1}, {1, 5}, {8, 0}};  // (a tokens, b tokens)
    int done_a = 0, done_b = 0;
    for (auto [count_a, count_b] : steps) {
      ForwardBatch batch;
      batch.logits_mode = LogitsMode::All;
      for (auto [tokens, table, done, count] :
           {std::tuple{&tokens_a, &table_a, done_a, count_a}, std::tuple{&tokens_b, &table_b, done_b, count_b}}) {
        if (count == 0) continue;
        batch.token_ids.insert(batch.token_ids.end(), tokens->begin() + done, tokens->begin() + done + count);
        batch.spans.push_back({count, done, *table, true});
      }
      const Tensor rows = runner.forward(batch);
      ASSERT_EQ(rows.dim(0), count_a + count_b);
      for (int i = 0; i < count_a; ++i) expect_rows_close(rows, i, reference, done_a + i, "batched seq a");
      for (int i = 0; i < count_b; ++i) expect_rows_close(rows, count_a + i, reference_b, done_b + i, "batched seq b");
      done_a += count_a;
      done_b += count_b;
    }
    ASSERT_EQ(done_a, kSeqLen);
    ASSERT_EQ(done_b, len_b);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, RunnerEquivalence, ::testing::Range(0, 6), [](const auto& info) {
  return std::string(variants()[info.param].name);
});

// Last mode returns one row per span that asks for logits, in span order.
TEST(ModelRunner, LastModeReturnsRowsOfSpansWantingLogits) {
  auto backend = make_cpu_backend(2);
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 3);
  std::mt19937_64 rng(5);
  const std::vector<int32_t> a = random_tokens(rng, 6, spec.vocab_size), b = random_tokens(rng, 3, spec.vocab_size),
                             c = random_tokens(rng, 4, spec.vocab_size);
  ModelRunner single(spec, weights, *backend, {16, kBlockSize});
  const Tensor ref_a = single.forward(single_span(a, 0, 6, {0, 1}, LogitsMode::All));
  const Tensor ref_c = single.forward(single_span(c, 0, 4, {2}, LogitsMode::All));

  ModelRunner runner(spec, weights, *backend, {16, kBlockSize});
  ForwardBatch batch;
  batch.token_ids = a;
  batch.token_ids.insert(batch.token_ids.end(), b.begin(), b.end());
  batch.token_ids.insert(batch.token_ids.end(), c.begin(), c.end());
  batch.spans = {{6, 0, {3, 4}, true}, {3, 0, {5}, false}, {4, 0, {6}, true}};
  const Tensor rows = runner.forward(batch);
  ASSERT_EQ(rows.shape, Shape({2, spec.vocab_size}));
  expect_rows_close(rows, 0, ref_a, 5, "span 0");
  expect_rows_close(rows, 1, ref_c, 3, "span 2");

  batch.spans[0].want_logits = batch.spans[2].want_logits = false;
  EXPECT_EQ(runner.forward(batch).dim(0), 0);
}

// forward_sample: greedy rows give the argmax of forward()'s logits (All mode across logits
// chunks too); sampled rows are tokens of the vocabulary; a row count that differs throws.
TEST(ModelRunner, ForwardSampleGreedyIsArgmaxOfForward) {
  auto backend = make_cpu_backend(2);
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 8);
  std::mt19937_64 rng(9);
  const std::vector<int32_t> tokens = random_tokens(rng, 40, spec.vocab_size);
  ModelRunner reference(spec, weights, *backend, {16, kBlockSize});
  const Tensor logits = reference.forward(single_span(tokens, 0, 40, iota_blocks(10), LogitsMode::All));
  ModelRunner runner(spec, weights, *backend, {16, kBlockSize}, {64, 2});  // 16 logit rows per chunk
  std::vector<SamplingRow> rows(40);
  rows[7] = {1.0f, 5, 0.9f, 0.0f, 3};
  const std::vector<int32_t> sampled =
      runner.forward_sample(single_span(tokens, 0, 40, iota_blocks(10), LogitsMode::All), rows);
  ASSERT_EQ(sampled.size(), 40u);
  for (int t = 0; t < 40; ++t) {
    const float* row = logits.as<float>() + t * spec.vocab_size;
    if (t != 7) {
      EXPECT_EQ(sampled[t], std::max_element(row, row + spec.vocab_size) - row) << "row " << t;
    }
  }
  EXPECT_GE(sampled[7], 0);
  EXPECT_LT(sampled[7], spec.vocab_size);
  EXPECT_THROW(runner.forward_sample(single_span(tokens, 0, 4, iota_blocks(10), LogitsMode::Last), rows), Error);
}

// Logits chunking: All mode with more rows than one logits chunk.
TEST(ModelRunner, AllModeBeyondOneLogitsChunk) {
  auto backend = make_cpu_backend(2);
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 4);
  std::mt19937_64 rng(6);
  const std::vector<int32_t> tokens = random_tokens(rng, 40, spec.vocab_size);
  ModelRunner chunky(spec, weights, *backend, {16, kBlockSize}, {64, 2});  // 16 logit rows per chunk
  const Tensor all = chunky.forward(single_span(tokens, 0, 40, iota_blocks(10), LogitsMode::All));
  ModelRunner stepper(spec, weights, *backend, {16, kBlockSize});
  for (int t = 0; t < 40; ++t)
    expect_rows_close(stepper.forward(single_span(tokens, t, 1, iota_blocks(10), LogitsMode::Last)), 0, all, t, "step");
}

// ---- bad input -------------------------------------------------------------------------------

class RunnerErrors : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  ModelSpec spec = tiny_spec();
  ModelWeights weights = random_weights(spec, DType::F32, 9);

  ForwardBatch good_batch() const { return single_span({1, 2, 3, 4, 5}, 0, 5, {0, 1}, LogitsMode::Last); }

  void expect_error(const ForwardBatch& batch, const std::string& fragment) {
    ModelRunner runner(spec, weights, *backend, {8, kBlockSize}, {16, 4});
    try {
      runner.forward(batch);
      FAIL() << "no error, expected one mentioning '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  }
};

TEST_F(RunnerErrors, GoodBatchRuns) {
  ModelRunner runner(spec, weights, *backend, {8, kBlockSize}, {16, 4});
  EXPECT_EQ(runner.forward(good_batch()).dim(0), 1);
}

TEST_F(RunnerErrors, MalformedBatches) {
  ForwardBatch batch = good_batch();
  batch.token_ids[2] = spec.vocab_size;
  expect_error(batch, "outside the vocabulary");

  batch = good_batch();
  batch.spans[0].block_table = {0};
  expect_error(batch, "needs 2");

  batch = good_batch();
  batch.spans[0].block_table = {0, 8};
  expect_error(batch, "block_table[1] = 8");

  batch = good_batch();
  batch.spans[0].num_tokens = 0;
  expect_error(batch, "num_tokens 0");

  batch = good_batch();
  batch.spans[0].start_position = -1;
  expect_error(batch, "start_position -1");

  batch = good_batch();
  batch.token_ids.push_back(1);
  expect_error(batch, "token_ids has 6 tokens");

  batch = good_batch();
  batch.spans.clear();
  expect_error(batch, "no spans");

  batch = good_batch();  // prompt longer than the context (max_position 64)
  batch.spans[0].start_position = 62;
  batch.spans[0].block_table = iota_blocks(8);
  expect_error(batch, "context of 64 tokens");

  batch = single_span(std::vector<int32_t>(17, 1), 0, 17, iota_blocks(5), LogitsMode::Last);
  expect_error(batch, "max_batch_tokens 16");

  batch = good_batch();
  for (int i = 0; i < 4; ++i) {
    batch.token_ids.push_back(1);
    batch.spans.push_back({1, 0, {2 + i}, true});
  }
  expect_error(batch, "max_seqs 4");
}

TEST_F(RunnerErrors, CacheSmallerThanSequence) {
  ModelRunner runner(spec, weights, *backend, {2, kBlockSize}, {16, 4});  // 8 cached tokens
  EXPECT_THROW(runner.forward(single_span(std::vector<int32_t>(9, 1), 0, 9, {0, 1, 0}, LogitsMode::Last)), Error);
}

TEST_F(RunnerErrors, WeightsDisagreeingWithSpec) {
  const auto expect_construct_error = [&](ModelWeights w, const std::string& fragment) {
    try {
      ModelRunner runner(spec, std::move(w), *backend, {8, kBlockSize});
      FAIL() << "no error, expected one mentioning '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  ModelWeights w = weights;
  w.layers[1].w_down = Tensor::zeros(DType::F32, {spec.hidden_size, spec.mlp.intermediate_size + 1});
  expect_construct_error(w, "layer 1 w_down: shape [48, 73], the spec needs [48, 72]");

  w = weights;
  w.layers[0].wqkv = Tensor();
  expect_construct_error(w, "layer 0 wqkv: missing");

  w = weights;
  w.layers[0].bo = Tensor::zeros(DType::F32, {spec.hidden_size});
  expect_construct_error(w, "layer 0 bo: present");

  w = weights;
  w.embed = Tensor::zeros(DType::I32, {spec.vocab_size, spec.hidden_size});
  expect_construct_error(w, "embed: dtype i32");

  w = weights;
  w.layers.pop_back();
  expect_construct_error(w, "1 layers");
}

TEST_F(RunnerErrors, UnsupportedSpecsAndConfigs) {
  ModelSpec shared = spec;
  shared.shared_layer_norm = true;
  EXPECT_THROW(ModelRunner(shared, weights, *backend, {8, kBlockSize}), Error);
  ModelSpec alibi = spec;
  alibi.position = PositionType::ALiBi;
  EXPECT_THROW(ModelRunner(alibi, weights, *backend, {8, kBlockSize}), Error);
  EXPECT_THROW(ModelRunner(spec, weights, *backend, {0, kBlockSize}), Error);
  EXPECT_THROW(ModelRunner(spec, weights, *backend, {8, 0}), Error);
  EXPECT_THROW(ModelRunner(spec, weights, *backend, {8, kBlockSize}, {0, 4}), Error);
}

TEST_F(RunnerErrors, KvCacheDtypeDefaultsToActivationsAndMustBeStorable) {
  EXPECT_EQ(ModelRunner(spec, weights, *backend, {8, kBlockSize}).kv_cache_dtype(), DType::F32);
  EXPECT_EQ(ModelRunner(spec, weights, *backend, {8, kBlockSize, 0, DType::F8E4M3}).kv_cache_dtype(), DType::F8E4M3);
  // 2 (K and V) x 2 layers x 2 kv heads x head_dim 12, one byte each.
  EXPECT_EQ(kv_cache_bytes_per_token(spec, DType::F8E4M3), 96);
  EXPECT_EQ(kv_cache_bytes_per_token(spec, DType::F32), 384);
  try {
    ModelRunner(spec, weights, *backend, {8, kBlockSize, 0, DType::I8});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the cpu backend does not store a i8 KV cache (it stores f32, f16, bf16, "
                                         "f8_e4m3)"),
              std::string::npos)
        << e.what();
  }
}

// ---- block allocator -------------------------------------------------------------------------

TEST(BlockAllocator, AllocatesReleasesAndReportsFull) {
  BlockAllocator allocator(3);
  std::vector<int32_t> table;
  allocator.grow_table(table, 9, 4);  // 3 blocks
  EXPECT_EQ(table, std::vector<int32_t>({0, 1, 2}));
  EXPECT_EQ(allocator.num_free(), 0);
  EXPECT_THROW(allocator.allocate(), Error);
  allocator.release(1);
  EXPECT_THROW(allocator.release(1), Error);
  EXPECT_THROW(allocator.release(3), Error);
  EXPECT_EQ(allocator.allocate(), 1);
  allocator.release_table(table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(allocator.num_free(), 3);
  allocator.grow_table(table, 0, 4);
  EXPECT_TRUE(table.empty());
  EXPECT_THROW(BlockAllocator(0), Error);
}

// A generate-style loop over the allocator: prefill, then decode with the table grown on demand,
// gives the same rows as one prefill.
TEST(BlockAllocator, DrivesSingleSequenceGeneration) {
  auto backend = make_cpu_backend(2);
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 11);
  std::mt19937_64 rng(12);
  const std::vector<int32_t> tokens = random_tokens(rng, 15, spec.vocab_size);
  ModelRunner reference_runner(spec, weights, *backend, {8, kBlockSize});
  const Tensor reference = reference_runner.forward(single_span(tokens, 0, 15, iota_blocks(4), LogitsMode::All));

  ModelRunner runner(spec, weights, *backend, {8, kBlockSize});
  BlockAllocator allocator(8);
  allocator.allocate();  // block 0 taken by someone else
  std::vector<int32_t> table;
  allocator.grow_table(table, 6, kBlockSize);
  expect_rows_close(runner.forward(single_span(tokens, 0, 6, table, LogitsMode::Last)), 0, reference, 5, "prefill");
  for (int t = 6; t < 15; ++t) {
    allocator.grow_table(table, t + 1, kBlockSize);
    expect_rows_close(runner.forward(single_span(tokens, t, 1, table, LogitsMode::Last)), 0, reference, t, "decode");
  }
  EXPECT_EQ(table.size(), 4u);
  EXPECT_EQ(table[0], 1);
}

// ---- layer plan ------------------------------------------------------------------------------

TEST(LayerPlan, SequentialRopeLayer) {
  EXPECT_EQ(build_layer_plan(tiny_spec()).describe(),
            "norm attn_norm + linear+rope_write_kv qkv: hidden -> qkv normed in attn_in\n"
            "attention: qkv -> attn_out\n"
            "linear o: attn_out ->+ hidden\n"
            "norm ffn_norm + linear+activation gate_up: hidden -> mlp_act normed in mlp_in via mlp_up\n"
            "linear down: mlp_act ->+ hidden\n");
}

// Without RoPE the attention norm stays a step of its own (the plain projection takes no norm).
TEST(LayerPlan, SequentialLearnedPositionsLayer) {
  ModelSpec spec = tiny_spec();
  spec.position = PositionType::Learned;
  spec.norm.bias = true;
  EXPECT_EQ(build_layer_plan(spec).describe(),
            "norm attn_norm+bias: hidden -> attn_in\n"
            "linear qkv: attn_in -> qkv\n"
            "write_kv: qkv\n"
            "attention: qkv -> attn_out\n"
            "linear o: attn_out ->+ hidden\n"
            "norm ffn_norm+bias + linear+activation gate_up: hidden -> mlp_act normed in mlp_in via mlp_up\n"
            "linear down: mlp_act ->+ hidden\n");
}

// QK-norm splits the projection from RoPE; post norms make the output projections write `proj`
// and add their norm to the residual (Gemma 3).
TEST(LayerPlan, QkNormAndPostNorms) {
  ModelSpec spec = tiny_spec();
  spec.attention.qk_norm = true;
  spec.post_norms = true;
  EXPECT_EQ(build_layer_plan(spec).describe(),
            "norm attn_norm: hidden -> attn_in\n"
            "linear qkv: attn_in -> qkv\n"
            "qk_norm qk_norm: qkv\n"
            "rope_write_kv: qkv\n"
            "attention: qkv -> attn_out\n"
            "linear o: attn_out -> proj\n"
            "norm_add post_attn_norm: proj ->+ hidden\n"
            "norm ffn_norm + linear+activation gate_up: hidden -> mlp_act normed in mlp_in via mlp_up\n"
            "linear down: mlp_act -> proj\n"
            "norm_add post_ffn_norm: proj ->+ hidden\n");
  spec.attention.qk_norm = false;
  const std::string fused = build_layer_plan(spec).describe();
  EXPECT_EQ(fused.find("norm attn_norm + linear+rope_write_kv qkv: hidden -> qkv normed in attn_in\n"), 0u) << fused;
}

TEST(LayerPlan, ParallelResidualSharedNormLearnedPositions) {
  ModelSpec spec = tiny_spec();
  spec.parallel_residual = spec.shared_layer_norm = true;
  spec.position = PositionType::Learned;
  spec.norm.bias = true;
  spec.attention.q_bias = true;
  spec.mlp.up_bias = true;
  EXPECT_EQ(build_layer_plan(spec).describe(),
            "norm attn_norm+bias: hidden -> attn_in\n"
            "linear qkv+bias: attn_in -> qkv\n"
            "write_kv: qkv\n"
            "attention: qkv -> attn_out\n"
            "linear o: attn_out ->+ hidden\n"
            "linear+activation gate_up+bias: attn_in -> mlp_act via mlp_up\n"
            "linear down: mlp_act ->+ hidden\n");
  spec.shared_layer_norm = false;
  const std::string two_norms = build_layer_plan(spec).describe();
  EXPECT_NE(two_norms.find("norm ffn_norm+bias: hidden -> mlp_in\n"), std::string::npos) << two_norms;
  EXPECT_NE(two_norms.find("linear+activation gate_up+bias: mlp_in -> mlp_act via mlp_up\n"), std::string::npos) << two_norms;
}

}  // namespace
