#include "runtime/kv_cache_sizing.h"

#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace splitflow {
namespace {

double gib(int64_t bytes) { return static_cast<double>(bytes) / double(int64_t{1} << 30); }

}  // namespace

KvCacheSizing size_kv_cache(const DeviceMemoryInfo& memory, const KvCacheMemoryBudget& budget, int64_t bytes_per_block,
                            int32_t block_size) {
  const double fraction = budget.memory_fraction;
  SF_CHECK(std::isfinite(fraction) && fraction > 0 && fraction <= 1,
           "kv cache: the memory fraction must be in (0, 1], not {}", fraction);
  SF_CHECK(budget.reserve_bytes >= 0, "kv cache: the memory reserve must not be negative, not {} bytes",
           budget.reserve_bytes);
  SF_CHECK(budget.min_tokens >= 0, "kv cache: min_tokens must not be negative, not {}", budget.min_tokens);
  SF_CHECK(bytes_per_block > 0 && block_size > 0, "kv cache: bytes per block ({}) and block size ({}) must be positive",
           bytes_per_block, block_size);
  SF_CHECK(memory.total_bytes > 0 && memory.free_bytes >= 0 && memory.free_bytes <= memory.total_bytes,
           "kv cache: the device reports {} bytes free of {} in total", memory.free_bytes, memory.total_bytes);

  KvCacheSizing sizing;
  sizing.memory = memory;
  sizing.bytes_per_block = bytes_per_block;
  // What the process may not take: the rest of the device past its share, rounded up to a byte.
  const auto outside_share =
      static_cast<int64_t>(std::ceil((1.0 - fraction) * static_cast<double>(memory.total_bytes)));
  sizing.usable_bytes = memory.free_bytes - outside_share - budget.reserve_bytes;
  sizing.num_blocks = std::min<int64_t>(std::max<int64_t>(sizing.usable_bytes, 0) / bytes_per_block, INT32_MAX);

  const int64_t min_blocks = std::max<int64_t>((budget.min_tokens + block_size - 1) / block_size, 1);
  if (sizing.num_blocks < min_blocks) {
    const int64_t share = memory.total_bytes - outside_share, in_use = memory.total_bytes - memory.free_bytes;
    const double block_mib = static_cast<double>(bytes_per_block) / double(1 << 20);
    const std::string wanted =
        budget.min_tokens > 0
            ? fmt::format("one sequence of {} tokens needs {} blocks of {} tokens ({:.2f} MiB each), but device "
                          "memory leaves room for {}",
                          budget.min_tokens, min_blocks, block_size, block_mib, sizing.num_blocks)
            : fmt::format("device memory leaves no room for one block of {} tokens ({:.2f} MiB)", block_size,
                          block_mib);
    fail("kv cache: {}: {:.2f} GiB free of {:.2f} GiB; memory fraction {} lets the process use {:.2f} GiB, {:.2f} GiB "
         "are in use (weights, step buffers, other processes), and a reserve of {:.2f} GiB stays free, which leaves "
         "{:.2f} GiB for the cache. Raise the memory fraction, shorten the sequences or lower max batch tokens",
         wanted, gib(memory.free_bytes), gib(memory.total_bytes), fraction, gib(share), gib(in_use),
         gib(budget.reserve_bytes), gib(std::max<int64_t>(sizing.usable_bytes, 0)));
  }
  return sizing;
}

KvCacheSizeRequest parse_kv_cache_size(int64_t num_blocks, std::string_view kv_cache_gb,
                                       std::optional<double> memory_fraction) {
  SF_CHECK(num_blocks >= 0, "--num-blocks must be a positive number of blocks, not {}", num_blocks);
  if (memory_fraction) {
    SF_CHECK(std::isfinite(*memory_fraction) && *memory_fraction > 0 && *memory_fraction <= 1,
             "--gpu-memory-utilization must be a fraction of the device's memory in (0, 1], not {}", *memory_fraction);
  }
  KvCacheSizeRequest request;
  if (memory_fraction) request.memory_fraction = *memory_fraction;
  if (kv_cache_gb == "auto") {
    SF_CHECK(num_blocks == 0, "give --num-blocks or --kv-cache-gb, not both");
    request.mode = KvCacheSizeRequest::Mode::Memory;
    return request;
  }
  if (!kv_cache_gb.empty()) {
    const std::string text(kv_cache_gb);
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    SF_CHECK(end == text.c_str() + text.size() && std::isfinite(value) && value > 0,
             "--kv-cache-gb must be a positive number of GiB or auto, not '{}'", text);
    SF_CHECK(num_blocks == 0, "give --num-blocks or --kv-cache-gb, not both");
    SF_CHECK(!memory_fraction,
             "--gpu-memory-utilization sizes the KV cache from device memory: give it alone or with --kv-cache-gb "
             "auto, not with --kv-cache-gb {}", text);
    request.mode = KvCacheSizeRequest::Mode::Gib;
    request.gib = value;
    return request;
  }
  if (num_blocks > 0) {
    SF_CHECK(!memory_fraction,
             "--gpu-memory-utilization sizes the KV cache from device memory: give it alone or with --kv-cache-gb "
             "auto, not with --num-blocks");
    request.mode = KvCacheSizeRequest::Mode::Blocks;
    request.num_blocks = num_blocks;
    return request;
  }
  if (memory_fraction) request.mode = KvCacheSizeRequest::Mode::Memory;
  return request;
}

}  // namespace splitflow
