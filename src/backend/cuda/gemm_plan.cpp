#include "backend/cuda/gemm_plan.h"

#include "backend/cuda/cuda_check.h"

namespace splitflow::cuda {

LtGemmPlan::~LtGemmPlan() {
  if (y) cublasLtMatrixLayoutDestroy(y);
  if (x) cublasLtMatrixLayoutDestroy(x);
  if (w) cublasLtMatrixLayoutDestroy(w);
  if (op) cublasLtMatmulDescDestroy(op);
}

void LtGemmPlan::create(cudaDataType operands, cudaDataType out, int64_t m, int64_t n, int64_t k, int64_t ldw,
                        int64_t ldy) {
  SF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  SF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)),
                  "matmul transa");
  SF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)),
                  "matmul transb");
  SF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&w, operands, k, n, ldw), "matmul w layout");
  SF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x, operands, k, m, k), "matmul x layout");
  SF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&y, out, n, m, ldy), "matmul y layout");
}

cublasStatus_t LtGemmPlan::find_algorithms(cublasLtHandle_t handle, uint64_t workspace_bytes, uint32_t alignment,
                                           int wanted, cublasLtMatmulHeuristicResult_t* results, int* found) const {
  cublasLtMatmulPreference_t pref = nullptr;
  SF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), "matmul preference");
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof(workspace_bytes));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof(alignment));
  *found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, op, w, x, y, y, pref, wanted, results, found);
  cublasLtMatmulPreferenceDestroy(pref);
  return status;
}

}  // namespace splitflow::cuda
