// backend/cuda/cuda_check.h — SF_CUDA_CALL(expr, what): a CUDA runtime call whose failure becomes a
// splitflow::Error "cuda <what>: <CUDA's message>" (`what` a string or anything fmt formats).
// For the backend's host files (not comm/'s, which has its own comm/cuda_check.h).
#pragma once

#include "core/error.h"

#include <cuda_runtime.h>

#define SF_CUDA_CALL(expr, what)                                                             \
  do {                                                                                       \
    const cudaError_t sf_err_ = (expr);                                                      \
    SF_CHECK(sf_err_ == cudaSuccess, "cuda {}: {}", what, cudaGetErrorString(sf_err_));     \
  } while (0)
