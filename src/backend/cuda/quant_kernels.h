// backend/cuda/quant_kernels.h — launchers for the kernels that read quantized weights in place
// (core/dtype.h's packed layouts, no bf16 copy): the decode GEMVs (backend/cuda/quant_gemv.cu),
// which dequantize blocks in registers and keep the bf16 GEMVs' epilogues (bias, accumulate,
// gated activation, RoPE + KV write, an input RMSNorm whose weight is applied on the fly), and the
// dequantization of rows into bf16 (backend/cuda/dequantize.cu) for prefill GEMMs and embed().
// Block decoders: backend/cuda/quant_decode.cuh. Plain pointers and sizes only, as kernels.h.
#pragma once

#include "backend/cuda/kernels.h"
#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace splitflow::cuda {

// One run of rows of one quantized dtype: rows [first_row, end_row) of the matrix, row i at
// data + (i - first_row) * row_bytes.
struct QuantRun {
  const uint8_t* data = nullptr;
  int64_t first_row = 0;
  int64_t end_row = 0;
  int64_t row_bytes = 0;
  DType dtype = DType::Q8_0;
};

// A quantized matrix [n, k] as up to kMaxQuantRuns runs (a single-dtype matrix is one run; a
// Mixed one, core/tensor.h's row runs, several), k a multiple of 32 (every type's block is 32,
// 64, 128 or 256 elements, or 16 for F8_CHANNEL: the kernels need 32).
constexpr int kMaxQuantRuns = 8;
struct QuantMatrix {
  QuantRun runs[kMaxQuantRuns];
  int count = 0;
  int64_t n = 0, k = 0;
};

// Whether the kernels decode `dtype` (every quantized type of core/dtype.h).
bool quant_supported(DType dtype);
// Bytes a run's base address must be a multiple of for the decoder's word loads (2 for the types
// whose blocks are 2-byte aligned, up to 16 for Q4_K, Q5_K and the FP8 types). Backend check.
int quant_alignment(DType dtype);

// An input RMSNorm the quantized GEMVs apply to x first: x / sqrt(mean(x^2) + eps) * (offset +
// weight[c]) (weight null: a unit weight, folded elsewhere), from fp32 sums: no bf16 round trip.
struct QuantNorm {
  bool on = false;
  float eps = 0.0f;
  const float* weight = nullptr;  // [k] f32 or null
  float offset = 0.0f;
};

// Bytes a quantized matrix's device allocation must extend past its last row: the GEMVs copy rows
// into shared memory in 16-byte words aligned down and up around them.
constexpr int64_t kQuantStagingPad = 16;

// Whether the decode GEMVs take the tensor-core path (quant_mma.cuh) for the types it decodes
// (Q4_0, Q8_0, FP8): only with SPLITFLOW_QUANT_MMA=1. Correct (the CudaQuant tests pass on it,
// H200) but still 2.5-4x slower than the one-warp-per-row kernels at m = 1 (docs/quantization.md),
// so not the default until it is faster.
bool quant_mma_enabled();

// Whether the decode GEMVs multiply with x quantized to int8 per 32 elements (dp4a; quant_q8x.cuh)
// rather than in fp32: on by default, off with SPLITFLOW_CUDA_Q8_ACTIVATIONS=0 (read at each launch,
// so a test can switch). quant_q8_activations(dtype): whether `dtype` has that path (every integer
// type: the GGUF ones, Inferflow's blocks and Q3H, int8 groups; not FP8).
bool quant_q8_activations_enabled();
bool quant_q8_activations(DType dtype);
// The same for FP8 weights (F8_CHANNEL, F8_G128) and x as fp16 (quant_f8x.cuh): on by default, off
// with SPLITFLOW_CUDA_F16_ACTIVATIONS=0.
bool quant_f16_activations_enabled();
bool quant_f16_activations(DType dtype);

// Largest m the quantized GEMVs take (decode steps; larger m: dequantize + cuBLASLt).
constexpr int64_t kMaxQuantGemvRows = 8;

// Rows of x the int8 tensor-core GEMM takes (quant_gemm_q8.cu: kMaxQuantGemvRows < m <= this, for
// Q4_0, Q5_0, Q8_0, Q4_K and Q6_K runs, with int8 activations on and SPLITFLOW_QUANT_GEMM=1: opt-in
// while it is slower than the path it replaces); otherwise the dequantize + cuBLASLt path.
constexpr int64_t kMaxQuantGemmRows = 64;
bool quant_q8_gemm_enabled();  // SPLITFLOW_QUANT_GEMM=1
bool quant_q8_gemm_type(DType dtype);
bool quant_q8_gemm_supported(const QuantMatrix& w, int64_t m);
// Scratch the GEMM needs for x's codes at k (for kMaxQuantGemmRows rows).
int64_t quant_q8_gemm_scratch_bytes(int64_t k);
// y[m, n] = x[m, k] w^T + bias (accumulate: y += ...) through the int8 tensor cores; x quantized into
// `scratch` first. cudaErrorInvalidValue when !quant_q8_gemm_supported or the scratch is short.
cudaError_t launch_quant_q8_gemm(const QuantMatrix& w, const bf16_bits* x, int64_t m, const float* bias,
                                 bf16_bits* y_bf16, float* y_f32, bool accumulate, void* scratch, int64_t scratch_bytes,
                                 cudaStream_t stream);

// y[m, n] = x[m, k] w^T + bias (one launch per run of w) (accumulate: y += ...), y bf16 (y_f32 null) or f32 (y_bf16 null),
// bias f32 or null; x bf16, 16-byte aligned rows (k % 32 == 0).
cudaError_t launch_quant_gemv(const QuantMatrix& w, const bf16_bits* x, const float* bias, bf16_bits* y_bf16,
                              float* y_f32, int64_t m, bool accumulate, cudaStream_t stream);

// launch_gemv_gated with a quantized w [2 inner, k] of one run (one dtype) and a QuantNorm.
cudaError_t launch_quant_gemv_gated(const QuantMatrix& w, const bf16_bits* x, const float* bias, int act,
                                    bf16_bits* y, int64_t m, const QuantNorm& norm, cudaStream_t stream);

// launch_gemv_qkv_rope with a quantized w of one run (a.w and a.norm unused: `w` and `norm`).
cudaError_t launch_quant_gemv_qkv_rope(const QuantMatrix& w, const QkvRopeLaunch& a, const QuantNorm& norm,
                                       cudaStream_t stream);

// out[i, :] = bf16(dequantize(row rows[i] of run) * multiplier) (+ pos_table[positions[i]] when
// pos_table is not null), i < count; rows null: row first_row + i. out bf16 [count, ld_out] from
// column 0; k % 32 == 0. Used for the prefill GEMM's weight (chunks of rows into a scratch) and
// for embed() from a quantized table.
cudaError_t launch_dequantize_rows(const QuantRun& run, int64_t k, const int32_t* rows, int64_t first_row,
                                   int64_t count, float multiplier, const bf16_bits* pos_table,
                                   const int32_t* positions, bf16_bits* out, cudaStream_t stream);

// W8A8's activations (fp8_quantize_rows.cu, for fp8_gemm.h): x [m, k] bf16 (16-byte aligned
// rows, k % 8 == 0) -> codes [m, k] e4m3 and scales [m]: each row's scale is max|x| / 448 (1 for a
// zero row), its codes e4m3(x * (1 / scale)), nearest even, saturating.
cudaError_t launch_quantize_rows_e4m3(const bf16_bits* x, int64_t m, int64_t k, uint8_t* codes, float* scales,
                                      cudaStream_t stream);

}  // namespace splitflow::cuda
