// runtime/block_allocator.h — a free list of KV cache blocks, for running sequences without the
// engine's scheduler (single-sequence `generate`, tests, benchmarks). The engine's BlockManager
// takes over admission, sharing and preemption.
#pragma once

#include <cstdint>
#include <vector>

namespace splitflow {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  // Throws splitflow::Error when no block is free (the message gives the cache size).
  int32_t allocate();
  // Throws on an id outside the cache or a block that is already free.
  void release(int32_t block);
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_blocks() const { return static_cast<int32_t>(in_use_.size()); }

  // Appends blocks to `table` until it covers `num_tokens` positions of `block_size` each.
  void grow_table(std::vector<int32_t>& table, int64_t num_tokens, int32_t block_size);
  // Releases every block of `table` and clears it.
  void release_table(std::vector<int32_t>& table);

 private:
  std::vector<int32_t> free_;  // a stack: the most recently released block is reused first
  std::vector<bool> in_use_;
};

}  // namespace splitflow
