// ModelRunner with a backend that folds pre-norm weights into their matrices
// (Backend::fold_norm_weight, as CUDA does): the CPU kernels behind a backend that folds in f32,
// so the logits must equal the plain CPU backend's up to f32 rounding. Catches a norm folded into
// the wrong matrix, a folded norm still applied with its weight, or a fold where the plan keeps
// the norm apart (parallel residual, LayerNorm).
#include "runtime/runner_test_util.h"

#include "backend/backend.h"

#include <gtest/gtest.h>

#include <memory>

namespace splitflow::test {
namespace {

class FoldingCpuBackend final : public Backend {
 public:
  FoldingCpuBackend() : cpu_(make_cpu_backend(1)) {}
  int32_t folds() const { return folds_; }

  bool fold_norm_weight(const DeviceTensor& w, const DeviceTensor& norm_weight, float weight_offset) override {
    EXPECT_EQ(w.dtype, DType::F32);
    const int64_t rows = w.dim(0), cols = w.dim(1);
    EXPECT_EQ(norm_weight.shape, Shape{cols});
    float* values = static_cast<float*>(w.data);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) values[r * cols + c] *= weight_offset + norm_weight.as<float>()[c];
    ++folds_;
    return true;
  }

  std::string name() const override { return "cpu (folding)"; }
  DType activation_dtype() const override { return cpu_->activation_dtype(); }
  std::span<const DType> kv_cache_dtypes() const override { return cpu_->kv_cache_dtypes(); }
  DeviceBuffer allocate(DType dtype, Shape shape) override { return cpu_->allocate(dtype, std::move(shape)); }
  DeviceBuffer upload(const Tensor& host) override { return cpu_->upload(host); }
  void copy_to_device(const void* host, const DeviceTensor& dst) override { cpu_->copy_to_device(host, dst); }
  void copy_to_host(const DeviceTensor& src, void* host) override { cpu_->copy_to_host(src, host); }
  void synchronize() override { cpu_->synchronize(); }
  DeviceMemoryInfo memory_info() const override { return cpu_->memory_info(); }
  std::shared_ptr<void> allocate_host(size_t bytes) override { return cpu_->allocate_host(bytes); }
  void copy_blocks(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                   CopyDirection direction) override {
    cpu_->copy_blocks(cache, host, copies, direction);
  }
  void embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier, const DeviceTensor& pos_table,
             const DeviceTensor& positions, const DeviceTensor& out) override {
    cpu_->embed(table, token_ids, multiplier, pos_table, positions, out);
  }
  void add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) override {
    cpu_->add_norm(residual, delta, weight, bias, params, out);
  }
  void matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
              bool accumulate) override {
    cpu_->matmul(x, w, bias, y, accumulate);
  }
  void rope(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
            const RopeParams& params) override {
    cpu_->rope(qkv, cos_sin, table_rows, params);
  }
  void write_kv(const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                const DeviceTensor& k_cache, const DeviceTensor& v_cache) override {
    cpu_->write_kv(qkv, slots, params, k_cache, v_cache);
  }
  void attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) override {
    cpu_->attention(qkv, k_cache, v_cache, batch, params, out);
  }
  void activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) override {
    cpu_->activation(x, act, gated, out);
  }
  void gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) override {
    cpu_->gather_rows(x, rows, out);
  }
  void sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) override {
    cpu_->sample(logits, rows, tokens);
  }

 private:
  std::unique_ptr<Backend> cpu_;
  int32_t folds_ = 0;
};

// Logits of a 10-token prefill, then 3 decode steps, every row.
std::vector<Tensor> run(const ModelSpec& spec, Backend& backend) {
  std::mt19937_64 rng(11);
  const std::vector<int32_t> tokens = random_tokens(rng, 13, spec.vocab_size);
  ModelRunner runner(spec, random_weights(spec, DType::F32, 5), backend, {8, 4});
  std::vector<Tensor> logits = {runner.forward(single_span(tokens, 0, 10, iota_blocks(4), LogitsMode::All))};
  for (int t = 10; t < 13; ++t) logits.push_back(runner.forward(single_span(tokens, t, 1, iota_blocks(4), LogitsMode::Last)));
  return logits;
}

void expect_same_logits(const ModelSpec& spec, int32_t expected_folds) {
  auto plain = make_cpu_backend(1);
  FoldingCpuBackend folding;
  const std::vector<Tensor> want = run(spec, *plain), got = run(spec, folding);
  EXPECT_EQ(folding.folds(), expected_folds);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].shape, want[i].shape);
    float scale = 0.0f, worst = 0.0f;
    for (int64_t j = 0; j < want[i].numel(); ++j) {
      scale = std::max(scale, std::abs(want[i].as<float>()[j]));
      worst = std::max(worst, std::abs(got[i].as<float>()[j] - want[i].as<float>()[j]));
    }
    EXPECT_LE(worst, 1e-4f * scale) << "step " << i;
  }
}

TEST(FoldNormWeights, SequentialRmsNormLayersFoldBothPreNorms) {
  expect_same_logits(tiny_spec(), 2 * tiny_spec().num_layers);
}

TEST(FoldNormWeights, WeightOffsetIsFoldedToo) {  // Gemma: x_hat * (1 + g)
  ModelSpec spec = tiny_spec();
  spec.norm.weight_offset = 1.0;
  expect_same_logits(spec, 2 * spec.num_layers);
}

TEST(FoldNormWeights, LayerNormAndParallelResidualKeepTheirNorms) {
  ModelSpec layer_norm = tiny_spec();
  layer_norm.norm.type = NormType::LayerNorm;
  expect_same_logits(layer_norm, 0);
  ModelSpec parallel = tiny_spec();
  parallel.parallel_residual = true;
  expect_same_logits(parallel, 0);
}

}  // namespace
}  // namespace splitflow::test
