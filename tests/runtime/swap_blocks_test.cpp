// ModelRunner::swap_blocks: a sequence's KV copied to the host swap area, its device blocks
// overwritten by another sequence, then copied back into other blocks, must continue exactly as
// the unswapped sequence does (same logits, bit for bit: same values, same order of math), with
// the cache in the activation dtype and in fp8 (a swap area of one byte per element).
#include "runtime/runner_test_util.h"

#include "backend/backend.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cstring>

namespace splitflow::test {
namespace {

constexpr int32_t kBlockSize = 4;

bool same_logits(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

class ModelRunnerSwap : public ::testing::TestWithParam<std::optional<DType>> {};

TEST_P(ModelRunnerSwap, SwappedBlocksContinueTheSequenceFromOtherBlocks) {
  auto backend = make_cpu_backend(1);
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 21);
  std::mt19937_64 rng(22);
  const std::vector<int32_t> tokens = random_tokens(rng, 13, spec.vocab_size);
  const std::vector<int32_t> other = random_tokens(rng, 12, spec.vocab_size);
  ModelRunner runner(spec, weights, *backend, {8, kBlockSize, 4, GetParam()});

  // Positions 0..11 in blocks 0-2; the decode of position 12 (block 3) is the reference.
  runner.forward(single_span(tokens, 0, 12, {0, 1, 2}, LogitsMode::Last));
  const Tensor reference = runner.forward(single_span(tokens, 12, 1, {0, 1, 2, 3}, LogitsMode::Last));

  const std::vector<BlockCopy> out = {{0, 3}, {1, 1}, {2, 0}};
  runner.swap_blocks(out, CopyDirection::DeviceToHost);
  runner.forward(single_span(other, 0, 12, {0, 1, 2}, LogitsMode::Last));  // clobbers blocks 0-2
  const Tensor clobbered = runner.forward(single_span(tokens, 12, 1, {0, 1, 2, 4}, LogitsMode::Last));
  EXPECT_FALSE(same_logits(clobbered, reference)) << "the overwrite was meant to change the context";

  const std::vector<BlockCopy> in = {{5, 3}, {6, 1}, {7, 0}};
  runner.swap_blocks(in, CopyDirection::HostToDevice);
  const Tensor swapped = runner.forward(single_span(tokens, 12, 1, {5, 6, 7, 4}, LogitsMode::Last));
  EXPECT_TRUE(same_logits(swapped, reference));
  runner.swap_blocks({}, CopyDirection::HostToDevice);  // nothing to copy
}

INSTANTIATE_TEST_SUITE_P(CacheDtypes, ModelRunnerSwap, ::testing::Values(std::nullopt, DType::F8E4M3),
                         [](const auto& info) { return info.param ? std::string(dtype_name(*info.param)) : "auto"; });

TEST(ModelRunnerSwapErrors, RejectsCopiesWithoutASwapAreaOrOutsideIt) {
  auto backend = make_cpu_backend(1);
  const ModelSpec spec = tiny_spec();
  const ModelWeights weights = random_weights(spec, DType::F32, 23);
  EXPECT_THROW(ModelRunner(spec, weights, *backend, {8, kBlockSize, -1}), Error);

  ModelRunner no_area(spec, weights, *backend, {8, kBlockSize});
  const std::vector<BlockCopy> copy = {{0, 0}};
  try {
    no_area.swap_blocks(copy, CopyDirection::DeviceToHost);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no host swap area"), std::string::npos) << e.what();
  }
  no_area.swap_blocks({}, CopyDirection::DeviceToHost);  // no copies, no area needed

  ModelRunner runner(spec, weights, *backend, {8, kBlockSize, 2});
  const std::vector<BlockCopy> past_host = {{0, 2}};
  const std::vector<BlockCopy> past_cache = {{8, 0}};
  EXPECT_THROW(runner.swap_blocks(past_host, CopyDirection::DeviceToHost), Error);
  EXPECT_THROW(runner.swap_blocks(past_cache, CopyDirection::HostToDevice), Error);
}

}  // namespace
}  // namespace splitflow::test
