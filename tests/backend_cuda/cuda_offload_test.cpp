// backend/matmul_offload.h with the real helper: the CPU backend's products of enough rows run on
// the CUDA backend from the matrices the CPU holds (f32 and f16 converted once to bf16, bf16 and
// packed types as stored), against an fp64 reference over the matrix's own values within the bf16
// tolerance; decode-sized products stay on the CPU; a model's logits over the offload backend match
// the plain CPU runner's within that tolerance. Skips without a GPU.
#include "backend_cuda/cuda_test_util.h"

#include "backend/matmul_offload.h"
#include "engine/model_loader.h"
#include "quant/quant.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <cmath>
#include <random>
#include <vector>

using namespace splitflow;

namespace {

// bf16 input and output rounding over k = 256 products.
constexpr double kBf16Product = 2e-2;

TEST(CudaMatmulOffload, PromptSizedProductsRunOnTheGpu) {
  SF_REQUIRE_GPU();
  std::mt19937_64 rng(5);
  MatmulOffloadBackend offload(make_cpu_backend(2), test::make_test_cuda_backend(), {16, 100});
  const int64_t n = 96, k = 256;
  int64_t offloaded = 0;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K, DType::Q6_K})
    for (int64_t m : {1, 15, 16, 257}) {
      SCOPED_TRACE(fmt::format("{} m {}", dtype_name(dtype), m));
      std::vector<float> w32 = test::random_values(rng, static_cast<size_t>(n * k));
      Tensor w = Tensor::zeros(DType::F32, {n, k});
      std::copy(w32.begin(), w32.end(), w.as<float>());
      if (dtype == DType::F16 || dtype == DType::BF16) w = to_dtype(w, dtype);
      if (is_quantized(dtype)) w = quant::quantize(w, dtype);
      const Tensor values = quant::dequantize(w);
      const DeviceBuffer stored = offload.upload(w);
      std::vector<float> x = test::random_values(rng, static_cast<size_t>(m * k));
      std::vector<float> bias = test::random_values(rng, static_cast<size_t>(n));
      std::vector<float> y = test::random_values(rng, static_cast<size_t>(m * n));
      std::vector<double> want(y.size());
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) {
          double dot = bias[j] + y[r * n + j];  // accumulate onto what y held
          for (int64_t i = 0; i < k; ++i) dot += double{x[r * k + i]} * values.as<float>()[j * k + i];
          want[r * n + j] = dot;
        }
      offload.matmul({x.data(), DType::F32, {m, k}}, stored.view(), {bias.data(), DType::F32, {n}},
                     {y.data(), DType::F32, {m, n}}, true);
      EXPECT_LE(test::relative_error(y, want), is_quantized(dtype) || m < 16 ? 3e-2 : kBf16Product);
      if (m >= 16) ++offloaded;
      EXPECT_EQ(offload.offloaded_products(), offloaded);
    }
}

TEST(CudaMatmulOffload, AModelsPrefillOnTheGpuGivesTheCpuLogits) {
  SF_REQUIRE_GPU();
  ModelLoadOptions options;
  options.model_path = test::shared_path("models/stories260K-hf");
  const LoadedModel model = load_model(options);
  const KvCacheConfig kv{16, 16};
  const RunnerLimits limits{64, 1};
  auto cpu = make_cpu_backend(2);
  ModelRunner plain(model.spec, model.weights, *cpu, kv, limits);
  MatmulOffloadBackend offload(make_cpu_backend(2), test::make_test_cuda_backend(), {8, 512});
  ModelRunner offloaded(model.spec, model.weights, offload, kv, limits);
  const std::vector<int32_t> prompt = model.tokenizer->encode("Once upon a time, there was a little dog", true);
  ForwardBatch batch;
  batch.token_ids = prompt;
  batch.spans.push_back({static_cast<int32_t>(prompt.size()), 0, {0}, true});
  batch.logits_mode = LogitsMode::All;
  const Tensor want = plain.forward(batch), got = offloaded.forward(batch);
  ASSERT_EQ(got.shape, want.shape);
  const int64_t vocab = model.spec.vocab_size;
  for (int64_t r = 0; r < got.dim(0); ++r)
    EXPECT_LE(test::relative_l2(got.as<float>() + r * vocab, want.as<float>() + r * vocab, vocab), 0.06) << "row " << r;
  EXPECT_GE(offload.offloaded_products(), int64_t{model.spec.num_layers} * 4);
}

}  // namespace
