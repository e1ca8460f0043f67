// Tensor parallelism on the CPU (parallel/tensor_parallel.h): which heads and columns a rank owns,
// the plan's sums, column slices of packed rows against quant::dequantize, and whole models run as
// 2 and 4 ranks (threads, each with its own CPU backend and sharded weights, rank 0 leading the
// others through the shared-memory step channel) against HF transformers' logits.
#include "parallel/tensor_parallel.h"

#include "backend/backend.h"
#include "backend/cpu/rank_group.h"
#include "backend/host_mailboxes.h"
#include "comm/file_store.h"
#include "formats/weight_source.h"
#include "hf_fixture_runner.h"
#include "parallel_harness.h"
#include "model/config.h"
#include "parallel/partition.h"
#include "parallel/shm_step_channel.h"
#include "quant/quant.h"
#include "quant/row_slice.h"
#include "runtime/model_runner.h"
#include "runtime/step_command.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <thread>

using namespace splitflow;

namespace {

ModelSpec toy_spec(int heads, int kv_heads, int inter) {
  ModelSpec spec;
  spec.hidden_size = 64;
  spec.num_layers = 2;
  spec.vocab_size = 100;
  spec.max_position = 64;
  spec.attention.num_heads = heads;
  spec.attention.num_kv_heads = kv_heads;
  spec.attention.head_dim = 16;
  spec.mlp.intermediate_size = inter;
  spec.mlp.gated = true;
  return spec;
}

std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}


}  // namespace

TEST(TensorParallelShard, HeadsKvHeadsAndColumnsPerRank) {
  const ModelSpec spec = toy_spec(8, 2, 128);
  // KV heads >= ranks: a range each.
  for (int r = 0; r < 2; ++r) {
    const TensorParallelShard s = plan_tensor_parallel_shard(spec, r, 2);
    EXPECT_EQ(s.num_heads, 4);
    EXPECT_EQ(s.head_begin, 4 * r);
    EXPECT_EQ(s.num_kv_heads, 1);
    EXPECT_EQ(s.kv_head_begin, r);
    EXPECT_EQ(s.mlp_columns, 64);
    EXPECT_EQ(s.mlp_begin, 64 * r);
  }
  // Fewer KV heads than ranks: each rank holds the KV head of its query group (replicated).
  const int expected_kv[8] = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int r = 0; r < 8; ++r) {
    const TensorParallelShard s = plan_tensor_parallel_shard(spec, r, 8);
    EXPECT_EQ(s.num_heads, 1);
    EXPECT_EQ(s.head_begin, r);
    EXPECT_EQ(s.num_kv_heads, 1);
    EXPECT_EQ(s.kv_head_begin, expected_kv[r]) << "rank " << r;
    // query head r reads kv head r / (heads / kv_heads) in the one-rank model
    EXPECT_EQ(s.kv_head_begin, s.head_begin / 4);
  }
  const ModelSpec sharded = shard_spec(spec, plan_tensor_parallel_shard(spec, 1, 4));
  EXPECT_EQ(sharded.attention.num_heads, 2);
  EXPECT_EQ(sharded.attention.num_kv_heads, 1);
  EXPECT_EQ(sharded.attention.head_dim, 16);
  EXPECT_EQ(sharded.mlp.intermediate_size, 32);
  EXPECT_EQ(sharded.hidden_size, 64);
}

TEST(TensorParallelShard, CountsThatDoNotDivideAreRefusedByName) {
  EXPECT_NE(expect_error([] { plan_tensor_parallel_shard(toy_spec(6, 6, 128), 0, 4); }).find("num_heads 6"),
            std::string::npos);
  EXPECT_NE(expect_error([] { plan_tensor_parallel_shard(toy_spec(12, 3, 128), 0, 2); }).find("num_kv_heads 3"),
            std::string::npos);
  EXPECT_NE(expect_error([] { plan_tensor_parallel_shard(toy_spec(8, 8, 100), 0, 8); }).find("intermediate_size 100"),
            std::string::npos);
  EXPECT_NE(expect_error([] { plan_tensor_parallel_shard(toy_spec(8, 8, 128), 2, 2); }).find("rank 2"),
            std::string::npos);
}

// No step reads or writes hidden while proj holds partial products, every partial product is
// summed exactly once, and nothing else changes.
void check_parallel_plan(const ModelSpec& spec, int expected_sums) {
  const LayerPlan plan = build_layer_plan(spec);
  const LayerPlan parallel = tensor_parallel_plan(plan);
  SCOPED_TRACE(parallel.describe());
  bool pending = false;
  int sums = 0, others = 0;
  for (const PlanStep& step : parallel.steps) {
    if (step.kind == StepKind::Allreduce) {
      ++sums;
      EXPECT_EQ(step.input, Slot::Proj);
      if (step.output == Slot::Hidden) {
        EXPECT_TRUE(pending);
        pending = false;
      }
      continue;
    }
    ++others;
    const bool row_parallel = step.kind == StepKind::Linear &&
                              (step.weight == LayerWeight::Output || step.weight == LayerWeight::Down);
    if (row_parallel) {
      EXPECT_EQ(step.output, Slot::Proj);
      EXPECT_EQ(step.accumulate, pending);  // a second partial product joins the first
      pending = !spec.post_norms;
      continue;
    }
    EXPECT_FALSE(pending && (step.input == Slot::Hidden || step.output == Slot::Hidden)) << "a step reads hidden "
                                                                                            "before the sum";
  }
  EXPECT_FALSE(pending);
  EXPECT_EQ(sums, expected_sums);
  EXPECT_EQ(others, static_cast<int>(plan.steps.size()));
}

TEST(TensorParallelPlan, SumsBeforeHiddenIsReadAgain) {
  ModelSpec sequential = toy_spec(8, 2, 128);
  check_parallel_plan(sequential, 2);
  ModelSpec parallel_residual = sequential;  // GPT-NeoX: both projections share one sum
  parallel_residual.parallel_residual = true;
  check_parallel_plan(parallel_residual, 1);
  ModelSpec post_norms = sequential;  // Gemma: each projection summed in place before its norm
  post_norms.post_norms = true;
  check_parallel_plan(post_norms, 2);
  ModelSpec encoder = sequential;  // BERT: post-norm layers
  encoder.norm.placement = NormPlacement::Post;
  encoder.network = NetworkType::EncoderOnly;
  check_parallel_plan(encoder, 2);
  EXPECT_NE(expect_error([&] { tensor_parallel_plan(tensor_parallel_plan(build_layer_plan(sequential))); })
                .find("already tensor-parallel"),
            std::string::npos);
}

// A column slice of a packed row decodes to the same values as those columns of the whole row.
TEST(TensorParallelShard, PackedRowColumnSlicesDecodeAsTheWholeRow) {
  const int64_t cols = 1024, begin = 256, count = 512;
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> values(cols);
  for (float& v : values) v = normal(random);
  for (const quant::TypeInfo& type : quant::all_types()) {
    if (begin % type.block_elems != 0 || count % type.block_elems != 0) continue;
    SCOPED_TRACE(std::string(dtype_name(type.type)));
    std::vector<uint8_t> row(dtype_row_bytes(type.type, cols)), slice(dtype_row_bytes(type.type, count));
    quant::quantize_row(type.type, values.data(), row.data(), cols);
    quant::slice_row_columns(type.type, cols, row, begin, count, slice);
    std::vector<float> whole(cols), part(count);
    quant::dequantize_row(type.type, row.data(), whole.data(), cols);
    quant::dequantize_row(type.type, slice.data(), part.data(), count);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(part[i], whole[begin + i]) << "column " << begin + i;
  }
  std::vector<uint8_t> row(dtype_row_bytes(DType::Q4_K, cols)), slice(dtype_row_bytes(DType::Q4_K, 256));
  EXPECT_NE(expect_error([&] { quant::slice_row_columns(DType::Q4_K, cols, row, 128, 256, slice); })
                .find("not on a 256-element block boundary"),
            std::string::npos);
}

namespace {

struct LoadedFixture {
  ModelSpec spec;
  ModelWeights weights;
};

LoadedFixture load_fixture(const std::string& name, std::optional<DType> quantization = std::nullopt) {
  const std::string dir = test::fixture_path("hf/" + name);
  const nlohmann::json meta = read_json_file(dir + "/meta.json");
  std::unique_ptr<WeightSource> source = open_weights(dir);
  LoadedFixture fixture;
  fixture.spec = resolve_source_spec(*source, dir);
  fixture.weights = bind_weights(fixture.spec, *source, parse_dtype(meta["weights_dtype"].get<std::string>()),
                                 quantization);
  return fixture;
}

void run_tensor_parallel(const LoadedFixture& fixture, int size, const KvCacheConfig& kv,
                         const std::function<void(ModelRunner&)>& lead) {
  test::run_parallel(fixture.spec, fixture.weights, ParallelLayout{size, 1}, kv, {}, lead);
}

// |delta| <= 1e-3 max|logit| per row and the reference's greedy token, as the one-rank fixture test.
void check_logits(const float* actual, const float* expected, int64_t rows, int64_t vocab, const std::string& what) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = actual + r * vocab;
    const float* e = expected + r * vocab;
    float scale = 0.0f, worst = 0.0f;
    for (int64_t i = 0; i < vocab; ++i) scale = std::max(scale, std::abs(e[i]));
    for (int64_t i = 0; i < vocab; ++i) worst = std::max(worst, std::abs(a[i] - e[i]));
    ASSERT_LE(worst, 1e-3f * scale) << what << " row " << r;
    ASSERT_EQ(std::max_element(a, a + vocab) - a, std::max_element(e, e + vocab) - e) << what << " row " << r;
  }
}

}  // namespace

class TensorParallelFixture : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallelFixture, MatchesTransformers) {
  const auto& [name, size] = GetParam();
  const LoadedFixture fixture = load_fixture(name);
  try {  // heads that do not divide, or packed blocks a shard would cut, are refused by name
    shard_model(fixture.spec, fixture.weights, 0, size);
  } catch (const Error& e) {
    GTEST_SKIP() << name << " does not split " << size << " ways: " << e.what();
  }
  int checks = 0;
  run_tensor_parallel(fixture, size, KvCacheConfig{32, 4}, [&](ModelRunner& runner) {
    test::run_hf_fixture(runner, name, [&](const float* actual, const float* expected, int64_t rows, int32_t,
                                           const std::string& what) {
      check_logits(actual, expected, rows, fixture.spec.vocab_size, what);
      ++checks;
    });
  });
  EXPECT_GT(checks, 0);
}

INSTANTIATE_TEST_SUITE_P(Hf, TensorParallelFixture,
                         ::testing::Combine(::testing::ValuesIn(test::hf_fixture_names()), ::testing::Values(2, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
                         });

// Packed shards (row gathers of packed rows, column slices of packed rows): the quantized model
// run as 2 ranks gives the one-rank quantized model's logits (same codes, same scales; only the
// order of the fp32 sums differs).
TEST(TensorParallelQuantized, PackedShardsGiveTheOneRankLogits) {
  for (const DType type : {DType::Q8_0, DType::Q4_0, DType::Q4_B32, DType::I8_G32}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    const LoadedFixture fixture = load_fixture("llama_gqa_tied", type);
    ForwardBatch prefill;
    prefill.token_ids = {1, 17, 33, 250, 7, 99, 3};
    prefill.spans = {{7, 0, {0, 1}, true}};
    prefill.logits_mode = LogitsMode::All;
    auto backend = make_cpu_backend(1);
    ModelRunner one(fixture.spec, fixture.weights, *backend, KvCacheConfig{8, 4});
    const Tensor want = one.forward(prefill);
    run_tensor_parallel(fixture, 2, KvCacheConfig{8, 4}, [&](ModelRunner& runner) {
      const Tensor got = runner.forward(prefill);
      ASSERT_EQ(got.shape, want.shape);
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_NEAR(got.as<float>()[i], want.as<float>()[i], 1e-4f * (1.0f + std::abs(want.as<float>()[i]))) << i;
    });
  }
}

// Pipeline stages and the hybrid grid (reference 002 §4): layer ranges x head ranges. Each
// layout must give transformers' logits on every fixture it divides.
class ParallelGridFixture : public ::testing::TestWithParam<std::tuple<std::string, ParallelLayout>> {};

TEST_P(ParallelGridFixture, MatchesTransformers) {
  const auto& [name, layout] = GetParam();
  const LoadedFixture fixture = load_fixture(name);
  try {
    partition_model(fixture.spec, fixture.weights, layout, 0);
  } catch (const Error& e) {
    GTEST_SKIP() << name << " does not split " << layout.tensor_parallel << " x " << layout.pipeline_parallel << ": "
                 << e.what();
  }
  int checks = 0;
  test::run_parallel(fixture.spec, fixture.weights, layout, KvCacheConfig{32, 4}, {}, [&](ModelRunner& runner) {
    test::run_hf_fixture(runner, name, [&](const float* actual, const float* expected, int64_t rows, int32_t,
                                           const std::string& what) {
      check_logits(actual, expected, rows, fixture.spec.vocab_size, what);
      ++checks;
    });
  });
  EXPECT_GT(checks, 0);
}

INSTANTIATE_TEST_SUITE_P(Hf, ParallelGridFixture,
                         ::testing::Combine(::testing::ValuesIn(test::hf_fixture_names()),
                                            ::testing::Values(ParallelLayout{1, 2}, ParallelLayout{1, 3},
                                                              ParallelLayout{2, 2}, ParallelLayout{1, 2, {1, 1}})),
                         [](const auto& info) {
                           const ParallelLayout& l = std::get<1>(info.param);
                           std::string name = std::get<0>(info.param) + "_tp" + std::to_string(l.tensor_parallel) +
                                              "_pp" + std::to_string(l.pipeline_parallel);
                           if (!l.stage_layers.empty()) name += "_given";
                           return name;
                         });

// Reference 000's transfer with tensor parallelism inside the stages: each rank of a stage sends
// the next stage's rank of its tensor-parallel index only its share of the residual stream (rows
// ceil(tokens / T) of them), which the receivers all-gather; the logits above (ParallelGridFixture,
// tp2_pp2) show the gathered stream is whole. Without tensor parallelism a rank sends every row.
TEST(ParallelGrid, EachRankSendsItsShareOfTheResidualStream) {
  const LoadedFixture fixture = load_fixture("llama");
  const int64_t row_bytes = fixture.spec.hidden_size * int64_t{sizeof(float)};  // the CPU's f32 stream
  ForwardBatch batch;
  batch.token_ids = {1, 2, 3, 4, 5};
  batch.spans.push_back({5, 0, {0, 1}, true});
  for (const ParallelLayout& layout : {ParallelLayout{2, 2}, ParallelLayout{1, 2}}) {
    test::run_parallel(
        fixture.spec, fixture.weights, layout, KvCacheConfig{32, 4}, {},
        [&](ModelRunner& runner) { runner.forward(batch); },
        [&](const LocalPipeline& job) {
          const int t = layout.tensor_parallel;
          for (int r = 0; r < t; ++r)  // stage 0's rank r feeds stage 1's rank r (job rank t + r)
            EXPECT_EQ(job.mailboxes().bytes_sent(r, t + r), (5 + t - 1) / t * row_bytes)
                << "tp " << t << " rank " << r;
        });
  }
}

TEST(ParallelLayout, StageRangesAndSpecs) {
  EXPECT_EQ(stage_layer_ranges(10, ParallelLayout{1, 3}), (std::vector<std::pair<int, int>>{{0, 4}, {4, 3}, {7, 3}}));
  EXPECT_EQ(stage_layer_ranges(10, ParallelLayout{1, 2, {3, 7}}), (std::vector<std::pair<int, int>>{{0, 3}, {3, 7}}));
  EXPECT_NE(expect_error([] { stage_layer_ranges(10, ParallelLayout{1, 2, {3, 6}}); }).find("add up to 9"),
            std::string::npos);
  EXPECT_NE(expect_error([] { stage_layer_ranges(2, ParallelLayout{1, 3}); }).find("2 layers cannot fill 3 stages"),
            std::string::npos);
  EXPECT_EQ(parse_stage_layers("12,20"), (std::vector<int>{12, 20}));
  EXPECT_NE(expect_error([] { parse_stage_layers("12,x"); }).find("'x'"), std::string::npos);
  EXPECT_NE(expect_error([] { parse_stage_layers("12,0"); }).find("'0'"), std::string::npos);

  // Gemma-style interval pattern: each stage's layer kinds are the whole model's at those layers.
  ModelSpec spec = toy_spec(8, 2, 128);
  spec.num_layers = 6;
  spec.attention.sliding_window = 4;
  spec.attention.full_attention_interval = 3;  // layers 2 and 5 full
  const ModelSpec stage = stage_spec(spec, 2, 3);
  EXPECT_EQ(stage.num_layers, 3);
  for (int l = 0; l < 3; ++l) EXPECT_EQ(stage.layer_attention(l), spec.layer_attention(2 + l)) << l;

  // Links: rank = stage * tp + tp_rank; the last stage's tp rank 0 sends rank 0 the outputs.
  const ParallelLayout grid{2, 3};
  ModelWeights weights;  // generated tensors of the toy spec's shapes
  const auto matrix = [](int64_t rows, int64_t cols) { return Tensor::generated_normal(DType::F32, {rows, cols}, {1, 0.02f}); };
  for (int l = 0; l < spec.num_layers; ++l) {
    LayerWeights layer;
    layer.wqkv = matrix((8 + 2 * 2) * 16, 64);
    layer.wo = matrix(64, 8 * 16);
    layer.w_gate_up = matrix(2 * 128, 64);
    layer.w_down = matrix(64, 128);
    weights.layers.push_back(layer);
  }
  const PartitionedModel middle = partition_model(spec, weights, grid, 3);  // stage 1, tp rank 1
  EXPECT_EQ(middle.stage, 1);
  EXPECT_EQ(middle.tp_rank, 1);
  EXPECT_EQ(middle.runner.pipeline.prev, 1);
  EXPECT_EQ(middle.runner.pipeline.next, 5);
  EXPECT_EQ(middle.runner.pipeline.output_source, 4);
  EXPECT_EQ(middle.spec.num_layers, 2);
  EXPECT_EQ(middle.weights.layers.size(), 2u);
  EXPECT_EQ(middle.spec.attention.num_heads, 4);
  EXPECT_TRUE(middle.runner.plan.has_value());
  const PartitionedModel last = partition_model(spec, weights, grid, 4);
  EXPECT_TRUE(last.runner.pipeline.sends_output());
  EXPECT_FALSE(partition_model(spec, weights, grid, 5).runner.pipeline.sends_output());
  EXPECT_TRUE(partition_model(spec, weights, grid, 0).runner.pipeline.receives_output());
}

// The vocabulary-parallel embedding: each first-stage rank holds its vocabulary rows of the table
// (copied from the source) and a zero row after them; the runner is told; a generated table, a
// vocabulary the ranks do not divide, and later stages keep the embedding as it was.
TEST(TensorParallelShard, EmbeddingRowsSplitWithAZeroRow) {
  const LoadedFixture fixture = load_fixture("llama_gqa_tied");
  const int64_t vocab = fixture.spec.vocab_size, hidden = fixture.spec.hidden_size;
  ASSERT_EQ(vocab % 2, 0);
  const Tensor source = to_dtype(fixture.weights.embed, DType::F32);
  for (int rank = 0; rank < 2; ++rank) {
    const PartitionedModel part = partition_model(fixture.spec, fixture.weights, ParallelLayout{2, 1}, rank);
    EXPECT_TRUE(part.runner.vocab.embed);
    EXPECT_EQ(part.runner.vocab.rows, vocab / 2);
    ASSERT_EQ(part.weights.embed.shape, (Shape{vocab / 2 + 1, hidden}));
    const Tensor got = to_dtype(part.weights.embed, DType::F32);
    for (int64_t r = 0; r < vocab / 2; ++r)
      for (int64_t c = 0; c < hidden; ++c)
        ASSERT_EQ(got.as<float>()[r * hidden + c], source.as<float>()[(rank * vocab / 2 + r) * hidden + c]) << r;
    for (int64_t c = 0; c < hidden; ++c) ASSERT_EQ(got.as<float>()[vocab / 2 * hidden + c], 0.0f);
    // The head's rows stay a slice of the head, untouched by the padding.
    EXPECT_EQ(part.weights.lm_head.shape, (Shape{vocab / 2, hidden}));
  }
  // A later stage has no embedding; the grid's first stage splits it.
  EXPECT_FALSE(partition_model(fixture.spec, fixture.weights, ParallelLayout{2, 2}, 2).runner.vocab.embed);
  EXPECT_TRUE(partition_model(fixture.spec, fixture.weights, ParallelLayout{2, 2}, 1).runner.vocab.embed);
  // Generated (dummy) tables stay replicated.
  ModelWeights generated = fixture.weights;
  generated.embed = Tensor::generated_normal(DType::F32, {vocab, hidden}, {7, 0.02f});
  const PartitionedModel dummy = partition_model(fixture.spec, generated, ParallelLayout{2, 1}, 1);
  EXPECT_FALSE(dummy.runner.vocab.embed);
  EXPECT_EQ(dummy.weights.embed.shape, (Shape{vocab, hidden}));
}
