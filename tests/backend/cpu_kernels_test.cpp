// Each CPU kernel against a naive fp64 reference written here, on random inputs with odd sizes and
// every matrix dtype. Kernels are reached through the Backend interface (as the runtime does).
#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/stream_read.h"
#include "backend/backend_test_util.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

using namespace splitflow;
using namespace splitflow::test;

namespace {

class CpuKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::mt19937_64 rng{1234};
};

const DType kMatrixDtypes[] = {DType::F32, DType::F16, DType::BF16};

// |got - want| <= tol * magnitude, magnitude the sum of |terms| that formed `want` (so fp32
// accumulation error is allowed for, and nothing more).
void expect_close(double got, double want, double magnitude, double tol, const std::string& what) {
  ASSERT_LE(std::abs(got - want), tol * magnitude + 1e-7) << what << ": got " << got << ", want " << want;
}

// ---- post norms, QK-norm, soft-capping --------------------------------------------------------

// rmsnorm(x[0, n)) * (offset + w) in fp64.
std::vector<double> rms_reference(const float* x, int64_t n, const float* w, double offset, double eps) {
  double squares = 0;
  for (int64_t i = 0; i < n; ++i) squares += double{x[i]} * x[i];
  const double inv = 1.0 / std::sqrt(squares / n + eps);
  std::vector<double> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * (offset + w[i]);
  return y;
}

TEST_F(CpuKernels, NormAddAddsTheNormedRow) {
  const int64_t tokens = 3, hidden = 37;
  const std::vector<float> x = random_floats(rng, tokens * hidden, -3, 3), w = random_floats(rng, hidden);
  const std::vector<float> residual = random_floats(rng, tokens * hidden);
  DeviceBuffer dx = to_device(*backend, x, {tokens, hidden}), dw = to_device(*backend, w, {hidden});
  DeviceBuffer dr = to_device(*backend, residual, {tokens, hidden});
  backend->norm_add(dx.view(), dw.view(), {NormType::RMSNorm, 1e-6f, 1.0f}, dr.view());
  const std::vector<float> got = to_host(*backend, dr.view());
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<double> normed = rms_reference(x.data() + t * hidden, hidden, w.data(), 1.0, 1e-6);
    for (int64_t i = 0; i < hidden; ++i)
      expect_close(got[t * hidden + i], residual[t * hidden + i] + normed[i], 4.0, 1e-6, "norm_add");
  }
}

TEST_F(CpuKernels, QkNormNormalizesQAndKHeadsOnly) {
  const int heads = 4, kv_heads = 2, head_dim = 12;
  const int64_t tokens = 5, width = (heads + 2 * kv_heads) * head_dim;
  const std::vector<float> qkv = random_floats(rng, tokens * width, -2, 2);
  const std::vector<float> q_w = random_floats(rng, head_dim, 0.5f, 1.5f), k_w = random_floats(rng, head_dim, 0.5f, 1.5f);
  DeviceBuffer d = to_device(*backend, qkv, {tokens, width});
  DeviceBuffer dq = to_device(*backend, q_w, {head_dim}), dk = to_device(*backend, k_w, {head_dim});
  backend->qk_norm(d.view(), dq.view(), dk.view(), {NormType::RMSNorm, 1e-6f, 0.0f},
                   AttentionParams{heads, kv_heads, head_dim, 16, 1.0f, 0});
  const std::vector<float> got = to_host(*backend, d.view());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads + kv_heads; ++h) {
      const int64_t at = t * width + int64_t{h} * head_dim;
      const std::vector<double> want =
          rms_reference(qkv.data() + at, head_dim, (h < heads ? q_w : k_w).data(), 0.0, 1e-6);
      for (int d = 0; d < head_dim; ++d) expect_close(got[at + d], want[d], 3.0, 1e-6, "qk_norm");
    }
    for (int64_t i = int64_t{heads + kv_heads} * head_dim; i < width; ++i)
      ASSERT_EQ(got[t * width + i], qkv[t * width + i]) << "v element " << i;
  }
}

TEST_F(CpuKernels, SoftcapIsCapTimesTanh) {
  const std::vector<float> x = random_floats(rng, 2 * 33, -90, 90);
  DeviceBuffer d = to_device(*backend, x, {2, 33});
  backend->softcap(d.view(), 30.0f);
  const std::vector<float> got = to_host(*backend, d.view());
  for (size_t i = 0; i < x.size(); ++i) expect_close(got[i], 30.0 * std::tanh(x[i] / 30.0), 30.0, 1e-6, "softcap");
}

// ---- matmul ----------------------------------------------------------------------------------

using MatmulFn = void (*)(const float*, int64_t, int64_t, const void*, DType, int64_t, const float*, float*, int);

// accumulate (backend path only): y starts as a random residual that the product adds to.
void check_matmul(Backend& backend, std::mt19937_64& rng, int64_t m, int64_t k, int64_t n, DType dtype, bool with_bias,
                  MatmulFn path, bool accumulate = false) {
  const std::vector<float> x = random_floats(rng, m * k);
  StoredMatrix w = store_matrix(backend, random_floats(rng, n * k), {n, k}, dtype);
  const std::vector<float> bias = random_floats(rng, n);
  const std::vector<float> residual = accumulate ? random_floats(rng, m * n) : std::vector<float>(m * n, 0.0f);
  std::vector<float> y(m * n, -7.0f);
  if (path != nullptr) {
    path(x.data(), m, k, w.buffer.view().data, dtype, n, with_bias ? bias.data() : nullptr, y.data(), 2);
  } else {
    DeviceBuffer dx = to_device(backend, x, {m, k});
    DeviceBuffer db = to_device(backend, bias, {n});
    DeviceBuffer dy = to_device(backend, accumulate ? residual : y, {m, n});
    backend.matmul(dx.view(), w.buffer.view(), with_bias ? db.view() : DeviceTensor{}, dy.view(), accumulate);
    y = to_host(backend, dy.view());
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = (with_bias ? bias[j] : 0.0) + residual[i * n + j];
      double magnitude = (with_bias ? std::abs(bias[j]) : 0.0) + std::abs(residual[i * n + j]);
      for (int64_t p = 0; p < k; ++p) {
        want += static_cast<double>(x[i * k + p]) * w.values[j * k + p];
        magnitude += std::abs(static_cast<double>(x[i * k + p]) * w.values[j * k + p]);
      }
      expect_close(y[i * n + j], want, magnitude, 2e-6,
                   fmt::format("y[{}, {}] m={} k={} n={} {}", i, j, m, k, n, dtype_name(dtype)));
    }
}

TEST_F(CpuKernels, MatmulMatchesReferenceForEveryDtypeAndOddShapes) {
  for (DType dtype : kMatrixDtypes)
    for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 13, 33})
      for (int64_t k : {1, 7, 17, 64, 259})
        for (int64_t n : {1, 5, 19, 40, 131}) check_matmul(*backend, rng, m, k, n, dtype, (m + k + n) % 2 == 0, nullptr);
}

// accumulate adds the product to y (the residual add of an output projection), both paths.
TEST_F(CpuKernels, MatmulAccumulatesIntoOutput) {
  for (int64_t m : {1, 4, 12, 40}) {
    check_matmul(*backend, rng, m, 70, 33, DType::F16, true, nullptr, true);
    check_matmul(*backend, rng, m, 64, 48, DType::BF16, false, nullptr, true);
  }
}

// Both CPU paths on every m, so neither is only exercised on the sizes the dispatch picks.
TEST_F(CpuKernels, GemvAndGemmPathsMatchReference) {
  for (DType dtype : kMatrixDtypes)
    for (int64_t m : {1, 3, 6, 7, 12, 20})
      for (auto [k, n] : {std::pair<int64_t, int64_t>{300, 37}, {513, 129}, {31, 260}}) {
        check_matmul(*backend, rng, m, k, n, dtype, true, cpu::matmul_gemv);
        check_matmul(*backend, rng, m, k, n, dtype, false, cpu::matmul_gemm);
      }
  // Zero depth: y is the bias (or zero) on both paths.
  check_matmul(*backend, rng, 12, 0, 7, DType::F16, true, cpu::matmul_gemv);
  check_matmul(*backend, rng, 12, 0, 7, DType::F16, true, cpu::matmul_gemm);
}

TEST_F(CpuKernels, MatmulRejectsMismatchedShapes) {
  DeviceBuffer x = backend->allocate(DType::F32, {2, 8});
  DeviceBuffer w = backend->allocate(DType::F16, {4, 9});
  DeviceBuffer y = backend->allocate(DType::F32, {2, 4});
  EXPECT_THROW(backend->matmul(x.view(), w.view(), {}, y.view(), false), Error);
  DeviceBuffer w_ok = backend->allocate(DType::F16, {4, 8});
  DeviceBuffer y_bad = backend->allocate(DType::F32, {2, 5});
  EXPECT_THROW(backend->matmul(x.view(), w_ok.view(), {}, y_bad.view(), true), Error);
  DeviceBuffer w_int = backend->allocate(DType::I32, {4, 8});
  EXPECT_THROW(backend->matmul(x.view(), w_int.view(), {}, y.view(), false), Error);
}

// ---- embedding -------------------------------------------------------------------------------

TEST_F(CpuKernels, EmbedGathersRowsScalesAndAddsPositions) {
  const int64_t vocab = 37, hidden = 19, max_positions = 11;
  const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 2, 30};
  const std::vector<int32_t> positions = {3, 0, 10, 4, 4, 7, 1};
  const int64_t tokens = ids.size();
  for (DType dtype : kMatrixDtypes)
    for (bool with_positions : {false, true}) {
      StoredMatrix table = store_matrix(*backend, random_floats(rng, vocab * hidden), {vocab, hidden}, dtype);
      StoredMatrix pos = store_matrix(*backend, random_floats(rng, max_positions * hidden), {max_positions, hidden}, dtype);
      DeviceBuffer d_ids = to_device(*backend, ids, {tokens});
      DeviceBuffer d_pos = to_device(*backend, positions, {tokens});
      DeviceBuffer out = backend->allocate(DType::F32, {tokens, hidden});
      const float multiplier = 1.75f;
      backend->embed(table.buffer.view(), d_ids.view(), multiplier, with_positions ? pos.buffer.view() : DeviceTensor{},
                     d_pos.view(), out.view());
      const std::vector<float> got = to_host(*backend, out.view());
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < hidden; ++i) {
          double want = table.values[ids[t] * hidden + i] * multiplier;
          if (with_positions) want += pos.values[positions[t] * hidden + i];
          expect_close(got[t * hidden + i], want, 4.0, 1e-7, fmt::format("embed t={} i={}", t, i));
        }
    }
}

TEST_F(CpuKernels, EmbedRejectsTokenOutsideVocabulary) {
  DeviceBuffer table = backend->allocate(DType::F32, {10, 4});
  DeviceBuffer ids = to_device(*backend, std::vector<int32_t>{3, 10}, {2});
  DeviceBuffer out = backend->allocate(DType::F32, {2, 4});
  EXPECT_THROW(backend->embed(table.view(), ids.view(), 1.0f, {}, {}, out.view()), Error);
}

TEST_F(CpuKernels, EmbedRejectsPositionOutsideTable) {
  DeviceBuffer table = backend->allocate(DType::F16, {10, 4});
  DeviceBuffer pos = backend->allocate(DType::F16, {6, 4});
  DeviceBuffer ids = to_device(*backend, std::vector<int32_t>{3, 4}, {2});
  DeviceBuffer positions = to_device(*backend, std::vector<int32_t>{5, 6}, {2});
  DeviceBuffer out = backend->allocate(DType::F32, {2, 4});
  EXPECT_THROW(backend->embed(table.view(), ids.view(), 1.0f, pos.view(), positions.view(), out.view()), Error);
}

// ---- norms -----------------------------------------------------------------------------------

TEST_F(CpuKernels, AddNormMatchesReference) {
  const int64_t tokens = 5, hidden = 67;
  for (NormType type : {NormType::RMSNorm, NormType::LayerNorm})
    for (bool with_delta : {false, true})
      for (float offset : {0.0f, 1.0f}) {
        const bool with_bias = type == NormType::LayerNorm;
        std::vector<float> residual = random_floats(rng, tokens * hidden, -2.0f, 3.0f);
        const std::vector<float> delta = random_floats(rng, tokens * hidden);
        const std::vector<float> weight = random_floats(rng, hidden, 0.5f, 1.5f);
        const std::vector<float> bias = random_floats(rng, hidden);
        DeviceBuffer d_res = to_device(*backend, residual, {tokens, hidden});
        DeviceBuffer d_delta = to_device(*backend, delta, {tokens, hidden});
        DeviceBuffer d_w = to_device(*backend, weight, {hidden});
        DeviceBuffer d_b = to_device(*backend, bias, {hidden});
        DeviceBuffer out = backend->allocate(DType::F32, {tokens, hidden});
        const NormParams params{type, 1e-5f, offset};
        backend->add_norm(d_res.view(), with_delta ? d_delta.view() : DeviceTensor{}, d_w.view(),
                          with_bias ? d_b.view() : DeviceTensor{}, params, out.view());
        const std::vector<float> got = to_host(*backend, out.view());
        const std::vector<float> got_residual = to_host(*backend, d_res.view());
        for (int64_t t = 0; t < tokens; ++t) {
          std::vector<double> x(hidden);
          for (int64_t i = 0; i < hidden; ++i)
            x[i] = static_cast<double>(residual[t * hidden + i]) + (with_delta ? delta[t * hidden + i] : 0.0);
          double mean = 0.0, var = 0.0;
          if (type == NormType::LayerNorm) mean = std::accumulate(x.begin(), x.end(), 0.0) / hidden;
          for (double v : x) var += (v - mean) * (v - mean);
          const double inv = 1.0 / std::sqrt(var / hidden + 1e-5);
          for (int64_t i = 0; i < hidden; ++i) {
            expect_close(got_residual[t * hidden + i], x[i], 1.0, 1e-7, "residual sum");
            const double want = (x[i] - mean) * inv * (offset + weight[i]) + (with_bias ? bias[i] : 0.0);
            expect_close(got[t * hidden + i], want, 1.0 + std::abs(want), 2e-6,
                         fmt::format("norm t={} i={} type={} delta={} offset={}", t, i, static_cast<int>(type),
                                     with_delta, offset));
          }
        }
      }
}

// ---- RoPE ------------------------------------------------------------------------------------

TEST_F(CpuKernels, RopeRotatesQAndKHeadsByTableRows) {
  for (RopeStyle style : {RopeStyle::Half, RopeStyle::Interleaved})
    for (auto [head_dim, rotary_dim] : {std::pair{16, 16}, {24, 8}, {10, 6}}) {
      const RopeParams params{6, 2, head_dim, rotary_dim, style};
      const int64_t tokens = 4, width = (6 + 2 * 2) * int64_t{head_dim}, half = rotary_dim / 2, table_rows = 9;
      const std::vector<float> qkv = random_floats(rng, tokens * width);
      const std::vector<float> table = random_floats(rng, table_rows * 2 * half);
      const std::vector<int32_t> rows = {8, 0, 3, 3};
      DeviceBuffer d_qkv = to_device(*backend, qkv, {tokens, width});
      DeviceBuffer d_table = to_device(*backend, table, {table_rows, 2, half});
      DeviceBuffer d_rows = to_device(*backend, rows, {tokens});
      backend->rope(d_qkv.view(), d_table.view(), d_rows.view(), params);
      const std::vector<float> got = to_host(*backend, d_qkv.view());
      for (int64_t t = 0; t < tokens; ++t)
        for (int head = 0; head < 10; ++head)
          for (int d = 0; d < head_dim; ++d) {
            const int64_t base = t * width + int64_t{head} * head_dim;
            double want = qkv[base + d];
            if (head < 8 && d < rotary_dim) {  // q and k heads rotate, v heads and dims past rotary_dim do not
              const int64_t pair = style == RopeStyle::Half ? d % half : d / 2;
              const double c = table[rows[t] * 2 * half + pair], s = table[rows[t] * 2 * half + half + pair];
              const bool first = style == RopeStyle::Half ? d < half : d % 2 == 0;
              const int64_t partner = style == RopeStyle::Half ? (first ? d + half : d - half) : (first ? d + 1 : d - 1);
              want = first ? qkv[base + d] * c - qkv[base + partner] * s : qkv[base + d] * c + qkv[base + partner] * s;
            }
            expect_close(got[base + d], want, 2.0, 1e-7, fmt::format("rope t={} head={} d={}", t, head, d));
          }
    }
}

TEST_F(CpuKernels, RopeRejectsRowOutsideTableAndOddRotaryDim) {
  DeviceBuffer qkv = backend->allocate(DType::F32, {1, 3 * 8});
  DeviceBuffer table = backend->allocate(DType::F32, {4, 2, 4});
  DeviceBuffer rows = to_device(*backend, std::vector<int32_t>{4}, {1});
  EXPECT_THROW(backend->rope(qkv.view(), table.view(), rows.view(), {1, 1, 8, 8, RopeStyle::Half}), Error);
  DeviceBuffer ok_rows = to_device(*backend, std::vector<int32_t>{3}, {1});
  EXPECT_THROW(backend->rope(qkv.view(), table.view(), ok_rows.view(), {1, 1, 8, 7, RopeStyle::Half}), Error);
  EXPECT_NO_THROW(backend->rope(qkv.view(), table.view(), ok_rows.view(), {1, 1, 8, 8, RopeStyle::Half}));
}

TEST_F(CpuKernels, AddNormRejectsMismatchedShapes) {
  DeviceBuffer x = backend->allocate(DType::F32, {3, 8});
  DeviceBuffer w = backend->allocate(DType::F32, {7});
  DeviceBuffer out = backend->allocate(DType::F32, {3, 8});
  EXPECT_THROW(backend->add_norm(x.view(), {}, w.view(), {}, {}, out.view()), Error);
  DeviceBuffer w_ok = backend->allocate(DType::F32, {8});
  DeviceBuffer delta = backend->allocate(DType::F32, {2, 8});
  EXPECT_THROW(backend->add_norm(x.view(), delta.view(), w_ok.view(), {}, {}, out.view()), Error);
}

// ---- activations -----------------------------------------------------------------------------

double reference_activation(double x, Activation act) {
  switch (act) {
    case Activation::SiLU: return x / (1.0 + std::exp(-x));
    case Activation::GELU: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::GELUTanh: return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::ReLU: return x > 0 ? x : 0.0;
  }
  return 0.0;
}

TEST_F(CpuKernels, ActivationsGatedAndPlain) {
  const int64_t tokens = 3, inner = 1029;  // several 512-column chunks plus a ragged tail
  for (Activation act : {Activation::SiLU, Activation::GELU, Activation::GELUTanh, Activation::ReLU})
    for (bool gated : {false, true}) {
      const int64_t width = gated ? 2 * inner : inner;
      const std::vector<float> x = random_floats(rng, tokens * width, -12.0f, 12.0f);
      DeviceBuffer d_x = to_device(*backend, x, {tokens, width});
      DeviceBuffer out = backend->allocate(DType::F32, {tokens, inner});
      backend->activation(d_x.view(), act, gated, out.view());
      const std::vector<float> got = to_host(*backend, out.view());
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t j = 0; j < inner; ++j) {
          double want = reference_activation(x[t * width + j], act);
          if (gated) want *= x[t * width + inner + j];
          expect_close(got[t * inner + j], want, std::abs(want) + 1e-6, 4e-6,
                       fmt::format("act {} gated={} x={}", static_cast<int>(act), gated, x[t * width + j]));
        }
    }
}

// ---- gather, write_kv ------------------------------------------------------------------------

TEST_F(CpuKernels, GatherRows) {
  const std::vector<float> x = random_floats(rng, 7 * 13);
  DeviceBuffer da = to_device(*backend, x, {7, 13});
  const std::vector<int32_t> rows = {6, 0, 6, 2};
  DeviceBuffer d_rows = to_device(*backend, rows, {4});
  DeviceBuffer out = backend->allocate(DType::F32, {4, 13});
  backend->gather_rows(da.view(), d_rows.view(), out.view());
  const std::vector<float> got = to_host(*backend, out.view());
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 13; ++c) ASSERT_EQ(got[i * 13 + c], x[rows[i] * 13 + c]);
  const std::vector<int32_t> bad_rows = {7};
  DeviceBuffer d_bad = to_device(*backend, bad_rows, {1});
  DeviceBuffer one = backend->allocate(DType::F32, {1, 13});
  EXPECT_THROW(backend->gather_rows(da.view(), d_bad.view(), one.view()), Error);
}

TEST_F(CpuKernels, ScatterRowsAndGatherOfAnyDtype) {
  // f16 rows (the KV cache's dtypes, not only the f32 activations) out of and back into a table.
  std::vector<uint16_t> table(6 * 5), packed = {1, 2, 3, 4, 5, 11, 12, 13, 14, 15};
  DeviceTensor d_table{table.data(), DType::F16, {6, 5}}, d_packed{packed.data(), DType::F16, {2, 5}};
  const std::vector<int32_t> rows = {4, 1};
  DeviceBuffer d_rows = to_device(*backend, rows, {2});
  backend->scatter_rows(d_packed, d_rows.view(), d_table);
  for (int c = 0; c < 5; ++c) {
    EXPECT_EQ(table[4 * 5 + c], packed[c]);
    EXPECT_EQ(table[1 * 5 + c], packed[5 + c]);
    EXPECT_EQ(table[0 * 5 + c], 0);
  }
  std::vector<uint16_t> back(10);
  backend->gather_rows(d_table, d_rows.view(), DeviceTensor{back.data(), DType::F16, {2, 5}});
  EXPECT_EQ(back, packed);
  const std::vector<int32_t> outside = {6, 0};
  DeviceBuffer d_outside = to_device(*backend, outside, {2});
  EXPECT_THROW(backend->scatter_rows(d_packed, d_outside.view(), d_table), Error);
  EXPECT_THROW(backend->gather_rows(d_table, d_rows.view(), DeviceTensor{back.data(), DType::BF16, {2, 5}}), Error);
}

TEST_F(CpuKernels, PoolRowsTakesFirstLastOrMeanOfEachSpan) {
  const int64_t cols = 11;
  const std::vector<int32_t> offsets = {0, 1, 5, 12};  // spans of 1, 4 and 7 rows
  const std::vector<float> x = random_floats(rng, 12 * cols);
  DeviceBuffer d_x = to_device(*backend, x, {12, cols}), d_offsets = to_device(*backend, offsets, {4});
  for (const Pooling pooling : {Pooling::Cls, Pooling::Mean, Pooling::Last}) {
    DeviceBuffer out = backend->allocate(DType::F32, {3, cols});
    backend->pool_rows(d_x.view(), d_offsets.view(), pooling, out.view());
    const std::vector<float> got = to_host(*backend, out.view());
    for (int s = 0; s < 3; ++s)
      for (int64_t c = 0; c < cols; ++c) {
        double want = 0.0;
        if (pooling == Pooling::Cls) want = x[offsets[s] * cols + c];
        if (pooling == Pooling::Last) want = x[(offsets[s + 1] - 1) * cols + c];
        if (pooling == Pooling::Mean) {
          for (int32_t r = offsets[s]; r < offsets[s + 1]; ++r) want += x[r * cols + c];
          want /= offsets[s + 1] - offsets[s];
        }
        expect_close(got[s * cols + c], want, std::abs(want) + 1e-6, 1e-6, fmt::format("span {} col {}", s, c));
      }
  }
  const std::vector<int32_t> empty_span = {0, 3, 3};  // span 1 has no rows
  DeviceBuffer d_empty = to_device(*backend, empty_span, {3});
  DeviceBuffer two = backend->allocate(DType::F32, {2, cols});
  EXPECT_THROW(backend->pool_rows(d_x.view(), d_empty.view(), Pooling::Mean, two.view()), Error);
}

TEST_F(CpuKernels, WriteKvStoresKAndVHeadsAtSlots) {
  const AttentionParams params{4, 2, 3, 5, 1.0f, 0};
  const int64_t tokens = 3, width = (4 + 2 * 2) * 3, kv_dim = 6, blocks = 4;
  const std::vector<float> qkv = random_floats(rng, tokens * width);
  const std::vector<int32_t> slots = {17, -1, 2};
  DeviceBuffer d_qkv = to_device(*backend, qkv, {tokens, width});
  DeviceBuffer d_slots = to_device(*backend, slots, {tokens});
  DeviceBuffer k = backend->allocate(DType::F32, {blocks, 5, 2, 3});
  DeviceBuffer v = backend->allocate(DType::F32, {blocks, 5, 2, 3});
  backend->write_kv(d_qkv.view(), d_slots.view(), params, k.view(), v.view());
  const std::vector<float> got_k = to_host(*backend, k.view()), got_v = to_host(*backend, v.view());
  for (int64_t slot = 0; slot < blocks * 5; ++slot)
    for (int64_t i = 0; i < kv_dim; ++i) {
      const int64_t t = slot == 17 ? 0 : slot == 2 ? 2 : -1;
      ASSERT_EQ(got_k[slot * kv_dim + i], t < 0 ? 0.0f : qkv[t * width + 12 + i]) << slot;
      ASSERT_EQ(got_v[slot * kv_dim + i], t < 0 ? 0.0f : qkv[t * width + 18 + i]) << slot;
    }
  const std::vector<int32_t> bad = {20, 0, 0};
  DeviceBuffer d_bad = to_device(*backend, bad, {tokens});
  EXPECT_THROW(backend->write_kv(d_qkv.view(), d_bad.view(), params, k.view(), v.view()), Error);
}

// An fp8 cache holds the host encoder's e4m3 byte of each k and v value (values past 448 saturate).
TEST_F(CpuKernels, WriteKvEncodesAnFp8Cache) {
  const AttentionParams params{2, 1, 4, 2, 1.0f, 0};
  const int64_t tokens = 2, width = (2 + 2 * 1) * 4, kv_dim = 4, q_dim = 8;
  std::vector<float> qkv = random_floats(rng, tokens * width, -3.0f, 3.0f);
  qkv[q_dim] = 1000.0f;
  qkv[width + q_dim + kv_dim] = -0.001f;
  const std::vector<int32_t> slots = {3, 0};
  DeviceBuffer d_qkv = to_device(*backend, qkv, {tokens, width});
  DeviceBuffer d_slots = to_device(*backend, slots, {tokens});
  DeviceBuffer k = backend->allocate(DType::F8E4M3, {2, 2, 1, 4}), v = backend->allocate(DType::F8E4M3, {2, 2, 1, 4});
  backend->write_kv(d_qkv.view(), d_slots.view(), params, k.view(), v.view());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < kv_dim; ++i) {
      EXPECT_EQ(k.view().as<uint8_t>()[slots[t] * kv_dim + i], f32_to_e4m3(qkv[t * width + q_dim + i])) << t;
      EXPECT_EQ(v.view().as<uint8_t>()[slots[t] * kv_dim + i], f32_to_e4m3(qkv[t * width + q_dim + kv_dim + i])) << t;
    }
  EXPECT_EQ(k.view().as<uint8_t>()[3 * kv_dim], 0x7e);  // 1000 saturates to 448
  DeviceBuffer f32_v = backend->allocate(DType::F32, {2, 2, 1, 4});
  EXPECT_THROW(backend->write_kv(d_qkv.view(), d_slots.view(), params, k.view(), f32_v.view()), Error);
}

}  // namespace

namespace {

// The roofline read touches every byte: its checksum is the xor of all 64-bit words (and of the
// trailing bytes), whatever the thread count.
TEST(StreamRead, ChecksumCoversEveryByte) {
  std::mt19937_64 rng(5);
  std::vector<uint64_t> words(100003);
  for (uint64_t& w : words) w = rng();
  const size_t bytes = words.size() * 8 - 3;  // a ragged tail
  uint64_t want = 0;
  const size_t lines_bytes = bytes / 64 * 64;
  for (size_t i = 0; i < lines_bytes / 8; ++i) want ^= words[i];
  const auto* raw = reinterpret_cast<const uint8_t*>(words.data());
  for (size_t i = lines_bytes; i < bytes; ++i) want ^= raw[i];
  for (int threads : {1, 2, 3}) EXPECT_EQ(cpu::stream_read(words.data(), bytes, threads), want) << threads;
}

}  // namespace
