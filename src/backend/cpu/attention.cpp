// Paged causal attention on the CPU: one work item per (new token, kv head); the item's group of
// query heads streams over the sequence's KV blocks once, with an online softmax (running max and
// sum per head, the accumulator rescaled when the max grows), so no score matrix is built.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace splitflow::cpu {
namespace {

// Per-thread scratch (grows, never shrinks): scores of one block, and the group's running state.
struct AttentionScratch {
  std::vector<float> scores, max, sum, acc;
};

// e^(x[j] - shift) for j < n, in place; returns their sum.
float exp_shifted(float* x, int64_t n, float shift) {
  int64_t j = 0;
  float total = 0.0f;
#ifdef SPLITFLOW_CPU_AVX2
  __m256 sum = _mm256_setzero_ps();
  const __m256 s = _mm256_set1_ps(shift);
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
    _mm256_storeu_ps(x + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = hsum(sum);
#endif
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    total += x[j];
  }
  return total;
}

}  // namespace

void CpuBackend::attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                           const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
  const int heads = params.num_heads, kv_heads = params.num_kv_heads, head_dim = params.head_dim;
  SF_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && params.block_size > 0,
           "cpu attention: heads {}, kv_heads {}, head_dim {}, block_size {} are not a valid configuration", heads,
           kv_heads, head_dim, params.block_size);
  SF_CHECK(qkv.dtype == DType::F32 && k_cache.dtype == DType::F32 && v_cache.dtype == DType::F32 &&
               out.dtype == DType::F32,
           "cpu attention: qkv, caches and out must be f32");
  const int64_t q_dim = int64_t{heads} * head_dim, kv_dim = int64_t{kv_heads} * head_dim;
  const int64_t width = q_dim + 2 * kv_dim, tokens = qkv.dim(0);
  SF_CHECK(qkv.shape == Shape({tokens, width}), "cpu attention: qkv has shape {}, expected [{}, {}]",
           shape_str(qkv.shape), tokens, width);
  SF_CHECK(out.shape == Shape({tokens, q_dim}), "cpu attention: out has shape {}, expected [{}, {}]",
           shape_str(out.shape), tokens, q_dim);
  SF_CHECK(k_cache.shape.size() == 4 && k_cache.dim(1) == params.block_size && k_cache.dim(2) == kv_heads &&
               k_cache.dim(3) == head_dim && v_cache.shape == k_cache.shape,
           "cpu attention: caches have shapes {} and {}, expected [blocks, {}, {}, {}]", shape_str(k_cache.shape),
           shape_str(v_cache.shape), params.block_size, kv_heads, head_dim);
  const int64_t seqs = batch.context_lens.numel();
  SF_CHECK(batch.query_start.numel() == seqs + 1 && batch.block_tables.shape.size() == 2 &&
               batch.block_tables.dim(0) == seqs,
           "cpu attention: query_start {}, context_lens {} and block_tables {} disagree on the sequence count",
           shape_str(batch.query_start.shape), shape_str(batch.context_lens.shape), shape_str(batch.block_tables.shape));
  const int32_t* query_start = batch.query_start.as<int32_t>();
  const int32_t* context_lens = batch.context_lens.as<int32_t>();
  const int32_t* block_tables = batch.block_tables.as<int32_t>();
  const int64_t table_width = batch.block_tables.dim(1), num_blocks = k_cache.dim(0);
  SF_CHECK(query_start[0] == 0 && query_start[seqs] == tokens, "cpu attention: query_start spans [{}, {}), not [0, {})",
           query_start[0], query_start[seqs], tokens);
  // Every position a query reads must map to a valid block: check once here, not in the loop.
  for (int64_t s = 0; s < seqs; ++s) {
    const int32_t count = query_start[s + 1] - query_start[s];
    SF_CHECK(count >= 0 && context_lens[s] >= count, "cpu attention: sequence {} has {} new tokens but context length {}",
             s, count, context_lens[s]);
    const int64_t used_blocks = (context_lens[s] + params.block_size - 1) / params.block_size;
    SF_CHECK(used_blocks <= table_width, "cpu attention: sequence {} needs {} blocks, its table holds {}", s,
             used_blocks, table_width);
    for (int64_t b = 0; b < used_blocks; ++b) {
      const int32_t block = block_tables[s * table_width + b];
      SF_CHECK(block >= 0 && block < num_blocks, "cpu attention: sequence {} block {} is {}, outside [0, {})", s, b,
               block, num_blocks);
    }
  }

  const int group = heads / kv_heads;
  const int block_size = params.block_size;
  const float scale = params.scale;
  const float* k_base = k_cache.as<float>();
  const float* v_base = v_cache.as<float>();
  const int64_t items = tokens * kv_heads;
  const int64_t work = int64_t{batch.max_context_len} * tokens * q_dim;  // bound on multiply-adds
#pragma omp parallel num_threads(num_threads_) if (items > 1 && work >= kMinParallelWork)
  {
    thread_local AttentionScratch scratch;
    scratch.scores.resize(block_size);
    scratch.max.resize(group);
    scratch.sum.resize(group);
    scratch.acc.resize(static_cast<size_t>(group) * head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item / kv_heads;
      const int kv_head = static_cast<int>(item % kv_heads);
      // The sequence owning token t: the last s with query_start[s] <= t (empty spans skipped).
      const int64_t s = std::upper_bound(query_start, query_start + seqs + 1, static_cast<int32_t>(t)) - query_start - 1;
      const int64_t position = context_lens[s] - (query_start[s + 1] - query_start[s]) + (t - query_start[s]);
      const int64_t first = params.sliding_window > 0 ? std::max<int64_t>(0, position - params.sliding_window + 1) : 0;
      const int32_t* table = block_tables + s * table_width;
      std::fill(scratch.max.begin(), scratch.max.end(), -std::numeric_limits<float>::infinity());
      std::fill(scratch.sum.begin(), scratch.sum.end(), 0.0f);
      std::fill(scratch.acc.begin(), scratch.acc.end(), 0.0f);
      for (int64_t b = first / block_size; b <= position / block_size; ++b) {
        const int64_t begin = std::max(first, b * block_size), end = std::min(position + 1, (b + 1) * block_size);
        const int64_t offset = begin - b * block_size, count = end - begin;
        const int64_t slot0 = int64_t{table[b]} * block_size + offset;
        const float* keys = k_base + slot0 * kv_dim + int64_t{kv_head} * head_dim;
        const float* values = v_base + slot0 * kv_dim + int64_t{kv_head} * head_dim;
        for (int r = 0; r < group; ++r) {
          const float* q = qkv.as<float>() + t * width + int64_t{kv_head * group + r} * head_dim;
          float* scores = scratch.scores.data();
          float block_max = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < count; ++j) {
            scores[j] = dot(q, keys + j * kv_dim, head_dim) * scale;
            block_max = std::max(block_max, scores[j]);
          }
          float* acc = scratch.acc.data() + int64_t{r} * head_dim;
          const float new_max = std::max(scratch.max[r], block_max);
          if (new_max > scratch.max[r] && scratch.sum[r] > 0.0f) {
            const float correction = std::exp(scratch.max[r] - new_max);
            scratch.sum[r] *= correction;
            cpu::scale(correction, acc, head_dim);
          }
          scratch.max[r] = new_max;
          scratch.sum[r] += exp_shifted(scores, count, new_max);
          for (int64_t j = 0; j < count; ++j) axpy(scores[j], values + j * kv_dim, acc, head_dim);
        }
      }
      for (int r = 0; r < group; ++r) {
        float* o = out.as<float>() + t * q_dim + int64_t{kv_head * group + r} * head_dim;
        const float inv = 1.0f / scratch.sum[r];
        const float* acc = scratch.acc.data() + int64_t{r} * head_dim;
        for (int d = 0; d < head_dim; ++d) o[d] = acc[d] * inv;
      }
    }
  }
}

}  // namespace splitflow::cpu
