// runtime/kv_cache_sizing.h — sizing the paged KV cache from the memory the device has left (vLLM's
// gpu_memory_utilization), and the command-line values that ask for it.
//
// The rule: the process may hold memory_fraction of the device's total memory. Everything in use
// on the device when the cache is sized counts against that share (weights, step buffers, the
// backend's scratch, the CUDA context, and other processes' memory, which cudaMemGetInfo does not
// tell apart), so
//   usable_bytes = free_bytes - (1 - memory_fraction) * total_bytes - reserve_bytes
//   num_blocks   = floor(usable_bytes / bytes_per_block)
// where reserve_bytes stays free inside the share for what is allocated after the cache (decode
// graphs recorded by warm-up, lazily loaded kernels, GEMM tuning scratch). ModelRunner measures
// free_bytes after everything else it owns is allocated, so the step buffers of a large
// max_batch_tokens (the [rows, vocab] f32 logits, the MLP activations) are paid for first.
#pragma once

#include "backend/backend.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace splitflow {

// vLLM's default gpu_memory_utilization.
inline constexpr double kDefaultMemoryFraction = 0.9;
// What decode graphs, lazily loaded kernels and GEMM tuning scratch take after the cache on an
// H100 with a few dozen recorded buckets stays well under this (an estimate with headroom, not a
// measurement of every model).
inline constexpr int64_t kDefaultKvReserveBytes = int64_t{1} << 30;

// How ModelRunner sizes its KV cache from device memory (KvCacheConfig::memory_budget).
struct KvCacheMemoryBudget {
  double memory_fraction = kDefaultMemoryFraction;  // (0, 1]: of the device's total memory
  int64_t reserve_bytes = kDefaultKvReserveBytes;   // kept free inside the share, after the cache
  // The cache must hold one sequence of this many tokens (0: one block); fewer is an error.
  int64_t min_tokens = 0;
};

// What sizing found (ModelRunner::kv_cache_sizing()).
struct KvCacheSizing {
  DeviceMemoryInfo memory;       // measured before the cache was allocated
  int64_t usable_bytes = 0;      // free - (1 - fraction) * total - reserve (negative: none)
  int64_t bytes_per_block = 0;   // what one block costs (K, V and its block-table entries)
  int64_t num_blocks = 0;        // floor(usable / bytes_per_block), at most INT32_MAX
};

// usable_bytes of the rule above (no checks): what the cache, or anything sized the same way (the
// GPU's layers of a GPU/CPU split, parallel/gpu_layer_fit.h), may take.
int64_t usable_memory_bytes(const DeviceMemoryInfo& memory, const KvCacheMemoryBudget& budget);

// The rule above. Throws naming every number (free, total, fraction, reserve, the share left, the
// bytes per block, and the blocks one sequence of min_tokens needs) when fewer blocks fit than
// that sequence needs; throws on a fraction outside (0, 1], a negative reserve, or memory figures
// that contradict each other (free > total).
KvCacheSizing size_kv_cache(const DeviceMemoryInfo& memory, const KvCacheMemoryBudget& budget, int64_t bytes_per_block,
                            int32_t block_size);

// The KV cache of `serve` on the CPU when no flag sizes it. The CPU's device is host memory, which
// the rest of the machine shares, and a CPU decode step's cost grows with every sequence in it, so
// the cache is sized from the model, not from what memory would allow:
//   wanted  = max_seqs x max_model_len tokens (every sequence at full length: no preemption ever)
//   tokens  = wanted when it takes at most soft_cap_bytes (small models), else at least one
//             full-length sequence (max_model_len tokens), which the paged cache shares among
//             concurrent shorter requests (llama.cpp's server shares one n_ctx among its slots),
//             or soft_cap_bytes' worth when that is more;
//   at most memory_fraction x available_bytes (MemAvailable, capped by the cgroup), whatever the
//   above says: a model too large for that gets a shorter context (the caller's rule), and none at
//   all an error naming the figures.
inline constexpr int64_t kHostKvSoftCapBytes = int64_t{256} << 20;
inline constexpr double kHostKvMemoryFraction = 0.5;

struct HostKvCacheDefault {
  int64_t num_blocks = 0;
  int64_t wanted_bytes = 0;  // max_seqs x max_model_len tokens
  int64_t cap_bytes = 0;     // memory_fraction x available_bytes
  // Why this size, for the log: "every sequence at full length", "one full-length sequence (...)",
  // "the soft cap", or "capped by available memory".
  std::string reason;
};

// Throws naming the figures when not one block fits under the cap, or on non-positive inputs.
HostKvCacheDefault default_host_kv_cache(int64_t max_model_len, int64_t max_seqs, int64_t bytes_per_token,
                                         int32_t block_size, int64_t available_bytes,
                                         int64_t soft_cap_bytes = kHostKvSoftCapBytes,
                                         double memory_fraction = kHostKvMemoryFraction);

// The KV cache size a command line asks for: --num-blocks N, --kv-cache-gb N|auto,
// --gpu-memory-utilization F.
struct KvCacheSizeRequest {
  enum class Mode { Default, Blocks, Gib, Memory };
  Mode mode = Mode::Default;  // Default: none of the flags; the command picks
  int64_t num_blocks = 0;     // Blocks
  double gib = 0;             // Gib
  double memory_fraction = kDefaultMemoryFraction;  // Memory
};

// num_blocks: --num-blocks (0: not given); kv_cache_gb: --kv-cache-gb ("": not given, "auto", or
// a positive number of GiB); memory_fraction: --gpu-memory-utilization (nullopt: not given), in
// (0, 1]. The fraction alone asks for Memory; with a fixed size (--num-blocks, --kv-cache-gb N) it
// is an error, as are both fixed sizes together. Throws naming the flag and the value.
KvCacheSizeRequest parse_kv_cache_size(int64_t num_blocks, std::string_view kv_cache_gb,
                                       std::optional<double> memory_fraction);

}  // namespace splitflow
