// Quantized weights on the CUDA backend (backend/cuda/quant_*.cu): every quantized type of
// core/dtype.h, uploaded packed, against the CPU reference codecs (quant::dequantize, fp64 dots).
// The decode GEMVs (m <= 8) decode blocks in registers; 9 to 64 rows go through the int8
// tensor-core GEMM for Q4_0, Q5_0, Q8_0, Q4_K and Q6_K (opt-in, switched on for the int8 path's
// run; same reference as the int8 GEMVs); prefill
// (m = 100, and the other types) through a bf16 dequantization scratch and cuBLASLt. Skips without a GPU. Each test runs on the three GEMV paths:
// int8 activations (the default: x quantized per 32 elements, dp4a), fp32 activations
// (SPLITFLOW_CUDA_Q8_ACTIVATIONS=0) and the tensor-core path (SPLITFLOW_QUANT_MMA=1).
//
// Tolerances: f32 outputs of the GEMVs differ from the fp64 product of the CPU-dequantized weights
// only by fp32 summation (and an fma where the CPU multiplies then adds), so ‖err‖/‖ref‖ < 1e-5;
// a wrong scale or code anywhere in a row is far above that. On the int8-activation path the
// reference multiplies the same weights with x quantized by the same rule (q8_rows: this test's
// own code, d = max |v| / 127, codes rounded to nearest even, as the CPU backend's rule), so the
// same bound holds. FP8 weights multiply fp16 x by default (quant_f8x.cuh): f32 outputs within
// kF16Activations. bf16 outputs round once (kOneRounding); prefill rounds the weights to bf16 too
// (kBf16Compute). embed() from a quantized table rounds each dequantized value to bf16 once: within
// 2^-8 relative of the CPU value (bf16's half ulp, with slack for the fma).
#include "backend_cuda/cuda_test_util.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "backend/cuda/quant_kernels.h"
#endif

#include "quant/quant.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

using namespace splitflow;
using namespace splitflow::test;

namespace {

enum class GemvPath { Q8Activations, Fp32Activations, TensorCore };

// Which path a type takes (quant_kernels.h); a build without CUDA runs none of these tests (they
// skip), but compiles them.
#ifdef SPLITFLOW_HAS_CUDA
bool has_q8_gemv(DType type) { return cuda::quant_q8_activations(type); }
bool has_q8_gemm(DType type) { return cuda::quant_q8_gemm_type(type); }
bool has_f16_gemv(DType type) { return cuda::quant_f16_activations(type); }
constexpr int64_t kGemvRows = cuda::kMaxQuantGemvRows, kGemmRows = cuda::kMaxQuantGemmRows;
#else
bool has_q8_gemv(DType) { return false; }
bool has_q8_gemm(DType) { return false; }
bool has_f16_gemv(DType) { return false; }
constexpr int64_t kGemvRows = 8, kGemmRows = 64;
#endif

constexpr double kF16Activations = 2e-3;

class CudaQuant : public ::testing::TestWithParam<GemvPath> {
 protected:
  void SetUp() override {
    SF_REQUIRE_GPU();
    if (GetParam() != GemvPath::Q8Activations) {
      setenv("SPLITFLOW_CUDA_Q8_ACTIVATIONS", "0", 1);
      setenv("SPLITFLOW_CUDA_F16_ACTIVATIONS", "0", 1);
    }
    if (GetParam() == GemvPath::TensorCore) setenv("SPLITFLOW_QUANT_MMA", "1", 1);
    if (GetParam() == GemvPath::Q8Activations) setenv("SPLITFLOW_QUANT_GEMM", "1", 1);  // opt-in, tested here
    backend = make_test_cuda_backend();
  }
  void TearDown() override {
    unsetenv("SPLITFLOW_QUANT_MMA");
    unsetenv("SPLITFLOW_QUANT_GEMM");
    unsetenv("SPLITFLOW_CUDA_Q8_ACTIVATIONS");
    unsetenv("SPLITFLOW_CUDA_F16_ACTIVATIONS");
  }
  // Whether a GEMV of m rows on `packed` multiplies with int8 x (every run's type has that path).
  // Up to 8 rows the GEMVs, 9 to 64 the int8 tensor-core GEMM for its types (quant_gemm_q8.cu).
  bool q8(const Tensor& packed, int64_t m) const {
    if (GetParam() != GemvPath::Q8Activations || m > kGemmRows) return false;
    const auto has_path = [&](DType type) { return m <= kGemvRows ? has_q8_gemv(type) : has_q8_gemm(type); };
    if (packed.dtype != DType::Mixed) return has_path(packed.dtype);
    for (const RowRun& run : *packed.row_runs)
      if (!has_path(run.dtype)) return false;
    return true;
  }
  // Whether it multiplies with fp16 x (FP8 weights): fp16 rounding of x and of 8-term partial sums,
  // about 2^-11 relative, so f32 outputs are held to kF16Activations instead of 1e-5.
  bool f16(const Tensor& packed, int64_t m) const {
    return GetParam() == GemvPath::Q8Activations && m <= 2 && has_f16_gemv(packed.dtype);
  }
  std::unique_ptr<Backend> backend;
  std::mt19937_64 rng{20261128};
};

// x as the int8-activation GEMVs see it: each 32-element block of v = x (times offset + g, with
// a weight) quantized with d = max |v| / 127 and codes v * (1 / d) rounded to nearest even, then
// d * code; in fp32, as the kernel computes v, d and the codes.
std::vector<double> q8_rows(const std::vector<float>& x, int64_t m, int64_t k, const std::vector<float>* g,
                            float offset) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < k; b += 32) {
      float v[32], amax = 0.0f;
      for (int e = 0; e < 32; ++e) {
        v[e] = x[r * k + b + e];
        if (g != nullptr) v[e] *= offset + (*g)[b + e];
        amax = std::max(amax, std::fabs(v[e]));
      }
      const float d = amax / 127.0f, inverse = d != 0.0f ? 1.0f / d : 0.0f;
      for (int e = 0; e < 32; ++e) out[r * k + b + e] = double{d} * std::nearbyint(v[e] * inverse);
    }
  return out;
}

// A quantized host matrix and its CPU dequantization.
struct QuantCase {
  Tensor packed;
  std::vector<float> dequantized;  // [n, k]
};

Tensor f32_matrix(std::vector<float>& values, int64_t n, int64_t k) {
  Tensor t = Tensor::zeros(DType::F32, {n, k});
  std::memcpy(t.data, values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> dequantized_of(const Tensor& packed) {
  const Tensor f32 = quant::dequantize(packed);
  return std::vector<float>(f32.as<float>(), f32.as<float>() + f32.numel());
}

QuantCase make_quant(std::mt19937_64& rng, DType type, int64_t n, int64_t k) {
  std::vector<float> w = random_values(rng, n * k, -0.5f, 0.5f);
  QuantCase c;
  c.packed = quant::quantize(f32_matrix(w, n, k), type);
  c.dequantized = dequantized_of(c.packed);
  return c;
}

// A Mixed matrix: runs of rows of the given types, each quantized apart, bytes back to back.
QuantCase make_mixed(std::mt19937_64& rng, const std::vector<RowRun>& runs, int64_t k) {
  int64_t n = 0;
  size_t bytes = 0;
  for (const RowRun& run : runs) {
    n += run.rows;
    bytes += dtype_row_bytes(run.dtype, k) * run.rows;
  }
  QuantCase c;
  c.packed = Tensor::zeros(DType::U8, {static_cast<int64_t>(bytes)});
  c.packed.dtype = DType::Mixed;
  c.packed.shape = {n, k};
  c.packed.row_runs = std::make_shared<const std::vector<RowRun>>(runs);
  size_t at = 0;
  for (const RowRun& run : runs) {
    std::vector<float> w = random_values(rng, run.rows * k, -0.5f, 0.5f);
    const Tensor part = quant::quantize(f32_matrix(w, run.rows, k), run.dtype);
    std::memcpy(static_cast<uint8_t*>(c.packed.data) + at, part.data, part.nbytes());
    at += part.nbytes();
  }
  c.dequantized = dequantized_of(c.packed);
  return c;
}

std::vector<DType> all_quantized() {
  std::vector<DType> types;
  for (const quant::TypeInfo& info : quant::all_types()) types.push_back(info.type);
  return types;
}

// y = x w^T (+ bias) (+ y0) through matmul() against the fp64 product of the CPU-dequantized w.
void check_matmul(Backend& backend, std::mt19937_64& rng, const QuantCase& w, int64_t m, bool bias_on,
                  bool accumulate, bool f32_out, bool q8, bool f16, const std::string& what) {
  const int64_t n = w.packed.dim(0), k = w.packed.dim(1);
  std::vector<float> x = random_values(rng, m * k);
  const std::vector<float> bias = random_values(rng, n);
  std::vector<float> y0 = random_values(rng, m * n);
  DeviceBuffer d_w = backend.upload(w.packed);
  DeviceBuffer d_x = to_device_bf16(backend, x, {m, k});
  DeviceBuffer d_bias = to_device_f32(backend, bias, {n});
  DeviceBuffer y = f32_out ? to_device_f32(backend, y0, {m, n}) : to_device_bf16(backend, y0, {m, n});
  backend.matmul(d_x.view(), d_w.view(), bias_on ? d_bias.view() : DeviceTensor{}, y.view(), accumulate);
  const std::vector<double> xin = q8 ? q8_rows(x, m, k, nullptr, 0.0f) : std::vector<double>(x.begin(), x.end());
  std::vector<double> ref(m * n);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double sum = (bias_on ? bias[j] : 0.0) + (accumulate ? y0[r * n + j] : 0.0);
      for (int64_t c = 0; c < k; ++c) sum += xin[r * k + c] * w.dequantized[j * k + c];
      ref[r * n + j] = sum;
    }
  const double tolerance = m > 8 && !q8 ? kBf16Compute : f32_out ? (f16 ? kF16Activations : 1e-5) : kOneRounding;
  EXPECT_LE(relative_error(to_host(backend, y.view()), ref), tolerance)
      << what << " m " << m << " k " << k << (f32_out ? " f32" : " bf16") << (accumulate ? " accumulate" : "")
      << (q8 ? " q8 x" : "") << (f16 ? " f16 x" : "");
}

TEST_P(CudaQuant, WeightDtypesListEveryQuantizedType) {
  const std::span<const DType> listed = backend->weight_dtypes();
  for (DType type : all_quantized())
    EXPECT_NE(std::find(listed.begin(), listed.end(), type), listed.end()) << dtype_name(type);
}

TEST_P(CudaQuant, UploadKeepsThePackedBytesAndDeclinesNormFolding) {
  for (DType type : {DType::Q4_0, DType::Q6_K, DType::Q3H_B64, DType::F8_G128}) {
    const QuantCase w = make_quant(rng, type, 16, 256);
    DeviceBuffer d_w = backend->upload(w.packed);
    EXPECT_EQ(d_w.view().dtype, type);
    EXPECT_EQ(d_w.view().nbytes(), w.packed.nbytes()) << dtype_name(type);
    const std::vector<uint8_t> bytes = bytes_to_host(*backend, d_w.view());
    EXPECT_EQ(std::memcmp(bytes.data(), w.packed.data, bytes.size()), 0) << dtype_name(type);
    std::vector<float> g(256, 0.5f);
    DeviceBuffer d_g = to_device_f32(*backend, g, {256});
    EXPECT_FALSE(backend->fold_norm_weight(d_w.view(), d_g.view(), 1.0f)) << dtype_name(type);
    EXPECT_EQ(bytes_to_host(*backend, d_w.view()), bytes) << dtype_name(type) << " unchanged";
  }
}

TEST_P(CudaQuant, MatmulEveryTypeDecodeAndPrefill) {
  for (DType type : all_quantized())
    for (int64_t k : {256, 768}) {
      const QuantCase w = make_quant(rng, type, 40, k);
      const std::string what(dtype_name(type));
      check_matmul(*backend, rng, w, 1, true, false, true, q8(w.packed, 1), f16(w.packed, 1), what);
      check_matmul(*backend, rng, w, 1, false, false, false, q8(w.packed, 1), f16(w.packed, 1), what);
      check_matmul(*backend, rng, w, 3, true, true, true, q8(w.packed, 3), f16(w.packed, 3), what);
      check_matmul(*backend, rng, w, 4, false, false, true, q8(w.packed, 4), f16(w.packed, 4), what);
      check_matmul(*backend, rng, w, 8, true, true, false, q8(w.packed, 8), f16(w.packed, 8), what);
      check_matmul(*backend, rng, w, 16, false, true, true, q8(w.packed, 16), f16(w.packed, 16), what);
      check_matmul(*backend, rng, w, 37, true, false, k == 768, q8(w.packed, 37), f16(w.packed, 37), what);
      check_matmul(*backend, rng, w, 64, true, true, true, q8(w.packed, 64), f16(w.packed, 64), what);
      check_matmul(*backend, rng, w, 100, true, k == 256, k == 768, q8(w.packed, 100), f16(w.packed, 100), what);
    }
}

TEST_P(CudaQuant, MatmulMixedRowRuns) {
  // Gemma 3 Q4_K_M's fused QKV (q/k Q5_0, v Q8_0) and a K-quant one (Q4_K, v Q6_K).
  const std::vector<std::vector<RowRun>> cases = {{{DType::Q5_0, 32}, {DType::Q8_0, 16}},
                                                  {{DType::Q4_K, 24}, {DType::Q6_K, 8}, {DType::Q4_K, 8}}};
  for (const auto& runs : cases) {
    const QuantCase w = make_mixed(rng, runs, 512);
    for (int64_t m : {1, 4, 20, 100})
      check_matmul(*backend, rng, w, m, m != 4, m == 4, m != 100, q8(w.packed, m), f16(w.packed, m), "mixed");
  }
}

TEST_P(CudaQuant, EmbedDequantizesEveryTypeAsTheCpu) {
  const int64_t vocab = 12, hidden = 256;
  const std::vector<int32_t> ids = {3, 0, 11, 3, 7};
  const auto tokens = static_cast<int64_t>(ids.size());
  DeviceBuffer d_ids = to_device_i32(*backend, ids, {tokens});
  for (DType type : all_quantized()) {
    const QuantCase table = make_quant(rng, type, vocab, hidden);
    DeviceBuffer d_table = backend->upload(table.packed);
    DeviceBuffer out = backend->allocate(DType::BF16, {tokens, hidden});
    backend->embed(d_table.view(), d_ids.view(), 2.0f, {}, {}, out.view());
    const std::vector<float> got = to_host(*backend, out.view());
    int bad = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < hidden; ++c) {
        const double ref = 2.0 * table.dequantized[ids[t] * hidden + c];
        if (std::abs(got[t * hidden + c] - ref) > std::abs(ref) * 0x1p-8 + 1e-30) ++bad;
      }
    EXPECT_EQ(bad, 0) << dtype_name(type);
  }
}

// The input rows a fused GEMV multiplies, in fp64: x / rms(x) * (offset + g) (unit: g = 1, offset 0).
// With int8 activations (q8) the kernel quantizes x * (offset + g) and applies 1 / rms(x) to the
// product: so does this.
std::vector<double> normed_rows(const std::vector<float>& x, int64_t m, int64_t k, const std::vector<float>& g,
                                float offset, bool on, bool q8) {
  std::vector<double> out = q8 ? q8_rows(x, m, k, on ? &g : nullptr, offset) : std::vector<double>(x.begin(), x.end());
  if (!on) return out;
  for (int64_t r = 0; r < m; ++r) {
    double squares = 0.0;
    for (int64_t c = 0; c < k; ++c) squares += double{x[r * k + c]} * x[r * k + c];
    const double inv = 1.0 / std::sqrt(squares / static_cast<double>(k) + 1e-5);
    for (int64_t c = 0; c < k; ++c) out[r * k + c] = q8 ? out[r * k + c] * inv : x[r * k + c] * inv * (offset + g[c]);
  }
  return out;
}

enum class Norm { None, Weighted, Unit };

TEST_P(CudaQuant, GatedMlpFusedWithNormWeight) {
  const int64_t inner = 48, k = 512;
  for (DType type : {DType::Q4_0, DType::Q4_K, DType::Q6_K, DType::Q3H_B64, DType::F8_G128})
    for (Norm norm : {Norm::None, Norm::Weighted, Norm::Unit})
      for (int64_t m : {1, 3, 8}) {
        const QuantCase w = make_quant(rng, type, 2 * inner, k);
        std::vector<float> x = random_values(rng, m * k);
        const std::vector<float> bias = random_values(rng, 2 * inner);
        const std::vector<float> g = norm == Norm::Weighted ? random_values(rng, k, -0.5f, 0.5f)
                                                             : std::vector<float>(k, 1.0f);
        const float offset = norm == Norm::Weighted ? 1.0f : 0.0f;  // Gemma's (1 + weight)
        DeviceBuffer d_w = backend->upload(w.packed), d_x = to_device_bf16(*backend, x, {m, k});
        DeviceBuffer d_bias = to_device_f32(*backend, bias, {2 * inner}), d_g = to_device_f32(*backend, g, {k});
        DeviceBuffer normed = backend->allocate(DType::BF16, {m, k});
        DeviceBuffer product = backend->allocate(DType::BF16, {m, 2 * inner});
        DeviceBuffer out = backend->allocate(DType::BF16, {m, inner});
        InputNorm input;
        if (norm != Norm::None)
          input = {d_g.view(), {}, NormParams{NormType::RMSNorm, 1e-5f, offset}, normed.view(), norm == Norm::Unit};
        backend->matmul_activation(input, d_x.view(), d_w.view(), d_bias.view(), Activation::SiLU, true,
                                   product.view(), out.view());
        const std::vector<double> xin = normed_rows(x, m, k, g, offset, norm != Norm::None, q8(w.packed, m));
        std::vector<double> ref(m * inner);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < inner; ++j) {
            double gate = bias[j], up = bias[inner + j];
            for (int64_t c = 0; c < k; ++c) {
              gate += xin[r * k + c] * w.dequantized[j * k + c];
              up += xin[r * k + c] * w.dequantized[(inner + j) * k + c];
            }
            ref[r * inner + j] = gate / (1.0 + std::exp(-gate)) * up;
          }
        EXPECT_LE(relative_error(to_host(*backend, out.view()), ref), kOneRounding)
            << dtype_name(type) << " norm " << static_cast<int>(norm) << " m " << m;
      }
}

// The QKV projection with RoPE and the KV write, fused on single-type quantized weights (unfused
// on Mixed ones), with a weighted input norm; qkv and the caches against the fp64 reference (bf16 cache) or the host
// encoder of the kernel's qkv values (fp8 cache).
void check_qkv(Backend& backend, std::mt19937_64& rng, const QuantCase& w, int64_t m, Norm norm, DType cache_dtype,
               bool q8, const std::string& what) {
  const int heads = 4, kv_heads = 2, head_dim = 32, rotary_dim = 32, half = rotary_dim / 2, block_size = 4, blocks = 3;
  const int64_t k = w.packed.dim(1), width = (heads + 2 * kv_heads) * head_dim, q_dim = heads * head_dim;
  const int64_t kv_dim = kv_heads * head_dim, table_len = 10;
  ASSERT_EQ(w.packed.dim(0), width);
  std::vector<float> x = random_values(rng, m * k);
  const std::vector<float> bias = random_values(rng, width), table = random_values(rng, table_len * 2 * half);
  const std::vector<float> g = random_values(rng, k, -0.5f, 0.5f);
  std::vector<int32_t> table_rows(m), slots(m);
  for (int64_t r = 0; r < m; ++r) {
    table_rows[r] = static_cast<int32_t>((3 * r + 1) % table_len);
    slots[r] = r == 1 ? -1 : static_cast<int32_t>((5 * r + 2) % (blocks * block_size));
  }
  DeviceBuffer d_w = backend.upload(w.packed), d_x = to_device_bf16(backend, x, {m, k});
  DeviceBuffer d_bias = to_device_f32(backend, bias, {width}), d_table = to_device_f32(backend, table, {table_len, 2, half});
  DeviceBuffer d_rows = to_device_i32(backend, table_rows, {m}), d_slots = to_device_i32(backend, slots, {m});
  DeviceBuffer d_g = to_device_f32(backend, g, {k}), normed = backend.allocate(DType::BF16, {m, k});
  DeviceBuffer qkv = backend.allocate(DType::BF16, {m, width});
  DeviceBuffer k_cache = backend.allocate(cache_dtype, {blocks, block_size, kv_heads, head_dim});
  DeviceBuffer v_cache = backend.allocate(cache_dtype, {blocks, block_size, kv_heads, head_dim});
  poison_bf16(backend, qkv.view());
  InputNorm input;
  if (norm != Norm::None) input = {d_g.view(), {}, NormParams{NormType::RMSNorm, 1e-5f, 1.0f}, normed.view(), false};
  backend.matmul_rope_write_kv(input, d_x.view(), d_w.view(), d_bias.view(), qkv.view(), d_table.view(), d_rows.view(),
                               RopeParams{heads, kv_heads, head_dim, rotary_dim, RopeStyle::Half}, d_slots.view(),
                               AttentionParams{heads, kv_heads, head_dim, block_size, 1.0f, 0}, k_cache.view(),
                               v_cache.view());
  // A Mixed w runs unfused: its int8 x is the bf16 normalized x's, within kBf16Compute of this.
  const std::vector<double> xin = normed_rows(x, m, k, g, 1.0f, norm != Norm::None, q8 && w.packed.dtype != DType::Mixed);
  std::vector<double> ref(m * width), k_ref(blocks * block_size * kv_dim, 0.0), v_ref(k_ref.size(), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    double* row = ref.data() + r * width;
    for (int64_t j = 0; j < width; ++j) {
      double sum = bias[j];
      for (int64_t c = 0; c < k; ++c) sum += xin[r * k + c] * w.dequantized[j * k + c];
      row[j] = sum;
    }
    for (int h = 0; h < heads + kv_heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double c = table[table_rows[r] * 2 * half + i], s = table[table_rows[r] * 2 * half + half + i];
        const double xa = row[h * head_dim + i], xb = row[h * head_dim + i + half];
        row[h * head_dim + i] = xa * c - xb * s;
        row[h * head_dim + i + half] = xb * c + xa * s;
      }
    if (slots[r] >= 0)
      for (int64_t j = 0; j < kv_dim; ++j) {
        k_ref[slots[r] * kv_dim + j] = row[q_dim + j];
        v_ref[slots[r] * kv_dim + j] = row[q_dim + kv_dim + j];
      }
  }
  const std::string label = fmt::format("{} m {} norm {} cache {}", what, m, static_cast<int>(norm), dtype_name(cache_dtype));
  // A Mixed w runs unfused (add_norm, a GEMV per run, rope_write_kv): the normalized x and the
  // product are rounded to bf16 on the way.
  const double tolerance = w.packed.dtype == DType::Mixed ? kBf16Compute : kOneRounding;
  expect_qkv_and_cache(backend, qkv.view(), ref, k_cache.view(), v_cache.view(), k_ref, v_ref, slots, q_dim, kv_dim,
                       tolerance, label);
}

TEST_P(CudaQuant, QkvRopeWriteKvFusedOnQuantizedAndMixed) {
  const int64_t width = 256, k = 512;
  const QuantCase q8_0 = make_quant(rng, DType::Q8_0, width, k), q5_k = make_quant(rng, DType::Q5_K, width, k);
  const QuantCase f8 = make_quant(rng, DType::F8_CHANNEL, width, k), q6_k = make_quant(rng, DType::Q6_K, width, k);
  check_qkv(*backend, rng, q8_0, 1, Norm::Weighted, DType::BF16, q8(q8_0.packed, 1), "q8_0");
  check_qkv(*backend, rng, q5_k, 3, Norm::None, DType::BF16, q8(q5_k.packed, 3), "q5_k");
  check_qkv(*backend, rng, q6_k, 8, Norm::Weighted, DType::BF16, q8(q6_k.packed, 8), "q6_k");
  check_qkv(*backend, rng, f8, 2, Norm::Weighted, DType::F8E4M3, q8(f8.packed, 2), "f8_channel");
  const QuantCase mixed = make_mixed(rng, {{DType::Q5_0, 192}, {DType::Q8_0, 64}}, k);
  for (int64_t m : {1, 4}) check_qkv(*backend, rng, mixed, m, Norm::Weighted, DType::BF16, q8(mixed.packed, m), "mixed q5_0/q8_0");
}

}  // namespace

namespace {

// Decode matmul speed of every quantized type against bf16 on Llama-shaped matrices, m = 1 and 4
// (the GEMVs), 16 and 64 (the opt-in int8 GEMM, or dequantize + cuBLASLt; bf16: cuBLASLt) (run on
// purpose: --gtest_also_run_disabled_tests --gtest_filter='*QuantGemvSpeed*'). Each timing replays
// a recorded graph of matmuls cycling over copies of the weight that together exceed the L2, so
// every call streams its weight from memory. Prints "[quant bench] type n k m us GB/s vs-bf16", on
// the default path (int8 x, fp16 for FP8, where the type has it) and with fp32 x.
double seconds_per_matmul(Backend& backend, const Tensor& weight, int64_t m) {
  const int64_t n = weight.dim(0), k = weight.dim(1);
  const int copies = static_cast<int>(std::max<size_t>(2, (size_t{160} << 20) / weight.nbytes() + 1));
  std::vector<DeviceBuffer> ws;
  for (int i = 0; i < copies; ++i) ws.push_back(backend.upload(weight));
  std::mt19937_64 rng{1};
  std::vector<float> x = random_values(rng, m * k);
  DeviceBuffer d_x = to_device_bf16(backend, x, {m, k});
  DeviceBuffer y = backend.allocate(DType::BF16, {m, n});
  const int calls = std::max(copies, 64);
  const auto issue = [&] {
    for (int i = 0; i < calls; ++i) backend.matmul(d_x.view(), ws[i % copies].view(), {}, y.view(), false);
  };
  issue();  // first use: plans, warm-up
  backend.synchronize();
  std::unique_ptr<RecordedWork> graph = backend.record(issue);
  graph->replay();
  backend.synchronize();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    graph->replay();
    backend.synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls);
  }
  return best;
}

// A [n, k] matrix of `type` tiled from a quantized [64, k] block of random values (quantizing the
// whole matrix on the host would take longer than the timing).
Tensor tiled_quantized(DType type, int64_t n, int64_t k) {
  std::mt19937_64 rng{7};
  std::vector<float> w = random_values(rng, 64 * k, -0.5f, 0.5f);
  const Tensor block = quant::quantize(f32_matrix(w, 64, k), type);
  Tensor out = Tensor::zeros(DType::U8, {static_cast<int64_t>(block.nbytes() / 64 * n)});
  out.dtype = type;
  out.shape = {n, k};
  for (int64_t r = 0; r < n; r += 64)
    std::memcpy(static_cast<uint8_t*>(out.data) + block.nbytes() / 64 * r, block.data,
                block.nbytes() / 64 * std::min<int64_t>(64, n - r));
  return out;
}

TEST(CudaQuantBench, DISABLED_QuantGemvSpeed) {
  SF_REQUIRE_GPU();
  std::unique_ptr<Backend> backend = make_test_cuda_backend();
  const std::pair<int64_t, int64_t> shapes[] = {{4096, 4096}, {11008, 4096}, {4096, 11008}};
  for (const auto& [n, k] : shapes)
    for (int64_t m : {1, 4, 16, 64}) {
      std::mt19937_64 rng{3};
      std::vector<float> values = random_values(rng, n * k, -0.5f, 0.5f);
      const Tensor bf16 = to_dtype(f32_matrix(values, n, k), DType::BF16);
      const double base = seconds_per_matmul(*backend, bf16, m);
      std::printf("[quant bench] %-10s n %5lld k %5lld m %lld %8.2f us %7.0f GB/s  1.00\n", "bf16",
                  static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m), base * 1e6,
                  bf16.nbytes() / base / 1e9);
      for (DType type : all_quantized()) {
        const Tensor w = tiled_quantized(type, n, k);
        setenv("SPLITFLOW_QUANT_GEMM", "1", 1);
        const double t = seconds_per_matmul(*backend, w, m);  // int8 (fp16 for FP8) x where the type has it
        unsetenv("SPLITFLOW_QUANT_GEMM");
        setenv("SPLITFLOW_CUDA_Q8_ACTIVATIONS", "0", 1);
        setenv("SPLITFLOW_CUDA_F16_ACTIVATIONS", "0", 1);
        const double t_f32 = seconds_per_matmul(*backend, w, m);
        unsetenv("SPLITFLOW_CUDA_Q8_ACTIVATIONS");
        unsetenv("SPLITFLOW_CUDA_F16_ACTIVATIONS");
        std::printf("[quant bench] %-10s n %5lld k %5lld m %lld %8.2f us %7.0f GB/s  %.2f  (fp32 x: %8.2f us, %.2f)\n",
                    std::string(dtype_name(type)).c_str(), static_cast<long long>(n), static_cast<long long>(k),
                    static_cast<long long>(m), t * 1e6, w.nbytes() / t / 1e9, base / t, t_f32 * 1e6, base / t_f32);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Gemv, CudaQuant,
                         ::testing::Values(GemvPath::Q8Activations, GemvPath::Fp32Activations, GemvPath::TensorCore),
                         [](const auto& info) {
                           return info.param == GemvPath::Q8Activations     ? "Q8Activations"
                                  : info.param == GemvPath::Fp32Activations ? "Fp32Activations"
                                                                             : "TensorCore";
                         });

}  // namespace
