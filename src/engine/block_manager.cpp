#include "engine/block_manager.h"

#include "core/error.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>

namespace splitflow {

namespace {
// hash_{-1}: the parent of a sequence's first block.
constexpr uint64_t kRootHash = 0x9e3779b97f4a7c15ull;

// An encoder-decoder sequence's blocks also hold its encoder's cross K/V, so equal decoder tokens
// do not mean equal KV: its blocks are never shared through the prefix cache.
bool prefix_cacheable(const Sequence& seq) { return seq.encoder_token_ids.empty(); }
}  // namespace

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, int32_t num_host_blocks)
    : block_size_(block_size), num_host_blocks_(num_host_blocks) {
  SF_CHECK(num_blocks > 0, "block manager: num_blocks must be positive, got {}", num_blocks);
  SF_CHECK(block_size > 0, "block manager: block_size must be positive, got {}", block_size);
  SF_CHECK(num_host_blocks >= 0, "block manager: num_host_blocks must not be negative, got {}", num_host_blocks);
  blocks_.resize(static_cast<size_t>(num_blocks));
  // Stacks popped from the back: block 0 is handed out first.
  uncached_free_.reserve(blocks_.size());
  for (int32_t b = num_blocks - 1; b >= 0; --b) uncached_free_.push_back(b);
  free_host_blocks_.reserve(static_cast<size_t>(num_host_blocks));
  for (int32_t b = num_host_blocks - 1; b >= 0; --b) free_host_blocks_.push_back(b);
}

uint64_t BlockManager::hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) const {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &parent_hash, sizeof(parent_hash));
  XXH3_64bits_update(&state, tokens.data(), tokens.size_bytes());
  return XXH3_64bits_digest(&state);
}

bool BlockManager::is_cached(int32_t block) const {
  const Block& b = blocks_[static_cast<size_t>(block)];
  if (!b.hashed) return false;
  const auto it = cached_blocks_.find(b.hash);
  return it != cached_blocks_.end() && it->second == block;
}

int32_t BlockManager::ref_count(int32_t block) const {
  SF_CHECK(block >= 0 && block < num_blocks(), "block manager: block {} is outside [0, {})", block, num_blocks());
  return blocks_[static_cast<size_t>(block)].ref_count;
}

std::vector<int32_t> BlockManager::find_cached_prefix(const Sequence& seq) const {
  std::vector<int32_t> hits;
  if (!prefix_cacheable(seq)) return hits;
  // Blocks lying wholly before the last token: that token is recomputed for its logits.
  const int32_t candidates = (seq.num_tokens() - 1) / block_size_;
  uint64_t parent = kRootHash;
  for (int32_t b = 0; b < candidates; ++b) {
    const auto tokens = std::span<const int32_t>(seq.token_ids).subspan(static_cast<size_t>(b) * block_size_,
                                                                        static_cast<size_t>(block_size_));
    const uint64_t hash = hash_block(parent, tokens);
    const auto it = cached_blocks_.find(hash);
    if (it == cached_blocks_.end()) break;
    const Block& block = blocks_[static_cast<size_t>(it->second)];
    if (!std::equal(tokens.begin(), tokens.end(), block.token_ids.begin())) break;  // a collision
    hits.push_back(it->second);
    parent = hash;
  }
  return hits;
}

bool BlockManager::fits(const Sequence& seq, const std::vector<int32_t>& hits) const {
  // A hit on a free cached block takes it out of the free pool without needing a fresh block.
  const auto free_hits = std::count_if(hits.begin(), hits.end(),
                                       [&](int32_t b) { return blocks_[static_cast<size_t>(b)].ref_count == 0; });
  const int64_t fresh = blocks_for_tokens(seq.num_kv_positions()) - static_cast<int64_t>(hits.size());
  return fresh <= num_free_blocks() - free_hits;
}

bool BlockManager::can_allocate(const Sequence& seq) const { return fits(seq, find_cached_prefix(seq)); }

void BlockManager::allocate(Sequence& seq) {
  SF_CHECK(seq.block_table.empty(), "block manager: sequence {} already holds {} blocks", seq.id,
           seq.block_table.size());
  const std::vector<int32_t> hits = find_cached_prefix(seq);
  SF_CHECK(fits(seq, hits), "block manager: sequence {} needs {} blocks for {} tokens but only {} of {} are free",
           seq.id, blocks_for_tokens(seq.num_kv_positions()), seq.num_kv_positions(), num_free_blocks(), num_blocks());
  if (prefix_cacheable(seq)) stats_.queried_blocks += (seq.num_tokens() - 1) / block_size_;
  stats_.hit_blocks += static_cast<int64_t>(hits.size());
  for (const int32_t b : hits) {
    Block& block = blocks_[static_cast<size_t>(b)];
    if (block.ref_count == 0) evictable_.erase(block.lru_position);
    ++block.ref_count;
    seq.block_table.push_back(b);
  }
  const int32_t needed = blocks_for_tokens(seq.num_kv_positions());
  while (static_cast<int32_t>(seq.block_table.size()) < needed) seq.block_table.push_back(take_fresh_block());
  seq.num_cached_tokens = static_cast<int32_t>(hits.size()) * block_size_;
  seq.num_computed_tokens = seq.num_cached_tokens;
}

bool BlockManager::can_append_slot(const Sequence& seq) const {
  return blocks_for_tokens(seq.num_kv_positions()) <= static_cast<int32_t>(seq.block_table.size()) ||
         num_free_blocks() > 0;
}

void BlockManager::append_slot(Sequence& seq) {
  SF_CHECK(!seq.block_table.empty(), "block manager: append_slot on sequence {} which holds no blocks (allocate first)",
           seq.id);
  while (blocks_for_tokens(seq.num_kv_positions()) > static_cast<int32_t>(seq.block_table.size())) {
    seq.block_table.push_back(take_fresh_block());
  }
}

int32_t BlockManager::take_fresh_block() {
  int32_t b;
  if (!uncached_free_.empty()) {
    b = uncached_free_.back();
    uncached_free_.pop_back();
  } else {
    SF_CHECK(!evictable_.empty(), "block manager: all {} KV blocks are in use", num_blocks());
    b = evictable_.front();
    evictable_.pop_front();
    cached_blocks_.erase(blocks_[static_cast<size_t>(b)].hash);
    ++stats_.evicted_blocks;
  }
  Block& block = blocks_[static_cast<size_t>(b)];
  block.hashed = false;
  block.token_ids.clear();
  block.ref_count = 1;
  return b;
}

void BlockManager::cache_computed_blocks(const Sequence& seq) {
  if (!prefix_cacheable(seq)) return;
  const int32_t full = std::min(seq.num_computed_tokens / block_size_, static_cast<int32_t>(seq.block_table.size()));
  // Blocks are hashed in order, so the first unhashed one follows the last hashed one.
  int32_t first = full;
  while (first > 0 && !blocks_[static_cast<size_t>(seq.block_table[static_cast<size_t>(first - 1)])].hashed) --first;
  uint64_t parent =
      first == 0 ? kRootHash : blocks_[static_cast<size_t>(seq.block_table[static_cast<size_t>(first - 1)])].hash;
  for (int32_t b = first; b < full; ++b) {
    const int32_t id = seq.block_table[static_cast<size_t>(b)];
    Block& block = blocks_[static_cast<size_t>(id)];
    const auto tokens = std::span<const int32_t>(seq.token_ids).subspan(static_cast<size_t>(b) * block_size_,
                                                                        static_cast<size_t>(block_size_));
    block.hash = hash_block(parent, tokens);
    block.hashed = true;
    block.token_ids.assign(tokens.begin(), tokens.end());
    cached_blocks_.try_emplace(block.hash, id);
    parent = block.hash;
  }
}

void BlockManager::release(int32_t b) {
  Block& block = blocks_[static_cast<size_t>(b)];
  SF_CHECK(block.ref_count > 0, "block manager: block {} released more often than it was referenced", b);
  if (--block.ref_count > 0) return;
  if (is_cached(b)) {
    block.lru_position = evictable_.insert(evictable_.end(), b);
  } else {
    block.hashed = false;
    block.token_ids.clear();
    uncached_free_.push_back(b);
  }
}

void BlockManager::free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) release(*it);
  seq.block_table.clear();
  free_host_blocks_.insert(free_host_blocks_.end(), seq.host_block_table.rbegin(), seq.host_block_table.rend());
  seq.host_block_table.clear();
  seq.num_computed_tokens = 0;
}

int32_t BlockManager::num_recompute_tokens(const Sequence& seq) const {
  const auto shared = std::count_if(seq.block_table.begin(), seq.block_table.end(),
                                    [&](int32_t b) { return blocks_[static_cast<size_t>(b)].ref_count > 1; });
  // A shared block is a prefix-cache hit: full and computed. An encoder-decoder sequence runs its
  // encoder again too.
  return std::max(0, seq.num_computed_tokens - static_cast<int32_t>(shared) * block_size_) +
         (seq.num_computed_tokens > 0 ? seq.num_encoder_tokens() : 0);
}

bool BlockManager::can_swap_out(const Sequence& seq) const {
  return blocks_for_tokens(seq.num_computed_kv_positions()) <= num_free_host_blocks();
}

std::vector<BlockCopy> BlockManager::swap_out(Sequence& seq) {
  SF_CHECK(!seq.block_table.empty() && seq.host_block_table.empty() && seq.num_computed_tokens > 0,
           "block manager: swap_out of sequence {}, which holds {} device and {} host blocks and {} computed tokens",
           seq.id, seq.block_table.size(), seq.host_block_table.size(), seq.num_computed_tokens);
  const int32_t computed_blocks = blocks_for_tokens(seq.num_computed_kv_positions());
  SF_CHECK(can_swap_out(seq), "block manager: sequence {} needs {} host blocks for {} computed tokens but {} of {} are free",
           seq.id, computed_blocks, seq.num_computed_tokens, num_free_host_blocks(), num_host_blocks_);
  std::vector<BlockCopy> copies;
  for (int32_t b = 0; b < computed_blocks; ++b) {
    const int32_t host = free_host_blocks_.back();
    free_host_blocks_.pop_back();
    seq.host_block_table.push_back(host);
    copies.push_back({seq.block_table[static_cast<size_t>(b)], host});
  }
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) release(*it);
  seq.block_table.clear();
  return copies;
}

bool BlockManager::can_swap_in(const Sequence& seq, int32_t num_reserved_blocks) const {
  return blocks_for_tokens(seq.num_kv_positions()) + num_reserved_blocks <= num_free_blocks();
}

std::vector<BlockCopy> BlockManager::swap_in(Sequence& seq) {
  SF_CHECK(seq.block_table.empty() && !seq.host_block_table.empty(),
           "block manager: swap_in of sequence {}, which holds {} device and {} host blocks", seq.id,
           seq.block_table.size(), seq.host_block_table.size());
  const int32_t needed = blocks_for_tokens(seq.num_kv_positions());
  SF_CHECK(can_swap_in(seq, 0), "block manager: sequence {} needs {} blocks for {} tokens but only {} of {} are free",
           seq.id, needed, seq.num_kv_positions(), num_free_blocks(), num_blocks());
  std::vector<BlockCopy> copies;
  for (const int32_t host : seq.host_block_table) {
    seq.block_table.push_back(take_fresh_block());
    copies.push_back({seq.block_table.back(), host});
  }
  while (static_cast<int32_t>(seq.block_table.size()) < needed) seq.block_table.push_back(take_fresh_block());
  free_host_blocks_.insert(free_host_blocks_.end(), seq.host_block_table.rbegin(), seq.host_block_table.rend());
  seq.host_block_table.clear();
  return copies;
}

}  // namespace splitflow
