// backend/argument_checks.h — the argument checks every backend makes before a kernel: shapes and
// dtypes from the kernel's contract in backend/backend.h. `backend` ("cpu", "cuda") prefixes the
// messages; `activation` is the backend's activation_dtype() (of qkv and out), `cache_dtypes` its
// kv_cache_dtypes() (K and V must share one of them). Checks that read tensor contents (slots,
// block tables) stay with the backends that can.
#pragma once

#include "backend/backend.h"

#include <span>

namespace splitflow {

void check_rope_args(const char* backend, DType activation, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                     const DeviceTensor& table_rows, const RopeParams& params);

void check_write_kv_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                         const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                         const DeviceTensor& k_cache, const DeviceTensor& v_cache);

// rope_write_kv's arguments: the two parameter sets describe the same heads, then the checks of
// rope() and write_kv() in that order. `op` names the call in the messages.
void check_rope_write_kv_args(const char* backend, const char* op, DType activation,
                              std::span<const DType> cache_dtypes, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                              const DeviceTensor& table_rows, const RopeParams& rope_params, const DeviceTensor& slots,
                              const AttentionParams& attention_params, const DeviceTensor& k_cache,
                              const DeviceTensor& v_cache);

// gather_columns' arguments for a group of `group_size` ranks: parts [group_size x R, S] and full
// [R, group_size x S], both F32. Returns R (rows).
int64_t check_gather_columns_args(const char* backend, const DeviceTensor& parts, const DeviceTensor& full,
                                  int group_size);

// Returns the number of sequences.
int64_t check_attention_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                             const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                             const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out);

// attention_with_position_bias: check_attention_args, then the bias table [num_buckets, num_heads] F32.
int64_t check_biased_attention_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                                    const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                    const AttentionBatch& batch, const AttentionParams& params,
                                    const RelativePositionBias& bias, const DeviceTensor& out);

// cross_attention: q and out [T, num_heads * head_dim], no causal mask or window. Returns the
// number of sequences.
int64_t check_cross_attention_args(const char* backend, DType activation, std::span<const DType> cache_dtypes,
                                   const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                   const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out);

// Also checks the block indices; returns the bytes of one block of one layer.
size_t checked_block_copy_bytes(const DeviceTensor& cache, const DeviceTensor& host, std::span<const BlockCopy> copies,
                                const char* backend);

}  // namespace splitflow
