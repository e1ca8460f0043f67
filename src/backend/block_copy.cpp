// The argument checks of Backend::copy_blocks (backend/backend.h), shared by every backend.
#include "backend/backend.h"

namespace splitflow {

size_t checked_block_copy_bytes(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                                const char* backend) {
  SF_CHECK(cache.shape.size() == 5,
           "{} copy_blocks: cache has shape {}, expected [num_layers, num_blocks, block_size, num_kv_heads, head_dim]",
           backend, shape_str(cache.shape));
  SF_CHECK(host.shape.size() == 5 && host.dim(1) == cache.dim(0) && host.dim(2) == cache.dim(2) &&
               host.dim(3) == cache.dim(3) && host.dim(4) == cache.dim(4),
           "{} copy_blocks: host area has shape {}, expected [num_host_blocks, {}, {}, {}, {}] for cache {}", backend,
           shape_str(host.shape), cache.dim(0), cache.dim(2), cache.dim(3), cache.dim(4), shape_str(cache.shape));
  SF_CHECK(host.dtype == cache.dtype, "{} copy_blocks: host area has dtype {}, the cache {}", backend,
           dtype_name(host.dtype), dtype_name(cache.dtype));
  SF_CHECK(copies.empty() || (!cache.empty() && !host.empty()), "{} copy_blocks: cache or host area has no memory",
           backend);
  for (size_t i = 0; i < copies.size(); ++i) {
    SF_CHECK(copies[i].device_block >= 0 && copies[i].device_block < cache.dim(1),
             "{} copy_blocks: copy {} names device block {}, outside the cache's [0, {})", backend, i,
             copies[i].device_block, cache.dim(1));
    SF_CHECK(copies[i].host_block >= 0 && copies[i].host_block < host.dim(0),
             "{} copy_blocks: copy {} names host block {}, outside the host area's [0, {})", backend, i,
             copies[i].host_block, host.dim(0));
  }
  return static_cast<size_t>(cache.dim(2) * cache.dim(3) * cache.dim(4)) * dtype_size(cache.dtype);
}

}  // namespace splitflow
