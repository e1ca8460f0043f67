// CudaBackend::copy_blocks: KV blocks between the paged cache and the pinned host swap area, on the
// backend's stream. A cache block is strided by the layer ([num_layers, num_blocks, ...]) while a
// host block holds every layer contiguously ([num_host_blocks, num_layers, ...]), so one block
// is one 2D copy: num_layers rows of a block's bytes, the cache's layer stride as its pitch.
#include "backend/cuda/cuda_backend.h"

#include "backend/argument_checks.h"
#include "core/error.h"

namespace splitflow::cuda {

void CudaBackend::copy_blocks(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                              CopyDirection direction) {
  const size_t block_bytes = checked_block_copy_bytes(cache, host, copies, "cuda");
  if (copies.empty()) return;
  const size_t num_layers = static_cast<size_t>(cache.dim(0));
  const size_t layer_stride_bytes = static_cast<size_t>(cache.dim(1)) * block_bytes;
  // cudaMemcpy2D takes pitches up to the device's limit (2^31 - 1 bytes on Hopper); a larger
  // layer stride (a K or V cache over ~2 GiB per layer) falls back to one copy per layer.
  int max_pitch = 0;
  const cudaError_t attribute = cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device_);
  SF_CHECK(attribute == cudaSuccess, "cuda copy_blocks: query the maximum pitch: {}", cudaGetErrorString(attribute));
  const bool two_d = layer_stride_bytes <= static_cast<size_t>(max_pitch);
  const bool to_host = direction == CopyDirection::DeviceToHost;
  const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (const BlockCopy& copy : copies) {
    char* const on_device = static_cast<char*>(cache.data) + static_cast<size_t>(copy.device_block) * block_bytes;
    char* const on_host = static_cast<char*>(host.data) + static_cast<size_t>(copy.host_block) * num_layers * block_bytes;
    cudaError_t err = cudaSuccess;
    if (two_d) {
      err = to_host ? cudaMemcpy2DAsync(on_host, block_bytes, on_device, layer_stride_bytes, block_bytes, num_layers,
                                        kind, stream_)
                    : cudaMemcpy2DAsync(on_device, layer_stride_bytes, on_host, block_bytes, block_bytes, num_layers,
                                        kind, stream_);
    } else {
      for (size_t layer = 0; layer < num_layers && err == cudaSuccess; ++layer) {
        char* const d = on_device + layer * layer_stride_bytes;
        char* const h = on_host + layer * block_bytes;
        err = to_host ? cudaMemcpyAsync(h, d, block_bytes, kind, stream_) : cudaMemcpyAsync(d, h, block_bytes, kind, stream_);
      }
    }
    SF_CHECK(err == cudaSuccess, "cuda copy_blocks: device block {} {} host block {}: {}", copy.device_block,
             to_host ? "to" : "from", copy.host_block, cudaGetErrorString(err));
  }
}

}  // namespace splitflow::cuda
