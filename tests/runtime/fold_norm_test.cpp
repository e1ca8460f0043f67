// ModelRunner with a backend that folds pre-norm weights into their matrices
// (Backend::fold_norm_weight, as CUDA does): the CPU kernels behind a backend that folds in f32,
// so the logits must equal the plain CPU backend's up to f32 rounding. Catches a norm folded into
// the wrong matrix, a folded norm still applied with its weight, or a fold where the plan keeps
// the norm apart (parallel residual, LayerNorm).
#include "backend/forwarding_backend.h"
#include "runtime/runner_test_util.h"

#include "backend/backend.h"

#include <gtest/gtest.h>

#include <memory>

namespace splitflow::test {
namespace {

class FoldingCpuBackend final : public ForwardingBackend {
 public:
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

 private:
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
