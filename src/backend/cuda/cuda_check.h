// backend/cuda/cuda_check.h — SF_CUDA_CALL(expr, what): a CUDA runtime call whose failure becomes a
// splitflow::Error "cuda <what>: <CUDA's message>" (`what` a string or anything fmt formats);
// SF_CUBLAS_CHECK the same for a cuBLASLt call.
// For the backend's host files (not comm/'s, which has its own comm/cuda_check.h).
#pragma once

#include "core/error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#define SF_CUDA_CALL(expr, what)                                                             \
  do {                                                                                       \
    const cudaError_t sf_err_ = (expr);                                                      \
    SF_CHECK(sf_err_ == cudaSuccess, "cuda {}: {}", what, cudaGetErrorString(sf_err_));     \
  } while (0)

#define SF_CUBLAS_CHECK(expr, what)                                                                 \
  do {                                                                                              \
    const cublasStatus_t sf_status_ = (expr);                                                       \
    SF_CHECK(sf_status_ == CUBLAS_STATUS_SUCCESS, "cuda {}: cuBLASLt {}", what,                     \
             cublasLtGetStatusString(sf_status_));                                                  \
  } while (0)
