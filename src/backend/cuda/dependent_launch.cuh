// backend/cuda/dependent_launch.cuh — programmatic dependent launch (Hopper): a kernel launched
// with launch_dependent() may start while the previous kernel in the stream is finishing, so its
// launch and its weight loads overlap that kernel's tail instead of following it. At batch 1 a
// decode step is ~230 short kernels, and these boundaries are most of the gap to the bandwidth
// roofline. Works inside CUDA graphs (stream capture records programmatic edges).
//
// The contract of a kernel launched this way:
// - before wait_for_previous_kernel() it reads only data no kernel writes (weights) and writes
//   nothing;
// - every block calls wait_for_previous_kernel() before any early return, so that the kernel's
//   completion still implies its predecessors' (the next kernel waits only on this one);
// - after the wait it calls allow_next_kernel(), which lets the next kernel start: after the wait,
//   so at most one kernel ahead is resident and waiting.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace splitflow::cuda {

template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                             cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Blocks until the previous kernel has completed and its writes are visible (returns at once
// when the kernel was launched without a programmatic dependency).
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void allow_next_kernel() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

}  // namespace splitflow::cuda
