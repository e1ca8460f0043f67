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

int64_t usable_memory_bytes(const DeviceMemoryInfo& memory, const KvCacheMemoryBudget& budget) {
  // What the process may not take: the rest of the device past its share, rounded up to a byte.
  const auto outside_share =
      static_cast<int64_t>(std::ceil((1.0 - budget.memory_fraction) * static_cast<double>(memory.total_bytes)));
  return memory.free_bytes - outside_share - budget.reserve_bytes;
}

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
  sizing.usable_bytes = usable_memory_bytes(memory, budget);
  const int64_t outside_share = memory.free_bytes - budget.reserve_bytes - sizing.usable_bytes;
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

HostKvCacheDefault default_host_kv_cache(int64_t max_model_len, int64_t max_seqs, int64_t bytes_per_token,
                                         int32_t block_size, int64_t available_bytes, int64_t soft_cap_bytes,
                                         double memory_fraction) {
  SF_CHECK(max_model_len > 0 && max_seqs > 0 && bytes_per_token > 0 && block_size > 0,
           "kv cache: max_model_len ({}), max_seqs ({}), bytes per token ({}) and block size ({}) must be positive",
           max_model_len, max_seqs, bytes_per_token, block_size);
  SF_CHECK(available_bytes >= 0 && soft_cap_bytes >= 0, "kv cache: available ({}) and soft cap ({}) bytes must not be "
           "negative", available_bytes, soft_cap_bytes);
  SF_CHECK(std::isfinite(memory_fraction) && memory_fraction > 0 && memory_fraction <= 1,
           "kv cache: the memory fraction must be in (0, 1], not {}", memory_fraction);
  const int64_t bytes_per_block = bytes_per_token * block_size;
  const auto blocks_of_tokens = [&](int64_t tokens) { return (tokens + block_size - 1) / block_size; };
  // Saturating: 256 sequences of a 1M-token context overflow nothing.
  const int64_t blocks_per_sequence = blocks_of_tokens(max_model_len);
  const int64_t wanted_blocks =
      blocks_per_sequence > INT64_MAX / max_seqs / bytes_per_block ? INT64_MAX / bytes_per_block
                                                                   : blocks_per_sequence * max_seqs;
  HostKvCacheDefault result;
  result.wanted_bytes = wanted_blocks * bytes_per_block;
  result.cap_bytes = static_cast<int64_t>(memory_fraction * static_cast<double>(available_bytes));
  const int64_t soft_cap_blocks = soft_cap_bytes / bytes_per_block;
  if (wanted_blocks <= soft_cap_blocks) {
    result.num_blocks = wanted_blocks;
    result.reason = fmt::format("every sequence at full length ({} x {} tokens) fits in {} MiB", max_seqs,
                                max_model_len, soft_cap_bytes >> 20);
  } else if (blocks_per_sequence >= soft_cap_blocks) {
    result.num_blocks = blocks_per_sequence;
    result.reason = fmt::format("{} sequences at full length would take {:.2f} GiB: one full-length sequence ({} "
                                "tokens), shared by the sequences that run",
                                max_seqs, gib(result.wanted_bytes), max_model_len);
  } else {
    result.num_blocks = soft_cap_blocks;
    result.reason = fmt::format("{} sequences at full length would take {:.2f} GiB: {} MiB, the CPU default's cap",
                                max_seqs, gib(result.wanted_bytes), soft_cap_bytes >> 20);
  }
  const int64_t cap_blocks = result.cap_bytes / bytes_per_block;
  if (result.num_blocks > cap_blocks) {
    SF_CHECK(cap_blocks > 0,
             "kv cache: not one block of {} tokens ({:.2f} MiB) fits in {} of the {:.2f} GiB of available host memory; "
             "give --num-blocks or --kv-cache-gb to size it yourself",
             block_size, static_cast<double>(bytes_per_block) / double(1 << 20), memory_fraction, gib(available_bytes));
    result.reason += fmt::format(", capped at {} of the {:.2f} GiB of available host memory", memory_fraction,
                                 gib(available_bytes));
    result.num_blocks = cap_blocks;
  }
  result.num_blocks = std::min<int64_t>(result.num_blocks, INT32_MAX);
  return result;
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
