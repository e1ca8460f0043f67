// Paged attention on the CPU, causal or (encoders) bidirectional, optionally with T5's relative
// position bias; cross-attention (decoder queries over the encoder's K/V) is the same kernel with
// every query seeing its sequence's whole context. A work item is (sequence, tile of up to 8
// consecutive new tokens, kv head): its tokens' query heads of that group stream over the
// sequence's KV blocks once, a chunk of about 128 keys (whole blocks) at a time, the chunk's keys
// transposed (16 x 16 register tiles) so scores vectorise over keys, two query rows scored per
// pass, with an online softmax (running max and sum per query row, the accumulator rescaled when
// the max grows); no score matrix is built. Values are read in place from an f32 cache; a cache in
// another dtype is converted to f32 a block at a time.
#include "backend/argument_checks.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/thread_team.h"
#include "backend/relative_position.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace splitflow::cpu {
namespace {

// New tokens of one sequence that share each pass over its KV blocks.
constexpr int64_t kQueryTile = 8;
// Keys scored together (whole KV blocks, at least one).
constexpr int64_t kChunkKeys = 128;
// Keys block_scores takes per pass of its widest loop (four vectors of 16).
constexpr int64_t kScorePass = 64;

// `count` rows of one kv head in the cache, row 0 at element `first`, as f32: the cache's own
// memory when it holds f32 (rows kv_dim apart), else converted to `converted` (head_dim apart).
struct F32Rows {
  const float* data;
  int64_t stride;
  const void* raw = nullptr;  // instead: an f16 / bf16 cache's rows, read in place (widened as loaded)
};

// Per-thread scratch (grows, never shrinks): one chunk's keys transposed, its scores, its values
// when the cache is not f32 (converted in place there), one block's keys in f32, where each
// block's values are (value_runs), and each query row's running max, sum and output accumulator.
struct AttentionScratch {
  std::vector<float> keys_t, scores, values, key_rows, max, sum, acc;
  std::vector<F32Rows> value_runs;
};

F32Rows f32_rows(const DeviceTensor& cache, int64_t first, int64_t count, int head_dim, int64_t kv_dim,
                 float* converted) {
  if (cache.dtype == DType::F32) return {cache.as<float>() + first, kv_dim};
  const char* base = static_cast<const char*>(cache.data);
  const size_t element_bytes = dtype_size(cache.dtype);
  for (int64_t j = 0; j < count; ++j) {
    const void* row = base + static_cast<size_t>(first + j * kv_dim) * element_bytes;
    float* out = converted + j * head_dim;
    // 16-bit caches through the SIMD widening (F16C, shifts); fp8 element by element.
    if (cache.dtype == DType::F16) {
      to_f32_row(static_cast<const F16Bits*>(row), out, head_dim);
    } else if (cache.dtype == DType::BF16) {
      to_f32_row(static_cast<const BF16Bits*>(row), out, head_dim);
    } else {
      convert_to_f32(cache.dtype, row, out, head_dim);
    }
  }
  return {converted, head_dim};
}

#ifdef SPLITFLOW_CPU_AVX512
// r[c] = column c of the 16 x 16 block whose rows are r[0..15].
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
  }
}
#endif

// keys_t[d * padded + column0 + j] = keys[j * stride + d] for j < rows, d < head_dim: a block's
// keys into the chunk's transposed layout. 16 x 16 tiles in registers on AVX-512 (a decode step's
// few query rows do not amortize a scalar transpose), scalar for what is left.
// Keys stored as f32, f16 or bf16 (T) are widened as they are loaded.
template <typename T>
void transpose_keys(const T* keys, int64_t stride, int64_t rows, int head_dim, float* keys_t, int64_t padded,
                    int64_t column0) {
  int64_t j0 = 0;
#ifdef SPLITFLOW_CPU_AVX512
  for (; j0 + 16 <= rows; j0 += 16) {
    int d0 = 0;
    for (; d0 + 16 <= head_dim; d0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = load16(keys + (j0 + i) * stride + d0);
      transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_ps(keys_t + (d0 + c) * padded + column0 + j0, r[c]);
    }
    for (int64_t j = j0; j < j0 + 16; ++j)
      for (int d = d0; d < head_dim; ++d) keys_t[d * padded + column0 + j] = to_f32(keys[j * stride + d]);
  }
#endif
  for (int64_t j = j0; j < rows; ++j)
    for (int d = 0; d < head_dim; ++d) keys_t[d * padded + column0 + j] = to_f32(keys[j * stride + d]);
}

// The largest of x[0..n), n >= 1.
float max_of(const float* x, int64_t n) {
  int64_t j = 0;
  float best = -std::numeric_limits<float>::infinity();
#ifdef SPLITFLOW_CPU_AVX512
  if (n >= 16) {
    __m512 m = _mm512_loadu_ps(x);
    for (j = 16; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
    best = _mm512_reduce_max_ps(m);
  }
#endif
  for (; j < n; ++j) best = std::max(best, x[j]);
  return best;
}

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

// scores[j] = scale * sum_d q[d] * keys_t[d * padded + j] for j < columns (a multiple of 8, at
// most padded), and with q2 the same for a second query row into scores2. Several key vectors
// per pass, each its own accumulator: one accumulator chain per vector of keys waits on the
// FMA's latency at every d (four times its throughput).
void block_scores(const float* q, float scale, const float* keys_t, int64_t padded, int64_t columns, int head_dim,
                  float* scores, const float* q2 = nullptr, float* scores2 = nullptr) {
  int64_t j = 0;
#ifdef SPLITFLOW_CPU_AVX512
  const __m512 scale16 = _mm512_set1_ps(scale);
  if (q2 != nullptr) {  // two query rows over the same keys: eight chains, each load used twice
    for (; j + 64 <= columns; j += 64) {
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
      for (int d = 0; d < head_dim; ++d) {
        const __m512 qa = _mm512_set1_ps(q[d]), qb = _mm512_set1_ps(q2[d]);
        const float* row = keys_t + d * padded + j;
        const __m512 k0 = _mm512_loadu_ps(row), k1 = _mm512_loadu_ps(row + 16), k2 = _mm512_loadu_ps(row + 32),
                     k3 = _mm512_loadu_ps(row + 48);
        a0 = _mm512_fmadd_ps(qa, k0, a0);
        a1 = _mm512_fmadd_ps(qa, k1, a1);
        a2 = _mm512_fmadd_ps(qa, k2, a2);
        a3 = _mm512_fmadd_ps(qa, k3, a3);
        b0 = _mm512_fmadd_ps(qb, k0, b0);
        b1 = _mm512_fmadd_ps(qb, k1, b1);
        b2 = _mm512_fmadd_ps(qb, k2, b2);
        b3 = _mm512_fmadd_ps(qb, k3, b3);
      }
      _mm512_storeu_ps(scores + j, _mm512_mul_ps(a0, scale16));
      _mm512_storeu_ps(scores + j + 16, _mm512_mul_ps(a1, scale16));
      _mm512_storeu_ps(scores + j + 32, _mm512_mul_ps(a2, scale16));
      _mm512_storeu_ps(scores + j + 48, _mm512_mul_ps(a3, scale16));
      _mm512_storeu_ps(scores2 + j, _mm512_mul_ps(b0, scale16));
      _mm512_storeu_ps(scores2 + j + 16, _mm512_mul_ps(b1, scale16));
      _mm512_storeu_ps(scores2 + j + 32, _mm512_mul_ps(b2, scale16));
      _mm512_storeu_ps(scores2 + j + 48, _mm512_mul_ps(b3, scale16));
    }
    if (j == columns) return;
    block_scores(q2, scale, keys_t + j, padded, columns - j, head_dim, scores2 + j);
  }
  for (; j + 64 <= columns; j += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < head_dim; ++d) {
      const __m512 qd = _mm512_set1_ps(q[d]);
      const float* row = keys_t + d * padded + j;
      a0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row), a0);
      a1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 16), a1);
      a2 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 32), a2);
      a3 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 48), a3);
    }
    _mm512_storeu_ps(scores + j, _mm512_mul_ps(a0, scale16));
    _mm512_storeu_ps(scores + j + 16, _mm512_mul_ps(a1, scale16));
    _mm512_storeu_ps(scores + j + 32, _mm512_mul_ps(a2, scale16));
    _mm512_storeu_ps(scores + j + 48, _mm512_mul_ps(a3, scale16));
  }
#endif
#ifdef SPLITFLOW_CPU_AVX2
  const __m256 scale8 = _mm256_set1_ps(scale);
  for (; j + 32 <= columns; j += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < head_dim; ++d) {
      const __m256 qd = _mm256_set1_ps(q[d]);
      const float* row = keys_t + d * padded + j;
      a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(row), a0);
      a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(row + 8), a1);
      a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(row + 16), a2);
      a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(row + 24), a3);
    }
    _mm256_storeu_ps(scores + j, _mm256_mul_ps(a0, scale8));
    _mm256_storeu_ps(scores + j + 8, _mm256_mul_ps(a1, scale8));
    _mm256_storeu_ps(scores + j + 16, _mm256_mul_ps(a2, scale8));
    _mm256_storeu_ps(scores + j + 24, _mm256_mul_ps(a3, scale8));
  }
  for (; j < columns; j += 8) {
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int d = 0;
    for (; d + 2 <= head_dim; d += 2) {
      even = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(keys_t + d * padded + j), even);
      odd = _mm256_fmadd_ps(_mm256_set1_ps(q[d + 1]), _mm256_loadu_ps(keys_t + (d + 1) * padded + j), odd);
    }
    if (d < head_dim) even = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(keys_t + d * padded + j), even);
    _mm256_storeu_ps(scores + j, _mm256_mul_ps(_mm256_add_ps(even, odd), scale8));
  }
#endif
  for (; j < columns; ++j) {
    float sum = 0.0f;
    for (int d = 0; d < head_dim; ++d) sum += q[d] * keys_t[d * padded + j];
    scores[j] = sum * scale;
  }
#ifndef SPLITFLOW_CPU_AVX512
  if (q2 != nullptr) block_scores(q2, scale, keys_t, padded, columns, head_dim, scores2);
#endif
}

}  // namespace

void CpuBackend::attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                           const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
  check_attention_args("cpu", DType::F32, kv_cache_dtypes(), qkv, k_cache, v_cache, batch, params, out);
  paged_attention(qkv.as<float>(), qkv.dim(1), qkv.dim(0), k_cache, v_cache, batch, params, nullptr, false, out);
}

void CpuBackend::attention_with_position_bias(const DeviceTensor& qkv, const DeviceTensor& k_cache,
                                              const DeviceTensor& v_cache, const AttentionBatch& batch,
                                              const AttentionParams& params, const RelativePositionBias& bias,
                                              const DeviceTensor& out) {
  check_biased_attention_args("cpu", DType::F32, kv_cache_dtypes(), qkv, k_cache, v_cache, batch, params, bias, out);
  paged_attention(qkv.as<float>(), qkv.dim(1), qkv.dim(0), k_cache, v_cache, batch, params, &bias, false, out);
}

void CpuBackend::cross_attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                 const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
  check_cross_attention_args("cpu", DType::F32, kv_cache_dtypes(), q, k_cache, v_cache, batch, params, out);
  AttentionParams all_keys = params;
  all_keys.causal = false;
  all_keys.sliding_window = 0;
  all_keys.logit_softcap = 0;
  paged_attention(q.as<float>(), q.dim(1), q.dim(0), k_cache, v_cache, batch, all_keys, nullptr, true, out);
}

void CpuBackend::paged_attention(const float* q_rows, int64_t q_stride, int64_t tokens, const DeviceTensor& k_cache,
                                 const DeviceTensor& v_cache, const AttentionBatch& batch, const AttentionParams& params,
                                 const RelativePositionBias* bias, bool cross, const DeviceTensor& out) {
  const int64_t seqs = batch.context_lens.numel();
  const int heads = params.num_heads, kv_heads = params.num_kv_heads, head_dim = params.head_dim;
  const int64_t q_dim = int64_t{heads} * head_dim, kv_dim = int64_t{kv_heads} * head_dim;
  const int32_t* query_start = batch.query_start.as<int32_t>();
  const int32_t* context_lens = batch.context_lens.as<int32_t>();
  const int32_t* block_tables = batch.block_tables.as<int32_t>();
  const int64_t table_width = batch.block_tables.dim(1), num_blocks = k_cache.dim(0);
  SF_CHECK(query_start[0] == 0 && query_start[seqs] == tokens, "cpu attention: query_start spans [{}, {}), not [0, {})",
           query_start[0], query_start[seqs], tokens);
  // Every position a query reads must map to a valid block: check once here, not in the loop.
  for (int64_t s = 0; s < seqs; ++s) {
    const int32_t count = query_start[s + 1] - query_start[s];
    SF_CHECK(count >= 0 && (cross ? context_lens[s] >= 1 : context_lens[s] >= count),
             "cpu attention: sequence {} has {} new tokens but context length {}", s, count, context_lens[s]);
    const int64_t used_blocks = (context_lens[s] + params.block_size - 1) / params.block_size;
    SF_CHECK(used_blocks <= table_width, "cpu attention: sequence {} needs {} blocks, its table holds {}", s,
             used_blocks, table_width);
    for (int64_t b = 0; b < used_blocks; ++b) {
      const int32_t block = block_tables[s * table_width + b];
      SF_CHECK(block >= 0 && block < num_blocks, "cpu attention: sequence {} block {} is {}, outside [0, {})", s, b,
               block, num_blocks);
    }
  }

  // Work items: (sequence, query tile of up to kQueryTile consecutive new tokens, kv head).
  // tile_start[s] counts the tiles of the sequences before s.
  // (The calling thread's vector: worker threads read it through a plain pointer.)
  thread_local std::vector<int64_t> tile_counts;
  tile_counts.assign(seqs + 1, 0);
  for (int64_t s = 0; s < seqs; ++s)
    tile_counts[s + 1] = tile_counts[s] + (query_start[s + 1] - query_start[s] + kQueryTile - 1) / kQueryTile;
  const int64_t* tile_start = tile_counts.data();
  const int64_t items = tile_start[seqs] * kv_heads;
  const int64_t work = int64_t{batch.max_context_len} * tokens * q_dim;  // bound on multiply-adds
  // The bias's bucket of every key - query distance a query of this batch can meet:
  // bucket_of[relative + longest - 1] for relative in (-longest, longest).
  thread_local std::vector<int32_t> bucket_table;
  int64_t longest = 0;
  if (bias != nullptr) {
    for (int64_t s = 0; s < seqs; ++s) longest = std::max<int64_t>(longest, context_lens[s]);
    bucket_table.resize(static_cast<size_t>(std::max<int64_t>(2 * longest - 1, 1)));
    for (int64_t r = -(longest - 1); r <= longest - 1; ++r)
      bucket_table[r + longest - 1] = relative_position_bucket(r, bias->num_buckets, bias->max_distance, bias->bidirectional);
  }
  const int32_t* bucket_of = bucket_table.data();
  const float* bias_table = bias != nullptr ? bias->table.as<float>() : nullptr;

  const int group = heads / kv_heads;
  const int64_t block_size = params.block_size;
  // Keys go through in chunks of whole blocks, about kChunkKeys at a time: one transpose, max,
  // rescale and exp per chunk rather than per block (16 keys), which dominated at long contexts.
  const int64_t chunk_blocks = std::max<int64_t>(1, kChunkKeys / block_size);
  const int64_t chunk_keys = chunk_blocks * block_size;
  // Key columns of a chunk, rounded to whole passes of block_scores (64 keys): a chunk's last
  // columns are zeros, scored like the others rather than by a slower remainder loop.
  const int64_t padded = (chunk_keys + kScorePass - 1) / kScorePass * kScorePass;
  const float scale = params.scale;
  // 16-bit values are read in place and widened as they are loaded; fp8 is converted a block at a time.
  const bool values_in_place = v_cache.dtype == DType::F16 || v_cache.dtype == DType::BF16;
  // Items are the team's chunks (backend/cpu/thread_team.h), each thread with its own scratch.
  parallel_chunks(items > 1 && work >= kMinParallelWork ? num_threads_ : 1, items, [&](int64_t item) {
    thread_local AttentionScratch scratch;
    scratch.keys_t.resize(head_dim * padded);
    scratch.scores.resize(2 * padded);
    scratch.key_rows.resize(block_size * head_dim);
    scratch.values.resize(chunk_keys * head_dim);
    scratch.value_runs.resize(chunk_blocks);
    scratch.max.resize(kQueryTile * group);
    scratch.sum.resize(kQueryTile * group);
    scratch.acc.resize(kQueryTile * group * int64_t{head_dim});
    {
      const int64_t tile = item / kv_heads;
      const int kv_head = static_cast<int>(item % kv_heads);
      const int64_t s = std::upper_bound(tile_start, tile_start + seqs + 1, tile) - tile_start - 1;
      const int64_t t0 = query_start[s] + (tile - tile_start[s]) * kQueryTile;
      const int64_t t1 = std::min<int64_t>(query_start[s + 1], t0 + kQueryTile);
      const int64_t pos0 = context_lens[s] - (query_start[s + 1] - query_start[s]) + (t0 - query_start[s]);
      // The last key any query of the tile sees: its own last token's, or the sequence's last.
      const int64_t last_pos = params.causal ? pos0 + (t1 - t0) - 1 : context_lens[s] - 1;
      const int64_t first_key = params.sliding_window > 0 ? std::max<int64_t>(0, pos0 - params.sliding_window + 1) : 0;
      const int32_t* table = block_tables + s * table_width;
      const int64_t rows = (t1 - t0) * group;
      std::fill_n(scratch.max.begin(), rows, -std::numeric_limits<float>::infinity());
      std::fill_n(scratch.sum.begin(), rows, 0.0f);
      std::fill_n(scratch.acc.begin(), rows * head_dim, 0.0f);
      const int64_t last_block = last_pos / block_size;
      for (int64_t b0 = first_key / block_size; b0 <= last_block; b0 += chunk_blocks) {
        const int64_t b1 = std::min(last_block + 1, b0 + chunk_blocks);
        const int64_t key0 = b0 * block_size, count = std::min(b1 * block_size, last_pos + 1) - key0;
        // keys_t [head_dim, padded]: the chunk's keys transposed, so scores vectorise over keys;
        // value_runs: each block's values, read in place from an f32 cache (else converted into
        // `values`, contiguous).
        float* keys_t = scratch.keys_t.data();
        F32Rows* value_runs = scratch.value_runs.data();
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t offset = b * block_size - key0, rows_here = std::min(block_size, count - offset);
          const int64_t first = int64_t{table[b]} * block_size * kv_dim + int64_t{kv_head} * head_dim;
          if (k_cache.dtype == DType::F16) {
            transpose_keys(static_cast<const F16Bits*>(k_cache.data) + first, kv_dim, rows_here, head_dim, keys_t, padded, offset);
          } else if (k_cache.dtype == DType::BF16) {
            transpose_keys(static_cast<const BF16Bits*>(k_cache.data) + first, kv_dim, rows_here, head_dim, keys_t, padded, offset);
          } else {  // f32 in place; fp8 converted a block at a time first
            const F32Rows keys = f32_rows(k_cache, first, rows_here, head_dim, kv_dim, scratch.key_rows.data());
            transpose_keys(keys.data, keys.stride, rows_here, head_dim, keys_t, padded, offset);
          }
          value_runs[b - b0] = values_in_place
                                   ? F32Rows{nullptr, kv_dim, static_cast<const char*>(v_cache.data) + first * dtype_size(v_cache.dtype)}
                                   : f32_rows(v_cache, first, rows_here, head_dim, kv_dim, scratch.values.data() + offset * head_dim);
        }
        for (int d = 0; d < head_dim; ++d) std::fill(keys_t + d * padded + count, keys_t + (d + 1) * padded, 0.0f);
        const int64_t scored = (count + kScorePass - 1) / kScorePass * kScorePass;  // whole passes
        for (int64_t i = 0; i < t1 - t0; ++i) {
          const int64_t position = pos0 + i;
          const int64_t lo = params.sliding_window > 0 ? std::max(key0, position - params.sliding_window + 1) : key0;
          const int64_t hi = params.causal ? std::min(key0 + count, position + 1) : key0 + count;
          if (lo >= hi) continue;
          const int64_t j_lo = lo - key0, j_count = hi - lo;
          // One query row's scores into its running softmax and accumulator.
          const auto absorb = [&](int r, float* scores) {
            const int64_t row = i * group + r;
            const int head = kv_head * group + r;
            float* live = scores + j_lo;  // the keys this query sees: [lo, hi)
            if (bias_table != nullptr)
              for (int64_t j = 0; j < j_count; ++j)
                live[j] += bias_table[int64_t{bucket_of[lo + j - position + longest - 1]} * heads + head];
            if (params.logit_softcap > 0.0f)
              for (int64_t j = 0; j < j_count; ++j) live[j] = params.logit_softcap * std::tanh(live[j] / params.logit_softcap);
            const float block_max = max_of(live, j_count);
            float* acc = scratch.acc.data() + row * head_dim;
            const float new_max = std::max(scratch.max[row], block_max);
            if (new_max > scratch.max[row] && scratch.sum[row] > 0.0f) {
              const float correction = std::exp(scratch.max[row] - new_max);
              scratch.sum[row] *= correction;
              cpu::scale(correction, acc, head_dim);
            }
            scratch.max[row] = new_max;
            scratch.sum[row] += exp_shifted(live, j_count, new_max);
            for (int64_t j = j_lo, end = j_lo + j_count; j < end;) {  // block by block
              const int64_t block = j / block_size, block_end = std::min(end, (block + 1) * block_size);
              const F32Rows& run = value_runs[block];
              const int64_t skip = (j - block * block_size) * run.stride;
              if (v_cache.dtype == DType::F16)
                add_weighted_rows(live + (j - j_lo), block_end - j, static_cast<const F16Bits*>(run.raw) + skip, run.stride, acc, head_dim);
              else if (v_cache.dtype == DType::BF16)
                add_weighted_rows(live + (j - j_lo), block_end - j, static_cast<const BF16Bits*>(run.raw) + skip, run.stride, acc, head_dim);
              else
                add_weighted_rows(live + (j - j_lo), block_end - j, run.data + skip, run.stride, acc, head_dim);
              j = block_end;
            }
          };
          const auto query = [&](int r) { return q_rows + (t0 + i) * q_stride + int64_t{kv_head * group + r} * head_dim; };
          float* scores = scratch.scores.data();
          float* scores2 = scores + padded;
          int r = 0;
          for (; r + 2 <= group; r += 2) {  // rows of one kv head two at a time: the keys loaded once
            block_scores(query(r), scale, keys_t, padded, scored, head_dim, scores, query(r + 1), scores2);
            absorb(r, scores);
            absorb(r + 1, scores2);
          }
          if (r < group) {
            block_scores(query(r), scale, keys_t, padded, scored, head_dim, scores);
            absorb(r, scores);
          }
        }
      }
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t t = t0 + row / group;
        float* o = out.as<float>() + t * q_dim + int64_t{kv_head * group + row % group} * head_dim;
        const float inv = 1.0f / scratch.sum[row];
        const float* acc = scratch.acc.data() + row * head_dim;
        for (int d = 0; d < head_dim; ++d) o[d] = acc[d] * inv;
      }
    }
  });
}

}  // namespace splitflow::cpu
