// backend/cuda/gemm_plan.h — one cuBLASLt GEMM in the backend's layout, its descriptors owned: row-
// major y[m, n] = x[m, k] w[n, k]^T is, column-major, y^T[n, m] = op_T(w)[n, k] x^T[k, m], w a
// column-major [k, n] matrix of stride ldw used transposed, x [k, m] of stride k, y [n, m] of
// stride ldy (the "TN" layout FP8 needs too). For cuda_backend.cpp's bf16 GEMMs and
// fp8_gemm.cpp's FP8 ones.
#pragma once

#include <cublasLt.h>

#include <cstdint>

namespace splitflow::cuda {

struct LtGemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo{};

  LtGemmPlan() = default;
  LtGemmPlan(const LtGemmPlan&) = delete;
  LtGemmPlan& operator=(const LtGemmPlan&) = delete;
  ~LtGemmPlan();

  // Creates the descriptors (fp32 compute and scale): w and x of type `operands`, y of `out`.
  // Throws on a cuBLASLt failure (what was created is destroyed with the plan).
  void create(cudaDataType operands, cudaDataType out, int64_t m, int64_t n, int64_t k, int64_t ldw, int64_t ldy);
  // cuBLASLt's heuristic: up to `wanted` algorithms, best first, for operands aligned to
  // `alignment` bytes and a workspace of `workspace_bytes`; `found` of them in `results`.
  cublasStatus_t find_algorithms(cublasLtHandle_t handle, uint64_t workspace_bytes, uint32_t alignment, int wanted,
                                 cublasLtMatmulHeuristicResult_t* results, int* found) const;
};

}  // namespace splitflow::cuda
