// backend/cuda/quant_backend.cpp — CudaBackend's quantized weights (cuda_backend.h): upload of the
// packed bytes as they are, the decode GEMVs that read them (quant_gemv.cu), the opt-in int8
// tensor-core GEMM for 9 to 64 rows (quant_gemm_q8.cu), prefill GEMMs through a bf16 scratch
// (dequantize.cu, then cuBLASLt), embed() from a quantized table.
#include "backend/argument_checks.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_kernels.h"
#include "core/error.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>

namespace splitflow::cuda {
namespace {

// The prefill scratch holds at most this many bf16 elements (128 MiB); larger matrices (a 128K-token
// vocabulary's lm head, a fused 8B gate/up) are dequantized and multiplied in chunks of rows.
constexpr int64_t kScratchMaxElems = int64_t{64} << 20;

bf16_bits* bf16_ptr(const DeviceTensor& t) { return static_cast<bf16_bits*>(t.data); }

// The largest power of two (<= 256) dividing every address, as cuda_backend.cpp's GEMM key takes.
int common_alignment_of(std::initializer_list<const void*> pointers) {
  int alignment = 256;
  for (const void* p : pointers)
    while (reinterpret_cast<uintptr_t>(p) % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace

bool is_quant_matrix(const DeviceTensor& w) { return is_quantized(w.dtype) || w.dtype == DType::Mixed; }

QuantMatrix CudaBackend::quant_matrix(const DeviceTensor& w, const char* kernel) const {
  SF_CHECK(w.shape.size() == 2, "cuda {}: quantized w has shape {}, expected [n, k]", kernel, shape_str(w.shape));
  QuantMatrix matrix;
  matrix.n = w.dim(0);
  matrix.k = w.dim(1);
  SF_CHECK(matrix.k % 32 == 0, "cuda {}: quantized w {} ({}): k must be a multiple of 32", kernel, shape_str(w.shape),
           dtype_name(w.dtype));
  const std::vector<MatrixRun> runs = w.runs();
  SF_CHECK(static_cast<int>(runs.size()) <= kMaxQuantRuns, "cuda {}: w has {} row runs, at most {} are supported",
           kernel, runs.size(), kMaxQuantRuns);
  for (const MatrixRun& run : runs) {
    const DType dtype = run.rows.dtype;
    SF_CHECK(quant_supported(dtype), "cuda {}: w has a run of dtype {}, which the CUDA backend does not decode",
             kernel, dtype_name(dtype));
    SF_CHECK(aligned_to(run.rows.data, static_cast<uintptr_t>(quant_alignment(dtype))),
             "cuda {}: a {} run of w starts at an address not aligned to {} bytes (its runs before it end there)",
             kernel, dtype_name(dtype), quant_alignment(dtype));
    QuantRun& out = matrix.runs[matrix.count++];
    out.data = static_cast<const uint8_t*>(run.rows.data);
    out.first_row = run.first_row;
    out.end_row = run.first_row + run.rows.dim(0);
    out.row_bytes = static_cast<int64_t>(dtype_row_bytes(dtype, matrix.k));
    out.dtype = dtype;
  }
  return matrix;
}

DeviceBuffer CudaBackend::upload_quantized(const Tensor& host) {
  SF_CHECK(!host.generated, "cuda upload: a generated tensor of dtype {} (generated weights are float)",
           dtype_name(host.dtype));
  SF_CHECK(host.shape.size() == 2, "cuda upload: a {} tensor of shape {}: quantized tensors are matrices",
           dtype_name(host.dtype), shape_str(host.shape));
  DeviceTensor view{nullptr, host.dtype, host.shape, host.row_runs};
  // Checks every run's dtype and alignment on a view at a 256-byte aligned address, as cudaMalloc's.
  view.data = reinterpret_cast<void*>(uintptr_t{256});
  (void)quant_matrix(view, "upload");
  // + kQuantStagingPad: the GEMVs stage rows in whole 16-byte words, so the last one reads past the end.
  const size_t bytes = view.nbytes() + kQuantStagingPad;
  SF_CUDA_CALL(cudaMalloc(&view.data, bytes),
                      fmt::format("allocate {} bytes for {} {}", bytes, dtype_name(host.dtype), shape_str(host.shape)));
  std::shared_ptr<void> owner(view.data, [](void* p) { cudaFree(p); });
  DeviceBuffer buffer(view, std::move(owner));
  copy_to_device(host.data, buffer.view());
  if (fp8_ != nullptr) fp8_->add_matrix(host, view.data);
  // The prefill scratch grows to the largest quantized matrix (capped), here and not at a matmul,
  // which may be recorded into a graph.
  const int64_t want = std::min(host.dim(0) * host.dim(1), kScratchMaxElems);
  if (want > scratch_elems_) {
    synchronize();
    if (scratch_ != nullptr) SF_CUDA_CALL(cudaFree(scratch_), "free the dequantization scratch");
    scratch_ = nullptr;
    scratch_elems_ = 0;
    SF_CUDA_CALL(cudaMalloc(&scratch_, static_cast<size_t>(want) * sizeof(bf16_bits)),
                        fmt::format("allocate the {}-element dequantization scratch", want));
    scratch_elems_ = want;
  }
  // The opt-in int8 GEMM's x scratch, only where it may run (SPLITFLOW_QUANT_GEMM=1 at upload).
  if (const int64_t x_bytes = quant_q8_gemm_scratch_bytes(host.dim(1));
      quant_q8_gemm_enabled() && x_bytes > x_codes_bytes_) {
    synchronize();
    if (x_codes_ != nullptr) SF_CUDA_CALL(cudaFree(x_codes_), "free the int8 x scratch");
    x_codes_ = nullptr;
    x_codes_bytes_ = 0;
    SF_CUDA_CALL(cudaMalloc(&x_codes_, static_cast<size_t>(x_bytes)),
                        fmt::format("allocate the {}-byte int8 x scratch", x_bytes));
    x_codes_bytes_ = x_bytes;
  }
  return buffer;
}

void CudaBackend::quant_matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias,
                               const DeviceTensor& y, bool accumulate) {
  const QuantMatrix matrix = quant_matrix(w, "matmul");
  SF_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "cuda matmul: y has dtype {}, expected bf16 or f32",
           dtype_name(y.dtype));
  SF_CHECK(x.shape.size() == 2 && x.dim(1) == matrix.k,
           "cuda matmul: x {} and w {} do not agree (expected [m, k] and [n, k])", shape_str(x.shape),
           shape_str(w.shape));
  const int64_t m = x.dim(0), n = matrix.n, k = matrix.k;
  SF_CHECK(y.shape == Shape({m, n}), "cuda matmul: y has shape {}, expected {}", shape_str(y.shape),
           shape_str(Shape{m, n}));
  if (!bias.empty())
    SF_CHECK(bias.dtype == DType::F32 && bias.shape == Shape({n}), "cuda matmul: bias must be f32 [{}]", n);
  if (m == 0 || n == 0) return;
  const bool f32_out = y.dtype == DType::F32;
  const float* bias_f32 = bias.empty() ? nullptr : bias.as<float>();
  if (m <= kMaxQuantGemvRows && aligned_to(x.data, 16)) {
    SF_CUDA_CALL(launch_quant_gemv(matrix, bf16_ptr(x), bias_f32, f32_out ? nullptr : bf16_ptr(y),
                                          f32_out ? y.as<float>() : nullptr, m, accumulate, stream_),
                        "matmul (quantized gemv)");
    return;
  }
  const auto add_bias = [&] {
    if (bias_f32 != nullptr)
      SF_CUDA_CALL(launch_add_bias(f32_out ? nullptr : bf16_ptr(y), f32_out ? y.as<float>() : nullptr, bias_f32, m, n,
                                   stream_),
                   "matmul bias");
  };
  // W8A8 (set_fp8_activations): an f8_channel matrix's larger products on FP8 tensor cores.
  if (fp8_ != nullptr && matrix.count == 1 &&
      fp8_->run(matrix.runs[0], n, k, bf16_ptr(x), m, y.data, f32_out, accumulate)) {
    add_bias();
    return;
  }
  if (aligned_to(x.data, 16) && quant_q8_gemm_supported(matrix, m) && x_codes_bytes_ >= quant_q8_gemm_scratch_bytes(k)) {
    SF_CUDA_CALL(launch_quant_q8_gemm(matrix, bf16_ptr(x), m, bias_f32, f32_out ? nullptr : bf16_ptr(y),
                                             f32_out ? y.as<float>() : nullptr, accumulate, x_codes_, x_codes_bytes_,
                                             stream_),
                        "matmul (quantized int8 gemm)");
    return;
  }
  SF_CHECK(scratch_ != nullptr && scratch_elems_ >= k,
           "cuda matmul: no dequantization scratch for a {} w (upload() allocates it)", dtype_name(w.dtype));
  // Chunks of rows: each dequantized into the scratch, then one cuBLASLt GEMM into y's columns.
  const int64_t chunk_rows = std::min(n, scratch_elems_ / k);
  const size_t y_elem = f32_out ? sizeof(float) : sizeof(bf16_bits);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  auto* scratch = static_cast<bf16_bits*>(scratch_);
  for (int64_t begin = 0; begin < n; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, n - begin);
    for (int i = 0; i < matrix.count; ++i) {
      const QuantRun& run = matrix.runs[i];
      const int64_t from = std::max(begin, run.first_row), to = std::min(begin + rows, run.end_row);
      if (from >= to) continue;
      SF_CUDA_CALL(launch_dequantize_rows(run, k, nullptr, from, to - from, 1.0f, nullptr, nullptr,
                                                 scratch + (from - begin) * k, stream_),
                          "matmul (dequantize)");
    }
    void* y_at = static_cast<char*>(y.data) + static_cast<size_t>(begin) * y_elem;
    const GemmPlan& plan = gemm_plan({m, rows, k, f32_out, common_alignment_of({x.data, scratch, y_at}), n}, x.data,
                                     scratch);
    run_gemm(plan, x.data, scratch, y_at, alpha, beta);
  }
  add_bias();
}

namespace {

// The QuantNorm of an input norm: an RMSNorm (its weight applied on the fly, or a unit one), or
// none; nullopt when the norm must run apart (LayerNorm, a bias).
std::optional<QuantNorm> quant_norm(const InputNorm& norm, int64_t k) {
  if (norm.empty()) return QuantNorm{};
  if (norm.params.type != NormType::RMSNorm || !norm.bias.empty()) return std::nullopt;
  if (norm.weight.dtype != DType::F32 || norm.weight.shape != Shape{k} || !aligned_to(norm.weight.data, 16))
    return std::nullopt;
  QuantNorm out;
  out.on = true;
  out.eps = norm.params.eps;
  if (!norm.unit_weight) {
    out.weight = norm.weight.as<float>();
    out.offset = norm.params.weight_offset;
  }
  return out;
}

}  // namespace

bool CudaBackend::quant_matmul_rope_write_kv(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                                             const DeviceTensor& bias, const DeviceTensor& qkv,
                                             const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                                             const RopeParams& rope_params, const DeviceTensor& slots,
                                             const AttentionParams& attention_params, const DeviceTensor& k_cache,
                                             const DeviceTensor& v_cache) {
  const int64_t m = x.shape.size() == 2 ? x.dim(0) : 0, k = x.shape.size() == 2 ? x.dim(1) : 0;
  const std::optional<QuantNorm> fused_norm = quant_norm(norm, k);
  if (!(m >= 1 && m <= kMaxQuantGemvRows && x.dtype == DType::BF16 && w.shape.size() == 2 && w.dim(1) == k &&
        k % 32 == 0 && aligned_to(x.data, 16) && fused_norm))
    return false;
  const QuantMatrix matrix = quant_matrix(w, "matmul_rope_write_kv");
  if (matrix.count != 1) return false;  // Mixed: the unfused way (a GEMV launch per run)
  check_rope_write_kv_args("cuda", "matmul_rope_write_kv", DType::BF16, kv_cache_dtypes(), qkv, cos_sin, table_rows,
                           rope_params, slots, attention_params, k_cache, v_cache);
  SF_CHECK(qkv.dim(1) == matrix.n, "cuda matmul_rope_write_kv: w has {} rows, qkv {} columns", matrix.n, qkv.dim(1));
  SF_CHECK(qkv.dim(0) == m, "cuda matmul_rope_write_kv: x has {} rows, qkv {}", m, qkv.dim(0));
  if (!bias.empty())
    SF_CHECK(bias.dtype == DType::F32 && bias.shape == Shape({qkv.dim(1)}),
             "cuda matmul_rope_write_kv: bias must be f32 [{}]", qkv.dim(1));
  const QkvRopeLaunch launch{bf16_ptr(x),
                             nullptr,
                             bias.empty() ? nullptr : bias.as<float>(),
                             bf16_ptr(qkv),
                             cos_sin.as<float>(),
                             table_rows.as<int32_t>(),
                             slots.as<int32_t>(),
                             k_cache.data,
                             v_cache.data,
                             k_cache.dtype == DType::F8E4M3,
                             k,
                             k_cache.dim(0) * attention_params.block_size,
                             static_cast<int>(m),
                             rope_params.num_heads,
                             rope_params.num_kv_heads,
                             rope_params.head_dim,
                             rope_params.rotary_dim,
                             rope_params.style == RopeStyle::Interleaved,
                             GemvNorm{}};
  SF_CUDA_CALL(launch_quant_gemv_qkv_rope(matrix, launch, *fused_norm, stream_),
                      "matmul_rope_write_kv (quantized gemv)");
  return true;
}

bool CudaBackend::quant_matmul_activation(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                                          const DeviceTensor& bias, int act, bool gated, const DeviceTensor& out) {
  const int64_t m = x.shape.size() == 2 ? x.dim(0) : 0, k = x.shape.size() == 2 ? x.dim(1) : 0;
  const std::optional<QuantNorm> fused_norm = quant_norm(norm, k);
  if (!(gated && m >= 1 && m <= kMaxQuantGemvRows && x.dtype == DType::BF16 && out.dtype == DType::BF16 &&
        w.shape.size() == 2 && w.dim(1) == k && w.dim(0) % 2 == 0 && k % 32 == 0 && aligned_to(x.data, 16) &&
        fused_norm))
    return false;
  const QuantMatrix matrix = quant_matrix(w, "matmul_activation");
  if (matrix.count != 1) return false;  // Mixed: the unfused way (a GEMV launch per run)
  const int64_t inner = matrix.n / 2;
  SF_CHECK(out.shape == Shape({m, inner}), "cuda matmul_activation: out has shape {}, expected {}",
           shape_str(out.shape), shape_str(Shape{m, inner}));
  if (!bias.empty())
    SF_CHECK(bias.dtype == DType::F32 && bias.shape == Shape({2 * inner}),
             "cuda matmul_activation: bias must be f32 [{}]", 2 * inner);
  SF_CUDA_CALL(launch_quant_gemv_gated(matrix, bf16_ptr(x), bias.empty() ? nullptr : bias.as<float>(), act,
                                              bf16_ptr(out), m, *fused_norm, stream_),
                      "matmul_activation (quantized gated gemv)");
  return true;
}

void CudaBackend::quant_embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier,
                              const DeviceTensor& pos_table, const DeviceTensor& positions, const DeviceTensor& out) {
  SF_CHECK(table.dtype != DType::Mixed, "cuda embed: a mixed-dtype embedding table is not supported");
  const QuantMatrix matrix = quant_matrix(table, "embed");
  SF_CHECK(token_ids.dtype == DType::I32 && out.dtype == DType::BF16, "cuda embed: token_ids must be i32, out bf16");
  const int64_t tokens = token_ids.numel(), hidden = matrix.k;
  SF_CHECK(out.shape == Shape({tokens, hidden}), "cuda embed: out has shape {}, expected {}", shape_str(out.shape),
           shape_str(Shape{tokens, hidden}));
  if (!pos_table.empty())
    SF_CHECK(pos_table.dtype == DType::BF16 && pos_table.shape.size() == 2 && pos_table.dim(1) == hidden &&
                 positions.dtype == DType::I32 && positions.shape == Shape({tokens}),
             "cuda embed: pos_table must be bf16 [positions, {}] with i32 positions [{}]", hidden, tokens);
  SF_CHECK(aligned_to(out.data, 16) && (pos_table.empty() || aligned_to(pos_table.data, 16)),
           "cuda embed: out and pos_table must be 16-byte aligned for a quantized table");
  SF_CUDA_CALL(launch_dequantize_rows(matrix.runs[0], hidden, token_ids.as<int32_t>(), 0, tokens, multiplier,
                                             pos_table.empty() ? nullptr : bf16_ptr(pos_table),
                                             pos_table.empty() ? nullptr : positions.as<int32_t>(), bf16_ptr(out),
                                             stream_),
                      "embed (quantized table)");
}

}  // namespace splitflow::cuda
