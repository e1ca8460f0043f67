#include "engine/block_manager.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <numeric>

namespace splitflow {
namespace {

constexpr int32_t kBlockSize = 4;

Sequence make_seq(int64_t id, std::vector<int32_t> tokens) { return Sequence(id, std::move(tokens), SamplingParams{}); }

std::vector<int32_t> iota_tokens(int32_t count, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(count));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Marks every token computed, as a forward over the whole sequence would, and caches its blocks.
void compute_all(BlockManager& manager, Sequence& seq) {
  seq.num_computed_tokens = seq.num_tokens();
  manager.cache_computed_blocks(seq);
}

TEST(BlockManager, AllocatesBlocksForAllTokensAndFreesThem) {
  BlockManager manager(8, kBlockSize);
  Sequence seq = make_seq(1, iota_tokens(9, 100));  // 9 tokens -> 3 blocks
  ASSERT_TRUE(manager.can_allocate(seq));
  manager.allocate(seq);
  ASSERT_EQ(seq.block_table.size(), 3u);
  EXPECT_EQ(seq.num_computed_tokens, 0);
  EXPECT_EQ(seq.num_cached_tokens, 0);
  for (int32_t b : seq.block_table) EXPECT_EQ(manager.ref_count(b), 1);
  EXPECT_EQ(manager.num_free_blocks(), 5);
  manager.free(seq);
  EXPECT_TRUE(seq.block_table.empty());
  EXPECT_EQ(manager.num_free_blocks(), 8);
  for (int32_t b = 0; b < 8; ++b) EXPECT_EQ(manager.ref_count(b), 0);
}

TEST(BlockManager, AppendSlotAddsABlockOnlyAtABlockBoundary) {
  BlockManager manager(4, kBlockSize);
  Sequence seq = make_seq(1, iota_tokens(4, 0));
  manager.allocate(seq);
  ASSERT_EQ(seq.block_table.size(), 1u);
  seq.token_ids.push_back(50);  // 5th token: position 4 opens block 1
  ASSERT_TRUE(manager.can_append_slot(seq));
  manager.append_slot(seq);
  EXPECT_EQ(seq.block_table.size(), 2u);
  for (int i = 0; i < 3; ++i) {  // positions 5..7 stay in block 1
    seq.token_ids.push_back(51 + i);
    manager.append_slot(seq);
    EXPECT_EQ(seq.block_table.size(), 2u);
  }
  EXPECT_EQ(manager.num_free_blocks(), 2);
}

TEST(BlockManager, SharedPromptPrefixHitsTheSameBlocks) {
  BlockManager manager(16, kBlockSize);
  // Two sequences share an 8-token system prompt (2 full blocks) and differ after it.
  std::vector<int32_t> a_tokens = iota_tokens(8, 7);
  std::vector<int32_t> b_tokens = a_tokens;
  for (int32_t t : {1, 2, 3}) a_tokens.push_back(t);
  for (int32_t t : {4, 5, 6, 7, 8}) b_tokens.push_back(t);
  Sequence a = make_seq(1, a_tokens), b = make_seq(2, b_tokens);
  manager.allocate(a);
  compute_all(manager, a);
  manager.allocate(b);
  ASSERT_EQ(b.block_table.size(), 4u);  // 13 tokens
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_NE(b.block_table[2], a.block_table[2]);
  EXPECT_EQ(b.num_cached_tokens, 8);
  EXPECT_EQ(b.num_computed_tokens, 8);
  EXPECT_EQ(manager.ref_count(a.block_table[0]), 2);
  EXPECT_EQ(manager.ref_count(a.block_table[1]), 2);
  EXPECT_EQ(manager.ref_count(a.block_table[2]), 1);
  // a looked up 2 candidate blocks (10/4), b 3 (12/4) of which 2 hit.
  EXPECT_EQ(manager.stats().queried_blocks, 5);
  EXPECT_EQ(manager.stats().hit_blocks, 2);
  EXPECT_DOUBLE_EQ(manager.stats().hit_rate(), 2.0 / 5.0);

  manager.free(a);
  EXPECT_EQ(manager.ref_count(b.block_table[0]), 1);
  manager.free(b);
  EXPECT_EQ(manager.num_free_blocks(), 16);
}

TEST(BlockManager, DifferentPrefixBeforeAnEqualBlockMisses) {
  BlockManager manager(16, kBlockSize);
  // The second blocks are equal, the first differ: the key covers the whole prefix.
  Sequence a = make_seq(1, {1, 2, 3, 4, 9, 9, 9, 9, 0});
  Sequence b = make_seq(2, {5, 6, 7, 8, 9, 9, 9, 9, 0});
  manager.allocate(a);
  compute_all(manager, a);
  manager.allocate(b);
  EXPECT_EQ(b.num_cached_tokens, 0);
  for (int32_t block : b.block_table) EXPECT_EQ(manager.ref_count(block), 1);
}

TEST(BlockManager, PartialLastBlockIsNeverShared) {
  BlockManager manager(16, kBlockSize);
  Sequence a = make_seq(1, {1, 2, 3, 4, 5, 6});  // block 1 holds 2 of 4 tokens
  manager.allocate(a);
  compute_all(manager, a);
  Sequence b = make_seq(2, {1, 2, 3, 4, 5, 6, 7});
  manager.allocate(b);
  EXPECT_EQ(b.num_cached_tokens, 4);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_NE(b.block_table[1], a.block_table[1]);
}

TEST(BlockManager, BlockOfTheLastTokenIsRecomputedNotShared) {
  BlockManager manager(16, kBlockSize);
  Sequence a = make_seq(1, iota_tokens(8, 0));
  manager.allocate(a);
  compute_all(manager, a);
  // The same 8 tokens: block 1 holds the last token, whose logits are needed, so only block 0 hits.
  Sequence b = make_seq(2, iota_tokens(8, 0));
  manager.allocate(b);
  EXPECT_EQ(b.num_cached_tokens, 4);
  EXPECT_EQ(b.num_uncomputed_tokens(), 4);
  EXPECT_NE(b.block_table[1], a.block_table[1]);
}

TEST(BlockManager, UncomputedBlocksAreNotCached) {
  BlockManager manager(16, kBlockSize);
  Sequence a = make_seq(1, iota_tokens(12, 0));
  manager.allocate(a);
  a.num_computed_tokens = 5;  // a first chunk: only block 0 is full and computed
  manager.cache_computed_blocks(a);
  Sequence b = make_seq(2, iota_tokens(12, 0));
  manager.allocate(b);
  EXPECT_EQ(b.num_cached_tokens, 4);
}

TEST(BlockManager, FreedCachedBlocksAreReusedUntilEvicted) {
  BlockManager manager(4, kBlockSize);
  Sequence a = make_seq(1, iota_tokens(9, 0));  // 3 blocks, 2 of them full
  manager.allocate(a);
  compute_all(manager, a);
  const std::vector<int32_t> a_blocks = a.block_table;
  manager.free(a);
  EXPECT_EQ(manager.num_free_blocks(), 4);
  EXPECT_EQ(manager.num_cached_free_blocks(), 2);
  // The same prompt again finds both full blocks although nobody held them.
  Sequence again = make_seq(2, iota_tokens(9, 0));
  ASSERT_TRUE(manager.can_allocate(again));
  manager.allocate(again);
  EXPECT_EQ(again.num_cached_tokens, 8);
  EXPECT_EQ(again.block_table[0], a_blocks[0]);
  EXPECT_EQ(again.block_table[1], a_blocks[1]);
  EXPECT_EQ(manager.num_cached_free_blocks(), 0);
  manager.free(again);
}

TEST(BlockManager, EvictsLeastRecentlyFreedCachedBlocksFirstAndTailsBeforePrefixes) {
  BlockManager manager(5, kBlockSize);
  Sequence a = make_seq(1, iota_tokens(9, 0));    // blocks a0 a1 (full) + a2 (partial)
  Sequence b = make_seq(2, iota_tokens(5, 100));  // b0 (full) + b1 (partial)
  manager.allocate(a);
  manager.allocate(b);
  compute_all(manager, a);
  compute_all(manager, b);
  const std::vector<int32_t> a_blocks = a.block_table, b_blocks = b.block_table;
  manager.free(a);  // LRU: a1, a0 (a2 was never cached: plain free)
  manager.free(b);  // LRU: a1, a0, b0
  ASSERT_EQ(manager.num_cached_free_blocks(), 3);

  // 3 fresh blocks: the 2 never-cached free blocks first, then the least recently freed, a1.
  Sequence c = make_seq(3, iota_tokens(12, 500));
  manager.allocate(c);
  EXPECT_EQ(c.block_table[2], a_blocks[1]);
  EXPECT_EQ(manager.stats().evicted_blocks, 1);
  // a0 and b0 survive; a's second block is gone, so a now hits one block.
  Sequence a_again = make_seq(4, iota_tokens(9, 0));
  EXPECT_FALSE(manager.can_allocate(a_again));  // a0 + 2 fresh blocks; only a0 and b0 are free
  manager.free(c);
  manager.allocate(a_again);
  EXPECT_EQ(a_again.num_cached_tokens, 4);
  EXPECT_EQ(a_again.block_table[0], a_blocks[0]);
  Sequence b_again = make_seq(5, iota_tokens(5, 100));
  manager.allocate(b_again);
  EXPECT_EQ(b_again.num_cached_tokens, 4);
  EXPECT_EQ(b_again.block_table[0], b_blocks[0]);
  EXPECT_EQ(manager.num_free_blocks(), 0);
}

TEST(BlockManager, ExhaustionIsReportedAndThrows) {
  BlockManager manager(2, kBlockSize);
  Sequence big = make_seq(1, iota_tokens(9, 0));  // 3 blocks
  EXPECT_FALSE(manager.can_allocate(big));
  EXPECT_THROW(manager.allocate(big), Error);
  EXPECT_TRUE(big.block_table.empty());

  Sequence seq = make_seq(2, iota_tokens(8, 0));
  manager.allocate(seq);
  EXPECT_EQ(manager.num_free_blocks(), 0);
  seq.token_ids.push_back(1);
  EXPECT_FALSE(manager.can_append_slot(seq));
  EXPECT_THROW(manager.append_slot(seq), Error);
  try {
    manager.append_slot(seq);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all 2 KV blocks are in use"), std::string::npos) << e.what();
  }
}

TEST(BlockManager, RejectsMisuse) {
  EXPECT_THROW(BlockManager(0, kBlockSize), Error);
  EXPECT_THROW(BlockManager(4, 0), Error);
  BlockManager manager(4, kBlockSize);
  Sequence seq = make_seq(1, iota_tokens(3, 0));
  EXPECT_THROW(manager.append_slot(seq), Error);  // nothing allocated yet
  manager.allocate(seq);
  EXPECT_THROW(manager.allocate(seq), Error);  // already holds blocks
  EXPECT_THROW(manager.ref_count(4), Error);
  EXPECT_THROW(manager.ref_count(-1), Error);
}

TEST(BlockManager, SwapOutCopiesTheComputedBlocksToHostAndFreesTheDevice) {
  BlockManager manager(8, kBlockSize, 4);
  EXPECT_EQ(manager.num_host_blocks(), 4);
  EXPECT_EQ(manager.num_free_host_blocks(), 4);
  Sequence seq = make_seq(1, iota_tokens(10, 0));  // 3 blocks
  manager.allocate(seq);
  seq.num_computed_tokens = 6;  // blocks 0 and 1 hold computed KV; block 2 none yet
  const std::vector<int32_t> device = seq.block_table;
  ASSERT_TRUE(manager.can_swap_out(seq));
  const std::vector<BlockCopy> out = manager.swap_out(seq);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].device_block, device[0]);
  EXPECT_EQ(out[1].device_block, device[1]);
  EXPECT_NE(out[0].host_block, out[1].host_block);
  EXPECT_EQ(seq.host_block_table, (std::vector<int32_t>{out[0].host_block, out[1].host_block}));
  EXPECT_TRUE(seq.block_table.empty());
  EXPECT_EQ(seq.num_computed_tokens, 6);
  EXPECT_EQ(manager.num_free_blocks(), 8);
  EXPECT_EQ(manager.num_free_host_blocks(), 2);

  seq.token_ids.push_back(77);  // 11 tokens: swap-in needs 3 blocks
  EXPECT_TRUE(manager.can_swap_in(seq, 5));
  EXPECT_FALSE(manager.can_swap_in(seq, 6));
  const std::vector<BlockCopy> in = manager.swap_in(seq);
  ASSERT_EQ(in.size(), 2u);
  ASSERT_EQ(seq.block_table.size(), 3u);
  EXPECT_EQ(in[0].host_block, out[0].host_block);
  EXPECT_EQ(in[1].host_block, out[1].host_block);
  EXPECT_EQ(in[0].device_block, seq.block_table[0]);
  EXPECT_EQ(in[1].device_block, seq.block_table[1]);
  EXPECT_TRUE(seq.host_block_table.empty());
  EXPECT_EQ(manager.num_free_host_blocks(), 4);
  EXPECT_EQ(manager.num_free_blocks(), 5);
  for (int32_t b : seq.block_table) EXPECT_EQ(manager.ref_count(b), 1);
  manager.free(seq);
  EXPECT_EQ(manager.num_free_blocks(), 8);
}

TEST(BlockManager, SharedBlocksAreCopiedAndStayWithTheirOtherHolder) {
  BlockManager manager(8, kBlockSize, 8);
  Sequence a = make_seq(1, iota_tokens(9, 0));
  manager.allocate(a);
  compute_all(manager, a);
  std::vector<int32_t> tokens = iota_tokens(8, 0);  // a's two full blocks, then its own
  tokens.push_back(500);
  tokens.push_back(501);
  Sequence b = make_seq(2, tokens);
  manager.allocate(b);
  ASSERT_EQ(b.num_cached_tokens, 8);
  compute_all(manager, b);
  EXPECT_EQ(manager.ref_count(b.block_table[0]), 2);
  // Recompute would find the two shared blocks in the cache: only b's 2 own tokens run again.
  EXPECT_EQ(manager.num_recompute_tokens(b), 2);
  EXPECT_EQ(manager.num_recompute_tokens(a), 1);  // a's 9th token; its shared blocks count for b too
  const std::vector<int32_t> shared = {b.block_table[0], b.block_table[1]};
  const std::vector<BlockCopy> out = manager.swap_out(b);
  ASSERT_EQ(out.size(), 3u);  // the shared blocks are copied like private ones
  EXPECT_EQ(out[0].device_block, shared[0]);
  EXPECT_EQ(out[1].device_block, shared[1]);
  for (int32_t block : shared) EXPECT_EQ(manager.ref_count(block), 1);  // a keeps them
  EXPECT_EQ(a.block_table[0], shared[0]);
  const std::vector<BlockCopy> in = manager.swap_in(b);
  ASSERT_EQ(in.size(), 3u);
  for (int32_t block : b.block_table) {
    EXPECT_EQ(manager.ref_count(block), 1);  // b comes back with private blocks
    EXPECT_NE(block, shared[0]);
    EXPECT_NE(block, shared[1]);
  }
  manager.free(a);
  manager.free(b);
  EXPECT_EQ(manager.num_free_blocks(), 8);
  EXPECT_EQ(manager.num_free_host_blocks(), 8);
}

TEST(BlockManager, FreeingASwappedSequenceReturnsItsHostBlocks) {
  BlockManager manager(4, kBlockSize, 2);
  Sequence seq = make_seq(1, iota_tokens(8, 0));
  manager.allocate(seq);
  compute_all(manager, seq);
  manager.swap_out(seq);
  EXPECT_EQ(manager.num_free_host_blocks(), 0);
  manager.free(seq);
  EXPECT_TRUE(seq.host_block_table.empty());
  EXPECT_EQ(seq.num_computed_tokens, 0);
  EXPECT_EQ(manager.num_free_host_blocks(), 2);
  EXPECT_EQ(manager.num_free_blocks(), 4);
}

TEST(BlockManager, RejectsSwapMisuse) {
  EXPECT_THROW(BlockManager(4, kBlockSize, -1), Error);
  BlockManager manager(4, kBlockSize, 1);
  Sequence seq = make_seq(1, iota_tokens(8, 0));
  EXPECT_THROW(manager.swap_out(seq), Error);  // holds no blocks
  EXPECT_THROW(manager.swap_in(seq), Error);   // not swapped out
  manager.allocate(seq);
  EXPECT_THROW(manager.swap_out(seq), Error);  // nothing computed to keep
  compute_all(manager, seq);
  EXPECT_FALSE(manager.can_swap_out(seq));     // 2 blocks, 1 host block
  try {
    manager.swap_out(seq);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 2 host blocks for 8 computed tokens but 1 of 1 are free"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(seq.block_table.size(), 2u);  // unchanged by the failed call
  EXPECT_EQ(manager.num_free_host_blocks(), 1);

  BlockManager roomy(4, kBlockSize, 4);
  Sequence big = make_seq(2, iota_tokens(12, 0));
  roomy.allocate(big);
  compute_all(roomy, big);
  roomy.swap_out(big);
  Sequence other = make_seq(3, iota_tokens(8, 100));
  roomy.allocate(other);
  EXPECT_FALSE(roomy.can_swap_in(big, 0));  // 3 blocks needed, 2 free
  EXPECT_THROW(roomy.swap_in(big), Error);
  EXPECT_EQ(big.host_block_table.size(), 3u);
}

}  // namespace
}  // namespace splitflow
