#include "runtime/block_allocator.h"

#include "core/error.h"

namespace splitflow {

BlockAllocator::BlockAllocator(int32_t num_blocks) : in_use_(num_blocks > 0 ? num_blocks : 0, false) {
  SF_CHECK(num_blocks > 0, "block allocator: num_blocks must be > 0, got {}", num_blocks);
  free_.reserve(num_blocks);
  // Pushed in reverse so blocks are handed out 0, 1, 2, ...
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_.push_back(block);
}

int32_t BlockAllocator::allocate() {
  SF_CHECK(!free_.empty(), "KV cache full: all {} blocks are in use (raise the cache size or shorten the sequence)",
           num_blocks());
  const int32_t block = free_.back();
  free_.pop_back();
  in_use_[block] = true;
  return block;
}

void BlockAllocator::release(int32_t block) {
  SF_CHECK(block >= 0 && block < num_blocks(), "block allocator: block {} is outside [0, {})", block, num_blocks());
  SF_CHECK(in_use_[block], "block allocator: block {} released twice", block);
  in_use_[block] = false;
  free_.push_back(block);
}

void BlockAllocator::grow_table(std::vector<int32_t>& table, int64_t num_tokens, int32_t block_size) {
  SF_CHECK(block_size > 0, "block allocator: block_size must be > 0, got {}", block_size);
  const int64_t needed = (num_tokens + block_size - 1) / block_size;
  while (static_cast<int64_t>(table.size()) < needed) table.push_back(allocate());
}

void BlockAllocator::release_table(std::vector<int32_t>& table) {
  for (int32_t block : table) release(block);
  table.clear();
}

}  // namespace splitflow
