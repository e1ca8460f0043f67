// KV cache sizing from device memory (runtime/kv_cache_sizing.h): the arithmetic of
// size_kv_cache, the command-line values parse_kv_cache_size accepts, and ModelRunner sizing its
// cache on a metered device: the CPU kernels behind a backend that reports a fixed capacity less
// what it has handed out, and logs every allocation, so the tests can check when the runner asked
// and what it allocated after.
#include "runtime/kv_cache_sizing.h"

#include "core/error.h"
#include "backend/forwarding_backend.h"
#include "runtime/model_runner.h"
#include "runtime/runner_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>

namespace splitflow::test {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20, kGiB = int64_t{1} << 30;

// The message of the Error `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- size_kv_cache -----------------------------------------------------------------------------

TEST(SizeKvCache, BlocksAreTheShareLeftLessTheReserve) {
  // 80 GiB device, 50 GiB free: 90% may be used, so 8 GiB stay outside the share; 30 GiB are in
  // use; a 1 GiB reserve leaves 41 GiB = 20992 blocks of 2 MiB.
  const KvCacheSizing sizing = size_kv_cache({50 * kGiB, 80 * kGiB}, {0.9, kGiB, 0}, 2 * kMiB, 16);
  EXPECT_EQ(sizing.usable_bytes, 41 * kGiB);
  EXPECT_EQ(sizing.num_blocks, 20992);
  EXPECT_EQ(sizing.bytes_per_block, 2 * kMiB);
  EXPECT_EQ(sizing.memory.free_bytes, 50 * kGiB);
  EXPECT_EQ(sizing.memory.total_bytes, 80 * kGiB);
  // The whole device: everything free but the reserve.
  EXPECT_EQ(size_kv_cache({50 * kGiB, 80 * kGiB}, {1.0, kGiB, 0}, 2 * kMiB, 16).num_blocks, 49 * 512);
  // No reserve, half the device: 50 - 40 = 10 GiB.
  EXPECT_EQ(size_kv_cache({50 * kGiB, 80 * kGiB}, {0.5, 0, 0}, 2 * kMiB, 16).num_blocks, 10 * 512);
}

TEST(SizeKvCache, RoundsDownToWholeBlocks) {
  const int64_t block = 1000;
  // free 1000 * 10 + 999 bytes, all of it usable: 10 blocks, never 11.
  EXPECT_EQ(size_kv_cache({10 * block + 999, 20 * block}, {1.0, 0, 0}, block, 16).num_blocks, 10);
  EXPECT_EQ(size_kv_cache({11 * block, 20 * block}, {1.0, 0, 0}, block, 16).num_blocks, 11);
  // The share outside the process rounds up: 1 - 0.3 of 10 bytes is 7 (not 6.999...), so 3 bytes
  // of a 10-byte device with 10 free are usable.
  EXPECT_EQ(size_kv_cache({10, 10}, {0.3, 0, 0}, 1, 1).usable_bytes, 3);
}

TEST(SizeKvCache, CapsTheCountAtInt32) {
  const KvCacheSizing sizing = size_kv_cache({int64_t{1} << 50, int64_t{1} << 50}, {1.0, 0, 0}, 1, 16);
  EXPECT_EQ(sizing.num_blocks, std::numeric_limits<int32_t>::max());
}

TEST(SizeKvCache, OneSequenceMustFitAndTheErrorNamesTheNumbers) {
  const int64_t block = 2 * kMiB;  // 16 tokens
  // 12 GiB free of 80: the 0.9 share leaves 4 GiB, less a 1 GiB reserve: 3 GiB = 1536 blocks.
  const DeviceMemoryInfo memory{12 * kGiB, 80 * kGiB};
  EXPECT_EQ(size_kv_cache(memory, {0.9, kGiB, 1536 * 16}, block, 16).num_blocks, 1536);  // exactly one sequence
  const std::string message = error_of([&] { size_kv_cache(memory, {0.9, kGiB, 1536 * 16 + 1}, block, 16); });
  ASSERT_FALSE(message.empty()) << "no error for a sequence one token past the cache";
  for (const char* part : {"one sequence of 24577 tokens needs 1537 blocks of 16 tokens (2.00 MiB each)",
                           "room for 1536", "12.00 GiB free of 80.00 GiB", "memory fraction 0.9",
                           "use 72.00 GiB", "68.00 GiB are in use", "reserve of 1.00 GiB", "leaves 3.00 GiB"}) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' missing from: " << message;
  }
  // Nothing left at all: more in use than the share (a negative remainder reads as none).
  const std::string none = error_of([&] { size_kv_cache({4 * kGiB, 80 * kGiB}, {0.9, kGiB, 0}, block, 16); });
  EXPECT_NE(none.find("device memory leaves no room for one block of 16 tokens (2.00 MiB)"), std::string::npos) << none;
  EXPECT_NE(none.find("leaves 0.00 GiB"), std::string::npos) << none;
}

TEST(SizeKvCache, RejectsImpossibleBudgetsAndMemoryFigures) {
  const DeviceMemoryInfo memory{kGiB, 2 * kGiB};
  for (const double fraction : {0.0, -0.5, 1.01, std::nan("")}) {
    const std::string message = error_of([&] { size_kv_cache(memory, {fraction, 0, 0}, kMiB, 16); });
    EXPECT_NE(message.find("memory fraction must be in (0, 1]"), std::string::npos) << fraction << ": " << message;
  }
  EXPECT_NE(error_of([&] { size_kv_cache(memory, {0.9, -1, 0}, kMiB, 16); }).find("reserve must not be negative"),
            std::string::npos);
  EXPECT_NE(error_of([&] { size_kv_cache({3 * kGiB, 2 * kGiB}, {0.9, 0, 0}, kMiB, 16); }).find("free of"),
            std::string::npos);
  EXPECT_FALSE(error_of([&] { size_kv_cache(memory, {0.9, 0, 0}, 0, 16); }).empty());
}

// ---- parse_kv_cache_size -----------------------------------------------------------------------

using Mode = KvCacheSizeRequest::Mode;

TEST(ParseKvCacheSize, AcceptsEachWayOfSizing) {
  EXPECT_EQ(parse_kv_cache_size(0, "", std::nullopt).mode, Mode::Default);
  const KvCacheSizeRequest blocks = parse_kv_cache_size(300, "", std::nullopt);
  EXPECT_EQ(blocks.mode, Mode::Blocks);
  EXPECT_EQ(blocks.num_blocks, 300);
  const KvCacheSizeRequest gib = parse_kv_cache_size(0, "62.5", std::nullopt);
  EXPECT_EQ(gib.mode, Mode::Gib);
  EXPECT_EQ(gib.gib, 62.5);
  const KvCacheSizeRequest automatic = parse_kv_cache_size(0, "auto", std::nullopt);
  EXPECT_EQ(automatic.mode, Mode::Memory);
  EXPECT_EQ(automatic.memory_fraction, 0.9);
  const KvCacheSizeRequest fraction = parse_kv_cache_size(0, "auto", 0.75);
  EXPECT_EQ(fraction.mode, Mode::Memory);
  EXPECT_EQ(fraction.memory_fraction, 0.75);
  // The fraction alone asks for a size from memory; 1 is the whole device.
  const KvCacheSizeRequest alone = parse_kv_cache_size(0, "", 1.0);
  EXPECT_EQ(alone.mode, Mode::Memory);
  EXPECT_EQ(alone.memory_fraction, 1.0);
}

TEST(ParseKvCacheSize, BadValuesNameTheFlag) {
  const std::pair<std::function<void()>, const char*> cases[] = {
      {[] { parse_kv_cache_size(0, "-1", std::nullopt); }, "--kv-cache-gb must be a positive number of GiB or auto, not '-1'"},
      {[] { parse_kv_cache_size(0, "0", std::nullopt); }, "--kv-cache-gb must be a positive number of GiB or auto, not '0'"},
      {[] { parse_kv_cache_size(0, "40GB", std::nullopt); }, "not '40GB'"},
      {[] { parse_kv_cache_size(0, "Auto", std::nullopt); }, "not 'Auto'"},
      {[] { parse_kv_cache_size(0, "inf", std::nullopt); }, "not 'inf'"},
      {[] { parse_kv_cache_size(0, "nan", std::nullopt); }, "not 'nan'"},
      {[] { parse_kv_cache_size(-4, "", std::nullopt); }, "--num-blocks must be a positive number of blocks, not -4"},
      {[] { parse_kv_cache_size(10, "2", std::nullopt); }, "give --num-blocks or --kv-cache-gb, not both"},
      {[] { parse_kv_cache_size(10, "auto", std::nullopt); }, "give --num-blocks or --kv-cache-gb, not both"},
      {[] { parse_kv_cache_size(0, "auto", 0.0); }, "--gpu-memory-utilization must be a fraction of the device's memory in (0, 1], not 0"},
      {[] { parse_kv_cache_size(0, "auto", 1.5); }, "in (0, 1], not 1.5"},
      {[] { parse_kv_cache_size(0, "", -0.2); }, "in (0, 1], not -0.2"},
      {[] { parse_kv_cache_size(0, "8", 0.5); }, "give it alone or with --kv-cache-gb auto, not with --kv-cache-gb 8"},
      {[] { parse_kv_cache_size(64, "", 0.5); }, "not with --num-blocks"},
  };
  for (const auto& [parse, expected] : cases) {
    const std::string message = error_of(parse);
    EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "', got '" << message << "'";
  }
}

// ---- ModelRunner on a metered device -----------------------------------------------------------

// The CPU kernels on a device of `total_bytes`: free is the total less the bytes of live buffers
// (allocations and uploads) and less other_bytes (another process's share). Logs each allocation
// and, at each memory_info() call, the free bytes it reported and how many allocations preceded it.
class MeteredCpuBackend final : public ForwardingBackend {
 public:
  struct Allocation {
    DType dtype;
    Shape shape;
  };
  struct Query {
    int64_t free_bytes = 0;
    size_t allocations_before = 0;
  };

  MeteredCpuBackend(int64_t total_bytes, int64_t other_bytes = 0)
      : total_bytes_(total_bytes), other_bytes_(other_bytes) {}
  const std::vector<Allocation>& allocations() const { return allocations_; }
  const std::vector<Query>& queries() const { return queries_; }
  int64_t live_bytes() const { return *live_; }

  std::string name() const override { return "metered cpu"; }
  DeviceMemoryInfo memory_info() const override {
    const int64_t free_bytes = std::max<int64_t>(total_bytes_ - other_bytes_ - *live_, 0);
    queries_.push_back({free_bytes, allocations_.size()});
    return {free_bytes, total_bytes_};
  }
  DeviceBuffer allocate(DType dtype, Shape shape) override {
    allocations_.push_back({dtype, shape});
    return metered(inner().allocate(dtype, std::move(shape)));
  }
  DeviceBuffer upload(const Tensor& host) override { return metered(inner().upload(host)); }

 private:
  // The buffer, counted in live bytes until its last view's owner goes.
  DeviceBuffer metered(DeviceBuffer buffer) {
    const int64_t bytes = static_cast<int64_t>(buffer.view().nbytes());
    *live_ += bytes;
    std::shared_ptr<void> owner(buffer.view().data, [live = live_, bytes, held = buffer](void*) { *live -= bytes; });
    return DeviceBuffer(buffer.view(), std::move(owner));
  }

  int64_t total_bytes_, other_bytes_;
  std::shared_ptr<int64_t> live_ = std::make_shared<int64_t>(0);
  std::vector<Allocation> allocations_;
  mutable std::vector<Query> queries_;
};

constexpr int32_t kBlockSize = 4;

KvCacheConfig from_memory(double fraction, int64_t reserve_bytes, int64_t min_tokens = 0) {
  KvCacheConfig config{0, kBlockSize};
  config.memory_budget = KvCacheMemoryBudget{fraction, reserve_bytes, min_tokens};
  return config;
}

// What the runner must have chosen: the rule applied to the free bytes it was told.
int64_t expected_blocks(const ModelSpec& spec, const MeteredCpuBackend& device, int64_t total, double fraction,
                        int64_t reserve, int32_t max_seqs) {
  const int64_t block = kv_cache_bytes_per_token(spec, DType::F32) * kBlockSize + int64_t{max_seqs} * 4;
  const auto outside = static_cast<int64_t>(std::ceil((1 - fraction) * static_cast<double>(total)));
  return (device.queries().at(0).free_bytes - outside - reserve) / block;
}

TEST(KvCacheFromMemory, RunnerSizesTheCacheLastFromWhatIsFree) {
  const ModelSpec spec = tiny_spec();  // 2 layers, 2 kv heads of 12: 384 bytes per token in f32
  const ModelWeights weights = random_weights(spec, DType::F32, 11);
  const int64_t total = 64 * kMiB, reserve = kMiB;
  const RunnerLimits limits{32, 4};
  MeteredCpuBackend device(total);
  ModelRunner runner(spec, weights, device, from_memory(0.5, reserve), limits);

  ASSERT_EQ(device.queries().size(), 1u);
  const int64_t blocks = expected_blocks(spec, device, total, 0.5, reserve, limits.max_seqs);
  ASSERT_GT(blocks, 1000);  // ~31 MiB of 1.5 KiB blocks: the test means something
  EXPECT_EQ(runner.kv_config().num_blocks, blocks);
  ASSERT_TRUE(runner.kv_cache_sizing().has_value());
  EXPECT_EQ(runner.kv_cache_sizing()->num_blocks, blocks);
  EXPECT_EQ(runner.kv_cache_sizing()->bytes_per_block, 384 * kBlockSize + 4 * 4);
  EXPECT_EQ(runner.kv_cache_sizing()->memory.free_bytes, device.queries()[0].free_bytes);

  // Asked once every other buffer existed: after the query only K, V and the step index buffer.
  const auto& allocations = device.allocations();
  ASSERT_EQ(allocations.size(), device.queries()[0].allocations_before + 3);
  const Shape cache_shape = {spec.num_layers, blocks, kBlockSize, spec.attention.num_kv_heads, spec.attention.head_dim};
  EXPECT_EQ(allocations[allocations.size() - 3].shape, cache_shape);
  EXPECT_EQ(allocations[allocations.size() - 2].shape, cache_shape);
  EXPECT_EQ(allocations.back().dtype, DType::I32);
  // The process stays inside its half of the device, the reserve free but for the step index
  // buffer's fixed part (a few KiB); it falls short of that by less than one block and the
  // block-table entries charged per block (here the tables stay 16 blocks wide).
  const int64_t block = 384 * kBlockSize + 4 * limits.max_seqs;
  EXPECT_LE(device.live_bytes(), total / 2 - reserve + 64 * 1024);
  EXPECT_GT(device.live_bytes() + block + blocks * 4 * limits.max_seqs, total / 2 - reserve);

  // The cache works: the same logits as a runner given that many blocks.
  std::mt19937_64 rng(3);
  const std::vector<int32_t> tokens = random_tokens(rng, 30, spec.vocab_size);
  const std::vector<int32_t> table = iota_blocks(8, static_cast<int>(blocks) - 8);  // the cache's last blocks
  const Tensor got = runner.forward(single_span(tokens, 0, 30, table, LogitsMode::All));
  auto cpu = make_cpu_backend(1);
  ModelRunner fixed(spec, weights, *cpu, {static_cast<int32_t>(blocks), kBlockSize}, limits);
  EXPECT_FALSE(fixed.kv_cache_sizing().has_value());
  const Tensor want = fixed.forward(single_span(tokens, 0, 30, table, LogitsMode::All));
  ASSERT_EQ(got.shape, want.shape);
  EXPECT_EQ(std::memcmp(got.data, want.data, got.nbytes()), 0);
}

// The bug this exists for: a larger max_batch_tokens needs larger step buffers (activations,
// logits), and the cache shrinks to make room instead of the start failing; memory other
// processes hold shrinks it too.
TEST(KvCacheFromMemory, StepBuffersAndOtherProcessesArePaidFirst) {
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 12);
  const int64_t total = 32 * kMiB, block = 384 * kBlockSize + 4 * 4;
  const auto sized = [&](int32_t max_batch_tokens, int64_t other_bytes) {
    MeteredCpuBackend device(total, other_bytes);
    ModelRunner runner(spec, weights, device, from_memory(0.9, 0), {max_batch_tokens, 4});
    return std::pair{runner.kv_config().num_blocks, device.queries().at(0).free_bytes};
  };
  const auto [small_blocks, small_free] = sized(16, 0);
  const auto [large_blocks, large_free] = sized(2048, 0);
  ASSERT_GT(small_free - large_free, 2 * kMiB);  // 2048 tokens of activations and logits
  EXPECT_LT(large_blocks, small_blocks);
  EXPECT_NEAR(small_blocks - large_blocks, static_cast<double>(small_free - large_free) / block, 1.0);
  const auto [shared_blocks, shared_free] = sized(16, 8 * kMiB);
  EXPECT_EQ(small_free - shared_free, 8 * kMiB);
  EXPECT_NEAR(small_blocks - shared_blocks, static_cast<double>(8 * kMiB) / block, 1.0);
}

TEST(KvCacheFromMemory, TooLittleMemoryForOneSequenceIsAnError) {
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 13);
  // 8 MiB device, 25% usable: 2 MiB less what the runner holds (~0.5 MiB), less 1 MiB: ~300 blocks.
  {
    MeteredCpuBackend device(8 * kMiB);
    ModelRunner runner(spec, weights, device, from_memory(0.25, kMiB, 64), {32, 4});
    EXPECT_GE(runner.kv_config().num_blocks, 16);
  }
  MeteredCpuBackend device(8 * kMiB);
  const std::string message = error_of([&] { ModelRunner runner(spec, weights, device, from_memory(0.1, kMiB, 64), {32, 4}); });
  EXPECT_NE(message.find("one sequence of 64 tokens needs 16 blocks of 4 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("memory fraction 0.1"), std::string::npos) << message;
  EXPECT_NE(message.find("room for 0"), std::string::npos) << message;
  // A block count and a memory budget together contradict each other.
  KvCacheConfig both = from_memory(0.5, 0);
  both.num_blocks = 16;
  const std::string contradiction = error_of([&] { ModelRunner runner(spec, weights, device, both, {32, 4}); });
  EXPECT_NE(contradiction.find("num_blocks (16) must be 0 when sized from memory"), std::string::npos) << contradiction;
}

// Dynamic NTK runs as far as the cache reaches: sized from memory, the context is the cache.
TEST(KvCacheFromMemory, DynamicNtkContextIsTheSizedCache) {
  ModelSpec spec = tiny_spec();  // max_position 64
  spec.rope.scaling.type = RopeScalingType::DynamicNTK;
  spec.rope.scaling.factor = 2.0;
  spec.rope.scaling.original_max_position = 64;
  const ModelWeights weights = random_weights(spec, DType::F32, 14);
  const RunnerLimits limits{128, 2};
  MeteredCpuBackend device(4 * kMiB);
  ModelRunner runner(spec, weights, device, from_memory(0.5, kMiB), limits);
  const int32_t blocks = runner.kv_config().num_blocks;
  // The block tables grow with the cache here: each block is charged its max_seqs entries.
  EXPECT_EQ(blocks, expected_blocks(spec, device, 4 * kMiB, 0.5, kMiB, limits.max_seqs));
  ASSERT_GT(blocks, 100);
  EXPECT_EQ(runner.context_limit(), int64_t{blocks} * kBlockSize);
  EXPECT_EQ(runner.max_blocks_per_seq(), blocks);

  std::mt19937_64 rng(4);
  const std::vector<int32_t> tokens = random_tokens(rng, 100, spec.vocab_size);  // past max_position
  const Tensor got = runner.forward(single_span(tokens, 0, 100, iota_blocks(25), LogitsMode::All));
  auto cpu = make_cpu_backend(1);
  ModelRunner fixed(spec, weights, *cpu, {blocks, kBlockSize}, limits);
  const Tensor want = fixed.forward(single_span(tokens, 0, 100, iota_blocks(25), LogitsMode::All));
  ASSERT_EQ(got.shape, want.shape);
  EXPECT_EQ(std::memcmp(got.data, want.data, got.nbytes()), 0);
}

}  // namespace
}  // namespace splitflow::test
