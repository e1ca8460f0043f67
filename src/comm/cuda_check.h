// comm/cuda_check.h — CUDA and NCCL return codes turned into splitflow::Error, naming the call that
// failed and the driver's message. Internal to comm's .cu files.
#pragma once

#include "core/error.h"

#include <cuda_runtime.h>

#define SF_CUDA_CHECK(call)                                                                              \
  do {                                                                                                   \
    const cudaError_t sf_cuda_status = (call);                                                           \
    if (sf_cuda_status != cudaSuccess)                                                                   \
      ::splitflow::fail("comm: {} failed: {} ({})", #call, cudaGetErrorString(sf_cuda_status),           \
                        cudaGetErrorName(sf_cuda_status));                                               \
  } while (0)
