// backend/cpu/host_memory.h — how much host memory this process may still take: the CPU backend's
// Backend::memory_info (its "device" memory is host memory).
//
// total: MemTotal (/proc/meminfo), capped by the tightest memory limit of the process's cgroup
// and its ancestors (cgroup v2 memory.max, v1 memory.limit_in_bytes; "no limit" values ignored).
// free: MemAvailable (the kernel's estimate of what can be allocated without swapping: free pages
// plus reclaimable page cache), capped by limit - usage of each limited cgroup on the path.
// MemAvailable counts clean page cache as available, the pages of a memory-mapped checkpoint
// included: memory sized from it on the CPU may later evict the weights' pages (then re-read
// from disk), so an automatic KV cache on the CPU is an estimate; a fixed size is the exact one.
// Without /proc/meminfo (not Linux): sysconf's physical and available pages.
#pragma once

#include "backend/backend.h"

#include <optional>
#include <string>
#include <string_view>

namespace splitflow::cpu {

// The value of `key` ("MemAvailable") in /proc/meminfo text, in bytes (the file gives kB);
// nullopt when the key is absent or its value is not a number.
std::optional<int64_t> meminfo_bytes(std::string_view meminfo, std::string_view key);

// Host memory as seen from `root` ("/" on a live system; tests pass a directory holding a fake
// proc/meminfo, proc/self/cgroup and sys/fs/cgroup tree). Throws when neither /proc/meminfo nor
// sysconf gives a total.
DeviceMemoryInfo read_host_memory(const std::string& root = "/");

}  // namespace splitflow::cpu
