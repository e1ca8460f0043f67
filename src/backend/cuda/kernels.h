// backend/cuda/kernels.h — launchers for the CUDA backend's own kernels (backend/cuda/kernels.cu).
// Plain pointers and sizes only: the kernels compile as C++17 under nvcc, the CudaBackend class
// (cuda_backend.cpp, C++20) checks shapes and dtypes and calls these. Activations are bf16
// (uint16_t bits), norms, biases and RoPE tables f32; all math accumulates in fp32. The KV cache
// is bf16, or fp8 e4m3 where a launch says kv_fp8 (backend/cuda/kv_cache.cuh). Every launcher
// enqueues on `stream` and returns the launch error (cudaSuccess when fine).
#pragma once

#include "sampling/sampling_rule.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace splitflow::cuda {

using bf16_bits = uint16_t;

// Whether p sits on a multiple of `bytes`: the launchers' test for their 16-byte-word kernels.
inline bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Largest head_dim attention() takes (8 dims per lane of a warp).
constexpr int kMaxHeadDim = 256;
// Most split-KV partitions per (token, head): the merges keep their weights in shared memory.
constexpr int kMaxAttentionPartitions = 2048;

// out[t] = table[ids[t]] * multiplier (+ pos_table[positions[t]] when pos_table is not null).
// table, pos_table bf16 [*, hidden]; out bf16 [tokens, hidden].
cudaError_t launch_embed(const bf16_bits* table, const int32_t* ids, float multiplier, const bf16_bits* pos_table,
                         const int32_t* positions, bf16_bits* out, int64_t tokens, int64_t hidden, cudaStream_t stream);

// out[i] = generated_normal_value(key, stddev, i) (core/counter_hash.h) for i < count, into bf16
// (out_f32 null) or f32 (out_bf16 null): the seeded dummy weights, generated in device memory.
cudaError_t launch_fill_generated_normal(uint64_t key, float stddev, bf16_bits* out_bf16, float* out_f32, int64_t count,
                                         cudaStream_t stream);

// residual += delta (delta may be null), then out = norm(residual) * (offset + weight) + bias.
// layer_norm: subtract the mean first (LayerNorm), else RMSNorm. bias may be null.
cudaError_t launch_add_norm(bf16_bits* residual, const bf16_bits* delta, const float* weight, const float* bias,
                            bool layer_norm, float eps, float weight_offset, bf16_bits* out, int64_t tokens,
                            int64_t hidden, cudaStream_t stream);

// Decode-sized matmul (backend/cuda/gemv.cu): y[m, n] = x[m, k] w[n, k]^T + bias for m <= kMaxGemvRows
// (accumulate: y += ...), fp32 accumulation, y bf16 (y_f32 null) or f32 (y_bf16 null); bias may be
// null. Needs k % 8 == 0
// and 16-byte aligned x and w (gemv_supported); the caller falls back to cuBLASLt otherwise.
constexpr int64_t kMaxGemvRows = 8;
bool gemv_supported(const void* x, const void* w, int64_t m, int64_t k);
cudaError_t launch_gemv(const bf16_bits* x, const bf16_bits* w, const float* bias, bf16_bits* y_bf16, float* y_f32,
                        int64_t m, int64_t n, int64_t k, bool accumulate, cudaStream_t stream);

// An RMSNorm with a unit weight (folded into w) the GEMV applies to its input rows first:
// x / sqrt(mean(x^2) + eps); off: x as is.
struct GemvNorm {
  bool on = false;
  float eps = 0.0f;
};

// The gated MLP's up projection and activation in one pass, m <= kMaxGemvRows: w [2 inner, k]
// (gate rows, then up rows), bias [2 inner] f32 or null, y [m, inner] = act(x W_gate^T + b) *
// (x W_up^T + b) from fp32 sums; act as launch_activation's; x normalized first when
// norm.on. Same requirements as launch_gemv.
cudaError_t launch_gemv_gated(const bf16_bits* x, const bf16_bits* w, const float* bias, int act, bf16_bits* y,
                              int64_t m, int64_t inner, int64_t k, const GemvNorm& norm, cudaStream_t stream);

// The QKV projection of m <= kMaxGemvRows tokens with RoPE and the KV write in its epilogue:
// qkv = x w^T + bias, q and k heads rotated (cos_sin [rows, 2, rotary_dim / 2] at table_rows[r]),
// k and v heads also stored at slots[r] (negative or >= capacity_slots: skipped). One rounding to
// bf16 after the rotation; the cache stores that bf16 value; x normalized first when norm.on.
// Same requirements on x and w as launch_gemv.
struct QkvRopeLaunch {
  const bf16_bits* x;
  const bf16_bits* w;
  const float* bias;  // may be null
  bf16_bits* qkv;
  const float* cos_sin;
  const int32_t* table_rows;
  const int32_t* slots;
  void* k_cache;  // bf16, or e4m3 with kv_fp8
  void* v_cache;
  bool kv_fp8;
  int64_t k;
  int64_t capacity_slots;
  int m, heads, kv_heads, head_dim, rotary_dim;
  bool interleaved;
  GemvNorm norm;
};
cudaError_t launch_gemv_qkv_rope(const QkvRopeLaunch& a, cudaStream_t stream);

// w[r, c] = bf16(w[r, c] * (offset + scale[c])) for w [rows, cols] bf16, scale [cols] f32: a norm's
// weight folded into the matrix it feeds.
cudaError_t launch_scale_columns(bf16_bits* w, int64_t rows, int64_t cols, const float* scale, float offset,
                                 cudaStream_t stream);

// y[r, c] += bias[c] for y [rows, cols], bf16 (y_f32 null) or f32 (y_bf16 null).
cudaError_t launch_add_bias(bf16_bits* y_bf16, float* y_f32, const float* bias, int64_t rows, int64_t cols,
                            cudaStream_t stream);

// RoPE in place on the q and k heads of qkv [tokens, (heads + 2 kv_heads) * head_dim].
// cos_sin [rows, 2, rotary_dim / 2] f32; table_rows [tokens].
cudaError_t launch_rope(bf16_bits* qkv, const float* cos_sin, const int32_t* table_rows, int64_t tokens, int heads,
                        int kv_heads, int head_dim, int rotary_dim, bool interleaved, cudaStream_t stream);

// launch_rope then launch_write_kv in one launch (the same results).
cudaError_t launch_rope_write_kv(bf16_bits* qkv, const float* cos_sin, const int32_t* table_rows, const int32_t* slots,
                                 void* k_cache, void* v_cache, bool kv_fp8, int64_t tokens, int heads, int kv_heads,
                                 int head_dim, int rotary_dim, bool interleaved, int64_t capacity_slots,
                                 cudaStream_t stream);

// k/v heads of qkv -> caches at slots[t] (negative: skipped; >= capacity_slots: skipped, the
// runner validates slots on the host); the caches are bf16, or e4m3 with kv_fp8.
cudaError_t launch_write_kv(const bf16_bits* qkv, const int32_t* slots, void* k_cache, void* v_cache, bool kv_fp8,
                            int64_t tokens, int heads, int kv_heads, int head_dim, int64_t capacity_slots,
                            cudaStream_t stream);

struct AttentionLaunch {
  const bf16_bits* qkv;          // [tokens, (heads + 2 kv_heads) * head_dim]
  const void* k_cache;           // [blocks, block_size, kv_heads, head_dim], bf16 or (kv_fp8) e4m3
  const void* v_cache;
  bool kv_fp8;
  const int32_t* query_start;    // [seqs + 1]
  const int32_t* context_lens;   // [seqs]
  const int32_t* block_tables;   // [seqs, table_width]
  bf16_bits* out;                // [tokens, heads * head_dim]
  int seqs, table_width, max_query_len;
  int heads, kv_heads, head_dim, block_size, sliding_window;
  float scale;
  int tokens, max_context_len;   // max_context_len: at least every context_lens[s]
  int sm_count;                  // the device's multiprocessors, to size the KV split
  float* partials;               // fp32 scratch for split-KV partial results (null: never split)
  int64_t partials_floats;       // its size; a launch that would need more does not split
  // Zeroed counters, attention_partition_counters(sm_count) of them: the decode kernel's last
  // partition of each (sequence, kv head) to finish merges the partials and resets its counter.
  int32_t* partition_counters;
  // > 0: each score becomes cap * tanh(score / cap) before the softmax (Gemma 2). Only the split-KV
  // kernel applies it: launch_attention sends such launches there whatever their shape.
  float logit_softcap = 0.0f;
  // false (encoders): each query sees all context_lens[s] keys of its sequence, later ones too;
  // the one-token decode kernel is not used (it is causal).
  bool causal = true;
  // > 0: the queries' rows are this many elements apart and `qkv` holds only them (cross-attention:
  // the decoder's q [tokens, heads * head_dim]; with causal false every query sees its sequence's
  // context_lens[s] encoder keys). 0: the rows of qkv.
  int64_t q_stride = 0;
  // T5's relative position bias (non-null): table [buckets, heads] f32, its entry for the bucket of
  // key - query position added to each score (after scale, before the softcap).
  const float* position_bias = nullptr;
  int bias_buckets = 0, bias_max_distance = 0;
  bool bias_bidirectional = false;
};

// Scratch attention() needs to split the KV length whenever it chooses to: at most 4 sm_count
// blocks, kQueryTile rows each, (m, l, head_dim accumulators) per row.
constexpr int64_t attention_partials_floats(int sm_count) {
  return int64_t{16} * sm_count * (kMaxHeadDim + 2);
}
// Split launches need tokens * heads * 2 partition rows of partials, so tokens * heads and hence
// seqs * kv_heads stay under 16 sm_count.
constexpr int64_t attention_partition_counters(int sm_count) { return int64_t{16} * sm_count; }
// Lets `kernel` launch with `bytes` of dynamic shared memory (past the default 48 KB) and, with
// carve_out_all, all of the SM's shared memory taken from L1. Both are per-device attributes: set at
// a kernel's first launch on each device and remembered, so hot-path launches skip the driver calls.
cudaError_t allow_shared_memory(const void* kernel, size_t bytes, bool carve_out_all);
// Prompt chunks (max_query_len >= kFlashMinQueryLen) with head_dim 64/80/96/128 and 16-byte
// aligned tensors run on tensor cores (backend/cuda/flash_prefill.cu), decode steps on the decode
// kernel below, the rest (other head dims, unaligned tensors, a soft-cap, a position bias, a q of
// its own) on the split-KV kernel.
cudaError_t launch_attention(const AttentionLaunch& a, cudaStream_t stream);
constexpr int kFlashMinQueryLen = 16;
// Decode steps (max_query_len 1), and the one-token spans of mixed batches next to the prefill
// kernel, with head_dim 64/80/96/128 and up to 16 query heads per kv head run on tensor cores
// (backend/cuda/attention_decode.cu): the KV split (partitions) is chosen from the grid size and
// max_context_len, the partition length from each sequence's context in the kernel; with
// partitions > 1 the last partition of each (sequence, kv head) merges the partials.
bool attention_decode_supported(const AttentionLaunch& a);  // the shapes; spans of one token only
int attention_decode_partitions(const AttentionLaunch& a);
cudaError_t launch_attention_decode(const AttentionLaunch& a, int partitions, cudaStream_t stream);
bool flash_prefill_supported(const AttentionLaunch& a);
// skip_single: leave one-token spans to the decode kernel.
cudaError_t launch_flash_prefill(const AttentionLaunch& a, bool skip_single, cudaStream_t stream);

// act: 0 SiLU, 1 GELU (erf), 2 GELU (tanh), 3 ReLU. gated: out = act(x[:, :inner]) * x[:, inner:].
cudaError_t launch_activation(const bf16_bits* x, int act, bool gated, bf16_bits* out, int64_t tokens, int64_t inner,
                              cudaStream_t stream);

// out[s] (f32 [spans, cols]) = row offsets[s] (mode 0), the fp32 mean of rows [offsets[s],
// offsets[s + 1]) (mode 1) or row offsets[s + 1] - 1 (mode 2) of x [T, cols], bf16 or f32.
cudaError_t launch_pool_rows(const void* x, bool x_f32, const int32_t* offsets, int mode, float* out, int64_t spans,
                             int64_t cols, cudaStream_t stream);

// out[i] = x[rows[i]] for rows of row_bytes bytes (a multiple of 2).
cudaError_t launch_gather_rows(const void* x, const int32_t* rows, void* out, int64_t count, int64_t row_bytes,
                               cudaStream_t stream);
// out[rows[i]] = x[i] for rows of row_bytes bytes (a multiple of 2).
cudaError_t launch_scatter_rows(const void* x, const int32_t* rows, void* out, int64_t count, int64_t row_bytes,
                                cudaStream_t stream);

// One token per row of logits [count, vocab] f32 under rows[r] (sampling/sampling_rule.h), into
// tokens [count] (backend/cuda/sampling.cu).
cudaError_t launch_sample(const float* logits, const SamplingRow* rows, int32_t* tokens, int64_t count, int64_t vocab,
                          cudaStream_t stream);

}  // namespace splitflow::cuda
