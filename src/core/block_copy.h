// core/block_copy.h — the block-copy plan: which KV blocks move between the paged cache on the
// device and the swap area in host memory. The scheduler (engine/) plans these pairs as pure CPU
// logic; the runner hands them to Backend::copy_blocks, which moves the bytes. Plain data only,
// so both sides can name it without either reaching the other.
#pragma once

#include <cstdint>

namespace splitflow {

// One KV block moved between a paged cache on the device and a swap area in host memory.
struct BlockCopy {
  int32_t device_block = 0;  // index along the cache's num_blocks dim
  int32_t host_block = 0;    // index along the host area's num_host_blocks dim
};

enum class CopyDirection : int8_t { DeviceToHost, HostToDevice };

}  // namespace splitflow
