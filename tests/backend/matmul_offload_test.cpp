// backend/matmul_offload.h with a CPU backend standing in for the GPU helper: products of at least
// min_rows rows are computed by the helper from the matrices as the CPU holds them (f16 converted
// once, packed types as stored), in chunks of chunk_rows, the bias and accumulate applied on the
// way back — each against an fp64 reference over the matrix's own values. A helper whose
// activations are bf16 (as CUDA's) rounds x on its way there. A whole model over the offload backend
// gives the plain CPU runner's logits, with prefill products offloaded and decode ones not.
#include "backend/matmul_offload.h"

#include "backend/backend.h"
#include "engine/model_loader.h"
#include "quant/quant.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace splitflow {
namespace {

// The CPU's kernels behind bf16 activations, as a GPU helper has them: x arrives as bf16, y goes
// out in f32 (the contract's logits form) or bf16.
class Bf16Helper final : public ForwardingBackend {
 public:
  std::string name() const override { return "cpu (bf16 activations)"; }
  DType activation_dtype() const override { return DType::BF16; }
  void matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias, const DeviceTensor& y,
              bool accumulate) override {
    ASSERT_EQ(x.dtype, DType::BF16);
    std::vector<float> x32(static_cast<size_t>(x.numel())), y32(static_cast<size_t>(y.numel()));
    convert_to_f32(DType::BF16, x.data, x32.data(), x32.size());
    if (y.dtype == DType::F32) {
      inner().matmul({x32.data(), DType::F32, x.shape}, w, bias, y, accumulate);
      return;
    }
    ASSERT_EQ(y.dtype, DType::BF16);
    ASSERT_FALSE(accumulate);
    inner().matmul({x32.data(), DType::F32, x.shape}, w, bias, {y32.data(), DType::F32, y.shape}, false);
    auto* out = static_cast<uint16_t*>(y.data);
    for (size_t i = 0; i < y32.size(); ++i) out[i] = f32_to_bf16(y32[i]);
  }
};

std::vector<float> random_values(std::mt19937& rng, size_t count) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

struct ProductCase {
  DType weight_dtype;
  int64_t rows;
  bool with_bias, accumulate;
};

// y (= or +=) x W^T + bias through `backend`, against fp64 over W's own values (dequantized).
double product_error(Backend& backend, std::mt19937& rng, const ProductCase& c) {
  const int64_t n = 48, k = 256;  // k: whole Q4_K blocks
  const std::vector<float> w32 = random_values(rng, static_cast<size_t>(n * k));
  Tensor w = Tensor::zeros(DType::F32, {n, k});
  std::copy(w32.begin(), w32.end(), w.as<float>());
  if (c.weight_dtype == DType::F16) w = to_dtype(w, DType::F16);
  if (is_quantized(c.weight_dtype)) w = quant::quantize(w, c.weight_dtype);
  const Tensor w_values = quant::dequantize(w);  // what the product must use
  const DeviceBuffer w_dev = backend.upload(w);

  std::vector<float> x = random_values(rng, static_cast<size_t>(c.rows * k));
  std::vector<float> bias = random_values(rng, static_cast<size_t>(n));
  std::vector<float> y = random_values(rng, static_cast<size_t>(c.rows * n));
  std::vector<double> want(y.size());
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double dot = c.with_bias ? bias[j] : 0.0;
      for (int64_t i = 0; i < k; ++i) dot += double{x[r * k + i]} * w_values.as<float>()[j * k + i];
      want[r * n + j] = (c.accumulate ? y[r * n + j] : 0.0) + dot;
    }
  const DeviceTensor bias_view = c.with_bias ? DeviceTensor{bias.data(), DType::F32, {n}} : DeviceTensor{};
  backend.matmul({x.data(), DType::F32, {c.rows, k}}, w_dev.view(), bias_view, {y.data(), DType::F32, {c.rows, n}},
                 c.accumulate);
  return relative_error(y, want);
}

// Each case uploads a matrix and frees it: the next one often gets the same address, which must
// not find the last one's converted copy.
TEST(MatmulOffload, ProductsOfEnoughRowsRunOnTheHelperInChunks) {
  std::mt19937 rng(7);
  MatmulOffloadBackend offload(make_cpu_backend(1), make_cpu_backend(1), {8, 5});
  int64_t expected = 0;
  for (DType dtype : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K})
    for (int64_t rows : {3, 8, 23})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(fmt::format("{} rows {} accumulate {}", dtype_name(dtype), rows, accumulate));
        const double error = product_error(offload, rng, {dtype, rows, rows != 8, accumulate});
        // The CPU quantizes x to 8 bits for packed products (llama.cpp's Q8 activations).
        EXPECT_LE(error, is_quantized(dtype) ? 2e-2 : 1e-5);
        if (rows >= 8) ++expected;
        EXPECT_EQ(offload.offloaded_products(), expected);
      }
}

TEST(MatmulOffload, ABf16HelperRoundsTheInput) {
  std::mt19937 rng(11);
  MatmulOffloadBackend offload(make_cpu_backend(1), std::make_unique<Bf16Helper>(), {4, 16});
  for (DType dtype : {DType::F32, DType::F16, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double error = product_error(offload, rng, {dtype, 37, true, true});
    EXPECT_LE(error, 2e-2);
    EXPECT_GT(error, 1e-6);  // it did round: bf16 keeps 8 bits of mantissa
  }
  EXPECT_EQ(offload.offloaded_products(), 3);
}

TEST(MatmulOffload, AMatrixItNeverUploadedStaysOnTheCpu) {
  std::mt19937 rng(3);
  MatmulOffloadBackend offload(make_cpu_backend(1), make_cpu_backend(1), {1, 8});
  std::vector<float> w = random_values(rng, 16 * 8), x = random_values(rng, 4 * 8), y(4 * 16), want(4 * 16);
  offload.matmul({x.data(), DType::F32, {4, 8}}, {w.data(), DType::F32, {16, 8}}, {}, {y.data(), DType::F32, {4, 16}},
                 false);
  EXPECT_EQ(offload.offloaded_products(), 0);
  auto cpu = make_cpu_backend(1);
  cpu->matmul({x.data(), DType::F32, {4, 8}}, {w.data(), DType::F32, {16, 8}}, {}, {want.data(), DType::F32, {4, 16}},
              false);
  EXPECT_EQ(y, want);
}

TEST(MatmulOffload, AModelGivesThePlainCpuLogitsWithPrefillProductsOffloaded) {
  ModelLoadOptions options;
  options.model_path = test::shared_path("models/stories260K-hf");
  const LoadedModel model = load_model(options);
  const KvCacheConfig kv{16, 16};
  const RunnerLimits limits{64, 1};
  auto cpu = make_cpu_backend(1);
  ModelRunner plain(model.spec, model.weights, *cpu, kv, limits);
  MatmulOffloadBackend offload(make_cpu_backend(1), make_cpu_backend(1), {8, 5});
  ModelRunner offloaded(model.spec, model.weights, offload, kv, limits);

  const std::vector<int32_t> prompt = model.tokenizer->encode("Once upon a time, there was a little", true);
  ASSERT_GE(prompt.size(), 8u);
  auto step = [&](ModelRunner& runner, std::vector<int32_t> tokens, int32_t start) {
    ForwardBatch batch;
    batch.spans.push_back({static_cast<int32_t>(tokens.size()), start, {0}, true});
    batch.token_ids = std::move(tokens);
    batch.logits_mode = LogitsMode::All;
    return runner.forward(batch);
  };
  auto expect_close = [](const Tensor& got, const Tensor& want, const char* what) {
    ASSERT_EQ(got.shape, want.shape);
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      diff += std::pow(double{got.as<float>()[i]} - want.as<float>()[i], 2);
      norm += std::pow(double{want.as<float>()[i]}, 2);
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << what;
  };
  expect_close(step(offloaded, prompt, 0), step(plain, prompt, 0), "prefill");
  const int64_t after_prefill = offload.offloaded_products();
  EXPECT_GE(after_prefill, int64_t{model.spec.num_layers} * 4);  // QKV, O, gate-up, down of every layer
  const int32_t next = 42;
  expect_close(step(offloaded, {next}, static_cast<int32_t>(prompt.size())),
               step(plain, {next}, static_cast<int32_t>(prompt.size())), "decode");
  EXPECT_EQ(offload.offloaded_products(), after_prefill);  // one row: the CPU's
}

}  // namespace
}  // namespace splitflow
