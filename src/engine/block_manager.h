// engine/block_manager.h — owns the KV cache's blocks for the Scheduler: which sequence holds
// which block, reference counts, and the prefix cache. It hands out block ids and fills
// Sequence::block_table; it never runs the model, never moves KV data and never decides who runs
// (that is engine/scheduler.h).
//
// Prefix caching: a FULL block whose KV is computed is keyed by
//   hash_b = xxh3_64(hash_{b-1} as 8 bytes, token ids of block b)   (hash_{-1} = a fixed root)
// so the key names the whole prefix up to the block's end. allocate() reuses the longest chain of
// cached blocks matching a sequence's leading tokens (a repeated system prompt is computed
// once); each hit is confirmed against the block's stored token ids, so a hash collision costs a
// miss, never wrong KV. A partial block is never shared, and the block holding a sequence's last
// token is never taken from the cache: that token is always recomputed to produce logits, and
// blocks are append-only, so a shared block is never written and needs no copy-on-write.
// A block whose reference count drops to zero keeps its KV and its key while it is free; fresh
// allocations take never-cached free blocks first, then evict cached ones least recently used.
//
// Swap space: a pool of num_host_blocks host blocks (the ModelRunner's host swap area). swap_out
// moves a sequence's computed KV to host blocks and drops all its device references; swap_in
// gives it fresh device blocks back. Both return the block copies the engine must run (the
// manager only does the bookkeeping). A block the sequence shares with others (prefix cache,
// ref_count > 1) is copied like a private one: shared blocks are never written, so the copy is
// exact; the sequence drops its reference (the others keep the block) and comes back with
// private blocks. So swapping needs no pinned device blocks and no special case, at the price of
// copying a shared prefix (recompute would find it in the cache: num_recompute_tokens()).
//
// Encoder-decoder sequences (engine/sequence.h): blocks cover num_kv_positions(), a swap copies
// the encoder's cross K/V with the rest, and they never enter or hit the prefix cache.
#pragma once

#include "core/block_copy.h"
#include "engine/sequence.h"

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace splitflow {

struct PrefixCacheStats {
  int64_t queried_blocks = 0;  // full blocks looked up by allocate()
  int64_t hit_blocks = 0;      // of those, found in the cache
  int64_t evicted_blocks = 0;  // cached blocks reused for other content
  double hit_rate() const { return queried_blocks ? static_cast<double>(hit_blocks) / queried_blocks : 0.0; }
};

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size, int32_t num_host_blocks = 0);

  // Whether allocate(seq) would succeed now, prefix-cache hits counted.
  bool can_allocate(const Sequence& seq) const;
  // Gives a sequence without blocks enough blocks for all its tokens, the leading ones from the
  // prefix cache; sets num_cached_tokens and num_computed_tokens to the cached length. Throws
  // when the sequence already holds blocks or the free blocks do not suffice.
  void allocate(Sequence& seq);
  // Whether append_slot(seq) would succeed now.
  bool can_append_slot(const Sequence& seq) const;
  // Grows the block table to cover num_tokens() (one new block at most per new token). Throws
  // when no block is free.
  void append_slot(Sequence& seq);
  // Enters the sequence's full, computed blocks into the prefix cache (call after the forward
  // that computed them). A block whose key is already cached by another block stays private.
  void cache_computed_blocks(const Sequence& seq);
  // Drops the sequence's references (last block first, so a prefix outlives its tails in the
  // LRU order) and its host blocks; clears its block tables and num_computed_tokens
  // (num_cached_tokens stays, for usage reports).
  void free(Sequence& seq);

  // Computed tokens a preemption by recompute would run again: those outside blocks another
  // sequence shares (readmission finds those in the prefix cache).
  int32_t num_recompute_tokens(const Sequence& seq) const;
  // Whether the free host blocks hold the sequence's computed KV.
  bool can_swap_out(const Sequence& seq) const;
  // Copies the blocks holding computed tokens to fresh host blocks (host_block_table) and drops
  // every device reference (block_table cleared, num_computed_tokens kept). Returns the
  // device-to-host copies. Throws when the sequence holds no blocks or host blocks run out.
  std::vector<BlockCopy> swap_out(Sequence& seq);
  // Whether swap_in(seq) would succeed and leave num_reserved_blocks free blocks.
  bool can_swap_in(const Sequence& seq, int32_t num_reserved_blocks) const;
  // Gives a swapped sequence fresh device blocks for all its tokens, the leading ones filled from
  // its host blocks, which are freed. Returns the host-to-device copies. Throws when the sequence
  // is not swapped out or the free blocks do not suffice.
  std::vector<BlockCopy> swap_in(Sequence& seq);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }
  // Blocks with no reference: never-cached ones plus cached ones that may be evicted.
  int32_t num_free_blocks() const { return static_cast<int32_t>(uncached_free_.size() + evictable_.size()); }
  int32_t num_cached_free_blocks() const { return static_cast<int32_t>(evictable_.size()); }
  int32_t ref_count(int32_t block) const;
  int32_t num_host_blocks() const { return num_host_blocks_; }
  int32_t num_free_host_blocks() const { return static_cast<int32_t>(free_host_blocks_.size()); }
  int32_t blocks_for_tokens(int64_t num_tokens) const {
    return static_cast<int32_t>((num_tokens + block_size_ - 1) / block_size_);
  }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Block {
    int32_t ref_count = 0;
    bool hashed = false;  // full and computed: hash and token_ids describe it
    uint64_t hash = 0;
    std::vector<int32_t> token_ids;  // (block_size) when hashed
    std::list<int32_t>::iterator lru_position;  // in evictable_ while free and cached
  };

  uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) const;
  // The cached blocks matching the sequence's leading full blocks, excluding the last token's.
  std::vector<int32_t> find_cached_prefix(const Sequence& seq) const;
  bool fits(const Sequence& seq, const std::vector<int32_t>& hits) const;
  int32_t take_fresh_block();
  void release(int32_t block);
  bool is_cached(int32_t block) const;

  int32_t block_size_;
  std::vector<Block> blocks_;
  std::unordered_map<uint64_t, int32_t> cached_blocks_;  // prefix hash -> block
  std::vector<int32_t> uncached_free_;  // a stack
  std::list<int32_t> evictable_;        // free cached blocks, least recently used first
  int32_t num_host_blocks_;
  std::vector<int32_t> free_host_blocks_;  // a stack
  PrefixCacheStats stats_;
};

}  // namespace splitflow
