// backend/cuda/launch.cuh — overlapped kernel launches (Hopper programmatic dependent launch).
// A decode step is a chain of ~300 short kernels; between two of them the GPU idles for the
// launch latency and the previous kernel's tail. Launched with launch_overlapped, the next kernel
// may start while the previous one still runs: each kernel first lets its successor launch
// (allow_next_kernel), and waits for its predecessor to complete and flush its writes
// (wait_for_previous_kernel) before it reads the predecessor's outputs or writes anything. Work
// that reads only weights (a GEMV's first weight loads) goes between the two. A kernel launched
// this way must call wait_for_previous_kernel before its first dependent access; both are no-ops
// when the kernel was launched normally. SPLITFLOW_OVERLAP=0 in the environment turns it off
// (for A/B timing).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

namespace splitflow::cuda {

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

inline bool overlapped_launches_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("SPLITFLOW_OVERLAP");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the kernel before it.
template <typename... Params, typename... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = overlapped_launches_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace splitflow::cuda
