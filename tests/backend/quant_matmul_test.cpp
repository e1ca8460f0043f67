// The CPU backend's quantized weight kernels (backend/cpu/quant_matmul.h) against the reference
// codecs: every quantized type's matrix is made by quant::quantize, its values read back by
// quant::dequantize, and y = x W^T compared with a plain fp64 dot over those values.
//
// Tolerance: |got - want| <= 3e-5 * sum_p |x_p w_p| + 1e-6. The kernels accumulate in fp32 (8
// lanes, so about k / 8 sequential adds: <= 96 * 2^-24 = 6e-6 for k = 768) and may round a
// decoded weight differently from the reference (an FMA for d * q + m: 1 ulp of each weight,
// 6e-8 relative); 3e-5 leaves a factor of 4 over both. A wrong block layout gives errors of
// order 1 (relative to the magnitude), so nothing short of exact decoding passes.
#include "backend/backend.h"
#include "backend/backend_test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/q8_activations.h"
#include "backend/cpu/q8_gemm.h"
#include "backend/cpu/quant_matmul.h"
#include "core/error.h"
#include "quant/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

using namespace splitflow;
using namespace splitflow::test;

namespace {

constexpr double kTolerance = 3e-5;

// The backend with fp32 activations: these tests hold every type to an fp32 reference (the Q8
// activation path has its own tests below).
std::unique_ptr<Backend> make_exact_cpu_backend(int threads) {
  std::unique_ptr<Backend> backend = make_cpu_backend(threads);
  static_cast<cpu::CpuBackend&>(*backend).set_q8_activations(false);
  return backend;
}

class CpuQuantKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_exact_cpu_backend(2);
  std::mt19937_64 rng{4242};
};

// A [rows, cols] float matrix whose rows have different magnitudes and offsets (so scales and
// mins of every block differ).
Tensor random_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  Tensor out = Tensor::zeros(DType::F32, {rows, cols});
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = 0.05f + 0.1f * static_cast<float>(r % 7), offset = 0.02f * static_cast<float>(r % 3);
    for (int64_t c = 0; c < cols; ++c) out.as<float>()[r * cols + c] = offset + scale * unit(rng);
  }
  return out;
}

// The smallest multiple of the block >= 576 that is not a power of two (576, 640 or 768).
int64_t odd_width(DType type) {
  const int64_t block = dtype_block_elems(type);
  int64_t k = (576 + block - 1) / block * block;
  while ((k & (k - 1)) == 0) k += block;
  return k;
}

struct Reference {
  std::vector<float> y;
  std::vector<float> magnitude;
};

// y = x W^T (+ bias) (+ residual) in fp64 over the dequantized values.
Reference reference(const std::vector<float>& x, const Tensor& w_values, int64_t m, const std::vector<float>* bias,
                    const std::vector<float>* residual) {
  const int64_t n = w_values.dim(0), k = w_values.dim(1);
  const float* w = w_values.as<float>();
  Reference ref{std::vector<float>(m * n), std::vector<float>(m * n)};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias ? (*bias)[j] : 0.0, magnitude = bias ? std::abs((*bias)[j]) : 0.0;
      if (residual) sum += (*residual)[i * n + j], magnitude += std::abs((*residual)[i * n + j]);
      for (int64_t p = 0; p < k; ++p) {
        const double term = static_cast<double>(x[i * k + p]) * w[j * k + p];
        sum += term;
        magnitude += std::abs(term);
      }
      ref.y[i * n + j] = static_cast<float>(sum);
      ref.magnitude[i * n + j] = static_cast<float>(magnitude);
    }
  return ref;
}

void expect_matches(const std::vector<float>& got, const Reference& want, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want.y[i]), kTolerance * want.magnitude[i] + 1e-6)
        << what << " element " << i << ": got " << got[i] << ", want " << want.y[i];
}

// backend.matmul with a packed w; returns y.
std::vector<float> run_matmul(Backend& backend, const std::vector<float>& x, const Tensor& w, int64_t m,
                              const std::vector<float>* bias, const std::vector<float>* residual) {
  const int64_t n = w.dim(0), k = w.dim(1);
  DeviceBuffer dw = backend.upload(w);
  DeviceBuffer dx = to_device(backend, x, {m, k});
  DeviceBuffer db = bias ? to_device(backend, *bias, {n}) : DeviceBuffer();
  DeviceBuffer dy = to_device(backend, residual ? *residual : std::vector<float>(m * n, -3.0f), {m, n});
  backend.matmul(dx.view(), dw.view(), bias ? db.view() : DeviceTensor{}, dy.view(), residual != nullptr);
  return to_host(backend, dy.view());
}

TEST_F(CpuQuantKernels, BackendListsEveryQuantizedType) {
  const std::span<const DType> runs = backend->weight_dtypes();
  for (const quant::TypeInfo& info : quant::all_types())
    EXPECT_NE(std::find(runs.begin(), runs.end(), info.type), runs.end()) << dtype_name(info.type);
}

TEST_F(CpuQuantKernels, MatmulMatchesDequantizedReferenceForEveryType) {
  const int64_t n = 37;  // odd: tiles of 4, 2 and 1 rows of w, and threads' uneven shares
  for (const quant::TypeInfo& info : quant::all_types())
    for (int64_t k : {int64_t{256}, odd_width(info.type)}) {
      const Tensor w = quant::quantize(random_matrix(rng, n, k), info.type);
      const Tensor values = quant::dequantize(w);
      for (int64_t m : {1, 3, 64}) {
        const std::vector<float> x = random_floats(rng, m * k);
        const std::string what = fmt::format("{} m={} k={}", dtype_name(info.type), m, k);
        expect_matches(run_matmul(*backend, x, w, m, nullptr, nullptr), reference(x, values, m, nullptr, nullptr), what);
        if (testing::Test::HasFatalFailure()) return;
      }
    }
}

// Both paths on sizes the dispatch would not pick for them (GEMV at 64 rows, GEMM at 3).
TEST_F(CpuQuantKernels, GemvAndGemmPathsMatchOnAnyRowCount) {
  const int64_t n = 21, k = 768;
  for (DType type : {DType::Q4_1, DType::Q5_0, DType::Q6_K, DType::Q8_0, DType::Q3H_B64, DType::F8_CHANNEL, DType::I8_G64})
    for (int64_t m : {3, 64}) {
      const Tensor w = quant::quantize(random_matrix(rng, n, k), type);
      const Tensor values = quant::dequantize(w);
      const std::vector<float> x = random_floats(rng, m * k), bias = random_floats(rng, n);
      const Reference want = reference(x, values, m, &bias, nullptr);
      for (auto path : {cpu::matmul_gemv, cpu::matmul_gemm}) {
        std::vector<float> y(m * n, -5.0f);
        path(x.data(), m, k, w.data, type, n, bias.data(), y.data(), 2);
        expect_matches(y, want, fmt::format("{} m={} {}", dtype_name(type), m, path == cpu::matmul_gemv ? "gemv" : "gemm"));
      }
    }
}

TEST_F(CpuQuantKernels, MatmulAddsBiasAndAccumulates) {
  const int64_t n = 40, k = 512;
  for (DType type : {DType::Q4_0, DType::Q4_K, DType::Q5_B64, DType::F8_G128})
    for (int64_t m : {1, 3, 64}) {
      const Tensor w = quant::quantize(random_matrix(rng, n, k), type);
      const Tensor values = quant::dequantize(w);
      const std::vector<float> x = random_floats(rng, m * k), bias = random_floats(rng, n),
                               residual = random_floats(rng, m * n);
      const std::string what = fmt::format("{} m={}", dtype_name(type), m);
      expect_matches(run_matmul(*backend, x, w, m, &bias, &residual), reference(x, values, m, &bias, &residual),
                     what + " bias+accumulate");
      expect_matches(run_matmul(*backend, x, w, m, nullptr, &residual), reference(x, values, m, nullptr, &residual),
                     what + " accumulate");
    }
}

// A fused QKV of a Q4_K_M GGUF: q/k rows Q5_0, v rows Q8_0; plus a plain f16 run.
TEST_F(CpuQuantKernels, MixedMatrixRunsWriteTheirOwnColumns) {
  const int64_t k = 576;
  const std::vector<std::pair<DType, int64_t>> parts = {{DType::Q5_0, 24}, {DType::Q8_0, 9}, {DType::F16, 5}};
  std::vector<Tensor> pieces;
  auto runs = std::make_shared<std::vector<RowRun>>();
  int64_t rows = 0;
  size_t bytes = 0;
  for (const auto& [type, count] : parts) {
    const Tensor floats = random_matrix(rng, count, k);
    pieces.push_back(is_quantized(type) ? quant::quantize(floats, type) : to_dtype(floats, type));
    runs->push_back({type, count});
    rows += count;
    bytes += pieces.back().nbytes();
  }
  Tensor mixed = Tensor::zeros(DType::U8, {static_cast<int64_t>(bytes)});
  mixed.dtype = DType::Mixed;
  mixed.shape = {rows, k};
  mixed.row_runs = runs;
  ASSERT_EQ(mixed.nbytes(), bytes);
  Tensor values = Tensor::zeros(DType::F32, {rows, k});
  size_t at = 0;
  int64_t row = 0;
  for (const Tensor& piece : pieces) {
    std::memcpy(static_cast<uint8_t*>(mixed.data) + at, piece.data, piece.nbytes());
    const Tensor piece_values = quant::dequantize(piece);
    std::memcpy(values.as<float>() + row * k, piece_values.data, piece_values.nbytes());
    at += piece.nbytes();
    row += piece.dim(0);
  }
  for (int64_t m : {1, 3, 64}) {
    const std::vector<float> x = random_floats(rng, m * k), bias = random_floats(rng, rows),
                             residual = random_floats(rng, m * rows);
    expect_matches(run_matmul(*backend, x, mixed, m, &bias, nullptr), reference(x, values, m, &bias, nullptr),
                   fmt::format("mixed m={}", m));
    expect_matches(run_matmul(*backend, x, mixed, m, nullptr, &residual), reference(x, values, m, nullptr, &residual),
                   fmt::format("mixed accumulate m={}", m));
  }
}

TEST_F(CpuQuantKernels, EmbedDequantizesTheLookedUpRows) {
  const int64_t vocab = 29, hidden = 256;
  const std::vector<int32_t> ids = {0, 28, 5, 5, 17};
  const int64_t tokens = static_cast<int64_t>(ids.size());
  for (const quant::TypeInfo& info : quant::all_types()) {
    const Tensor table = quant::quantize(random_matrix(rng, vocab, hidden), info.type);
    const Tensor values = quant::dequantize(table);
    DeviceBuffer d_table = backend->upload(table);
    DeviceBuffer d_ids = to_device(*backend, ids, {tokens});
    DeviceBuffer out = backend->allocate(DType::F32, {tokens, hidden});
    const float multiplier = 1.5f;
    backend->embed(d_table.view(), d_ids.view(), multiplier, DeviceTensor{}, DeviceTensor{}, out.view());
    const std::vector<float> got = to_host(*backend, out.view());
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < hidden; ++i) {
        const float want = values.as<float>()[ids[t] * hidden + i] * multiplier;
        ASSERT_NEAR(got[t * hidden + i], want, 1e-6f * (1.0f + std::abs(want)))
            << dtype_name(info.type) << " token " << t << " element " << i;
      }
  }
}

TEST_F(CpuQuantKernels, UploadSharesPackedStorage) {
  const Tensor w = quant::quantize(random_matrix(rng, 8, 64), DType::Q4_0);
  DeviceBuffer buffer = backend->upload(w);
  EXPECT_EQ(buffer.view().data, w.data);
  EXPECT_EQ(buffer.view().dtype, DType::Q4_0);
  EXPECT_EQ(buffer.view().nbytes(), w.nbytes());
}

// ---- Q8 activations (backend/cpu/q8_activations.h) -------------------------------------------
// The test's own Q8_0 quantization of x, written from the contract (not the kernel's code): per
// 32-element block d = max |x| / 127 and q = x * (1 / d) rounded to nearest, ties to even, in fp32.
struct Q8Activations {
  std::vector<int8_t> q;
  std::vector<float> d;
};
Q8Activations quantize_q8(const std::vector<float>& x) {
  Q8Activations out{std::vector<int8_t>(x.size()), std::vector<float>(x.size() / 32)};
  for (size_t b = 0; b < out.d.size(); ++b) {
    float amax = 0.0f;
    for (size_t p = 0; p < 32; ++p) amax = std::max(amax, std::abs(x[b * 32 + p]));
    const float d = amax / 127.0f, inverse = d == 0.0f ? 0.0f : 1.0f / d;
    out.d[b] = d;
    for (size_t p = 0; p < 32; ++p) {
      const float scaled = x[b * 32 + p] * inverse;
      float rounded = std::floor(scaled + 0.5f);
      if (rounded - scaled == 0.5f && std::fmod(rounded, 2.0f) != 0.0f) rounded -= 1.0f;  // a tie: to even
      out.q[b * 32 + p] = static_cast<int8_t>(rounded);
    }
  }
  return out;
}

constexpr DType kQ8ActivationTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                                        DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// A row length of an odd number of the type's blocks (the 32-element types' last block is alone).
int64_t odd_blocks(DType type) { return dtype_block_elems(type) == 256 ? 768 : 544; }

TEST(CpuQ8Activations, QuantizationFollowsTheContract) {
  std::mt19937_64 rng(7);
  std::vector<float> x = random_floats(rng, 32 * 9, -3.0f, 3.0f);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);     // an all-zero block: d = 0, codes 0
  for (int p = 0; p < 32; ++p) x[96 + p] = 0.5f * static_cast<float>(p - 16);  // ties at d = 16 / 127
  const Q8Activations want = quantize_q8(x);
  std::vector<int8_t> q(x.size());
  std::vector<float> d(x.size() / 32);
  cpu::quantize_q8_blocks(x.data(), static_cast<int64_t>(x.size()), q.data(), d.data());
  EXPECT_EQ(q, want.q);
  EXPECT_EQ(d, want.d);
  for (size_t p = 0; p < x.size(); ++p)  // nearest: within half a step of x
    ASSERT_LE(std::abs(want.q[p] * want.d[p / 32] - x[p]), 0.5f * want.d[p / 32] * (1 + 1e-5f)) << p;
}

// Checks y (+)= x' W^T for x' the Q8 quantization of x: against an fp64 sum over the dequantized
// weights and q * d, to fp32 accuracy (kTolerance); and against x itself within the quantization's
// bound sum_b d_b / 2 * sum_{p in b} |w_p|. y0: y before the call when it accumulated.
void expect_q8_product(const std::vector<float>& y, const std::vector<float>& x, const Tensor& w, int64_t m,
                       const std::vector<float>* y0, const std::string& what) {
  const Tensor values = quant::dequantize(w);
  const float* wv = values.as<float>();
  const int64_t n = w.shape[0], k = w.shape[1];
  const Q8Activations xq = quantize_q8(x);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double exact = y0 ? (*y0)[i * n + j] : 0.0, quantized = exact, magnitude = std::abs(exact), bound = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double wp = wv[j * k + p], xp = xq.q[i * k + p] * static_cast<double>(xq.d[(i * k + p) / 32]);
        quantized += wp * xp;
        exact += wp * x[i * k + p];
        magnitude += std::abs(wp * xp);
        bound += 0.5 * xq.d[(i * k + p) / 32] * std::abs(wp);
      }
      const float got = y[i * n + j];
      ASSERT_LE(std::abs(got - quantized), kTolerance * magnitude + 1e-6)
          << what << " y[" << i << "][" << j << "]: got " << got << ", want " << quantized;
      ASSERT_LE(std::abs(got - exact), bound * (1 + 1e-3) + kTolerance * magnitude + 1e-6)
          << what << " y[" << i << "][" << j << "]";
    }
}

TEST(CpuQ8Activations, GemvIsTheDotProductOverQuantizedX) {
  std::mt19937_64 rng(99);
  const int64_t n = 37;  // tiles of 4, 2 and 1 rows, uneven thread shares
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  ASSERT_TRUE(static_cast<cpu::CpuBackend&>(*backend).q8_activations()) << "on by default";
  for (DType type : kQ8ActivationTypes) {
    if (!cpu::q8_gemv_supported(type)) GTEST_SKIP() << "no AVX-512 VNNI on this host: the float path runs";
    for (int64_t k : {odd_blocks(type), int64_t{2048}}) {
      const Tensor w = quant::quantize(random_matrix(rng, n, k), type);
      for (int64_t m : {1, 2, 3, 4, 5, 9})
        for (bool accumulate : {false, true}) {
          const std::vector<float> x = random_floats(rng, m * k, -2.0f, 2.0f);
          const std::vector<float> y0 = random_floats(rng, m * n);
          std::vector<float> y = accumulate ? y0 : std::vector<float>(m * n, -7.0f);
          cpu::quant_gemv(x.data(), m, k, w.data, type, n, y.data(), n, accumulate, true, 2);
          const std::string what = fmt::format("{} k={} m={} acc={}", dtype_name(type), k, m, accumulate);
          expect_q8_product(y, x, w, m, accumulate ? &y0 : nullptr, what);
          // The backend's decode path (m < 10; for Q4_0 and Q8_0 over its repacked copy) keeps the contract.
          if (m <= 5) {
            const std::vector<float> bias = random_floats(rng, n);
            std::vector<float> before = accumulate ? y0 : std::vector<float>(m * n, 0.0f);
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) before[i * n + j] += bias[j];
            expect_q8_product(run_matmul(*backend, x, w, m, &bias, accumulate ? &y0 : nullptr), x, w, m, &before,
                              what + " (backend.matmul with a bias)");
          }
        }
    }
  }
}

// The prefill GEMM (m >= kGemmMinRows) over the same x': the same contract, for row counts that fill
// 16-row tiles partly, exactly and over several kernel calls and work items, and columns that
// leave a single-column tail; the backend's matmul takes it.
TEST(CpuQ8Activations, GemmIsTheDotProductOverQuantizedX) {
  std::mt19937_64 rng(123);
  const int64_t n = 35;  // 16-column chunks and an odd last column
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  for (DType type : kQ8ActivationTypes) {
    if (!cpu::q8_gemm_supported(type) || !cpu::q8_gemv_supported(type))
      GTEST_SKIP() << "no AVX-512 VNNI on this host: the float path runs";
    const int64_t k = odd_blocks(type);
    const Tensor w = quant::quantize(random_matrix(rng, n, k), type);
    for (int64_t m : {10, 16, 37, 64, 300})
      for (bool accumulate : {false, true}) {
        const std::vector<float> x = random_floats(rng, m * k, -2.0f, 2.0f);
        const std::vector<float> y0 = random_floats(rng, m * n);
        std::vector<float> y = accumulate ? y0 : std::vector<float>(m * n, -7.0f);
        cpu::q8_gemm(x.data(), m, k, w.data, type, n, y.data(), n, accumulate, 2);
        const std::string what = fmt::format("{} k={} m={} acc={}", dtype_name(type), k, m, accumulate);
        expect_q8_product(y, x, w, m, accumulate ? &y0 : nullptr, what);
        // The backend's matmul: for these types its repacked copy's GEMM (16-row groups, then the
        // last 3 rows as stored), under the same contract.
        expect_q8_product(run_matmul(*backend, x, w, m, nullptr, accumulate ? &y0 : nullptr), x, w, m,
                          accumulate ? &y0 : nullptr, what + " (backend.matmul)");
      }
  }
}

// Without Q8 activations the same types stay on the fp32 path, to fp32 accuracy.
TEST(CpuQ8Activations, TurnedOffTheGemvIsExact) {
  std::mt19937_64 rng(5);
  const int64_t n = 19;
  for (DType type : kQ8ActivationTypes) {
    const int64_t k = odd_blocks(type);
    const Tensor w = quant::quantize(random_matrix(rng, n, k), type);
    const std::vector<float> x = random_floats(rng, k);
    std::vector<float> y(n);
    cpu::quant_gemv(x.data(), 1, k, w.data, type, n, y.data(), n, false, false, 2);
    expect_matches(y, reference(x, quant::dequantize(w), 1, nullptr, nullptr), std::string(dtype_name(type)));
  }
}

}  // namespace

namespace {

// Not a check: the decode GEMV's speed on a TinyLlama MLP shape (n 5632, k 2048, one x row, the
// backend's threads) for a few types against bf16, printed for the record.
TEST_F(CpuQuantKernels, DecodeGemvSpeedIsPrinted) {
  const int64_t n = 5632, k = 2048;
  const Tensor floats = random_matrix(rng, n, k);
  const std::vector<float> x = random_floats(rng, k);
  std::vector<float> y(n);
  for (DType type : {DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q4_B32, DType::Q3H_B64, DType::F8_CHANNEL,
                     DType::I8_G32}) {
    const Tensor w = is_quantized(type) ? quant::quantize(floats, type) : to_dtype(floats, type);
    const int reps = 20;
    cpu::matmul_gemv(x.data(), 1, k, w.data, type, n, nullptr, y.data(), 2);
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) cpu::matmul_gemv(x.data(), 1, k, w.data, type, n, nullptr, y.data(), 2);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
    std::printf("gemv %-10s %7.3f ms  %6.2f GB/s of weights  %6.2f GMAC/s\n", std::string(dtype_name(type)).c_str(),
                seconds * 1e3, w.nbytes() / seconds / 1e9, n * k / seconds / 1e9);
  }
}

// Not a check: the prefill GEMM's speed on a TinyLlama MLP shape (64 rows, n 5632, k 2048, the
// backend's threads) for the Q8-activation types, integer kernel against the fp32 GEMM.
TEST_F(CpuQuantKernels, PrefillGemmSpeedIsPrinted) {
  const int64_t m = 64, n = 5632, k = 2048;
  const Tensor floats = random_matrix(rng, n, k);
  const std::vector<float> x = random_floats(rng, m * k);
  std::vector<float> y(m * n);
  for (DType type : kQ8ActivationTypes) {
    if (!cpu::q8_gemm_supported(type)) GTEST_SKIP() << "no AVX-512 VNNI on this host";
    const Tensor w = quant::quantize(floats, type);
    for (bool q8 : {false, true}) {
      const auto run = [&] {
        cpu::matmul_strided(x.data(), m, k, w.data, type, n, y.data(), n, cpu::MatmulMode{false, q8}, 2);
      };
      run();
      const int reps = 5;
      const auto start = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) run();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
      std::printf("gemm %-6s %-5s %7.3f ms  %7.1f GFLOP/s\n", std::string(dtype_name(type)).c_str(), q8 ? "q8" : "fp32",
                  seconds * 1e3, 2.0 * m * n * k / seconds / 1e9);
    }
  }
}

}  // namespace
