// Paged attention against a dense fp64 softmax(scale * Q K^T) V with a causal (and sliding-window)
// mask, over sequences whose blocks are scattered through the cache and whose new tokens follow an
// already cached prefix; caches in f32 and in the reduced-precision dtypes the CPU backend stores
// (the reference then reads the values the cache holds).
#include "backend/backend.h"
#include "backend/backend_test_util.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

using namespace splitflow;
using namespace splitflow::test;

namespace {

struct SequenceCase {
  int prefix;   // tokens already cached
  int fresh;    // new tokens this step
};

struct AttentionCase {
  int heads, kv_heads, head_dim, block_size, window;
  std::vector<SequenceCase> seqs;
  float softcap = 0;  // > 0: scores become softcap * tanh(score / softcap)
};

// Rounds `values` to what a `dtype` cache holds.
void round_to(DType dtype, std::vector<float>& values) {
  Tensor stored = Tensor::zeros(dtype, {static_cast<int64_t>(values.size())});
  convert_from_f32(values.data(), dtype, stored.data, values.size());
  convert_to_f32(dtype, stored.data, values.data(), values.size());
}

// Runs the case with the caches in `cache_dtype`; the outputs go to `output` when given.
void run_case(Backend& backend, const AttentionCase& c, uint64_t seed, DType cache_dtype = DType::F32,
              std::vector<float>* output = nullptr) {
  std::mt19937_64 rng(seed);
  const int64_t kv_dim = int64_t{c.kv_heads} * c.head_dim, q_dim = int64_t{c.heads} * c.head_dim;
  const int64_t width = q_dim + 2 * kv_dim;
  const int64_t seqs = c.seqs.size();

  // Block tables: a random permutation of the cache's blocks dealt out to the sequences, so tables
  // are non-contiguous and interleaved; a few blocks stay unused.
  std::vector<int64_t> blocks_needed;
  int64_t total_blocks = 3, max_blocks = 1;
  for (const SequenceCase& s : c.seqs) {
    blocks_needed.push_back((s.prefix + s.fresh + c.block_size - 1) / c.block_size);
    total_blocks += blocks_needed.back();
    max_blocks = std::max(max_blocks, blocks_needed.back());
  }
  std::vector<int32_t> permutation(total_blocks);
  std::iota(permutation.begin(), permutation.end(), 0);
  std::shuffle(permutation.begin(), permutation.end(), rng);
  std::vector<int32_t> tables(seqs * (max_blocks + 1), -1);  // padded with an out-of-range marker
  size_t next = 0;
  for (int64_t s = 0; s < seqs; ++s)
    for (int64_t b = 0; b < blocks_needed[s]; ++b) tables[s * (max_blocks + 1) + b] = permutation[next++];

  // Keys and values of every position of every sequence, written into the paged cache on the host.
  std::vector<std::vector<float>> keys(seqs), values(seqs);
  std::vector<float> k_cache(total_blocks * c.block_size * kv_dim, 0.0f), v_cache(k_cache.size(), 0.0f);
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t length = c.seqs[s].prefix + c.seqs[s].fresh;
    keys[s] = random_floats(rng, length * kv_dim, -2.0f, 2.0f);
    values[s] = random_floats(rng, length * kv_dim);
    round_to(cache_dtype, keys[s]);
    round_to(cache_dtype, values[s]);
    for (int64_t p = 0; p < length; ++p) {
      const int64_t slot = int64_t{tables[s * (max_blocks + 1) + p / c.block_size]} * c.block_size + p % c.block_size;
      std::copy_n(&keys[s][p * kv_dim], kv_dim, &k_cache[slot * kv_dim]);
      std::copy_n(&values[s][p * kv_dim], kv_dim, &v_cache[slot * kv_dim]);
    }
  }

  std::vector<int32_t> query_start = {0}, context_lens;
  for (const SequenceCase& s : c.seqs) {
    query_start.push_back(query_start.back() + s.fresh);
    context_lens.push_back(s.prefix + s.fresh);
  }
  const int64_t tokens = query_start.back();
  const std::vector<float> qkv = random_floats(rng, tokens * width, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)) * 1.3f;

  DeviceBuffer d_qkv = to_device(backend, qkv, {tokens, width});
  const Shape cache_shape = {total_blocks, c.block_size, c.kv_heads, c.head_dim};
  DeviceBuffer d_k = store_matrix(backend, k_cache, cache_shape, cache_dtype).buffer;
  DeviceBuffer d_v = store_matrix(backend, v_cache, cache_shape, cache_dtype).buffer;
  DeviceBuffer d_qs = to_device(backend, query_start, {seqs + 1});
  DeviceBuffer d_cl = to_device(backend, context_lens, {seqs});
  DeviceBuffer d_bt = to_device(backend, tables, {seqs, max_blocks + 1});
  DeviceBuffer d_out = backend.allocate(DType::F32, {tokens, q_dim});
  AttentionBatch batch{d_qs.view(), d_cl.view(), d_bt.view(), 0, 0};
  for (int64_t s = 0; s < seqs; ++s) {
    batch.max_query_len = std::max(batch.max_query_len, c.seqs[s].fresh);
    batch.max_context_len = std::max(batch.max_context_len, context_lens[s]);
  }
  const AttentionParams params{c.heads, c.kv_heads, c.head_dim, c.block_size, scale, c.window, c.softcap};
  backend.attention(d_qkv.view(), d_k.view(), d_v.view(), batch, params, d_out.view());
  const std::vector<float> got = to_host(backend, d_out.view());
  if (output != nullptr) *output = got;

  const int group = c.heads / c.kv_heads;
  for (int64_t s = 0; s < seqs; ++s)
    for (int i = 0; i < c.seqs[s].fresh; ++i) {
      const int64_t t = query_start[s] + i, position = c.seqs[s].prefix + i;
      const int64_t first = c.window > 0 ? std::max<int64_t>(0, position - c.window + 1) : 0;
      for (int h = 0; h < c.heads; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> scores;
        for (int64_t j = first; j <= position; ++j) {
          double dot = 0.0;
          for (int d = 0; d < c.head_dim; ++d)
            dot += static_cast<double>(qkv[t * width + h * c.head_dim + d]) * keys[s][j * kv_dim + kvh * c.head_dim + d];
          const double score = dot * scale;
          scores.push_back(c.softcap > 0 ? c.softcap * std::tanh(score / c.softcap) : score);
        }
        const double top = *std::max_element(scores.begin(), scores.end());
        double total = 0.0;
        for (double& v : scores) total += (v = std::exp(v - top));
        for (int d = 0; d < c.head_dim; ++d) {
          double want = 0.0;
          for (int64_t j = first; j <= position; ++j)
            want += scores[j - first] / total * values[s][j * kv_dim + kvh * c.head_dim + d];
          ASSERT_NEAR(got[t * q_dim + h * c.head_dim + d], want, 2e-6)
              << "seq " << s << " token " << i << " head " << h << " dim " << d << " (heads " << c.heads << ", kv "
              << c.kv_heads << ", window " << c.window << ", block " << c.block_size << ", cache "
              << dtype_name(cache_dtype) << ")";
        }
      }
    }
}

class PagedAttention : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
};

// A full prefill, a chunk after a cached prefix, and a decode step, batched together.
const std::vector<SequenceCase> kMixedBatch = {{0, 9}, {13, 6}, {37, 1}, {4, 1}};

TEST_F(PagedAttention, GqaRatiosMatchDenseReference) {
  uint64_t seed = 1;
  for (int kv_heads : {8, 4, 2, 1})
    for (int head_dim : {20, 64}) run_case(*backend, {8, kv_heads, head_dim, 4, 0, kMixedBatch}, seed++);
}

TEST_F(PagedAttention, SlidingWindowMatchesDenseReference) {
  uint64_t seed = 100;
  for (int window : {1, 5, 16, 64})
    for (int block_size : {4, 16}) run_case(*backend, {4, 2, 16, block_size, window, kMixedBatch}, seed++);
}

TEST_F(PagedAttention, LogitSoftcapMatchesDenseReference) {
  uint64_t seed = 200;
  for (int window : {0, 5}) {
    AttentionCase c{4, 2, 16, 4, window, kMixedBatch};
    c.softcap = 0.5f;
    run_case(*backend, c, seed++);
  }
}

TEST_F(PagedAttention, LongContextAcrossManyBlocks) {
  run_case(*backend, {6, 3, 32, 16, 0, {{300, 17}, {511, 1}}}, 7);
  run_case(*backend, {2, 1, 8, 1, 0, {{40, 3}}}, 8);  // one token per block
  // Keys go in chunks of whole blocks (about 128 keys): an odd block size, a window and new tokens
  // that straddle chunk boundaries.
  run_case(*backend, {4, 2, 16, 7, 0, {{250, 20}, {3, 130}}}, 9);
  run_case(*backend, {4, 2, 16, 16, 100, {{240, 30}, {120, 9}}}, 10);
  // Keys are transposed in 16 x 16 tiles where a block holds 16 of them: a head_dim that is not a
  // multiple of 16 leaves a column remainder.
  run_case(*backend, {4, 2, 20, 16, 0, {{100, 9}, {0, 33}}}, 11);
}

// A cache in f16, bf16 or fp8 e4m3 holds rounded values; attention reads them back exactly, so it
// meets the f32 tolerance against the reference computed from those values.
TEST_F(PagedAttention, ReducedPrecisionCachesMatchTheReferenceOfTheirValues) {
  uint64_t seed = 200;
  for (DType dtype : {DType::F8E4M3, DType::BF16, DType::F16}) {
    for (int kv_heads : {8, 2, 1}) run_case(*backend, {8, kv_heads, 64, 4, 0, kMixedBatch}, seed++, dtype);
    run_case(*backend, {4, 2, 16, 16, 5, kMixedBatch}, seed++, dtype);
    run_case(*backend, {6, 3, 32, 16, 0, {{300, 17}, {511, 1}}}, seed++, dtype);
  }
}

// The fp8 cache against the f32 cache on the same inputs. e4m3 keeps 3 mantissa bits, so each K
// and V element moves by at most 2^-4 of its value (RMS about 2.6 % for these uniform values);
// outputs, mixes of V rows under softmax weights that the K errors shift, move by a relative L2
// of 3.0-3.4 % here (K in [-2, 2], V in [-1, 1], scale 1.3/sqrt(d)). Bound: 5 %.
TEST_F(PagedAttention, Fp8CacheStaysCloseToTheF32Cache) {
  uint64_t seed = 300;
  const AttentionCase cases[] = {{8, 2, 64, 16, 0, kMixedBatch}, {4, 1, 128, 16, 0, {{500, 1}, {0, 40}}},
                                 {4, 2, 32, 4, 16, kMixedBatch}};
  for (const AttentionCase& c : cases) {
    std::vector<float> exact, fp8;
    run_case(*backend, c, seed, DType::F32, &exact);
    run_case(*backend, c, seed++, DType::F8E4M3, &fp8);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
      diff += (fp8[i] - exact[i]) * double{fp8[i] - exact[i]};
      norm += exact[i] * double{exact[i]};
    }
    EXPECT_LE(std::sqrt(diff / norm), 0.05) << "head_dim " << c.head_dim << ", kv heads " << c.kv_heads;
  }
}

TEST_F(PagedAttention, RejectsBlockOutsideCache) {
  const std::vector<float> qkv(4 * 2, 0.5f);
  DeviceBuffer d_qkv = to_device(*backend, qkv, {2, 4});  // heads 2, kv 1, head_dim 1
  DeviceBuffer cache = backend->allocate(DType::F32, {2, 2, 1, 1});
  DeviceBuffer qs = to_device(*backend, std::vector<int32_t>{0, 2}, {2});
  DeviceBuffer cl = to_device(*backend, std::vector<int32_t>{3}, {1});
  DeviceBuffer bt = to_device(*backend, std::vector<int32_t>{1, 2}, {1, 2});  // block 2 does not exist
  DeviceBuffer out = backend->allocate(DType::F32, {2, 2});
  const AttentionParams params{2, 1, 1, 2, 1.0f, 0};
  EXPECT_THROW(backend->attention(d_qkv.view(), cache.view(), cache.view(), {qs.view(), cl.view(), bt.view(), 2, 3},
                                  params, out.view()),
               Error);
  DeviceBuffer short_table = to_device(*backend, std::vector<int32_t>{1}, {1, 1});  // 3 tokens need 2 blocks
  EXPECT_THROW(backend->attention(d_qkv.view(), cache.view(), cache.view(),
                                  {qs.view(), cl.view(), short_table.view(), 2, 3}, params, out.view()),
               Error);
}

}  // namespace
