// comm/allreduce_selection: the crossover table, what the custom kernels support, forced
// algorithms, and names. Every rank must reach the same choice, so these are pure functions of
// size, world size, link and capacity.
#include "comm/allreduce_selection.h"

#include "core/error.h"

#include <gtest/gtest.h>

using namespace splitflow;
using namespace splitflow::comm;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

CustomCapability capability(LinkType link, int world_size, size_t max_bytes = 64 * MiB) {
  return {true, link, world_size, max_bytes};
}

const CrossoverRow& row(LinkType link, int world_size) {
  for (const CrossoverRow& r : default_crossovers()) {
    if (r.link == link && r.world_size == world_size) return r;
  }
  throw std::runtime_error("no row");
}

}  // namespace

TEST(AllreduceSelection, NamesRoundTrip) {
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::Nccl, AllreduceAlgorithm::OneShot, AllreduceAlgorithm::TwoShot,
                               AllreduceAlgorithm::HalfButterfly}) {
    EXPECT_EQ(parse_algorithm(algorithm_name(a)), a);
  }
  EXPECT_EQ(link_name(LinkType::NVLink), "nvlink");
  EXPECT_EQ(link_name(LinkType::PCIe), "pcie");
  EXPECT_EQ(link_name(LinkType::None), "none");
  try {
    parse_algorithm("ring");
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("'ring'"), std::string::npos);
  }
}

TEST(AllreduceSelection, TableCoversEveryCustomWorldSizeOnBothLinks) {
  for (LinkType link : {LinkType::NVLink, LinkType::PCIe}) {
    for (int n : {2, 4, 6, 8}) {
      const CrossoverRow& r = row(link, n);
      EXPECT_GT(r.one_shot_max_bytes, 0u);
      EXPECT_TRUE(r.then == AllreduceAlgorithm::Nccl || r.then_max_bytes > r.one_shot_max_bytes);
      // Half-butterfly exists only for powers of two.
      if (r.then == AllreduceAlgorithm::HalfButterfly) {
        EXPECT_EQ(n & (n - 1), 0);
      }
      EXPECT_NE(std::string(r.source), "");
    }
  }
}

TEST(AllreduceSelection, NvlinkFollowsTheTableBoundaries) {
  for (int n : {2, 4, 6, 8}) {
    const CrossoverRow& r = row(LinkType::NVLink, n);
    const CustomCapability c = capability(LinkType::NVLink, n, 256 * MiB);
    EXPECT_EQ(select_allreduce(1, c), AllreduceAlgorithm::OneShot) << n;
    EXPECT_EQ(select_allreduce(r.one_shot_max_bytes, c), AllreduceAlgorithm::OneShot) << n;
    EXPECT_EQ(select_allreduce(r.one_shot_max_bytes + 1, c), r.then) << n;
    if (r.then != AllreduceAlgorithm::Nccl) {
      EXPECT_EQ(select_allreduce(r.then_max_bytes, c), r.then) << n;
      EXPECT_EQ(select_allreduce(r.then_max_bytes + 1, c), AllreduceAlgorithm::Nccl) << n;
    }
  }
}

TEST(AllreduceSelection, PcieUsesHalfButterflyWhereThePaperFoundItFaster) {
  const CustomCapability four = capability(LinkType::PCIe, 4);
  EXPECT_EQ(select_allreduce(4 * KiB, four), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_allreduce(64 * KiB, four), AllreduceAlgorithm::HalfButterfly);
  EXPECT_EQ(select_allreduce(512 * KiB, four), AllreduceAlgorithm::HalfButterfly);
  EXPECT_EQ(select_allreduce(512 * KiB + 1, four), AllreduceAlgorithm::Nccl);
  // Six GPUs: no half-butterfly, so NCCL past the one-shot range.
  EXPECT_EQ(select_allreduce(64 * KiB, capability(LinkType::PCIe, 6)), AllreduceAlgorithm::Nccl);
}

TEST(AllreduceSelection, NcclWhereverTheCustomPathCannotRun) {
  // Not set up (e.g. disabled, or one GPU).
  CustomCapability off = capability(LinkType::NVLink, 2);
  off.available = false;
  EXPECT_EQ(select_allreduce(4 * KiB, off), AllreduceAlgorithm::Nccl);
  // Some pair without peer access.
  EXPECT_EQ(select_allreduce(4 * KiB, capability(LinkType::None, 2)), AllreduceAlgorithm::Nccl);
  // World sizes without kernels.
  for (int n : {1, 3, 5, 7, 16}) EXPECT_EQ(select_allreduce(4 * KiB, capability(LinkType::NVLink, n)), AllreduceAlgorithm::Nccl);
  // Larger than the registered buffers.
  EXPECT_EQ(select_allreduce(2 * MiB, capability(LinkType::NVLink, 2, 1 * MiB)), AllreduceAlgorithm::Nccl);
}

TEST(AllreduceSelection, CustomSupport) {
  const CustomCapability c = capability(LinkType::NVLink, 6, 8 * MiB);
  EXPECT_TRUE(custom_supports(AllreduceAlgorithm::OneShot, c, 8 * MiB));
  EXPECT_FALSE(custom_supports(AllreduceAlgorithm::OneShot, c, 8 * MiB + 1));
  EXPECT_FALSE(custom_supports(AllreduceAlgorithm::OneShot, c, 0));
  EXPECT_TRUE(custom_supports(AllreduceAlgorithm::TwoShot, c, 1));
  EXPECT_FALSE(custom_supports(AllreduceAlgorithm::HalfButterfly, c, 1024));  // 6 is not a power of two
  EXPECT_TRUE(custom_supports(AllreduceAlgorithm::HalfButterfly, capability(LinkType::PCIe, 8), 1024));
  EXPECT_TRUE(custom_supports(AllreduceAlgorithm::Nccl, CustomCapability{}, 1));
}

TEST(AllreduceSelection, ForcedAlgorithmWinsWhereSupported) {
  const CustomCapability c = capability(LinkType::NVLink, 2);
  EXPECT_EQ(select_allreduce(64 * MiB, c, AllreduceAlgorithm::OneShot), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_allreduce(1024, c, AllreduceAlgorithm::Nccl), AllreduceAlgorithm::Nccl);
  EXPECT_EQ(select_allreduce(1024, c, AllreduceAlgorithm::HalfButterfly), AllreduceAlgorithm::HalfButterfly);
  // Unsupported: NCCL instead.
  EXPECT_EQ(select_allreduce(1024, capability(LinkType::NVLink, 6), AllreduceAlgorithm::HalfButterfly),
            AllreduceAlgorithm::Nccl);
  EXPECT_EQ(select_allreduce(128 * MiB, c, AllreduceAlgorithm::TwoShot), AllreduceAlgorithm::Nccl);
}

TEST(AllreduceSelection, CustomTableOverridesTheDefault) {
  const std::vector<CrossoverRow> table = {
      {LinkType::NVLink, 2, 100, AllreduceAlgorithm::HalfButterfly, 200, "test"}};
  const CustomCapability c = capability(LinkType::NVLink, 2);
  EXPECT_EQ(select_allreduce(100, c, std::nullopt, table), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_allreduce(150, c, std::nullopt, table), AllreduceAlgorithm::HalfButterfly);
  EXPECT_EQ(select_allreduce(201, c, std::nullopt, table), AllreduceAlgorithm::Nccl);
  EXPECT_EQ(select_allreduce(150, capability(LinkType::NVLink, 4), std::nullopt, table), AllreduceAlgorithm::Nccl);
}

TEST(AllreduceSelection, FusedRmsnormTwoShotWithinItsRowsRange) {
  const std::vector<CrossoverRow> table = {
      {LinkType::NVLink, 2, 1000, AllreduceAlgorithm::TwoShot, 4000, "test", 500, 3000},
      {LinkType::NVLink, 4, 1000, AllreduceAlgorithm::TwoShot, 4000, "test"}};  // never two-shot fused
  const CustomCapability two = capability(LinkType::NVLink, 2, 8000);
  EXPECT_EQ(select_fused_rmsnorm(499, two, std::nullopt, table), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_fused_rmsnorm(500, two, std::nullopt, table), AllreduceAlgorithm::TwoShot);
  EXPECT_EQ(select_fused_rmsnorm(3000, two, std::nullopt, table), AllreduceAlgorithm::TwoShot);
  EXPECT_EQ(select_fused_rmsnorm(3001, two, std::nullopt, table), AllreduceAlgorithm::TwoShot);  // the plain choice
  EXPECT_EQ(select_fused_rmsnorm(999, two, std::nullopt, table), AllreduceAlgorithm::TwoShot);
  // Where the plain table picks NCCL, so does the fused one.
  EXPECT_EQ(select_fused_rmsnorm(4001, two, std::nullopt, table), AllreduceAlgorithm::Nccl);
  const CustomCapability four = capability(LinkType::NVLink, 4, 8000);
  EXPECT_EQ(select_fused_rmsnorm(999, four, std::nullopt, table), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_fused_rmsnorm(2000, four, std::nullopt, table), AllreduceAlgorithm::TwoShot);  // the plain choice
  // A forced algorithm wins; no custom path: NCCL.
  EXPECT_EQ(select_fused_rmsnorm(3000, two, AllreduceAlgorithm::OneShot, table), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_fused_rmsnorm(600, CustomCapability{}, std::nullopt, table), AllreduceAlgorithm::Nccl);
}

TEST(AllreduceSelection, DefaultFusedTwoShotOnlyOverNvlink) {
  for (int n : {2, 4, 6, 8}) EXPECT_EQ(row(LinkType::PCIe, n).fused_two_shot_min_bytes, kNeverBytes) << n;
  // Two H200s: the one-shot kernel throughout (over LL128 it beats the two-shot one at every row
  // count); four: the two-shot kernel from 256 KB.
  const CustomCapability two = capability(LinkType::NVLink, 2);
  for (size_t bytes : {128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB})
    EXPECT_EQ(select_fused_rmsnorm(bytes, two), AllreduceAlgorithm::OneShot) << bytes;
  const CustomCapability four = capability(LinkType::NVLink, 4);
  EXPECT_EQ(select_fused_rmsnorm(128 * KiB, four), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_fused_rmsnorm(512 * KiB, four), AllreduceAlgorithm::TwoShot);
  EXPECT_EQ(select_fused_rmsnorm(512 * KiB, capability(LinkType::PCIe, 2)), AllreduceAlgorithm::OneShot);
}

TEST(AllreduceSelection, TwoShotBandInsideTheOneShotRange) {
  const std::vector<CrossoverRow> table = {
      {LinkType::NVLink, 2, 10000, AllreduceAlgorithm::Nccl, 0, "test", kNeverBytes, kNeverBytes, 1000, 2000}};
  const CustomCapability c = capability(LinkType::NVLink, 2, 20000);
  EXPECT_EQ(select_allreduce(999, c, std::nullopt, table), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_allreduce(1000, c, std::nullopt, table), AllreduceAlgorithm::TwoShot);
  EXPECT_EQ(select_allreduce(2000, c, std::nullopt, table), AllreduceAlgorithm::TwoShot);
  EXPECT_EQ(select_allreduce(2001, c, std::nullopt, table), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_allreduce(10001, c, std::nullopt, table), AllreduceAlgorithm::Nccl);
  // The fused norm keeps its one-shot kernel there (no fused two-shot range in this row).
  EXPECT_EQ(select_fused_rmsnorm(1500, c, std::nullopt, table), AllreduceAlgorithm::OneShot);
  // Two H200s: two-shot from 512 KB to 1 MB, one-shot around it.
  const CustomCapability two = capability(LinkType::NVLink, 2);
  EXPECT_EQ(select_allreduce(256 * KiB, two), AllreduceAlgorithm::OneShot);
  EXPECT_EQ(select_allreduce(512 * KiB, two), AllreduceAlgorithm::TwoShot);
  EXPECT_EQ(select_allreduce(1 * MiB, two), AllreduceAlgorithm::TwoShot);
  EXPECT_EQ(select_allreduce(2 * MiB, two), AllreduceAlgorithm::OneShot);
}
