// The CPU server's default KV cache (runtime/kv_cache_sizing.h, default_host_kv_cache): from the
// model's per-token bytes, the context and max_seqs, capped by available memory.
#include "runtime/kv_cache_sizing.h"

#include "core/error.h"

#include <gtest/gtest.h>

using namespace splitflow;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20, kGiB = int64_t{1} << 30;
// SmolLM2-135M with an f32 cache: 30 layers x (K + V) x 3 KV heads x 64 x 4 bytes.
constexpr int64_t kSmolBytesPerToken = 30 * 2 * 3 * 64 * 4;
// stories260K (f32): 5 layers x (K + V) x 4 KV heads x 8 x 4 bytes.
constexpr int64_t kStoriesBytesPerToken = 5 * 2 * 4 * 8 * 4;

TEST(HostKvDefault, SmallModelsHoldEverySequenceAtFullLength) {
  const HostKvCacheDefault chosen = default_host_kv_cache(512, 256, kStoriesBytesPerToken, 16, 20 * kGiB);
  EXPECT_EQ(chosen.num_blocks, 256 * 512 / 16);
  EXPECT_EQ(chosen.wanted_bytes, 256 * 512 * kStoriesBytesPerToken);
  EXPECT_NE(chosen.reason.find("every sequence at full length (256 x 512 tokens)"), std::string::npos) << chosen.reason;
}

TEST(HostKvDefault, LargerModelsHoldOneFullLengthSequence) {
  // 256 x 8192 tokens would take 90 GiB; one sequence of 8192 takes 360 MiB, past the 256 MiB cap.
  const HostKvCacheDefault chosen = default_host_kv_cache(8192, 256, kSmolBytesPerToken, 16, 20 * kGiB);
  EXPECT_EQ(chosen.num_blocks, 8192 / 16);
  EXPECT_EQ(chosen.wanted_bytes, int64_t{256} * 8192 * kSmolBytesPerToken);
  EXPECT_NE(chosen.reason.find("one full-length sequence (8192 tokens)"), std::string::npos) << chosen.reason;
  EXPECT_LT(chosen.num_blocks * 16 * kSmolBytesPerToken, 400 * kMiB);
}

TEST(HostKvDefault, BetweenOneSequenceAndAllOfThemTheSoftCapDecides) {
  // 2048-token context: one sequence is 90 MiB, 256 of them 22.5 GiB: the 256 MiB cap.
  const HostKvCacheDefault chosen = default_host_kv_cache(2048, 256, kSmolBytesPerToken, 16, 20 * kGiB);
  EXPECT_EQ(chosen.num_blocks, kHostKvSoftCapBytes / (16 * kSmolBytesPerToken));
  EXPECT_NE(chosen.reason.find("256 MiB, the CPU default's cap"), std::string::npos) << chosen.reason;
  // A smaller soft cap is the caller's to give.
  EXPECT_EQ(default_host_kv_cache(2048, 256, kSmolBytesPerToken, 16, 20 * kGiB, 0).num_blocks, 2048 / 16);
}

TEST(HostKvDefault, AvailableMemoryCapsWhateverTheModelAsks) {
  // 1 MiB per token, 8192 tokens: 8 GiB for one sequence, with 4 GiB available: half of it.
  const HostKvCacheDefault chosen = default_host_kv_cache(8192, 4, kMiB, 16, 4 * kGiB);
  EXPECT_EQ(chosen.cap_bytes, 2 * kGiB);
  EXPECT_EQ(chosen.num_blocks, 2 * kGiB / (16 * kMiB));
  EXPECT_NE(chosen.reason.find("capped at 0.5 of the 4.00 GiB of available host memory"), std::string::npos)
      << chosen.reason;
  EXPECT_EQ(default_host_kv_cache(8192, 4, kMiB, 16, 4 * kGiB, kHostKvSoftCapBytes, 0.25).num_blocks,
            kGiB / (16 * kMiB));
}

TEST(HostKvDefault, HugeProductsDoNotOverflow) {
  const HostKvCacheDefault chosen = default_host_kv_cache(int64_t{1} << 40, 1 << 20, kMiB, 16, 64 * kGiB);
  EXPECT_GT(chosen.wanted_bytes, 0);
  EXPECT_EQ(chosen.num_blocks, 32 * kGiB / (16 * kMiB));
}

TEST(HostKvDefault, NoRoomOrBadFiguresAreErrors) {
  try {
    default_host_kv_cache(8192, 1, 64 * kMiB, 16, kGiB);  // a block is 1 GiB, half a GiB available
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not one block of 16 tokens (1024.00 MiB)"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("--num-blocks or --kv-cache-gb"), std::string::npos) << error.what();
  }
  EXPECT_THROW(default_host_kv_cache(0, 1, 1, 16, kGiB), Error);
  EXPECT_THROW(default_host_kv_cache(16, 0, 1, 16, kGiB), Error);
  EXPECT_THROW(default_host_kv_cache(16, 1, 0, 16, kGiB), Error);
  EXPECT_THROW(default_host_kv_cache(16, 1, 1, 16, -1), Error);
  EXPECT_THROW(default_host_kv_cache(16, 1, 1, 16, kGiB, kHostKvSoftCapBytes, 1.5), Error);
}

}  // namespace
