// backend/cuda/fp8_gemm.h — W8A8 products (`--quantization fp8`): an f8_channel matrix (e4m3 codes,
// one fp32 scale a row) times x quantized on the fly to e4m3 with one scale per row, on Hopper's
// FP8 tensor cores through cuBLASLt, both scale vectors applied in its epilogue (outer-vector
// scaling, sm_90 only: y[i, j] = sx[i] sw[j] sum_k xq[i, k] wq[j, k]). CudaBackend runs it for
// products of more than kMaxQuantGemvRows rows (prefill, large batches); decode-sized ones keep
// the weight-only GEMVs, whose cost is the weights' bytes, not their arithmetic.
// Owns: the x codes scratch (grown, never freed before the end: a CUDA graph recorded with it
// keeps its address), each f8_channel matrix's scales as a contiguous vector (cuBLASLt wants
// them so; a matrix row holds its own), its cuBLASLt plans. Never allocates while the stream is
// being captured (run() declines instead), never touches other dtypes.
#pragma once

#include "backend/cuda/quant_kernels.h"
#include "core/tensor.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace splitflow::cuda {

struct LtGemmPlan;

class Fp8Gemm {
 public:
  // lt_handle: the backend's cublasLtHandle_t; workspace: its cuBLASLt workspace; both outlive this.
  Fp8Gemm(void* lt_handle, void* workspace, size_t workspace_bytes, cudaStream_t stream);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // At upload of an f8_channel matrix (host: its packed rows; device_rows: where they now are):
  // keeps its row scales for run(). Other dtypes are ignored.
  void add_matrix(const Tensor& host, const void* device_rows);
  // y [m, n] (bf16, or f32 with f32_out; added to with accumulate) = x w^T for an f8_channel run
  // covering all n rows of w. false, with nothing issued, where this path cannot take it (a
  // matrix add_matrix did not see, unaligned rows, a shape cuBLASLt has no FP8 kernel for, or
  // a scratch to grow during capture): the caller takes the weight-only way.
  bool run(const QuantRun& w, int64_t n, int64_t k, const bf16_bits* x, int64_t m, void* y, bool f32_out,
           bool accumulate);

 private:
  using Plan = LtGemmPlan;  // gemm_plan.h
  // (m, n, k, w's row stride in bytes, f32 output)
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, bool>;
  const Plan* plan(const PlanKey& key);

  void* lt_handle_;
  void* workspace_;
  size_t workspace_bytes_;
  cudaStream_t stream_;
  std::unordered_map<const void*, std::shared_ptr<void>> weight_scales_;  // device rows -> [n] fp32
  void* scratch_ = nullptr;  // x codes [m, k], then x scales [m]
  int64_t scratch_bytes_ = 0;
  std::vector<void*> retired_;  // scratches outgrown: recorded graphs may still use them

  std::map<PlanKey, std::unique_ptr<Plan>> plans_;  // null: cuBLASLt has no kernel for the shape
};

}  // namespace splitflow::cuda
