// CudaBackend::copy_blocks (backend/cuda/kv_swap.cpp) against the layouts written out by hand:
// cache [num_layers, num_blocks, block_size, num_kv_heads, head_dim] on the device, host area
// [num_host_blocks, num_layers, ...] in pinned memory. The copy is byte-exact, so elements hold
// bf16 bit patterns naming where they came from. Also an fp8 cache (one byte per element), a
// cache whose layer stride exceeds the 2D-copy pitch limit (the per-layer fallback), and the copy
// bandwidth. Skips without a GPU.
#include "backend_cuda/cuda_test_util.h"

#include "core/error.h"
#include "splitwise/kv_rows.h"

#include <chrono>
#include <cstring>
#include <vector>

using namespace splitflow;
using namespace splitflow::test;

namespace {

// A bit pattern naming (layer, block, element); distinct for the sizes below.
uint16_t tag(int64_t layer, int64_t block, int64_t element) {
  return static_cast<uint16_t>((layer * 7919 + block * 104729 + element * 31) & 0xffff);
}

struct Layout {
  int64_t layers, blocks, block_size, kv_heads, head_dim, host_blocks;
  int64_t block_elems() const { return block_size * kv_heads * head_dim; }
  Shape cache_shape() const { return {layers, blocks, block_size, kv_heads, head_dim}; }
  Shape host_shape() const { return {host_blocks, layers, block_size, kv_heads, head_dim}; }
};

// Writes tag(l, b, e) into block b of every layer.
void fill_block(Backend& backend, const DeviceTensor& cache, const Layout& layout, int64_t block) {
  std::vector<uint16_t> bits(static_cast<size_t>(layout.block_elems()));
  for (int64_t l = 0; l < layout.layers; ++l) {
    for (int64_t e = 0; e < layout.block_elems(); ++e) bits[e] = tag(l, block, e);
    const size_t offset = static_cast<size_t>((l * layout.blocks + block) * layout.block_elems()) * 2;
    backend.copy_to_device(bits.data(), DeviceTensor{static_cast<char*>(cache.data) + offset, DType::BF16,
                                                     {layout.block_elems()}});
  }
}

std::vector<uint16_t> read_block(Backend& backend, const DeviceTensor& cache, const Layout& layout, int64_t layer,
                                 int64_t block) {
  std::vector<uint16_t> bits(static_cast<size_t>(layout.block_elems()));
  const size_t offset = static_cast<size_t>((layer * layout.blocks + block) * layout.block_elems()) * 2;
  backend.copy_to_host(DeviceTensor{static_cast<char*>(cache.data) + offset, DType::BF16, {layout.block_elems()}},
                       bits.data());
  return bits;
}

// The same memory as a cache of one-byte elements (fp8 e4m3): head_dim twice as many.
DeviceTensor as_fp8(const DeviceTensor& bf16) {
  Shape shape = bf16.shape;
  shape.back() *= 2;
  return DeviceTensor{bf16.data, DType::F8E4M3, shape};
}

// fp8: the copies go through views of the same memory as e4m3 bytes; the bytes moved are the same.
void check_round_trip(const Layout& layout, int64_t out_block, int64_t in_block, bool fp8 = false) {
  auto backend = make_test_cuda_backend();
  DeviceBuffer cache = backend->allocate(DType::BF16, layout.cache_shape());
  fill_block(*backend, cache.view(), layout, 1);
  fill_block(*backend, cache.view(), layout, out_block);
  const size_t host_bytes = static_cast<size_t>(shape_numel(layout.host_shape())) * 2;
  std::shared_ptr<void> host_memory = backend->allocate_host(host_bytes);
  std::memset(host_memory.get(), 0xff, host_bytes);
  const DeviceTensor bf16_host{host_memory.get(), DType::BF16, layout.host_shape()};
  const DeviceTensor host = fp8 ? as_fp8(bf16_host) : bf16_host;
  const DeviceTensor cache_view = fp8 ? as_fp8(cache.view()) : cache.view();

  const std::vector<BlockCopy> out = {{static_cast<int32_t>(out_block), 2}, {1, 0}};
  backend->copy_blocks(cache_view, host, out, CopyDirection::DeviceToHost);
  backend->synchronize();
  const auto* host_bits = static_cast<const uint16_t*>(host_memory.get());
  for (int64_t l = 0; l < layout.layers; ++l) {
    for (int64_t e = 0; e < layout.block_elems(); ++e) {
      ASSERT_EQ(host_bits[(2 * layout.layers + l) * layout.block_elems() + e], tag(l, out_block, e))
          << "layer " << l << " element " << e;
      ASSERT_EQ(host_bits[(0 * layout.layers + l) * layout.block_elems() + e], tag(l, 1, e));
      ASSERT_EQ(host_bits[(1 * layout.layers + l) * layout.block_elems() + e], 0xffff) << "host block 1 was written";
    }
  }

  const std::vector<BlockCopy> in = {{static_cast<int32_t>(in_block), 2}};
  backend->copy_blocks(cache_view, host, in, CopyDirection::HostToDevice);
  for (int64_t l = 0; l < layout.layers; ++l) {
    const std::vector<uint16_t> bits = read_block(*backend, cache.view(), layout, l, in_block);
    for (int64_t e = 0; e < layout.block_elems(); ++e) ASSERT_EQ(bits[e], tag(l, out_block, e)) << "layer " << l;
    const std::vector<uint16_t> untouched = read_block(*backend, cache.view(), layout, l, 1);
    for (int64_t e = 0; e < layout.block_elems(); ++e) ASSERT_EQ(untouched[e], tag(l, 1, e));
  }
}

TEST(CudaKvSwap, BlocksGoToHostLayerContiguousAndBack) {
  SF_REQUIRE_GPU();
  check_round_trip({4, 9, 16, 2, 64, 3}, 7, 5);
}

TEST(CudaKvSwap, Fp8CacheBlocksMoveOneBytePerElement) {
  SF_REQUIRE_GPU();
  check_round_trip({4, 9, 16, 2, 64, 3}, 7, 5, true);
}

TEST(CudaKvSwap, LayerStridePastThePitchLimitCopiesPerLayer) {
  SF_REQUIRE_GPU();
  // 2 layers of 65,537 blocks of 32 KiB: a layer stride just over 2 GiB (4 GiB of device memory).
  check_round_trip({2, 65537, 16, 8, 128, 3}, 65536, 3);
}

TEST(CudaKvSwap, RejectsBlocksOutsideEitherArea) {
  SF_REQUIRE_GPU();
  auto backend = make_test_cuda_backend();
  const Layout layout{2, 4, 16, 2, 64, 2};
  DeviceBuffer cache = backend->allocate(DType::BF16, layout.cache_shape());
  std::shared_ptr<void> host_memory = backend->allocate_host(static_cast<size_t>(shape_numel(layout.host_shape())) * 2);
  const DeviceTensor host{host_memory.get(), DType::BF16, layout.host_shape()};
  const std::vector<BlockCopy> bad_device = {{4, 0}};
  const std::vector<BlockCopy> bad_host = {{0, 2}};
  EXPECT_THROW(backend->copy_blocks(cache.view(), host, bad_device, CopyDirection::DeviceToHost), Error);
  EXPECT_THROW(backend->copy_blocks(cache.view(), host, bad_host, CopyDirection::HostToDevice), Error);
}

// Llama-3-8B's blocks (32 layers, 8 KV heads of 128, 16 tokens: 1 MiB of K per block): the rate
// the swap path reaches for a preempted sequence of 128 blocks (2,048 tokens). Printed, with a
// floor far below PCIe rates so only a broken path fails.
TEST(CudaKvSwap, Llama3BlocksCopyAtHostLinkRates) {
  SF_REQUIRE_GPU();
  auto backend = make_test_cuda_backend();
  const Layout layout{32, 1024, 16, 8, 128, 128};
  DeviceBuffer cache = backend->allocate(DType::BF16, layout.cache_shape());
  std::shared_ptr<void> host_memory = backend->allocate_host(static_cast<size_t>(shape_numel(layout.host_shape())) * 2);
  const DeviceTensor host{host_memory.get(), DType::BF16, layout.host_shape()};
  std::vector<BlockCopy> copies;
  for (int32_t b = 0; b < 128; ++b) copies.push_back({b * 7 % 1024, b});
  const double bytes = 128.0 * 32 * layout.block_elems() * 2;
  for (const CopyDirection direction : {CopyDirection::DeviceToHost, CopyDirection::HostToDevice}) {
    backend->copy_blocks(cache.view(), host, copies, direction);  // warm-up
    backend->synchronize();
    const auto start = std::chrono::steady_clock::now();
    constexpr int kRepeats = 5;
    for (int r = 0; r < kRepeats; ++r) backend->copy_blocks(cache.view(), host, copies, direction);
    backend->synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kRepeats;
    const double gbps = bytes / seconds / 1e9;
    std::printf("  copy_blocks %s: 128 blocks of 1 MiB (K of Llama-3-8B) in %.3f ms, %.1f GB/s\n",
                direction == CopyDirection::DeviceToHost ? "to host  " : "to device", seconds * 1e3, gbps);
    EXPECT_GT(gbps, 2.0);
  }
}

}  // namespace

// splitwise/kv_rows.h on a CUDA cache (the Splitwise transfer's re-blocking, gathered on the
// device): rows written into a pool of 16-token blocks land at block_table[p / 16], slot p % 16 of
// the raw cache (read back whole and indexed here), and cross into a pool of 5-token blocks intact.
TEST(CudaKvRows, ReblockingGathersAndScattersOnTheDevice) {
  SF_REQUIRE_GPU();
  auto backend = make_test_cuda_backend();
  using splitwise::KvCache;
  const splitwise::KvLayout layout{2, 2, 64, DType::BF16};  // rows of 256 bytes
  const int64_t row_elems = 2 * 64;
  std::vector<DeviceBuffer> keep;
  auto make = [&](int32_t block_size, int32_t blocks) {
    keep.push_back(backend->allocate(DType::BF16, {2, blocks, block_size, 2, 64}));
    keep.push_back(backend->allocate(DType::BF16, {2, blocks, block_size, 2, 64}));
    return KvCache{backend.get(), keep[keep.size() - 2].view(), keep.back().view(), layout, blocks, block_size};
  };
  const KvCache a = make(16, 4), b = make(5, 12);
  const std::vector<int32_t> table_a = {3, 0, 2}, table_b = {7, 1, 11, 4, 0, 9, 2};
  const int32_t n = 33;
  std::vector<uint16_t> k(n * row_elems), v(n * row_elems);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(i * 7 + 1);
    v[i] = static_cast<uint16_t>(60000 - i);
  }
  for (int32_t layer = 0; layer < 2; ++layer) {
    splitwise::write_rows(a, layer, 0, n, table_a, reinterpret_cast<const char*>(k.data()),
                          reinterpret_cast<const char*>(v.data()));
    std::vector<uint16_t> raw(static_cast<size_t>(a.k.numel()));
    backend->copy_to_host(a.k, raw.data());
    for (int32_t p = 0; p < n; ++p) {
      const int64_t at = ((int64_t{layer} * 4 + table_a[p / 16]) * 16 + p % 16) * row_elems;
      ASSERT_EQ(std::memcmp(raw.data() + at, k.data() + p * row_elems, row_elems * 2), 0) << "layer " << layer << " p " << p;
    }
    std::vector<uint16_t> kt(n * row_elems), vt(n * row_elems), k2(n * row_elems), v2(n * row_elems);
    splitwise::read_rows(a, layer, 0, 20, table_a, reinterpret_cast<char*>(kt.data()), reinterpret_cast<char*>(vt.data()));
    splitwise::read_rows(a, layer, 20, 13, table_a, reinterpret_cast<char*>(kt.data() + 20 * row_elems),
                         reinterpret_cast<char*>(vt.data() + 20 * row_elems));
    splitwise::write_rows(b, layer, 0, n, table_b, reinterpret_cast<const char*>(kt.data()),
                          reinterpret_cast<const char*>(vt.data()));
    splitwise::read_rows(b, layer, 0, n, table_b, reinterpret_cast<char*>(k2.data()), reinterpret_cast<char*>(v2.data()));
    EXPECT_EQ(k2, k) << "layer " << layer;
    EXPECT_EQ(v2, v) << "layer " << layer;
  }
}
