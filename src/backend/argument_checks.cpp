#include "backend/argument_checks.h"

#include <algorithm>

namespace splitflow {
namespace {

void check_dtype(const char* backend, const char* kernel, const char* arg, const DeviceTensor& t, DType dtype) {
  SF_CHECK(t.dtype == dtype, "{} {}: {} has dtype {}, expected {}", backend, kernel, arg, dtype_name(t.dtype),
           dtype_name(dtype));
}

void check_shape(const char* backend, const char* kernel, const char* arg, const DeviceTensor& t,
                 const Shape& expected) {
  SF_CHECK(t.shape == expected, "{} {}: {} has shape {}, expected {}", backend, kernel, arg, shape_str(t.shape),
           shape_str(expected));
}

// [blocks, block_size, kv_heads, head_dim] in one of cache_dtypes, V the same as K.
void check_caches(const char* backend, const char* kernel, std::span<const DType> cache_dtypes,
                  const DeviceTensor& k_cache, const DeviceTensor& v_cache, const AttentionParams& params) {
  SF_CHECK(std::find(cache_dtypes.begin(), cache_dtypes.end(), k_cache.dtype) != cache_dtypes.end(),
           "{} {}: k_cache has dtype {}, expected one of {}", backend, kernel, dtype_name(k_cache.dtype),
           dtype_names(cache_dtypes));
  check_dtype(backend, kernel, "v_cache", v_cache, k_cache.dtype);
  SF_CHECK(k_cache.shape.size() == 4 && k_cache.dim(1) == params.block_size &&
               k_cache.dim(2) == params.num_kv_heads && k_cache.dim(3) == params.head_dim &&
               v_cache.shape == k_cache.shape,
           "{} {}: caches have shapes {} and {}, expected [blocks, {}, {}, {}]", backend, kernel,
           shape_str(k_cache.shape), shape_str(v_cache.shape), params.block_size, params.num_kv_heads,
           params.head_dim);
}

}  // namespace

void check_rope_args(const char* backend, DType activation, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                     const DeviceTensor& table_rows, const RopeParams& params) {
  check_dtype(backend, "rope", "qkv", qkv, activation);
  check_dtype(backend, "rope", "cos_sin", cos_sin, DType::F32);
  check_dtype(backend, "rope", "table_rows", table_rows, DType::I32);
  const int head_dim = params.head_dim;
  SF_CHECK(params.rotary_dim % 2 == 0 && params.rotary_dim > 0 && params.rotary_dim <= head_dim,
           "{} rope: rotary_dim {} must be even and in (0, head_dim {}]", backend, params.rotary_dim, head_dim);
  SF_CHECK(qkv.shape.size() == 2, "{} rope: qkv has shape {}, expected [tokens, width]", backend,
           shape_str(qkv.shape));
  const int64_t tokens = qkv.dim(0), width = (params.num_heads + 2 * params.num_kv_heads) * int64_t{head_dim};
  check_shape(backend, "rope", "qkv", qkv, {tokens, width});
  check_shape(backend, "rope", "table_rows", table_rows, {tokens});
  SF_CHECK(cos_sin.shape.size() == 3 && cos_sin.dim(1) == 2 && cos_sin.dim(2) == params.rotary_dim / 2,
           "{} rope: cos_sin has shape {}, expected [rows, 2, {}]", backend, shape_str(cos_sin.shape),
           params.rotary_dim / 2);
}

void check_write_kv_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                         const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                         const DeviceTensor& k_cache, const DeviceTensor& v_cache) {
  check_dtype(backend, "write_kv", "qkv", qkv, activation);
  check_dtype(backend, "write_kv", "slots", slots, DType::I32);
  SF_CHECK(qkv.shape.size() == 2, "{} write_kv: qkv has shape {}, expected [tokens, width]", backend,
           shape_str(qkv.shape));
  const int64_t kv_dim = int64_t{params.num_kv_heads} * params.head_dim;
  const int64_t tokens = qkv.dim(0), width = int64_t{params.num_heads} * params.head_dim + 2 * kv_dim;
  check_shape(backend, "write_kv", "qkv", qkv, {tokens, width});
  check_shape(backend, "write_kv", "slots", slots, {tokens});
  check_caches(backend, "write_kv", cache_dtypes, k_cache, v_cache, params);
}

void check_rope_write_kv_args(const char* backend, const char* op, DType activation,
                              std::span<const DType> cache_dtypes, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                              const DeviceTensor& table_rows, const RopeParams& rope_params, const DeviceTensor& slots,
                              const AttentionParams& attention_params, const DeviceTensor& k_cache,
                              const DeviceTensor& v_cache) {
  SF_CHECK(rope_params.num_heads == attention_params.num_heads &&
               rope_params.num_kv_heads == attention_params.num_kv_heads &&
               rope_params.head_dim == attention_params.head_dim,
           "{} {}: rope ({} heads, {} kv heads, head_dim {}) and attention ({}, {}, {}) disagree", backend, op,
           rope_params.num_heads, rope_params.num_kv_heads, rope_params.head_dim, attention_params.num_heads,
           attention_params.num_kv_heads, attention_params.head_dim);
  check_rope_args(backend, activation, qkv, cos_sin, table_rows, rope_params);
  check_write_kv_args(backend, activation, cache_dtypes, qkv, slots, attention_params, k_cache, v_cache);
}

int64_t check_attention_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                             const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                             const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
  const int heads = params.num_heads, kv_heads = params.num_kv_heads, head_dim = params.head_dim;
  SF_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && params.block_size > 0,
           "{} attention: heads {}, kv_heads {}, head_dim {}, block_size {} are not a valid configuration", backend,
           heads, kv_heads, head_dim, params.block_size);
  SF_CHECK(params.causal || params.sliding_window == 0,
           "{} attention: a sliding window ({}) needs causal attention", backend, params.sliding_window);
  check_dtype(backend, "attention", "qkv", qkv, activation);
  check_dtype(backend, "attention", "out", out, activation);
  SF_CHECK(qkv.shape.size() == 2, "{} attention: qkv has shape {}, expected [tokens, width]", backend,
           shape_str(qkv.shape));
  const int64_t q_dim = int64_t{heads} * head_dim, kv_dim = int64_t{kv_heads} * head_dim;
  const int64_t tokens = qkv.dim(0);
  check_shape(backend, "attention", "qkv", qkv, {tokens, q_dim + 2 * kv_dim});
  check_shape(backend, "attention", "out", out, {tokens, q_dim});
  check_caches(backend, "attention", cache_dtypes, k_cache, v_cache, params);
  for (const DeviceTensor* t : {&batch.query_start, &batch.context_lens, &batch.block_tables})
    check_dtype(backend, "attention", "batch index tensor", *t, DType::I32);
  const int64_t seqs = batch.context_lens.numel();
  SF_CHECK(batch.query_start.numel() == seqs + 1 && batch.block_tables.shape.size() == 2 &&
               batch.block_tables.dim(0) == seqs,
           "{} attention: query_start {}, context_lens {} and block_tables {} disagree on the sequence count", backend,
           shape_str(batch.query_start.shape), shape_str(batch.context_lens.shape), shape_str(batch.block_tables.shape));
  SF_CHECK(batch.max_query_len >= 0 && batch.max_query_len <= tokens, "{} attention: max_query_len {} is outside [0, {}]",
           backend, batch.max_query_len, tokens);
  SF_CHECK(batch.max_context_len >= batch.max_query_len, "{} attention: max_context_len {} is below max_query_len {}",
           backend, batch.max_context_len, batch.max_query_len);
  return seqs;
}

int64_t check_biased_attention_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                                    const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                    const AttentionBatch& batch, const AttentionParams& params,
                                    const RelativePositionBias& bias, const DeviceTensor& out) {
  const int64_t seqs = check_attention_args(backend, activation, cache_dtypes, qkv, k_cache, v_cache, batch, params, out);
  check_dtype(backend, "attention_with_position_bias", "bias table", bias.table, DType::F32);
  check_shape(backend, "attention_with_position_bias", "bias table", bias.table, {bias.num_buckets, params.num_heads});
  const int exact = bias.num_buckets / (bias.bidirectional ? 4 : 2);
  SF_CHECK(exact >= 1 && bias.max_distance > exact,
           "{} attention_with_position_bias: {} buckets ({}) and max_distance {} leave no exact or log buckets", backend,
           bias.num_buckets, bias.bidirectional ? "bidirectional" : "causal", bias.max_distance);
  return seqs;
}

int64_t check_cross_attention_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                                   const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                   const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
  const int heads = params.num_heads, kv_heads = params.num_kv_heads, head_dim = params.head_dim;
  SF_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && params.block_size > 0,
           "{} cross_attention: heads {}, kv_heads {}, head_dim {}, block_size {} are not a valid configuration", backend,
           heads, kv_heads, head_dim, params.block_size);
  check_dtype(backend, "cross_attention", "q", q, activation);
  check_dtype(backend, "cross_attention", "out", out, activation);
  SF_CHECK(q.shape.size() == 2, "{} cross_attention: q has shape {}, expected [tokens, q_dim]", backend,
           shape_str(q.shape));
  const int64_t tokens = q.dim(0);
  check_shape(backend, "cross_attention", "q", q, {tokens, int64_t{heads} * head_dim});
  check_shape(backend, "cross_attention", "out", out, {tokens, int64_t{heads} * head_dim});
  check_caches(backend, "cross_attention", cache_dtypes, k_cache, v_cache, params);
  for (const DeviceTensor* t : {&batch.query_start, &batch.context_lens, &batch.block_tables})
    check_dtype(backend, "cross_attention", "batch index tensor", *t, DType::I32);
  const int64_t seqs = batch.context_lens.numel();
  SF_CHECK(batch.query_start.numel() == seqs + 1 && batch.block_tables.shape.size() == 2 &&
               batch.block_tables.dim(0) == seqs,
           "{} cross_attention: query_start {}, context_lens {} and block_tables {} disagree on the sequence count",
           backend, shape_str(batch.query_start.shape), shape_str(batch.context_lens.shape),
           shape_str(batch.block_tables.shape));
  return seqs;
}

size_t checked_block_copy_bytes(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                                const char* backend) {
  SF_CHECK(cache.shape.size() == 5,
           "{} copy_blocks: cache has shape {}, expected [num_layers, num_blocks, block_size, num_kv_heads, head_dim]",
           backend, shape_str(cache.shape));
  SF_CHECK(host.shape.size() == 5 && host.dim(1) == cache.dim(0) && host.dim(2) == cache.dim(2) &&
               host.dim(3) == cache.dim(3) && host.dim(4) == cache.dim(4),
           "{} copy_blocks: host area has shape {}, expected [num_host_blocks, {}, {}, {}, {}] for cache {}", backend,
           shape_str(host.shape), cache.dim(0), cache.dim(2), cache.dim(3), cache.dim(4), shape_str(cache.shape));
  SF_CHECK(host.dtype == cache.dtype, "{} copy_blocks: host area has dtype {}, the cache {}", backend,
           dtype_name(host.dtype), dtype_name(cache.dtype));
  SF_CHECK(copies.empty() || (!cache.empty() && !host.empty()), "{} copy_blocks: cache or host area has no memory",
           backend);
  for (size_t i = 0; i < copies.size(); ++i) {
    SF_CHECK(copies[i].device_block >= 0 && copies[i].device_block < cache.dim(1),
             "{} copy_blocks: copy {} names device block {}, outside the cache's [0, {})", backend, i,
             copies[i].device_block, cache.dim(1));
    SF_CHECK(copies[i].host_block >= 0 && copies[i].host_block < host.dim(0),
             "{} copy_blocks: copy {} names host block {}, outside the host area's [0, {})", backend, i,
             copies[i].host_block, host.dim(0));
  }
  return static_cast<size_t>(cache.dim(2) * cache.dim(3) * cache.dim(4)) * dtype_size(cache.dtype);
}

int64_t check_gather_columns_args(const char* backend, const DeviceTensor& parts, const DeviceTensor& full,
                                  int group_size) {
  SF_CHECK(parts.dtype == DType::F32 && full.dtype == DType::F32 && parts.shape.size() == 2 && full.shape.size() == 2,
           "{} gather_columns: parts {} {} and full {} {} must be 2-D f32", backend, dtype_name(parts.dtype),
           shape_str(parts.shape), dtype_name(full.dtype), shape_str(full.shape));
  SF_CHECK(group_size >= 1 && parts.shape[0] % group_size == 0 &&
               full.shape[0] == parts.shape[0] / group_size && full.shape[1] == parts.shape[1] * group_size,
           "{} gather_columns: parts {} and full {} do not match a group of {} ranks ([{} x R, S] and [R, {} x S])",
           backend, shape_str(parts.shape), shape_str(full.shape), group_size, group_size, group_size);
  return full.shape[0];
}

}  // namespace splitflow
