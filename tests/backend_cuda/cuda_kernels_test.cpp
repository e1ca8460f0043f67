// Each CUDA kernel on random inputs against a float64 reference computed here from the exact
// bf16 (and, for the KV cache, fp8 e4m3) values the device holds; tolerances in cuda_test_util.h.
// Skips without a GPU (the host fp8 conversion check needs none).
#include "backend_cuda/cuda_test_util.h"

#include "core/error.h"

#ifdef SPLITFLOW_HAS_CUDA
#include <cuda_fp8.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <utility>

using namespace splitflow;
using namespace splitflow::test;

namespace {

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    SF_REQUIRE_GPU();
    backend = make_test_cuda_backend();
  }
  std::unique_ptr<Backend> backend;
  std::mt19937_64 rng{20261122};
};

TEST_F(CudaKernels, EmbedGathersScalesAndAddsPositions) {
  const int64_t vocab = 50, hidden = 96, positions = 40;
  std::vector<float> table = random_values(rng, vocab * hidden), pos = random_values(rng, positions * hidden);
  // upload() stores matrices as bf16: the reference uses the rounded values.
  Tensor host_table = Tensor::zeros(DType::F32, {vocab, hidden}), host_pos = Tensor::zeros(DType::F32, {positions, hidden});
  std::copy(table.begin(), table.end(), host_table.as<float>());
  std::copy(pos.begin(), pos.end(), host_pos.as<float>());
  DeviceBuffer d_table = backend->upload(host_table), d_pos = backend->upload(host_pos);
  ASSERT_EQ(d_table.view().dtype, DType::BF16);
  const std::vector<int32_t> ids = {3, 0, 49, 17, 17, 8, 22}, at = {0, 1, 2, 39, 5, 6, 7};
  const int64_t tokens = static_cast<int64_t>(ids.size());
  DeviceBuffer d_ids = to_device_i32(*backend, ids, {tokens}), d_at = to_device_i32(*backend, at, {tokens});
  DeviceBuffer out = backend->allocate(DType::BF16, {tokens, hidden});
  poison_bf16(*backend, out.view());
  backend->embed(d_table.view(), d_ids.view(), 1.5f, d_pos.view(), d_at.view(), out.view());
  std::vector<double> ref(tokens * hidden);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < hidden; ++i)
      ref[t * hidden + i] = 1.5 * bf16_round(table[ids[t] * hidden + i]) + bf16_round(pos[at[t] * hidden + i]);
  EXPECT_LE(relative_error(to_host(*backend, out.view()), ref), kOneRounding);
}

// --dummy-weights are generated in device memory; the host fill (materialize) is the reference:
// bf16 matrices bit for bit, f32 vectors exactly.
TEST_F(CudaKernels, GeneratedWeightsEqualTheHostFill) {
  const Tensor matrix = Tensor::generated_normal(DType::BF16, {333, 72}, {0x5eedULL, 0.02f});
  const Tensor vector = Tensor::generated_normal(DType::F32, {1001}, {0xb1a5ULL, 0.5f});
  for (const Tensor* tensor : {&matrix, &vector}) {
    const DeviceBuffer on_device = backend->upload(*tensor);
    const Tensor host = materialize(*tensor);
    std::vector<float> expected(static_cast<size_t>(host.numel()));
    convert_to_f32(host.dtype, host.data, expected.data(), expected.size());
    EXPECT_EQ(to_host(*backend, on_device.view()), expected) << shape_str(tensor->shape);
  }
}

// hidden 300: not a multiple of 8 (the scalar kernel); multiples of 8: 16-byte words, one or two per thread.
void check_add_norm(Backend& backend, std::mt19937_64& rng, NormType type, bool with_delta, bool with_bias,
                    int64_t tokens = 5, int64_t hidden = 300) {
  std::vector<float> residual = random_values(rng, tokens * hidden, -2.0f, 2.0f), delta = random_values(rng, tokens * hidden);
  const std::vector<float> weight = random_values(rng, hidden, 0.5f, 1.5f), bias = random_values(rng, hidden);
  DeviceBuffer d_res = to_device_bf16(backend, residual, {tokens, hidden});
  DeviceBuffer d_delta = to_device_bf16(backend, delta, {tokens, hidden});
  DeviceBuffer d_w = to_device_f32(backend, weight, {hidden}), d_b = to_device_f32(backend, bias, {hidden});
  DeviceBuffer out = backend.allocate(DType::BF16, {tokens, hidden});
  poison_bf16(backend, out.view());
  const NormParams params{type, 1e-5f, 0.25f};
  backend.add_norm(d_res.view(), with_delta ? d_delta.view() : DeviceTensor{}, d_w.view(),
                   with_bias ? d_b.view() : DeviceTensor{}, params, out.view());
  std::vector<double> ref(tokens * hidden), ref_res(tokens * hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    double mean = 0, squares = 0;
    for (int64_t i = 0; i < hidden; ++i) {
      const int64_t k = t * hidden + i;
      ref_res[k] = residual[k] + (with_delta ? delta[k] : 0.0);
      mean += ref_res[k];
    }
    mean = type == NormType::LayerNorm ? mean / hidden : 0.0;
    for (int64_t i = 0; i < hidden; ++i) squares += (ref_res[t * hidden + i] - mean) * (ref_res[t * hidden + i] - mean);
    const double inv = 1.0 / std::sqrt(squares / hidden + 1e-5);
    for (int64_t i = 0; i < hidden; ++i)
      ref[t * hidden + i] = (ref_res[t * hidden + i] - mean) * inv * (0.25 + weight[i]) + (with_bias ? bias[i] : 0.0);
  }
  EXPECT_LE(relative_error(to_host(backend, out.view()), ref), kBf16Compute) << "output";
  EXPECT_LE(relative_error(to_host(backend, d_res.view()), ref_res), kOneRounding) << "residual";
}

TEST_F(CudaKernels, RmsNormWithResidualAdd) { check_add_norm(*backend, rng, NormType::RMSNorm, true, false); }
TEST_F(CudaKernels, RmsNormWithoutDelta) { check_add_norm(*backend, rng, NormType::RMSNorm, false, false); }
TEST_F(CudaKernels, LayerNormWithResidualAddAndBias) { check_add_norm(*backend, rng, NormType::LayerNorm, true, true); }
TEST_F(CudaKernels, AddNormVectorizedRows) {
  for (int64_t tokens : {1, 3})
    for (int64_t hidden : {4096, 8200}) {
      check_add_norm(*backend, rng, NormType::RMSNorm, true, false, tokens, hidden);
      check_add_norm(*backend, rng, NormType::LayerNorm, true, true, tokens, hidden);
      check_add_norm(*backend, rng, NormType::RMSNorm, false, false, tokens, hidden);
    }
}

// accumulate: y starts as a random residual that the product adds to (in the epilogue).
void check_matmul(Backend& backend, std::mt19937_64& rng, int64_t m, int64_t k, int64_t n, bool bias, DType out_dtype,
                  DType weight_dtype, bool accumulate = false) {
  std::vector<float> x = random_values(rng, m * k);
  const std::vector<float> w = random_values(rng, n * k), b = random_values(rng, n);
  DeviceBuffer d_x = to_device_bf16(backend, x, {m, k});
  Tensor host_w = Tensor::zeros(weight_dtype, {n, k});
  convert_from_f32(w.data(), weight_dtype, host_w.data, w.size());
  DeviceBuffer d_w = backend.upload(host_w);
  DeviceBuffer d_b = to_device_f32(backend, b, {n});
  std::vector<float> residual = random_values(rng, m * n);
  if (out_dtype == DType::BF16)
    for (float& v : residual) v = bf16_round(v);
  DeviceBuffer y = out_dtype == DType::BF16 ? to_device_bf16(backend, residual, {m, n}) : to_device_f32(backend, residual, {m, n});
  if (!accumulate && out_dtype == DType::BF16) poison_bf16(backend, y.view());
  backend.matmul(d_x.view(), d_w.view(), bias ? d_b.view() : DeviceTensor{}, y.view(), accumulate);
  std::vector<float> stored(w.size());
  convert_to_f32(weight_dtype, host_w.data, stored.data(), w.size());
  std::vector<double> ref(m * n);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double sum = (bias ? b[c] : 0.0) + (accumulate ? residual[r * n + c] : 0.0);
      for (int64_t i = 0; i < k; ++i) sum += static_cast<double>(x[r * k + i]) * bf16_round(stored[c * k + i]);
      ref[r * n + c] = sum;
    }
  EXPECT_LE(relative_error(to_host(backend, y.view()), ref), kBf16Compute)
      << "m " << m << " k " << k << " n " << n << " out " << dtype_name(out_dtype);
}

TEST_F(CudaKernels, MatmulBf16OutputAcrossRowCounts) {
  for (int64_t m : {1, 3, 16, 100}) check_matmul(*backend, rng, m, 96, 130, false, DType::BF16, DType::F32);
}
TEST_F(CudaKernels, MatmulWithBiasAndF32Output) {
  for (int64_t m : {1, 7, 64}) {
    check_matmul(*backend, rng, m, 64, 257, true, DType::F32, DType::F32);
    check_matmul(*backend, rng, m, 64, 257, true, DType::BF16, DType::F32);
  }
}
// The residual add in the epilogue: cuBLASLt with beta = 1 and the GEMV, bf16 and f32 outputs.
TEST_F(CudaKernels, MatmulAccumulatesIntoOutput) {
  for (int64_t m : {1, 2, 5, 64}) {
    check_matmul(*backend, rng, m, 256, 130, m % 2 == 1, DType::BF16, DType::F32, true);
    check_matmul(*backend, rng, m, 64, 72, true, DType::F32, DType::F32, true);
  }
}
// With tuning on, a new decode-sized shape times its candidate algorithms first (into scratch):
// the result, accumulating or not, is the one call's, for bf16 and f32 outputs (shapes no earlier
// test planned, so the tuning runs here).
TEST_F(CudaKernels, MatmulTunedAtFirstUseWritesOnlyItsResult) {
  backend->set_tuning(true);
  for (bool accumulate : {false, true}) {  // each call a new shape
    check_matmul(*backend, rng, accumulate ? 56 : 48, 320, 136, false, DType::BF16, DType::F32, accumulate);
    check_matmul(*backend, rng, accumulate ? 32 : 40, 320, 136, true, DType::F32, DType::F32, accumulate);
  }
  backend->set_tuning(false);
}

TEST_F(CudaKernels, MatmulReadsF16AndBf16Weights) {
  check_matmul(*backend, rng, 5, 128, 64, false, DType::BF16, DType::F16);
  check_matmul(*backend, rng, 5, 128, 64, true, DType::F32, DType::BF16);
}
// With SPLITFLOW_GEMV_MAX_ROWS=8, m <= 8 with k % 8 == 0 runs the GEMV kernel: every row count,
// k past one unrolled pass (4 x 32 words) with a tail, and k % 8 != 0 (cuBLASLt fallback) next to
// it; the default backend (GEMV for at most 2 rows) gives the same answers.
TEST_F(CudaKernels, MatmulDecodeRowsThroughGemv) {
  ::setenv("SPLITFLOW_GEMV_MAX_ROWS", "8", 1);
  std::unique_ptr<Backend> gemv = make_test_cuda_backend();
  ::unsetenv("SPLITFLOW_GEMV_MAX_ROWS");
  for (Backend* b : {gemv.get(), backend.get()}) {
    for (int64_t m = 1; m <= 8; ++m) check_matmul(*b, rng, m, 1032, 72, m % 2 == 0, DType::BF16, DType::F32, m % 3 == 0);
    check_matmul(*b, rng, 1, 4096, 300, true, DType::F32, DType::F32);
    check_matmul(*b, rng, 2, 11008, 40, false, DType::BF16, DType::F32);
    check_matmul(*b, rng, 3, 100, 33, true, DType::BF16, DType::F32);
    check_matmul(*b, rng, 9, 1032, 72, false, DType::BF16, DType::F32);
  }
}
TEST(CudaBackend, RejectsBadGemvRowLimit) {
  SF_REQUIRE_GPU();
  ::setenv("SPLITFLOW_GEMV_MAX_ROWS", "9", 1);
  EXPECT_THROW(make_test_cuda_backend(), Error);
  ::unsetenv("SPLITFLOW_GEMV_MAX_ROWS");
}
TEST_F(CudaKernels, MatmulRejectsF32Activations) {
  DeviceBuffer x = backend->allocate(DType::F32, {2, 8}), w = backend->allocate(DType::BF16, {4, 8}),
               y = backend->allocate(DType::BF16, {2, 4});
  EXPECT_THROW(backend->matmul(x.view(), w.view(), {}, y.view(), false), Error);
}

void check_rope(Backend& backend, std::mt19937_64& rng, RopeStyle style, int rotary_dim) {
  const int heads = 4, kv_heads = 2, head_dim = 16, half = rotary_dim / 2;
  const int64_t tokens = 6, width = (heads + 2 * kv_heads) * head_dim, rows = 10;
  std::vector<float> qkv = random_values(rng, tokens * width);
  const std::vector<float> table = random_values(rng, rows * 2 * half);
  const std::vector<int32_t> table_rows = {0, 9, 3, 3, 7, 1};
  DeviceBuffer d_qkv = to_device_bf16(backend, qkv, {tokens, width});
  DeviceBuffer d_table = to_device_f32(backend, table, {rows, 2, half});
  DeviceBuffer d_rows = to_device_i32(backend, table_rows, {tokens});
  backend.rope(d_qkv.view(), d_table.view(), d_rows.view(), {heads, kv_heads, head_dim, rotary_dim, style});
  std::vector<double> ref(qkv.begin(), qkv.end());
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads + kv_heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double c = table[table_rows[t] * 2 * half + i], s = table[table_rows[t] * 2 * half + half + i];
        const int64_t base = t * width + h * head_dim;
        const int64_t a = base + (style == RopeStyle::Half ? i : 2 * i), b = base + (style == RopeStyle::Half ? i + half : 2 * i + 1);
        ref[a] = qkv[a] * c - qkv[b] * s;
        ref[b] = qkv[b] * c + qkv[a] * s;
      }
  EXPECT_LE(relative_error(to_host(backend, d_qkv.view()), ref), kOneRounding);
}

TEST_F(CudaKernels, RopeHalfStyle) { check_rope(*backend, rng, RopeStyle::Half, 16); }
TEST_F(CudaKernels, RopeInterleavedStyle) { check_rope(*backend, rng, RopeStyle::Interleaved, 16); }
TEST_F(CudaKernels, RopePartialRotaryLeavesTailDims) { check_rope(*backend, rng, RopeStyle::Half, 6); }

// The input norm of a matmul-family call: none; an RMSNorm with its own weight (offset 1 as
// Gemma's), which the CUDA backend runs apart; or one whose weight was folded into the matrix
// (unit weight), which the decode GEMVs fuse.
enum class NormKind { None, Weighted, Unit };
struct NormCase {
  NormKind kind = NormKind::None;
  std::vector<float> weight;
  DeviceBuffer d_weight, normed;
  InputNorm input(int64_t m) const {
    if (kind == NormKind::None) return {};
    const NormParams params{NormType::RMSNorm, 1e-5f, kind == NormKind::Weighted ? 1.0f : 0.0f};
    return {d_weight.view(), {}, params, normed.view().rows(0, m), kind == NormKind::Unit};
  }
  // Whether the normalized rows go through memory (bf16) before the product reads them.
  bool stored(int64_t m) const { return kind == NormKind::Weighted || m > 2; }
};
NormCase make_norm(Backend& backend, std::mt19937_64& rng, NormKind kind, int64_t m, int64_t k) {
  NormCase norm;
  norm.kind = kind;
  if (kind == NormKind::None) return norm;
  norm.weight = kind == NormKind::Unit ? std::vector<float>(k, 1.0f) : random_values(rng, k, -0.5f, 0.5f);
  norm.d_weight = to_device_f32(backend, norm.weight, {k});
  norm.normed = backend.allocate(DType::BF16, {m, k});
  return norm;
}
// The input rows the product multiplies, in fp64: x itself, or x / rms(x) * (offset + g), rounded to
// bf16 when stored.
std::vector<double> matmul_input_ref(const std::vector<float>& x, int64_t m, int64_t k, const NormCase& norm) {
  std::vector<double> out(x.begin(), x.end());
  if (norm.kind == NormKind::None) return out;
  const double offset = norm.kind == NormKind::Weighted ? 1.0 : 0.0;
  for (int64_t r = 0; r < m; ++r) {
    double squares = 0.0;
    for (int64_t c = 0; c < k; ++c) squares += double{x[r * k + c]} * x[r * k + c];
    const double inv = 1.0 / std::sqrt(squares / static_cast<double>(k) + 1e-5);
    for (int64_t c = 0; c < k; ++c) {
      const double v = x[r * k + c] * inv * (offset + norm.weight[c]);
      out[r * k + c] = norm.stored(m) ? bf16_round(static_cast<float>(v)) : v;
    }
  }
  return out;
}

// The QKV projection with RoPE and the KV write: fused in one GEMV for decode rows (m <= the GEMV
// limit), matmul then rope_write_kv otherwise; against the fp64 product of the bf16 inputs, rotated,
// and the cache rows it must hold (slot -1: not stored). An fp8 cache must hold exactly the host
// encoder's bytes of the k and v values the kernel left in qkv.
void check_matmul_rope_write_kv(Backend& backend, std::mt19937_64& rng, int64_t m, RopeStyle style, int rotary_dim,
                                bool with_bias, NormKind norm_kind, DType cache_dtype = DType::BF16) {
  const int heads = 4, kv_heads = 2, head_dim = 16, half = rotary_dim / 2, block_size = 4, blocks = 3;
  const int64_t k = 72, width = (heads + 2 * kv_heads) * head_dim, q_dim = heads * head_dim;
  const int64_t kv_dim = kv_heads * head_dim, table_len = 10;
  std::vector<float> x = random_values(rng, m * k), w = random_values(rng, width * k, -0.3f, 0.3f);
  const std::vector<float> bias = random_values(rng, width), table = random_values(rng, table_len * 2 * half);
  std::vector<int32_t> table_rows(m), slots(m);
  for (int64_t r = 0; r < m; ++r) {
    table_rows[r] = static_cast<int32_t>((3 * r + 1) % table_len);
    slots[r] = r == 1 ? -1 : static_cast<int32_t>((5 * r + 2) % (blocks * block_size));
  }
  DeviceBuffer d_x = to_device_bf16(backend, x, {m, k}), d_w = to_device_bf16(backend, w, {width, k});
  DeviceBuffer d_bias = to_device_f32(backend, bias, {width}), d_table = to_device_f32(backend, table, {table_len, 2, half});
  DeviceBuffer d_rows = to_device_i32(backend, table_rows, {m}), d_slots = to_device_i32(backend, slots, {m});
  DeviceBuffer qkv = backend.allocate(DType::BF16, {m, width});
  DeviceBuffer k_cache = backend.allocate(cache_dtype, {blocks, block_size, kv_heads, head_dim});
  DeviceBuffer v_cache = backend.allocate(cache_dtype, {blocks, block_size, kv_heads, head_dim});
  poison_bf16(backend, qkv.view());
  const RopeParams rope{heads, kv_heads, head_dim, rotary_dim, style};
  const AttentionParams attention{heads, kv_heads, head_dim, block_size, 1.0f, 0};
  const NormCase norm = make_norm(backend, rng, norm_kind, m, k);
  const std::vector<double> x_in = matmul_input_ref(x, m, k, norm);
  backend.matmul_rope_write_kv(norm.input(m), d_x.view(), d_w.view(), with_bias ? d_bias.view() : DeviceTensor{}, qkv.view(),
                               d_table.view(), d_rows.view(), rope, d_slots.view(), attention, k_cache.view(),
                               v_cache.view());
  std::vector<double> ref(m * width), k_ref(blocks * block_size * kv_dim, 0.0), v_ref(k_ref.size(), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    double* row = ref.data() + r * width;
    for (int64_t j = 0; j < width; ++j) {
      double sum = with_bias ? bias[j] : 0.0;
      for (int64_t c = 0; c < k; ++c) sum += x_in[r * k + c] * w[j * k + c];
      row[j] = sum;
    }
    // Unfused (m above the GEMV limit, or a norm with its own weight), qkv is stored in bf16
    // before the rotation reads it.
    if (norm.stored(m))
      for (int64_t j = 0; j < width; ++j) row[j] = bf16_round(static_cast<float>(row[j]));
    for (int h = 0; h < heads + kv_heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double c = table[table_rows[r] * 2 * half + i], s = table[table_rows[r] * 2 * half + half + i];
        const int64_t a = h * head_dim + (style == RopeStyle::Half ? i : 2 * i);
        const int64_t b = h * head_dim + (style == RopeStyle::Half ? i + half : 2 * i + 1);
        const double xa = row[a], xb = row[b];
        row[a] = xa * c - xb * s;
        row[b] = xb * c + xa * s;
      }
    if (slots[r] >= 0)
      for (int64_t j = 0; j < kv_dim; ++j) {
        k_ref[slots[r] * kv_dim + j] = row[q_dim + j];
        v_ref[slots[r] * kv_dim + j] = row[q_dim + kv_dim + j];
      }
  }
  const std::string what = fmt::format("m {} rotary_dim {} interleaved {} bias {} norm {} cache {}", m, rotary_dim,
                                       style == RopeStyle::Interleaved, with_bias, static_cast<int>(norm_kind),
                                       dtype_name(cache_dtype));
  expect_qkv_and_cache(backend, qkv.view(), ref, k_cache.view(), v_cache.view(), k_ref, v_ref, slots, q_dim, kv_dim,
                       kBf16Compute, what);
}

TEST_F(CudaKernels, MatmulRopeWriteKvFusedAndNot) {
  for (int64_t m : {1, 2, 5})
    for (RopeStyle style : {RopeStyle::Half, RopeStyle::Interleaved})
      for (NormKind norm : {NormKind::None, NormKind::Weighted, NormKind::Unit}) {
        check_matmul_rope_write_kv(*backend, rng, m, style, 16, m == 2, norm);
        check_matmul_rope_write_kv(*backend, rng, m, style, 6, m != 2, norm);  // dims 6..15 pass through
      }
}

TEST_F(CudaKernels, MatmulRopeWriteKvEncodesFp8Caches) {
  for (int64_t m : {1, 2, 5})
    for (RopeStyle style : {RopeStyle::Half, RopeStyle::Interleaved}) {
      check_matmul_rope_write_kv(*backend, rng, m, style, 16, m == 2, NormKind::Unit, DType::F8E4M3);
      check_matmul_rope_write_kv(*backend, rng, m, style, 6, m != 2, NormKind::None, DType::F8E4M3);
    }
}

// head_dim 8: 16-byte words; 6: the element-wise path; kv_dim 2048: several blocks per token.
void check_write_kv(Backend& backend, std::mt19937_64& rng, int kv_heads, int head_dim) {
  const int heads = 2 * kv_heads, block_size = 4, blocks = 3;
  const int64_t tokens = 4, kv_dim = kv_heads * head_dim, q_dim = heads * head_dim, width = q_dim + 2 * kv_dim;
  std::vector<float> qkv = random_values(rng, tokens * width);
  DeviceBuffer d_qkv = to_device_bf16(backend, qkv, {tokens, width});
  const std::vector<int32_t> slots = {5, -1, 0, 11};
  DeviceBuffer d_slots = to_device_i32(backend, slots, {tokens});
  DeviceBuffer k = backend.allocate(DType::BF16, {blocks, block_size, kv_heads, head_dim});
  DeviceBuffer v = backend.allocate(DType::BF16, {blocks, block_size, kv_heads, head_dim});
  AttentionParams params{heads, kv_heads, head_dim, block_size, 1.0f, 0};
  backend.write_kv(d_qkv.view(), d_slots.view(), params, k.view(), v.view());
  std::vector<double> ref_k(blocks * block_size * kv_dim, 0.0), ref_v(ref_k.size(), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t i = 0; i < kv_dim; ++i) {
      ref_k[slots[t] * kv_dim + i] = qkv[t * width + q_dim + i];
      ref_v[slots[t] * kv_dim + i] = qkv[t * width + q_dim + kv_dim + i];
    }
  }
  EXPECT_EQ(relative_error(to_host(backend, k.view()), ref_k), 0.0);
  EXPECT_EQ(relative_error(to_host(backend, v.view()), ref_v), 0.0);
}
// The fused launch gives exactly what rope() then write_kv() give: qkv rotated in place, k and v
// in the caches (negative slots skipped), partial rotary dims and both pairings. Rotary dims 32
// and 16 run the 16-byte-word kernel (16: with pass-through words), 8 the words when
// interleaved and the element kernel by halves, 6 the element kernel.
TEST_F(CudaKernels, RopeWriteKvEqualsTheTwoKernels) {
  const int heads = 4, kv_heads = 2, head_dim = 32, block_size = 4, blocks = 6, tokens = 5;
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  for (RopeStyle style : {RopeStyle::Half, RopeStyle::Interleaved})
    for (int rotary_dim : {32, 16, 8, 6}) {
      std::vector<float> qkv = random_values(rng, tokens * width), table = random_values(rng, 20 * rotary_dim);
      const RopeParams rope{heads, kv_heads, head_dim, rotary_dim, style};
      const AttentionParams attention{heads, kv_heads, head_dim, block_size, 1.0f, 0};
      DeviceBuffer d_table = to_device_f32(*backend, table, {20, 2, rotary_dim / 2});
      DeviceBuffer rows = to_device_i32(*backend, {3, 0, 19, 7, 7}, {tokens});
      DeviceBuffer slots = to_device_i32(*backend, {0, 5, -1, 23, 9}, {tokens});
      const Shape cache = {blocks, block_size, kv_heads, head_dim};
      std::vector<std::vector<float>> results;
      for (bool fused : {false, true}) {
        std::vector<float> values = qkv;
        DeviceBuffer d_qkv = to_device_bf16(*backend, values, {tokens, width});
        DeviceBuffer k = backend->allocate(DType::BF16, cache), v = backend->allocate(DType::BF16, cache);
        if (fused) {
          backend->rope_write_kv(d_qkv.view(), d_table.view(), rows.view(), rope, slots.view(), attention, k.view(), v.view());
        } else {
          backend->rope(d_qkv.view(), d_table.view(), rows.view(), rope);
          backend->write_kv(d_qkv.view(), slots.view(), attention, k.view(), v.view());
        }
        std::vector<float> all = to_host(*backend, d_qkv.view());
        for (const DeviceBuffer* b : {&k, &v}) {
          const std::vector<float> part = to_host(*backend, b->view());
          all.insert(all.end(), part.begin(), part.end());
        }
        results.push_back(std::move(all));
      }
      EXPECT_EQ(results[0], results[1]) << "rotary_dim " << rotary_dim;
    }
}

TEST_F(CudaKernels, WriteKvStoresSlotsAndSkipsNegative) {
  check_write_kv(*backend, rng, 2, 8);
  check_write_kv(*backend, rng, 2, 6);
  check_write_kv(*backend, rng, 8, 256);
}

// Values whose e4m3 encoding tests the rules: ties to even (1.0625, 1.1875, 1.5 subnormal steps),
// subnormals, underflow, saturation (the tie at 464, 1000, infinities), NaN and signed zero.
const float kE4m3Specials[] = {1.0625f, 1.1875f, 3 * 0x1p-10f, 0x1p-9f, 0x1p-12f, 464.0f, 1000.0f, -1000.0f,
                               INFINITY, -INFINITY, NAN, -0.0f, 0.0f, -448.0f, 0.015625f, -0.013671875f};

// write_kv into fp8 caches: each stored byte is the host encoder's byte (core/dtype.h) of the bf16
// value in qkv; slots -1 skipped (the zeroed cache stays zero). head_dim 8: 8-element words; 6:
// one element per thread; kv_dim 2048: several blocks per token.
void check_write_kv_fp8(Backend& backend, std::mt19937_64& rng, int kv_heads, int head_dim) {
  const int heads = 2 * kv_heads, block_size = 4, blocks = 3;
  const int64_t tokens = 4, kv_dim = kv_heads * head_dim, q_dim = heads * head_dim, width = q_dim + 2 * kv_dim;
  std::vector<float> qkv = random_values(rng, tokens * width, -3.0f, 3.0f);
  for (size_t i = 0; i < std::size(kE4m3Specials); ++i) qkv[q_dim + i * (2 * kv_dim - 1) / 15] = kE4m3Specials[i];
  DeviceBuffer d_qkv = to_device_bf16(backend, qkv, {tokens, width});
  const std::vector<int32_t> slots = {5, -1, 0, 11};
  DeviceBuffer d_slots = to_device_i32(backend, slots, {tokens});
  DeviceBuffer k = backend.allocate(DType::F8E4M3, {blocks, block_size, kv_heads, head_dim});
  DeviceBuffer v = backend.allocate(DType::F8E4M3, {blocks, block_size, kv_heads, head_dim});
  backend.write_kv(d_qkv.view(), d_slots.view(), {heads, kv_heads, head_dim, block_size, 1.0f, 0}, k.view(), v.view());
  std::vector<uint8_t> k_bytes(blocks * block_size * kv_dim, 0), v_bytes(k_bytes.size(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t i = 0; i < kv_dim; ++i) {
      k_bytes[slots[t] * kv_dim + i] = f32_to_e4m3(qkv[t * width + q_dim + i]);
      v_bytes[slots[t] * kv_dim + i] = f32_to_e4m3(qkv[t * width + q_dim + kv_dim + i]);
    }
  }
  EXPECT_EQ(bytes_to_host(backend, k.view()), k_bytes) << "kv_heads " << kv_heads << " head_dim " << head_dim;
  EXPECT_EQ(bytes_to_host(backend, v.view()), v_bytes) << "kv_heads " << kv_heads << " head_dim " << head_dim;
}

TEST_F(CudaKernels, WriteKvEncodesFp8CachesAsTheHostEncoder) {
  check_write_kv_fp8(*backend, rng, 2, 8);
  check_write_kv_fp8(*backend, rng, 2, 6);
  check_write_kv_fp8(*backend, rng, 8, 256);
}

// rope_write_kv into fp8 caches: qkv rotated exactly as rope() rotates it, each cached k and v
// byte the host encoder's byte of the bf16 value qkv then holds; the same bytes as rope() then
// write_kv(). Partial rotary dims and both pairings, by words (32, 16) and by elements (6).
TEST_F(CudaKernels, RopeWriteKvEncodesFp8Caches) {
  const int heads = 4, kv_heads = 2, head_dim = 32, block_size = 4, blocks = 6, tokens = 5;
  const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim, width = q_dim + 2 * kv_dim;
  const std::vector<int32_t> slots = {0, 5, -1, 23, 9};
  for (RopeStyle style : {RopeStyle::Half, RopeStyle::Interleaved})
    for (int rotary_dim : {32, 16, 6}) {
      std::vector<float> qkv = random_values(rng, tokens * width, -2.0f, 2.0f);
      const std::vector<float> table = random_values(rng, 20 * rotary_dim);
      for (size_t i = 0; i < std::size(kE4m3Specials); ++i)  // into v, which passes as is (NaN: in write_kv's test)
        if (!std::isnan(kE4m3Specials[i])) qkv[q_dim + kv_dim + i] = kE4m3Specials[i];
      const RopeParams rope{heads, kv_heads, head_dim, rotary_dim, style};
      const AttentionParams attention{heads, kv_heads, head_dim, block_size, 1.0f, 0};
      DeviceBuffer d_table = to_device_f32(*backend, table, {20, 2, rotary_dim / 2});
      DeviceBuffer rows = to_device_i32(*backend, {3, 0, 19, 7, 7}, {tokens});
      DeviceBuffer d_slots = to_device_i32(*backend, slots, {tokens});
      const Shape cache = {blocks, block_size, kv_heads, head_dim};
      std::vector<std::vector<uint8_t>> caches;
      std::vector<float> rotated;
      for (bool fused : {false, true}) {
        std::vector<float> values = qkv;
        DeviceBuffer d_qkv = to_device_bf16(*backend, values, {tokens, width});
        DeviceBuffer k = backend->allocate(DType::F8E4M3, cache), v = backend->allocate(DType::F8E4M3, cache);
        if (fused) {
          backend->rope_write_kv(d_qkv.view(), d_table.view(), rows.view(), rope, d_slots.view(), attention, k.view(),
                                 v.view());
          EXPECT_EQ(to_host(*backend, d_qkv.view()), rotated) << "rotary_dim " << rotary_dim;
        } else {
          backend->rope(d_qkv.view(), d_table.view(), rows.view(), rope);
          rotated = to_host(*backend, d_qkv.view());
          backend->write_kv(d_qkv.view(), d_slots.view(), attention, k.view(), v.view());
        }
        caches.push_back(bytes_to_host(*backend, k.view()));
        const std::vector<uint8_t> v_bytes = bytes_to_host(*backend, v.view());
        caches.back().insert(caches.back().end(), v_bytes.begin(), v_bytes.end());
      }
      std::vector<uint8_t> expected(2 * blocks * block_size * kv_dim, 0);
      for (int t = 0; t < tokens; ++t)
        if (slots[t] >= 0)
          for (int64_t i = 0; i < kv_dim; ++i) {
            expected[slots[t] * kv_dim + i] = f32_to_e4m3(rotated[t * width + q_dim + i]);
            expected[blocks * block_size * kv_dim + slots[t] * kv_dim + i] =
                f32_to_e4m3(rotated[t * width + q_dim + kv_dim + i]);
          }
      EXPECT_EQ(caches[0], expected) << "rope then write_kv, rotary_dim " << rotary_dim;
      EXPECT_EQ(caches[1], expected) << "rope_write_kv, rotary_dim " << rotary_dim;
    }
}

#ifdef SPLITFLOW_HAS_CUDA
// The host e4m3 conversions (core/dtype.h) against cuda_fp8.h's host implementation of the ones
// the kernels call (__nv_cvt_float_to_fp8 with __NV_SATFINITE, __nv_cvt_fp8_to_halfraw): every
// code decodes alike, and a sweep of floats (every 4093rd bit pattern of either sign, with the
// specials above) encodes alike. Runs without a GPU.
TEST(CudaFp8, HostConversionsMatchCudaFp8Header) {
  for (int code = 0; code < 256; ++code) {
    const __half_raw half = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
    const float cuda = f16_to_f32(half.x), ours = e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(cuda)) {
      EXPECT_TRUE(std::isnan(ours)) << code;
    } else {
      EXPECT_EQ(ours, cuda) << code;
    }
  }
  std::vector<float> sweep(std::begin(kE4m3Specials), std::end(kE4m3Specials));
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093) {
    float x;
    const uint32_t word = static_cast<uint32_t>(bits);
    std::memcpy(&x, &word, sizeof x);
    sweep.push_back(x);
  }
  for (const float x : sweep)
    ASSERT_EQ(f32_to_e4m3(x), __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) << x;
}
#endif

// Paged attention against a dense float64 reference: S sequences with cached prefixes and new
// chunks (prefill, chunked prefill and decode mixed), block tables shuffled over the cache. The
// cache is bf16 or fp8 e4m3 (random values rounded by the host encoder; the reference reads the
// rounded values): every kernel reads e4m3 exactly (as bf16 or f16), so both meet kBf16Compute,
// the bound for bf16 operands (P rounded to bf16). The decode kernel over an e4m3 cache computes
// in f16 (Q times the softmax scale and P rounded to f16, 2^-11 relative, fp32 accumulation), so
// the output's one bf16 rounding (2^-9 per element) is all but its whole error: its cases take
// kOneRounding (4e-3; a host model of the kernel's roundings gives at most 1.9e-3 on cases like
// these, 2.6e-3 with P in bf16).
struct AttentionCase {
  int heads, kv_heads, head_dim, block_size, sliding_window;
  std::vector<int> new_tokens, context_lens;
  int max_context_hint = 0;  // > 0: the launch's max_context_len (an upper bound, as a recorded decode passes)
  float logit_softcap = 0;   // > 0: scores capped as cap * tanh(score / cap)
  bool causal = true;        // false: every query sees its sequence's whole context
  int bias_buckets = 0;      // > 0: T5's relative position bias (bidirectional when not causal)
  int bias_max_distance = 0;
  bool cross = false;        // cross_attention: q of its own, every encoder key visible
  float q_scale = 1.0f;      // q's values times this: above 1 the softmax peaks on a few keys
};

// transformers' T5Attention._relative_position_bucket, written from its definition in double
// precision (the kernel computes in f32 as transformers does; the cases keep off the boundaries).
int reference_bucket(int relative, int num_buckets, int max_distance, bool bidirectional) {
  int bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    bucket = relative > 0 ? num_buckets : 0;
    relative = std::abs(relative);
  } else {
    relative = std::max(-relative, 0);
  }
  const int max_exact = num_buckets / 2;
  if (relative < max_exact) return bucket + relative;
  const double large = max_exact + std::log(static_cast<double>(relative) / max_exact) /
                                       std::log(static_cast<double>(max_distance) / max_exact) * (num_buckets - max_exact);
  return bucket + std::min(static_cast<int>(large), num_buckets - 1);
}

void check_attention(Backend& backend, std::mt19937_64& rng, const AttentionCase& c, DType cache_dtype = DType::BF16,
                     double tolerance = kBf16Compute) {
  const int seqs = static_cast<int>(c.new_tokens.size());
  const int64_t q_dim = int64_t{c.heads} * c.head_dim, kv_dim = int64_t{c.kv_heads} * c.head_dim;
  const int64_t width = q_dim + 2 * kv_dim;
  int max_blocks = 0, total_blocks = 0, max_query = 0, max_context = 0;
  std::vector<int32_t> query_start = {0};
  for (int s = 0; s < seqs; ++s) {
    const int blocks = (c.context_lens[s] + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, blocks);
    total_blocks += blocks;
    query_start.push_back(query_start.back() + c.new_tokens[s]);
    max_query = std::max(max_query, c.new_tokens[s]);
    max_context = std::max(max_context, c.context_lens[s]);
  }
  const int64_t tokens = query_start.back(), cache_blocks = total_blocks + 2;
  std::vector<int32_t> order(cache_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> tables(seqs * max_blocks, 0);
  for (int s = 0, next = 0; s < seqs; ++s)
    for (int b = 0; b < (c.context_lens[s] + c.block_size - 1) / c.block_size; ++b) tables[s * max_blocks + b] = order[next++];

  std::vector<float> qkv = random_values(rng, tokens * width), k_cache = random_values(rng, cache_blocks * c.block_size * kv_dim),
                     v_cache = random_values(rng, k_cache.size());
  for (int64_t t = 0; c.q_scale != 1.0f && t < tokens; ++t)
    for (int64_t i = 0; i < q_dim; ++i) qkv[t * width + i] *= c.q_scale;
  DeviceBuffer d_qkv = to_device_bf16(backend, qkv, {tokens, width});
  const Shape cache_shape = {cache_blocks, c.block_size, c.kv_heads, c.head_dim};
  DeviceBuffer d_k = cache_to_device(backend, k_cache, cache_shape, cache_dtype);
  DeviceBuffer d_v = cache_to_device(backend, v_cache, cache_shape, cache_dtype);
  DeviceBuffer d_start = to_device_i32(backend, query_start, {seqs + 1});
  DeviceBuffer d_lens = to_device_i32(backend, std::vector<int32_t>(c.context_lens.begin(), c.context_lens.end()), {seqs});
  DeviceBuffer d_tables = to_device_i32(backend, tables, {seqs, max_blocks});
  DeviceBuffer out = backend.allocate(DType::BF16, {tokens, q_dim});
  poison_bf16(backend, out.view());
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  AttentionParams params{c.heads, c.kv_heads, c.head_dim, c.block_size, scale, c.sliding_window, c.logit_softcap};
  params.causal = c.causal && !c.cross;
  const AttentionBatch batch{d_start.view(), d_lens.view(), d_tables.view(), max_query,
                             c.max_context_hint > 0 ? c.max_context_hint : max_context};
  // Cross-attention reads q from a tensor of its own: the q columns of qkv, copied out.
  std::vector<float> q_only;
  for (int64_t t = 0; c.cross && t < tokens; ++t)
    q_only.insert(q_only.end(), qkv.begin() + t * width, qkv.begin() + t * width + q_dim);
  std::vector<float> bias_table = random_values(rng, static_cast<size_t>(c.bias_buckets) * c.heads, -2.0f, 2.0f);
  if (c.cross) {
    DeviceBuffer d_q = to_device_bf16(backend, q_only, {tokens, q_dim});
    backend.cross_attention(d_q.view(), d_k.view(), d_v.view(), batch, params, out.view());
  } else if (c.bias_buckets > 0) {
    DeviceBuffer d_bias = backend.allocate(DType::F32, {c.bias_buckets, c.heads});
    backend.copy_to_device(bias_table.data(), d_bias.view());
    const RelativePositionBias bias{d_bias.view(), c.bias_buckets, c.bias_max_distance, !c.causal};
    backend.attention_with_position_bias(d_qkv.view(), d_k.view(), d_v.view(), batch, params, bias, out.view());
  } else {
    backend.attention(d_qkv.view(), d_k.view(), d_v.view(), batch, params, out.view());
  }

  std::vector<double> ref(tokens * q_dim);
  const int group = c.heads / c.kv_heads;
  for (int s = 0; s < seqs; ++s)
    for (int i = 0; i < c.new_tokens[s]; ++i) {
      const int64_t t = query_start[s] + i;
      const int pos = c.context_lens[s] - c.new_tokens[s] + i;
      const int first = c.sliding_window > 0 ? std::max(0, pos - c.sliding_window + 1) : 0;
      const int last = params.causal ? pos : c.context_lens[s] - 1;
      for (int h = 0; h < c.heads; ++h) {
        const int kvh = h / group;
        std::vector<double> scores;
        for (int p = first; p <= last; ++p) {
          const int64_t slot = int64_t{tables[s * max_blocks + p / c.block_size]} * c.block_size + p % c.block_size;
          double dot = 0;
          for (int d = 0; d < c.head_dim; ++d)
            dot += static_cast<double>(qkv[t * width + h * c.head_dim + d]) * k_cache[slot * kv_dim + kvh * c.head_dim + d];
          double score = dot * scale;
          if (c.bias_buckets > 0)
            score += bias_table[reference_bucket(p - pos, c.bias_buckets, c.bias_max_distance, !c.causal) * c.heads + h];
          scores.push_back(c.logit_softcap > 0 ? c.logit_softcap * std::tanh(score / c.logit_softcap) : score);
        }
        const double top = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double& sc : scores) sum += (sc = std::exp(sc - top));
        for (int d = 0; d < c.head_dim; ++d) {
          double acc = 0;
          for (int p = first; p <= last; ++p) {
            const int64_t slot = int64_t{tables[s * max_blocks + p / c.block_size]} * c.block_size + p % c.block_size;
            acc += scores[p - first] * v_cache[slot * kv_dim + kvh * c.head_dim + d];
          }
          ref[t * q_dim + h * c.head_dim + d] = acc / sum;
        }
      }
    }
  EXPECT_LE(relative_error(to_host(backend, out.view()), ref), tolerance)
      << "heads " << c.heads << " kv_heads " << c.kv_heads << " head_dim " << c.head_dim << " block " << c.block_size
      << " window " << c.sliding_window << " cache " << dtype_name(cache_dtype);
}

TEST_F(CudaKernels, AttentionHeadDimsAndGqaRatios) {
  for (int head_dim : {8, 16, 64, 80, 96, 128})
    for (int kv_heads : {8, 4, 2, 1})
      check_attention(*backend, rng, {8, kv_heads, head_dim, 16, 0, {1, 7, 13, 1}, {1, 40, 13, 77}});
}
TEST_F(CudaKernels, AttentionSlidingWindow) {
  for (int window : {1, 5, 33})
    check_attention(*backend, rng, {4, 2, 64, 4, window, {9, 1, 20}, {30, 61, 20}});
}
TEST_F(CudaKernels, AttentionLongContextAndOddBlockSize) {
  check_attention(*backend, rng, {4, 1, 128, 7, 0, {1, 3}, {1000, 517}});
  check_attention(*backend, rng, {2, 2, 256, 16, 0, {5}, {300}});
}
// Soft-capped scores (Gemma 2) take the split-KV kernel whatever the shape: prefill and decode,
// head dims the tensor-core kernels would take, a window, a split key range.
TEST_F(CudaKernels, AttentionLogitSoftcap) {
  for (int head_dim : {16, 64, 128, 256}) {
    AttentionCase c{4, 2, head_dim, 16, 0, {1, 20, 1}, {40, 20, 3000}};
    c.logit_softcap = 0.5f;  // well below the scores' spread: the cap changes every row
    check_attention(*backend, rng, c);
    c.sliding_window = 7;
    check_attention(*backend, rng, c);
  }
}

// T5's relative position bias (encoder: bidirectional; decoder: causal buckets) on the split-KV
// kernel: prompts, a chunk over a cached prefix, decode rows, distances past max_distance.
TEST_F(CudaKernels, AttentionWithRelativePositionBias) {
  for (int head_dim : {8, 64}) {
    AttentionCase encoder{4, 4, head_dim, 4, 0, {11, 30}, {11, 30}};
    encoder.causal = false;
    encoder.bias_buckets = 32;
    encoder.bias_max_distance = 20;
    check_attention(*backend, rng, encoder);
    AttentionCase decoder{4, 4, head_dim, 4, 0, {1, 17, 1}, {9, 40, 300}};
    decoder.bias_buckets = 32;
    decoder.bias_max_distance = 128;
    check_attention(*backend, rng, decoder);
  }
}
// Decoder queries over each sequence's encoder K/V: more or fewer queries than keys, every key
// visible to every query, a long encoder output split over partitions.
TEST_F(CudaKernels, CrossAttentionSeesEveryEncoderKey) {
  for (int head_dim : {8, 64}) {
    AttentionCase c{4, 4, head_dim, 4, 0, {1, 9, 3}, {13, 5, 2000}};
    c.cross = true;
    check_attention(*backend, rng, c);
  }
}

// Few queries over long contexts: the launch splits the key range across blocks (flash-decoding)
// and combines the partitions; with a window most partitions of the range hold no visible key.
TEST_F(CudaKernels, AttentionSplitKvLongContextDecode) {
  check_attention(*backend, rng, {8, 2, 128, 16, 0, {1}, {4500}});
  check_attention(*backend, rng, {8, 2, 128, 7, 0, {1, 3}, {4100, 2900}});
  for (int window : {100, 1000})
    check_attention(*backend, rng, {4, 1, 64, 16, window, {1, 2}, {4200, 3000}});
  check_attention(*backend, rng, {2, 2, 80, 16, 0, {1}, {700}});
}
// Prompt chunks of >= 16 tokens run the tensor-core kernel: whole prompts, chunks over a cached
// prefix, a decode row in the same batch, several 64-row tiles, windows, odd block sizes.
TEST_F(CudaKernels, AttentionPrefillTensorCores) {
  for (int head_dim : {64, 80, 96, 128})
    for (int kv_heads : {4, 2, 1})
      check_attention(*backend, rng, {4, kv_heads, head_dim, 16, 0, {100, 1, 37}, {100, 50, 300}});
  check_attention(*backend, rng, {8, 1, 128, 7, 0, {200, 16}, {520, 16}});
  for (int window : {1, 20, 64, 100})
    check_attention(*backend, rng, {4, 2, 64, 16, window, {130, 17}, {130, 400}});
  check_attention(*backend, rng, {2, 2, 128, 16, 0, {512}, {1024}});
  // A SplitFuse step: prompt chunks next to decode rows over long contexts (those go to the decode
  // kernel), GQA group 4.
  check_attention(*backend, rng, {32, 8, 128, 16, 0, {300, 1, 1, 1, 64, 1}, {300, 1500, 40, 700, 2000, 64}});
  for (int window : {50, 400}) check_attention(*backend, rng, {8, 2, 64, 16, window, {1, 40, 1}, {900, 40, 30}});
}

// Decode batches (one new token per sequence) with head_dim 64/80/96/128 run the tensor-core
// decode kernel (256 the split-KV kernel): contexts shorter than a tile, GQA groups 1-16 (odd ones
// too), windows, odd block sizes, many sequences (no split).
TEST_F(CudaKernels, AttentionDecodeKernel) {
  for (int head_dim : {64, 80, 96, 128, 256})
    for (int kv_heads : {8, 2, 1})
      check_attention(*backend, rng, {8, kv_heads, head_dim, 16, 0, {1, 1, 1, 1}, {1, 5, 33, 700}});
  for (int heads : {16, 14, 5, 3}) check_attention(*backend, rng, {heads, heads == 14 ? 2 : 1, 128, 16, 0, {1, 1, 1}, {64, 65, 1000}});
  check_attention(*backend, rng, {4, 4, 128, 7, 0, {1, 1}, {129, 1500}});
  for (int window : {1, 30, 200}) check_attention(*backend, rng, {4, 1, 128, 16, window, {1, 1}, {10, 900}});
  check_attention(*backend, rng, {32, 8, 128, 16, 0, std::vector<int>(80, 1), std::vector<int>(80, 300)});
}

// A recorded decode launches for the cache's longest context: partitions size themselves from
// each sequence's own length, and those past it stay empty.
TEST_F(CudaKernels, AttentionSplitKvWithContextBound) {
  check_attention(*backend, rng, {32, 8, 128, 16, 0, {1}, {576}, 4096});
  check_attention(*backend, rng, {8, 2, 64, 16, 0, {1, 1, 1}, {5, 130, 1000}, 8192});
  check_attention(*backend, rng, {4, 1, 64, 16, 300, {1, 1}, {2000, 40}, 4096});
}

// The same kernels over fp8 e4m3 caches (flash_prefill.cu stages the bytes and widens them to bf16
// in shared memory, kernels.cu's split-KV kernel as it loads them; attention_decode.cu converts
// ldmatrix fragments of the staged bytes to f16 in registers, in a dim order of its own: a wrong
// fragment map scrambles scores or output dims, far past any tolerance, whenever a row sees two
// or more keys).
// Decode on the tensor-core kernel, at every head_dim 64/80/96/128: GQA groups 1, 4, 8, 16, 7 and
// 3 over a few sequences (split into partitions, most of them empty for the contexts shorter than
// a tile); many sequences in one partition each (several tiles, past the ring of stages), one
// group per head_dim; windows. Odd block sizes; head_dim 256 on the split-KV kernel.
// The many-sequence batch: 2640 (sequence, kv head) blocks, more than the split's counters (16 per
// SM: 2112 on an H100, fewer than 2640 up to 164 SMs), so it never splits; contexts from 1 to 450
// keys (1 to 8 tiles of 64).
AttentionCase many_decodes(int heads, int kv_heads, int head_dim) {
  constexpr int kContexts[] = {1, 9, 33, 64, 65, 130, 450};
  const int seqs = (2640 + kv_heads - 1) / kv_heads;
  AttentionCase c{heads, kv_heads, head_dim, 16, 0, std::vector<int>(seqs, 1), std::vector<int>(seqs)};
  for (int s = 0; s < seqs; ++s) c.context_lens[s] = kContexts[s % std::size(kContexts)];
  return c;
}

TEST_F(CudaKernels, AttentionFp8CacheDecodeKernel) {
  const DType fp8 = DType::F8E4M3;
  const std::pair<int, int> groups[] = {{8, 8}, {8, 2}, {8, 1}, {16, 1}, {14, 2}, {6, 2}};  // (heads, kv_heads)
  for (int head_dim : {64, 80, 96, 128}) {
    for (const auto& [heads, kv_heads] : groups)
      check_attention(*backend, rng, {heads, kv_heads, head_dim, 16, 0, {1, 1, 1, 1}, {1, 5, 33, 700}}, fp8,
                      kOneRounding);
    for (int window : {1, 30, 200})
      check_attention(*backend, rng, {8, 2, head_dim, 16, window, {1, 1}, {10, 900}}, fp8, kOneRounding);
  }
  // Unsplit: groups 16, 1, 7 and 4.
  check_attention(*backend, rng, many_decodes(128, 8, 64), fp8, kOneRounding);
  check_attention(*backend, rng, many_decodes(8, 8, 80), fp8, kOneRounding);
  check_attention(*backend, rng, many_decodes(56, 8, 96), fp8, kOneRounding);
  check_attention(*backend, rng, many_decodes(32, 8, 128), fp8, kOneRounding);
  check_attention(*backend, rng, {4, 4, 128, 7, 0, {1, 1}, {129, 1500}}, fp8, kOneRounding);
  for (int kv_heads : {8, 4, 2, 1})
    check_attention(*backend, rng, {8, kv_heads, 256, 16, 0, {1, 1, 1, 1}, {1, 5, 33, 700}}, fp8);
}
// Few decode rows over long contexts: split-KV partitions merged by the last one to finish, also
// with a recorded decode's context bound and with windows leaving most partitions empty (batches
// with a span of 2 or 3 tokens run on the split-KV kernel).
TEST_F(CudaKernels, AttentionFp8CacheSplitKvPartitions) {
  const DType fp8 = DType::F8E4M3;
  for (int head_dim : {64, 80, 96, 128})
    check_attention(*backend, rng, {8, 2, head_dim, 16, 0, {1}, {4500}}, fp8, kOneRounding);
  check_attention(*backend, rng, {8, 2, 128, 7, 0, {1, 3}, {4100, 2900}}, fp8);
  for (int window : {100, 1000}) check_attention(*backend, rng, {4, 1, 64, 16, window, {1, 2}, {4200, 3000}}, fp8);
  check_attention(*backend, rng, {32, 8, 128, 16, 0, {1}, {576}, 4096}, fp8, kOneRounding);
  check_attention(*backend, rng, {8, 2, 64, 16, 0, {1, 1, 1}, {5, 130, 1000}, 8192}, fp8, kOneRounding);
  check_attention(*backend, rng, {4, 1, 64, 16, 300, {1, 1}, {2000, 40}, 4096}, fp8, kOneRounding);
}
// 128K-token serving (issue 25): decode rows at 32K and 131,072 keys and a prompt chunk ending at
// 33K, on both cache dtypes, against the fp64 reference: a flat softmax (every key's value
// counts, the split-KV merge of hundreds of partitions) and a peaked one (q x 8: a few keys
// anywhere in the context decide the row, so a misplaced far block shows).
TEST_F(CudaKernels, AttentionAt32KAnd128KContexts) {
  for (const DType cache : {DType::BF16, DType::F8E4M3})
    for (const float q_scale : {1.0f, 8.0f}) {
      AttentionCase decode{8, 2, 128, 16, 0, {1, 1}, {32768, 131072}};
      decode.q_scale = q_scale;
      check_attention(*backend, rng, decode, cache);
      AttentionCase chunk{4, 1, 128, 16, 0, {32}, {33000}};
      chunk.q_scale = q_scale;
      check_attention(*backend, rng, chunk, cache);
    }
}
// Prompt chunks on the tensor-core prefill kernel: head_dim 64/80/96/128, GQA 1 to 8, chunks over
// cached prefixes, several 64-row tiles, windows, odd block sizes, and SplitFuse mixes (decode rows
// beside prompt chunks go to the decode kernel).
TEST_F(CudaKernels, AttentionFp8CachePrefillTensorCores) {
  const DType fp8 = DType::F8E4M3;
  for (int head_dim : {64, 80, 96, 128})
    for (int kv_heads : {8, 4, 2, 1})
      check_attention(*backend, rng, {8, kv_heads, head_dim, 16, 0, {100, 1, 37}, {100, 50, 300}}, fp8);
  check_attention(*backend, rng, {8, 1, 128, 7, 0, {200, 16}, {520, 16}}, fp8);
  for (int window : {1, 20, 64, 100})
    check_attention(*backend, rng, {4, 2, 64, 16, window, {130, 17}, {130, 400}}, fp8);
  check_attention(*backend, rng, {32, 8, 128, 16, 0, {300, 1, 1, 1, 64, 1}, {300, 1500, 40, 700, 2000, 64}}, fp8);
  for (int window : {50, 400}) check_attention(*backend, rng, {8, 2, 64, 16, window, {1, 40, 1}, {900, 40, 30}}, fp8);
}
// The split-KV kernel for what the tensor-core kernels do not take: head_dim 8 (8-byte words), 12
// (one element at a time), 256, short chunks.
TEST_F(CudaKernels, AttentionFp8CacheGenericKernel) {
  const DType fp8 = DType::F8E4M3;
  for (int head_dim : {8, 12, 256})
    for (int kv_heads : {4, 1})
      check_attention(*backend, rng, {8, kv_heads, head_dim, 16, 0, {1, 7, 13, 1}, {1, 40, 13, 77}}, fp8);
  check_attention(*backend, rng, {4, 2, 12, 16, 33, {9, 1, 20}, {30, 61, 20}}, fp8);
  check_attention(*backend, rng, {2, 2, 256, 16, 0, {1}, {3000}}, fp8);
}

// sample(): the CUDA kernel's radix selects against the CPU backend's sort-based rule on the same
// logits, seeds and steps: the same tokens (greedy, temperature, top-k, top-p, min-p, all).
TEST_F(CudaKernels, SampleMatchesTheCpuRule) {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  const int64_t vocab = 32000;
  const std::vector<SamplingRow> settings = {{0.0f},           {0.8f},           {1.0f, 40},
                                             {1.0f, 0, 0.9f},  {1.2f, 0, 1.0f, 0.05f}, {0.7f, 50, 0.8f, 0.02f},
                                             {1.0f, 1},        {1.0f, 0, 0.01f}};
  const int draws = 64;
  const int64_t count = static_cast<int64_t>(settings.size()) * draws;
  std::vector<float> logits = random_values(rng, count * vocab, -4.0f, 4.0f);
  for (int64_t r = 0; r < count; r += 3) logits[r * vocab + r % vocab] = 12.0f;  // a peaked row now and then
  std::vector<SamplingRow> rows(count);
  for (int64_t r = 0; r < count; ++r) {
    rows[r] = settings[r / draws];
    rows[r].seed = 7;
    rows[r].step = static_cast<uint64_t>(r);
  }
  std::vector<int32_t> expected(count), got(count);
  {
    DeviceBuffer l = cpu->allocate(DType::F32, {count, vocab}), p = cpu->allocate(DType::I32, {count, kSamplingRowWords}),
                 t = cpu->allocate(DType::I32, {count});
    cpu->copy_to_device(logits.data(), l.view());
    cpu->copy_to_device(rows.data(), p.view());
    cpu->sample(l.view(), p.view(), t.view());
    cpu->copy_to_host(t.view(), expected.data());
  }
  DeviceBuffer l = to_device_f32(*backend, logits, {count, vocab});
  DeviceBuffer p = backend->allocate(DType::I32, {count, kSamplingRowWords});
  backend->copy_to_device(rows.data(), p.view());
  DeviceBuffer t = backend->allocate(DType::I32, {count});
  backend->sample(l.view(), p.view(), t.view());
  backend->copy_to_host(t.view(), got.data());
  for (int64_t r = 0; r < count; ++r)
    EXPECT_EQ(got[r], expected[r]) << "row " << r << " (setting " << r / draws << ")";
}
// Greedy sample(): the first index of the row's largest value (std::max_element), also for rows
// that are not 16-byte aligned (vocab % 4 != 0), a maximum in the scalar tail, ties in different
// threads' words and a row of -inf.
TEST_F(CudaKernels, GreedySampleIsTheFirstArgmax) {
  for (const int64_t vocab : {int64_t{1}, int64_t{7}, int64_t{32000}, int64_t{32003}, int64_t{128256}}) {
    const int64_t count = 5;
    std::vector<float> logits = random_values(rng, count * vocab, -4.0f, 4.0f);
    float* rows = logits.data();
    rows[1 * vocab + vocab - 1] = 9.0f;                                      // the last element
    rows[2 * vocab + vocab / 2] = rows[2 * vocab + vocab / 3] = 9.0f;        // a tie: vocab / 3 wins
    std::fill(rows + 3 * vocab, rows + 4 * vocab, -std::numeric_limits<float>::infinity());
    rows[4 * vocab + std::max<int64_t>(0, vocab - 2)] = 9.0f;                // in the tail when vocab % 4 != 0
    std::vector<int32_t> expected(count), got(count);
    for (int64_t r = 0; r < count; ++r)
      expected[r] = static_cast<int32_t>(std::max_element(rows + r * vocab, rows + (r + 1) * vocab) - (rows + r * vocab));
    DeviceBuffer l = to_device_f32(*backend, logits, {count, vocab});
    const std::vector<SamplingRow> greedy(count);  // temperature 0
    DeviceBuffer p = backend->allocate(DType::I32, {count, kSamplingRowWords});
    backend->copy_to_device(greedy.data(), p.view());
    DeviceBuffer t = backend->allocate(DType::I32, {count});
    backend->sample(l.view(), p.view(), t.view());
    backend->copy_to_host(t.view(), got.data());
    EXPECT_EQ(got, expected) << "vocab " << vocab;
  }
}
TEST_F(CudaKernels, AttentionRejectsHeadDimPastLimit) {
  DeviceBuffer qkv = backend->allocate(DType::BF16, {1, 3 * 512}), out = backend->allocate(DType::BF16, {1, 512});
  DeviceBuffer k = backend->allocate(DType::BF16, {1, 4, 1, 512}), i = backend->allocate(DType::I32, {2});
  const AttentionParams params{1, 1, 512, 4, 1.0f, 0};
  EXPECT_THROW(backend->attention(qkv.view(), k.view(), k.view(),
                                  {i.view(), i.view().rows(0, 1), i.view().rows(0, 1).reshape({1, 1}), 1, 1}, params,
                                  out.view()),
               Error);
}
TEST_F(CudaKernels, AttentionRejectsContextBelowQueryLength) {
  DeviceBuffer qkv = backend->allocate(DType::BF16, {2, 3 * 8}), out = backend->allocate(DType::BF16, {2, 8});
  DeviceBuffer k = backend->allocate(DType::BF16, {1, 4, 1, 8}), i = backend->allocate(DType::I32, {2});
  const AttentionParams params{1, 1, 8, 4, 1.0f, 0};
  EXPECT_THROW(backend->attention(qkv.view(), k.view(), k.view(),
                                  {i.view(), i.view().rows(0, 1), i.view().rows(0, 1).reshape({1, 1}), 2, 1}, params,
                                  out.view()),
               Error);
}

double activate_ref(double x, Activation act) {
  switch (act) {
    case Activation::SiLU: return x / (1 + std::exp(-x));
    case Activation::GELU: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::GELUTanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::ReLU: return x > 0 ? x : 0;
  }
  return x;
}

// inner 700: the scalar kernel; 704 (a multiple of 8): 16-byte words.
TEST_F(CudaKernels, ActivationsPlainAndGated) {
  const int64_t tokens = 3;
  for (int64_t inner : {700, 704}) {
    for (Activation act : {Activation::SiLU, Activation::GELU, Activation::GELUTanh, Activation::ReLU})
      for (bool gated : {false, true}) {
        const int64_t in_width = gated ? 2 * inner : inner;
        std::vector<float> x = random_values(rng, tokens * in_width, -4.0f, 4.0f);
        DeviceBuffer d_x = to_device_bf16(*backend, x, {tokens, in_width});
        DeviceBuffer out = backend->allocate(DType::BF16, {tokens, inner});
        poison_bf16(*backend, out.view());
        backend->activation(d_x.view(), act, gated, out.view());
        std::vector<double> ref(tokens * inner);
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t j = 0; j < inner; ++j)
            ref[t * inner + j] =
                activate_ref(x[t * in_width + j], act) * (gated ? static_cast<double>(x[t * in_width + inner + j]) : 1.0);
        EXPECT_LE(relative_error(to_host(*backend, out.view()), ref), kOneRounding)
            << "inner " << inner << " act " << static_cast<int>(act) << " gated " << gated;
      }
  }
}

// The MLP's up projection + activation: fused in one GEMV for decode rows (m <= the GEMV limit,
// gated), matmul then activation otherwise, with and without the input norm; both against the fp64
// product of the bf16 inputs.
TEST_F(CudaKernels, MatmulActivationFusedAndNot) {
  const int64_t inner = 72;
  for (int64_t k : {264, 1032})  // 264: the GEMV's tail loop alone; 1032: its unrolled loop, then the tail
    for (int64_t m : {1, 2, 5})
      for (Activation act : {Activation::SiLU, Activation::GELUTanh})
        for (bool with_bias : {false, true}) {
          const NormKind norm_kind = with_bias                   ? NormKind::Unit
                                     : act == Activation::SiLU ? NormKind::Weighted
                                                               : NormKind::None;
          std::vector<float> x = random_values(rng, m * k), w = random_values(rng, 2 * inner * k, -0.2f, 0.2f);
          const std::vector<float> b = random_values(rng, 2 * inner);
          DeviceBuffer d_x = to_device_bf16(*backend, x, {m, k}), d_w = to_device_bf16(*backend, w, {2 * inner, k});
          DeviceBuffer d_b = to_device_f32(*backend, b, {2 * inner});
          DeviceBuffer product = backend->allocate(DType::BF16, {m, 2 * inner}), out = backend->allocate(DType::BF16, {m, inner});
          poison_bf16(*backend, out.view());
          const NormCase norm = make_norm(*backend, rng, norm_kind, m, k);
          const std::vector<double> x_in = matmul_input_ref(x, m, k, norm);
          backend->matmul_activation(norm.input(m), d_x.view(), d_w.view(), with_bias ? d_b.view() : DeviceTensor{}, act,
                                     true, product.view(), out.view());
          std::vector<double> ref(m * inner);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < inner; ++j) {
              double gate = with_bias ? b[j] : 0.0, up = with_bias ? b[inner + j] : 0.0;
              for (int64_t c = 0; c < k; ++c) {
                gate += x_in[r * k + c] * w[j * k + c];
                up += x_in[r * k + c] * w[(inner + j) * k + c];
              }
              // Unfused, the product is stored in bf16 before the activation reads it.
              if (norm.stored(m)) gate = bf16_round(static_cast<float>(gate)), up = bf16_round(static_cast<float>(up));
              ref[r * inner + j] = activate_ref(gate, act) * up;
            }
          EXPECT_LE(relative_error(to_host(*backend, out.view()), ref), kBf16Compute)
              << "m " << m << " act " << static_cast<int>(act) << " bias " << with_bias << " norm "
              << static_cast<int>(norm_kind) << " k " << k;
        }
}

// A norm weight folded into its matrix: w[:, c] * (offset + g[c]) rounded once to bf16.
TEST_F(CudaKernels, FoldNormWeightScalesColumns) {
  const int64_t rows = 37, cols = 264;
  std::vector<float> w = random_values(rng, rows * cols);
  const std::vector<float> g = random_values(rng, cols, -0.5f, 0.5f);
  DeviceBuffer d_w = to_device_bf16(*backend, w, {rows, cols}), d_g = to_device_f32(*backend, g, {cols});
  ASSERT_TRUE(backend->fold_norm_weight(d_w.view(), d_g.view(), 1.0f));
  std::vector<double> ref(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ref[r * cols + c] = double{w[r * cols + c]} * (1.0 + g[c]);
  EXPECT_LE(relative_error(to_host(*backend, d_w.view()), ref), kOneRounding);
  EXPECT_THROW(backend->fold_norm_weight(d_w.view(), d_g.view().rows(0, cols - 8), 1.0f), Error);
}

TEST_F(CudaKernels, GatherRowsBf16AndF32) {
  const int64_t rows = 9, cols = 33;
  std::vector<float> x = random_values(rng, rows * cols);
  const std::vector<int32_t> pick = {8, 0, 3, 3};
  DeviceBuffer d_pick = to_device_i32(*backend, pick, {4});
  DeviceBuffer d_bf16 = to_device_bf16(*backend, x, {rows, cols}), d_f32 = to_device_f32(*backend, x, {rows, cols});
  std::vector<double> ref;
  for (int32_t r : pick) ref.insert(ref.end(), x.begin() + r * cols, x.begin() + (r + 1) * cols);
  for (const DeviceBuffer* src : {&d_bf16, &d_f32}) {
    DeviceBuffer out = backend->allocate(src->view().dtype, {4, cols});
    backend->gather_rows(src->view(), d_pick.view(), out.view());
    EXPECT_EQ(relative_error(to_host(*backend, out.view()), ref), 0.0) << dtype_name(src->view().dtype);
  }
}

TEST_F(CudaKernels, ScatterRowsAndGatherOfFp8Rows) {
  // An fp8 cache's rows (one byte an element, rows of an even byte count) out and back in.
  const int64_t rows = 7, cols = 6;
  std::vector<uint8_t> table(rows * cols, 0), packed(3 * cols);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(i + 1);
  DeviceBuffer d_table = backend->allocate(DType::F8E4M3, {rows, cols});
  DeviceBuffer d_packed = backend->allocate(DType::F8E4M3, {3, cols});
  backend->copy_to_device(packed.data(), d_packed.view());
  const std::vector<int32_t> where = {6, 0, 3};
  DeviceBuffer d_where = to_device_i32(*backend, where, {3});
  backend->scatter_rows(d_packed.view(), d_where.view(), d_table.view());
  backend->copy_to_host(d_table.view(), table.data());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < cols; ++c) EXPECT_EQ(table[where[r] * cols + c], packed[r * cols + c]) << r << " " << c;
  EXPECT_EQ(table[1 * cols], 0);
  DeviceBuffer d_back = backend->allocate(DType::F8E4M3, {3, cols});
  backend->gather_rows(d_table.view(), d_where.view(), d_back.view());
  std::vector<uint8_t> back(3 * cols);
  backend->copy_to_host(d_back.view(), back.data());
  EXPECT_EQ(back, packed);
}

TEST_F(CudaKernels, PoolRowsTakesFirstLastOrMeanOfEachSpanBf16AndF32) {
  // Spans as an embedding step has them: many short ones, one long.
  const int64_t cols = 384;
  std::vector<int32_t> offsets = {0};
  for (int32_t length : {1, 7, 32, 3, 300, 2}) offsets.push_back(offsets.back() + length);
  const int64_t rows = offsets.back(), spans = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<float> x = random_values(rng, rows * cols);
  DeviceBuffer d_offsets = to_device_i32(*backend, offsets, {spans + 1});
  DeviceBuffer d_bf16 = to_device_bf16(*backend, x, {rows, cols}), d_f32 = to_device_f32(*backend, x, {rows, cols});
  for (const Pooling pooling : {Pooling::Cls, Pooling::Mean, Pooling::Last}) {
    std::vector<double> ref;
    for (int64_t s = 0; s < spans; ++s)
      for (int64_t c = 0; c < cols; ++c) {
        double value = 0.0;
        if (pooling == Pooling::Cls) value = x[offsets[s] * cols + c];
        if (pooling == Pooling::Last) value = x[(offsets[s + 1] - 1) * cols + c];
        if (pooling == Pooling::Mean) {
          for (int32_t r = offsets[s]; r < offsets[s + 1]; ++r) value += x[r * cols + c];
          value /= offsets[s + 1] - offsets[s];
        }
        ref.push_back(value);
      }
    for (const DeviceBuffer* src : {&d_bf16, &d_f32}) {
      DeviceBuffer out = backend->allocate(DType::F32, {spans, cols});
      backend->pool_rows(src->view(), d_offsets.view(), pooling, out.view());
      // x holds bf16-exact values (to_device_bf16 rounded them): only the fp32 sum rounds.
      EXPECT_LE(relative_error(to_host(*backend, out.view()), ref), 1e-6)
          << dtype_name(src->view().dtype) << " pooling " << static_cast<int>(pooling);
    }
  }
}

TEST(CudaBackend, RejectsMissingDevice) {
  SF_REQUIRE_GPU();
#ifdef SPLITFLOW_HAS_CUDA
  EXPECT_THROW(make_cuda_backend(1 << 20), Error);
#endif
}

TEST(CudaBackend, ActivationDtypeIsBf16AndUploadKeepsVectorsF32) {
  SF_REQUIRE_GPU();
  std::unique_ptr<Backend> backend = make_test_cuda_backend();
  EXPECT_EQ(backend->activation_dtype(), DType::BF16);
  Tensor vec = Tensor::zeros(DType::BF16, {4});
  for (int i = 0; i < 4; ++i) vec.as<uint16_t>()[i] = f32_to_bf16(0.5f * i);
  DeviceBuffer d = backend->upload(vec);
  ASSERT_EQ(d.view().dtype, DType::F32);
  std::vector<float> back(4);
  backend->copy_to_host(d.view(), back.data());
  EXPECT_EQ(back, (std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f}));
}

}  // namespace
