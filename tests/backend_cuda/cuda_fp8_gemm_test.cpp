// W8A8 (`--quantization fp8`, backend/cuda/fp8_gemm.h) against its definition in fp64: x rows
// quantized on the host to e4m3 with scale max|x| / 448 (core/dtype.h's encoder, nearest even,
// saturating), the f8_channel matrix dequantized by quant::dequantize, their dot in double. Also:
// decode-sized products stay the weight-only GEMV's bit for bit, and the residual add and bias.
#include "cuda_test_util.h"
#include "quant/quant.h"

#include <cstring>
#include <type_traits>

namespace splitflow::test {
namespace {

constexpr double kFp8Accumulation = 2e-4;

bool have_hopper() {
#ifdef SPLITFLOW_HAS_CUDA
  const auto devices = cuda::list_devices();
  return !devices.empty() && devices[0].compute_major == 9;
#else
  return false;
#endif
}

// x rows as W8A8 sees them: e4m3(x * (1 / s)) * s with s = max|x| / 448 per row.
std::vector<float> fp8_rows(const std::vector<float>& x, int64_t m, int64_t k) {
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < m; ++r) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(x[r * k + i]));
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f, inverse = 1.0f / scale;
    for (int64_t i = 0; i < k; ++i) out[r * k + i] = e4m3_to_f32(f32_to_e4m3(x[r * k + i] * inverse)) * scale;
  }
  return out;
}

std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t n,
                               int64_t k) {
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double sum = 0.0;
      for (int64_t i = 0; i < k; ++i) sum += double{x[r * k + i]} * w[c * k + i];
      y[r * n + c] = sum;
    }
  return y;
}

struct Fp8Case {
  Tensor packed;
  std::vector<float> dequantized;
};

Fp8Case make_weights(std::mt19937_64& rng, int64_t n, int64_t k) {
  std::vector<float> w = random_values(rng, n * k, -0.5f, 0.5f);
  // Rows of different magnitudes, so the per-row scales matter.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) w[r * k + i] *= 0.25f + static_cast<float>(r % 7);
  Tensor f32 = Tensor::zeros(DType::F32, {n, k});
  std::memcpy(f32.data, w.data(), w.size() * sizeof(float));
  Fp8Case c;
  c.packed = quant::quantize(f32, DType::F8_CHANNEL);
  const Tensor back = quant::dequantize(c.packed);
  c.dequantized.assign(back.as<float>(), back.as<float>() + back.numel());
  return c;
}

template <typename T>
std::vector<float> download(Backend& backend, const DeviceBuffer& buffer) {
  std::vector<T> raw(static_cast<size_t>(buffer.view().numel()));
  backend.copy_to_host(buffer.view(), raw.data());
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      out[i] = raw[i];
    } else {
      out[i] = bf16_to_f32(raw[i]);
    }
  }
  return out;
}

TEST(CudaFp8Gemm, MatchesTheW8A8DefinitionInFp64) {
  SF_REQUIRE_GPU();
  if (!have_hopper()) GTEST_SKIP() << "W8A8 needs a Hopper GPU (cuBLASLt's outer-vector FP8 scaling is sm_90's)";
  auto backend = make_test_cuda_backend();
  ASSERT_TRUE(backend->set_fp8_activations(true));
  std::mt19937_64 rng(11);
  constexpr int64_t n = 384, k = 512;
  const Fp8Case w = make_weights(rng, n, k);
  DeviceBuffer d_w = backend->upload(w.packed);
  for (const int64_t m : {9, 64, 333}) {
    std::vector<float> x = random_values(rng, m * k, -2.0f, 2.0f);
    for (int64_t i = 0; i < k; ++i) x[i] = 0.0f;  // a zero row: scale 1, codes 0
    DeviceBuffer d_x = to_device_bf16(*backend, x, {m, k});
    const std::vector<double> ref = reference(fp8_rows(x, m, k), w.dequantized, m, n, k);

    DeviceBuffer y32 = backend->allocate(DType::F32, {m, n});
    backend->matmul(d_x.view(), d_w.view(), {}, y32.view(), false);
    // The e4m3 products are exact; what remains is the accumulation's rounding. Hopper's FP8 MMA
    // keeps about 14 mantissa bits (DeepSeek-V3's report), and cuBLASLt (fast accumulation off)
    // promotes its partial sums to fp32 every few k steps: about 1e-4 of the norm at worst.
    EXPECT_LE(relative_error(download<float>(*backend, y32), ref), kFp8Accumulation) << "f32 out, m " << m;

    DeviceBuffer y16 = backend->allocate(DType::BF16, {m, n});
    backend->matmul(d_x.view(), d_w.view(), {}, y16.view(), false);
    EXPECT_LE(relative_error(download<uint16_t>(*backend, y16), ref), kOneRounding) << "bf16 out, m " << m;

    // accumulate (the residual add: y += x w^T) and a bias, into f32
    std::vector<float> bias = random_values(rng, n), start = random_values(rng, m * n);
    DeviceBuffer d_bias = backend->allocate(DType::F32, {n}), d_y = backend->allocate(DType::F32, {m, n});
    backend->copy_to_device(bias.data(), d_bias.view());
    backend->copy_to_device(start.data(), d_y.view());
    backend->matmul(d_x.view(), d_w.view(), d_bias.view(), d_y.view(), true);
    std::vector<double> want = ref;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) want[r * n + c] += double{start[r * n + c]} + bias[c];
    EXPECT_LE(relative_error(download<float>(*backend, d_y), want), kFp8Accumulation) << "accumulate + bias, m " << m;
  }
}

TEST(CudaFp8Gemm, DecodeSizedProductsStayWeightOnly) {
  SF_REQUIRE_GPU();
  if (!have_hopper()) GTEST_SKIP() << "W8A8 needs a Hopper GPU";
  auto w8a8 = make_test_cuda_backend(), weight_only = make_test_cuda_backend();
  ASSERT_TRUE(w8a8->set_fp8_activations(true));
  std::mt19937_64 rng(5);
  constexpr int64_t n = 256, k = 256;
  const Fp8Case w = make_weights(rng, n, k);
  DeviceBuffer w_a = w8a8->upload(w.packed), w_b = weight_only->upload(w.packed);
  for (const int64_t m : {1, 8, 16}) {
    std::vector<float> x = random_values(rng, m * k);
    std::vector<float> x_copy = x;
    DeviceBuffer x_a = to_device_bf16(*w8a8, x, {m, k}), x_b = to_device_bf16(*weight_only, x_copy, {m, k});
    DeviceBuffer y_a = w8a8->allocate(DType::F32, {m, n}), y_b = weight_only->allocate(DType::F32, {m, n});
    w8a8->matmul(x_a.view(), w_a.view(), {}, y_a.view(), false);
    weight_only->matmul(x_b.view(), w_b.view(), {}, y_b.view(), false);
    const std::vector<float> a = download<float>(*w8a8, y_a), b = download<float>(*weight_only, y_b);
    if (m <= 8) {
      EXPECT_EQ(a, b) << "m " << m << ": decode-sized products keep bf16 activations";
    } else {
      // Above 8 rows the activations are e4m3: close to weight-only, but not equal.
      EXPECT_NE(a, b) << "m " << m;
      EXPECT_LE(relative_l2(a.data(), b.data(), static_cast<int64_t>(a.size())), 0.08) << "m " << m;
    }
  }
}

}  // namespace
}  // namespace splitflow::test
