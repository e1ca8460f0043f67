// Backend::copy_blocks on the CPU backend against the layouts written out by hand: the cache
// [num_layers, num_blocks, block_size, num_kv_heads, head_dim] (a block strided by the layer)
// and the host area [num_host_blocks, num_layers, block_size, num_kv_heads, head_dim] (a block's
// layers contiguous). Every element holds a value naming where it came from.
#include "backend/backend.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <vector>

namespace splitflow {
namespace {

constexpr int64_t kLayers = 3, kBlocks = 5, kBlockSize = 2, kKvHeads = 2, kHeadDim = 4;
constexpr int64_t kHostBlocks = 4;
constexpr int64_t kBlockElems = kBlockSize * kKvHeads * kHeadDim;  // one block of one layer

// The value the cache holds at (layer, block, element within the block).
float cache_value(int64_t layer, int64_t block, int64_t element) {
  return static_cast<float>(layer * 10000 + block * 100 + element);
}
constexpr float kHostUntouched = -1.0f;

struct Areas {
  std::vector<float> cache = std::vector<float>(kLayers * kBlocks * kBlockElems);
  std::vector<float> host = std::vector<float>(kHostBlocks * kLayers * kBlockElems, kHostUntouched);
  DeviceTensor cache_view() { return {cache.data(), DType::F32, {kLayers, kBlocks, kBlockSize, kKvHeads, kHeadDim}}; }
  DeviceTensor host_view() { return {host.data(), DType::F32, {kHostBlocks, kLayers, kBlockSize, kKvHeads, kHeadDim}}; }
  float& cache_at(int64_t layer, int64_t block, int64_t e) { return cache[(layer * kBlocks + block) * kBlockElems + e]; }
  float& host_at(int64_t host_block, int64_t layer, int64_t e) {
    return host[(host_block * kLayers + layer) * kBlockElems + e];
  }
};

Areas filled_areas() {
  Areas areas;
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t b = 0; b < kBlocks; ++b)
      for (int64_t e = 0; e < kBlockElems; ++e) areas.cache_at(l, b, e) = cache_value(l, b, e);
  return areas;
}

TEST(CopyBlocks, DeviceToHostGathersEveryLayerOfABlockIntoOneHostBlock) {
  auto backend = make_cpu_backend(1);
  Areas areas = filled_areas();
  const std::vector<BlockCopy> copies = {{4, 0}, {1, 3}};
  backend->copy_blocks(areas.cache_view(), areas.host_view(), copies, CopyDirection::DeviceToHost);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t e = 0; e < kBlockElems; ++e) {
      EXPECT_EQ(areas.host_at(0, l, e), cache_value(l, 4, e));
      EXPECT_EQ(areas.host_at(3, l, e), cache_value(l, 1, e));
      EXPECT_EQ(areas.host_at(1, l, e), kHostUntouched);
      EXPECT_EQ(areas.host_at(2, l, e), kHostUntouched);
    }
  }
  // The cache is only read.
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t b = 0; b < kBlocks; ++b)
      for (int64_t e = 0; e < kBlockElems; ++e) ASSERT_EQ(areas.cache_at(l, b, e), cache_value(l, b, e));
}

TEST(CopyBlocks, HostToDeviceScattersAHostBlockOverTheLayers) {
  auto backend = make_cpu_backend(1);
  Areas areas = filled_areas();
  for (int64_t h = 0; h < kHostBlocks; ++h)
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t e = 0; e < kBlockElems; ++e) areas.host_at(h, l, e) = -(h * 1000 + l * 100 + e) - 1.0f;
  const std::vector<BlockCopy> copies = {{0, 2}, {3, 1}};
  backend->copy_blocks(areas.cache_view(), areas.host_view(), copies, CopyDirection::HostToDevice);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t e = 0; e < kBlockElems; ++e) {
      EXPECT_EQ(areas.cache_at(l, 0, e), -(2 * 1000 + l * 100 + e) - 1.0f);
      EXPECT_EQ(areas.cache_at(l, 3, e), -(1 * 1000 + l * 100 + e) - 1.0f);
      for (int64_t b : {1, 2, 4}) EXPECT_EQ(areas.cache_at(l, b, e), cache_value(l, b, e));
    }
  }
}

TEST(CopyBlocks, RoundTripMovesABlockToAnotherDeviceBlock) {
  auto backend = make_cpu_backend(1);
  Areas areas = filled_areas();
  const std::vector<BlockCopy> out = {{2, 1}};
  const std::vector<BlockCopy> in = {{4, 1}};
  backend->copy_blocks(areas.cache_view(), areas.host_view(), out, CopyDirection::DeviceToHost);
  backend->copy_blocks(areas.cache_view(), areas.host_view(), in, CopyDirection::HostToDevice);
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t e = 0; e < kBlockElems; ++e) EXPECT_EQ(areas.cache_at(l, 4, e), cache_value(l, 2, e));
  backend->copy_blocks(areas.cache_view(), areas.host_view(), {}, CopyDirection::HostToDevice);  // nothing to do
}

// An fp8 cache moves one byte per element: the same memory viewed as e4m3 bytes (four per float,
// so head_dim x 4) copies exactly the same blocks.
TEST(CopyBlocks, Fp8CacheCopiesOneBytePerElement) {
  auto backend = make_cpu_backend(1);
  Areas areas = filled_areas();
  const DeviceTensor cache{areas.cache.data(), DType::F8E4M3, {kLayers, kBlocks, kBlockSize, kKvHeads, 4 * kHeadDim}};
  const DeviceTensor host{areas.host.data(), DType::F8E4M3, {kHostBlocks, kLayers, kBlockSize, kKvHeads, 4 * kHeadDim}};
  const std::vector<BlockCopy> copies = {{2, 1}};
  backend->copy_blocks(cache, host, copies, CopyDirection::DeviceToHost);
  for (int64_t l = 0; l < kLayers; ++l)
    for (int64_t e = 0; e < kBlockElems; ++e) {
      EXPECT_EQ(areas.host_at(1, l, e), cache_value(l, 2, e));
      EXPECT_EQ(areas.host_at(0, l, e), kHostUntouched);
      EXPECT_EQ(areas.host_at(2, l, e), kHostUntouched);
    }
}

TEST(CopyBlocks, RejectsBadBlocksShapesAndDtypes) {
  auto backend = make_cpu_backend(1);
  Areas areas = filled_areas();
  const auto copy = [&](const DeviceTensor& cache, const DeviceTensor& host, std::vector<BlockCopy> copies) {
    backend->copy_blocks(cache, host, copies, CopyDirection::DeviceToHost);
  };
  EXPECT_THROW(copy(areas.cache_view(), areas.host_view(), {{kBlocks, 0}}), Error);
  EXPECT_THROW(copy(areas.cache_view(), areas.host_view(), {{-1, 0}}), Error);
  EXPECT_THROW(copy(areas.cache_view(), areas.host_view(), {{0, kHostBlocks}}), Error);
  EXPECT_THROW(copy(areas.cache_view(), areas.host_view(), {{0, -1}}), Error);
  // The host area's per-block shape must be the cache's with the layer in front.
  DeviceTensor wrong_layers = areas.host_view();
  wrong_layers.shape = {kHostBlocks * kLayers, 1, kBlockSize, kKvHeads, kHeadDim};
  EXPECT_THROW(copy(areas.cache_view(), wrong_layers, {{0, 0}}), Error);
  DeviceTensor flat_cache = areas.cache_view().reshape({kLayers * kBlocks, kBlockElems});
  EXPECT_THROW(copy(flat_cache, areas.host_view(), {{0, 0}}), Error);
  DeviceTensor wrong_dtype = areas.host_view();
  wrong_dtype.dtype = DType::I32;
  EXPECT_THROW(copy(areas.cache_view(), wrong_dtype, {{0, 0}}), Error);
  try {
    copy(areas.cache_view(), areas.host_view(), {{0, 0}, {1, 9}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("copy 1 names host block 9"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace splitflow
