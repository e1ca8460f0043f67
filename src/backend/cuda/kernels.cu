// backend/cuda/kernels.cu — the CUDA backend's own kernels: bf16 storage (the KV cache bf16 or
// fp8 e4m3: kv_cache.cuh), fp32 math. A first,
// correct version: one thread per element for the elementwise kernels, one block per row for
// the norm (the row in registers), one block per (sequence, query head, tile of query rows, KV
// partition) for attention, plus a combine kernel when the KV length is split.
#include "backend/cuda/kernels.h"

#include "backend/cuda/activation.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/relative_position.h"

#include "core/counter_hash.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <set>
#include <tuple>

namespace splitflow::cuda {

cudaError_t allow_shared_memory(const void* kernel, size_t bytes, bool carve_out_all) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, size_t>> allowed;  // (kernel, device, bytes)
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  const std::lock_guard lock(mutex);
  if (allowed.count({kernel, device, bytes}) > 0) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err == cudaSuccess && carve_out_all)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess) allowed.insert({kernel, device, bytes});
  return err;
}
namespace {

__device__ __forceinline__ float load(const bf16_bits* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ void store(bf16_bits* p, int64_t i, float v) {
  reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);  // round to nearest even
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// op over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// identity: op's neutral value, for lanes of warp 0 past the block's warps.
template <typename Op>
__device__ float block_reduce(float v, Op op, float identity) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, offset));
    if (lane == 0) total = w;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();  // partial/total are reused by the next call
  return result;
}

__device__ float block_sum(float v) {
  return block_reduce(v, [](float a, float b) { return a + b; }, 0.0f);
}
__device__ float block_max(float v) {
  return block_reduce(v, [](float a, float b) { return fmaxf(a, b); }, -INFINITY);
}

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void fill_generated_normal_kernel(uint64_t key, float stddev, bf16_bits* out_bf16, float* out_f32,
                                             int64_t count) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float value = generated_normal_value(key, stddev, i);
    if (out_bf16) {
      store(out_bf16, i, value);
    } else {
      out_f32[i] = value;
    }
  }
}

__global__ void embed_kernel(const bf16_bits* table, const int32_t* ids, float multiplier, const bf16_bits* pos_table,
                             const int32_t* positions, bf16_bits* out, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const int64_t row = ids[t];
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = load(table, row * hidden + i) * multiplier;
    if (pos_table != nullptr) v += load(pos_table, static_cast<int64_t>(positions[t]) * hidden + i);
    store(out, t * hidden + i, v);
  }
}

// One block per row. The residual is stored in bf16 (as a bf16 model keeps it); the statistics
// are taken over the stored (rounded) values in fp32.
__global__ void add_norm_kernel(bf16_bits* residual, const bf16_bits* delta, const float* weight, const float* bias,
                                bool layer_norm, float eps, float weight_offset, bf16_bits* out, int64_t hidden) {
  bf16_bits* x = residual + blockIdx.x * hidden;
  bf16_bits* y = out + blockIdx.x * hidden;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = load(x, i);
    if (delta != nullptr) {
      v = round_bf16(v + load(delta, blockIdx.x * hidden + i));
      store(x, i, v);
    }
    sum += v;
  }
  const float mean = layer_norm ? block_sum(sum) / static_cast<float>(hidden) : 0.0f;
  float squares = 0.0f;
  // Each thread rereads the elements it wrote above: no barrier needed.
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = load(x, i) - mean;
    squares += v * v;
  }
  const float inv = rsqrtf(block_sum(squares) / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = (load(x, i) - mean) * inv * (weight_offset + weight[i]);
    if (bias != nullptr) v += bias[i];
    store(y, i, v);
  }
}

__device__ __forceinline__ void unpack8(const uint4& w, float* v) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack8(const float* v) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    words[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// add_norm with 16-byte words (hidden % 8 == 0, aligned pointers): each thread keeps up to
// kNormVecs words of the row in registers, so the residual is read once and every load of the
// row is in flight at the same time (at batch 1 this one block is the whole kernel).
constexpr int kNormVecs = 4;
__global__ void __launch_bounds__(1024) add_norm_vec_kernel(bf16_bits* residual, const bf16_bits* delta, const float* weight, const float* bias,
                                    bool layer_norm, float eps, float weight_offset, bf16_bits* out, int64_t hidden) {
  const int vecs = static_cast<int>(hidden / 8);
  uint4* x = reinterpret_cast<uint4*>(residual + blockIdx.x * hidden);
  const uint4* dx = delta != nullptr ? reinterpret_cast<const uint4*>(delta + blockIdx.x * hidden) : nullptr;
  uint4* y = reinterpret_cast<uint4*>(out + blockIdx.x * hidden);
  // The first word's weights are loaded before the reductions, so their latency overlaps them (up
  // to hidden 8192 that is every weight a thread needs; at batch 1 this kernel is pure latency).
  float4 first_weights[2] = {};
  if (static_cast<int>(threadIdx.x) < vecs) {
    first_weights[0] = reinterpret_cast<const float4*>(weight)[2 * threadIdx.x];
    first_weights[1] = reinterpret_cast<const float4*>(weight)[2 * threadIdx.x + 1];
  }
  float v[kNormVecs][8];
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < kNormVecs; ++r) {
    const int i = threadIdx.x + r * blockDim.x;
    if (i >= vecs) continue;
    unpack8(x[i], v[r]);
    if (dx != nullptr) {
      float d[8];
      unpack8(dx[i], d);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[r][k] = round_bf16(v[r][k] + d[k]);
      x[i] = pack8(v[r]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sum += v[r][k];
  }
  const float mean = layer_norm ? block_sum(sum) / static_cast<float>(hidden) : 0.0f;
  float squares = 0.0f;
#pragma unroll
  for (int r = 0; r < kNormVecs; ++r) {
    if (threadIdx.x + r * blockDim.x >= vecs) continue;
#pragma unroll
    for (int k = 0; k < 8; ++k) squares += (v[r][k] - mean) * (v[r][k] - mean);
  }
  const float inv = rsqrtf(block_sum(squares) / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int r = 0; r < kNormVecs; ++r) {
    const int i = threadIdx.x + r * blockDim.x;
    if (i >= vecs) continue;
    const float4* w4 = reinterpret_cast<const float4*>(weight) + 2 * i;
    const float4 w0 = r == 0 ? first_weights[0] : w4[0], w1 = r == 0 ? first_weights[1] : w4[1];
    const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    float o[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = (v[r][k] - mean) * inv * (weight_offset + w[k]);
    if (bias != nullptr) {
      const float4* b4 = reinterpret_cast<const float4*>(bias) + 2 * i;
      const float4 b0 = b4[0], b1 = b4[1];
      const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] += b[k];
    }
    y[i] = pack8(o);
  }
}

__global__ void scale_columns_kernel(bf16_bits* w, int64_t count, int64_t cols, const float* scale, float offset) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride)
    store(w, i, load(w, i) * (offset + scale[i % cols]));
}

__global__ void add_bias_kernel(bf16_bits* y_bf16, float* y_f32, const float* bias, int64_t rows, int64_t cols) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  if (y_f32 != nullptr)
    y_f32[i] += bias[i % cols];
  else
    store(y_bf16, i, load(y_bf16, i) + bias[i % cols]);
}

// (x1, x2) rotated by the angle with cosine c and sine s, with explicit roundings so that every
// RoPE kernel (rope, rope_write_kv by elements or by words) gives the same bits.
__device__ __forceinline__ void rotate_pair(float& x1, float& x2, float c, float s) {
  const float y1 = __fmaf_rn(x1, c, -__fmul_rn(x2, s));
  x2 = __fmaf_rn(x2, c, __fmul_rn(x1, s));
  x1 = y1;
}

// One thread per (token, rotated head, pair).
__global__ void rope_kernel(bf16_bits* qkv, const float* cos_sin, const int32_t* table_rows, int64_t tokens,
                            int rotated_heads, int width, int head_dim, int half, bool interleaved) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * rotated_heads * half) return;
  const int pair = static_cast<int>(i % half);
  const int head = static_cast<int>((i / half) % rotated_heads);
  const int64_t t = i / (static_cast<int64_t>(half) * rotated_heads);
  const float* row = cos_sin + static_cast<int64_t>(table_rows[t]) * 2 * half;
  const float c = row[pair], s = row[half + pair];
  const int64_t base = t * width + static_cast<int64_t>(head) * head_dim;
  const int64_t i1 = base + (interleaved ? 2 * pair : pair);
  const int64_t i2 = base + (interleaved ? 2 * pair + 1 : pair + half);
  float x1 = load(qkv, i1), x2 = load(qkv, i2);
  rotate_pair(x1, x2, c, s);
  store(qkv, i1, x1);
  store(qkv, i2, x2);
}

// RoPE and the KV write in one launch: block (token, head) over the q heads, then the kv heads;
// a thread per rotated pair and per pass-through dim. K heads are rotated in qkv and stored in
// the cache; the block of kv head h also stores v head h.
template <typename Cache>
__global__ void rope_write_kv_kernel(bf16_bits* qkv, const float* cos_sin, const int32_t* table_rows,
                                     const int32_t* slots, Cache* k_cache, Cache* v_cache, int heads,
                                     int kv_heads, int head_dim, int half, bool interleaved, int64_t capacity_slots) {
  const int64_t t = blockIdx.x;
  const int head = blockIdx.y;  // [0, heads): q heads; [heads, heads + kv_heads): kv heads
  const int64_t width = static_cast<int64_t>(heads + 2 * kv_heads) * head_dim;
  bf16_bits* row = qkv + t * width + static_cast<int64_t>(head) * head_dim;
  const bool is_k = head >= heads;
  const int64_t slot = is_k ? slots[t] : -1;
  const bool to_cache = slot >= 0 && slot < capacity_slots;
  const int64_t kv_dim = static_cast<int64_t>(kv_heads) * head_dim;
  Cache* k_dst = to_cache ? k_cache + slot * kv_dim + static_cast<int64_t>(head - heads) * head_dim : nullptr;
  const float* table = cos_sin + static_cast<int64_t>(table_rows[t]) * 2 * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
    const float c = table[i], s = table[half + i];
    float x1 = load(row, i1), x2 = load(row, i2);
    rotate_pair(x1, x2, c, s);
    const bf16_bits y1 = __bfloat16_as_ushort(__float2bfloat16(x1));
    const bf16_bits y2 = __bfloat16_as_ushort(__float2bfloat16(x2));
    row[i1] = y1;
    row[i2] = y2;
    if (to_cache) {
      store_kv(k_dst + i1, y1);
      store_kv(k_dst + i2, y2);
    }
  }
  if (!to_cache) return;
  for (int d = 2 * half + threadIdx.x; d < head_dim; d += blockDim.x) store_kv(k_dst + d, row[d]);  // past rotary_dim
  const bf16_bits* v_src = row + kv_dim;
  Cache* v_dst = v_cache + slot * kv_dim + static_cast<int64_t>(head - heads) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) store_kv(v_dst + d, v_src[d]);
}

// rope_write_kv_kernel in 16-byte words, for rotary dims in whole words (half % 8 == 0 rotated
// by halves, half % 4 == 0 interleaved) and aligned rows: grid (tokens, pieces), a thread per
// unit. The first units rotate: a word of 8 dims and its partner word half dims on (by halves),
// or a word of 4 pairs (interleaved), K words also stored in the cache; the units after them
// copy a kv head's pass-through K words and its V words into the cache (the launcher counts
// rotate_units per head and copy_units per kv head).
template <typename Cache, bool Interleaved>
__global__ void rope_write_kv_words_kernel(bf16_bits* qkv, const float* cos_sin, const int32_t* table_rows,
                                           const int32_t* slots, Cache* k_cache, Cache* v_cache, int heads,
                                           int kv_heads, int head_dim, int half, int rotate_units, int copy_units,
                                           int64_t capacity_slots) {
  const int64_t t = blockIdx.x;
  const int unit = blockIdx.y * blockDim.x + threadIdx.x;
  if (unit >= (heads + kv_heads) * rotate_units + kv_heads * copy_units) return;
  const int64_t width = static_cast<int64_t>(heads + 2 * kv_heads) * head_dim;
  const int64_t kv_dim = static_cast<int64_t>(kv_heads) * head_dim;
  bf16_bits* row = qkv + t * width;
  const int64_t slot = slots[t];
  const bool to_cache = slot >= 0 && slot < capacity_slots;

  if (unit < (heads + kv_heads) * rotate_units) {
    const int head = unit / rotate_units, word = unit % rotate_units;
    bf16_bits* x = row + static_cast<int64_t>(head) * head_dim;
    Cache* k = head >= heads && to_cache ? k_cache + slot * kv_dim + static_cast<int64_t>(head - heads) * head_dim
                                         : nullptr;
    const float* table = cos_sin + static_cast<int64_t>(table_rows[t]) * 2 * half;
    if constexpr (Interleaved) {
      float v[8];
      unpack8(*reinterpret_cast<const uint4*>(x + 8 * word), v);
      const float4 c = *reinterpret_cast<const float4*>(table + 4 * word);
      const float4 s = *reinterpret_cast<const float4*>(table + half + 4 * word);
      const float cs[4] = {c.x, c.y, c.z, c.w}, sn[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int p = 0; p < 4; ++p) rotate_pair(v[2 * p], v[2 * p + 1], cs[p], sn[p]);
      const uint4 y = pack8(v);
      *reinterpret_cast<uint4*>(x + 8 * word) = y;
      if (k != nullptr) store_kv_word(k + 8 * word, y);
    } else {
      float a[8], b[8], c[8], sn[8];
      unpack8(*reinterpret_cast<const uint4*>(x + 8 * word), a);
      unpack8(*reinterpret_cast<const uint4*>(x + half + 8 * word), b);
      *reinterpret_cast<float4*>(c) = *reinterpret_cast<const float4*>(table + 8 * word);
      *reinterpret_cast<float4*>(c + 4) = *reinterpret_cast<const float4*>(table + 8 * word + 4);
      *reinterpret_cast<float4*>(sn) = *reinterpret_cast<const float4*>(table + half + 8 * word);
      *reinterpret_cast<float4*>(sn + 4) = *reinterpret_cast<const float4*>(table + half + 8 * word + 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) rotate_pair(a[i], b[i], c[i], sn[i]);
      const uint4 w1 = pack8(a), w2 = pack8(b);
      *reinterpret_cast<uint4*>(x + 8 * word) = w1;
      *reinterpret_cast<uint4*>(x + half + 8 * word) = w2;
      if (k != nullptr) {
        store_kv_word(k + 8 * word, w1);
        store_kv_word(k + half + 8 * word, w2);
      }
    }
    return;
  }
  if (!to_cache) return;
  const int copy = unit - (heads + kv_heads) * rotate_units;
  const int kv_head = copy / copy_units, pass_words = (head_dim - 2 * half) / 8;
  const int word = copy % copy_units;
  const int64_t offset = slot * kv_dim + static_cast<int64_t>(kv_head) * head_dim;
  const bf16_bits* k_row = row + static_cast<int64_t>(heads + kv_head) * head_dim;
  if (word < pass_words) {
    const int d = 2 * half + 8 * word;
    store_kv_word(k_cache + offset + d, *reinterpret_cast<const uint4*>(k_row + d));
  } else {
    const int d = 8 * (word - pass_words);
    store_kv_word(v_cache + offset + d, *reinterpret_cast<const uint4*>(k_row + kv_dim + d));
  }
}

// Grid (tokens, pieces of the row): each thread stores one unit of `unit` elements (8: one 16-byte
// word of qkv, when rows and caches are aligned to their 8-element words; else 1) of the token's
// k and of its v heads, so even one token spreads over several blocks.
template <typename Cache>
__global__ void write_kv_kernel(const bf16_bits* qkv, const int32_t* slots, Cache* k_cache, Cache* v_cache,
                                int64_t width, int64_t q_dim, int64_t kv_dim, int64_t capacity_slots, int unit) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= capacity_slots) return;
  const int64_t i = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * unit;
  if (i >= kv_dim) return;
  const bf16_bits* row = qkv + t * width;
  if (unit == 8) {
    store_kv_word(k_cache + slot * kv_dim + i, *reinterpret_cast<const uint4*>(row + q_dim + i));
    store_kv_word(v_cache + slot * kv_dim + i, *reinterpret_cast<const uint4*>(row + q_dim + kv_dim + i));
  } else {
    store_kv(k_cache + slot * kv_dim + i, row[q_dim + i]);
    store_kv(v_cache + slot * kv_dim + i, row[q_dim + kv_dim + i]);
  }
}

// Attention: a block of kQueryTile warps handles up to kQueryTile consecutive new tokens of one
// sequence for one query head, one warp per query row, over one partition of the tile's key
// range (blockIdx.z; partition_keys keys from the tile's first visible key). Keys and values
// stream through shared memory kKeyChunk positions at a time (gathered through the block table);
// each warp keeps an online softmax (running max m, sum l, accumulator: head dims lane, lane +
// 32, ...). With one partition the row is normalized and written to out; with several
// (flash-decoding: few queries would leave most SMs idle) each partition writes its (m, l,
// unnormalized accumulator) in fp32 to `partials` and attention_combine_kernel merges them.
constexpr int kQueryTile = 4;
constexpr int kKeyChunk = 32;
constexpr int kMinPartitionKeys = 64;
constexpr int kDimsPerLane = kMaxHeadDim / 32;
constexpr int kVecsPerThread = kKeyChunk * (kMaxHeadDim / 8) / (kQueryTile * 32);  // 16-byte words of a chunk

size_t attention_smem_bytes(int head_dim) {
  return sizeof(float) * kQueryTile * head_dim + sizeof(bf16_bits) * kKeyChunk * (head_dim + 2) +
         sizeof(bf16_bits) * kKeyChunk * head_dim;
}

// vector_kv: head_dim % 8 == 0 and both caches aligned to 8-element words, so a head row is whole
// words (KvWord). Cache elements are widened to bf16 on their way into shared memory.
// partials: [tokens, heads, partitions] rows of (m, l, acc[head_dim]) floats.
template <typename Cache>
__global__ void attention_kernel(AttentionLaunch a, int tiles_per_seq, bool vector_kv, float* partials) {
  extern __shared__ __align__(16) float smem[];
  const int hd = a.head_dim, key_stride = hd + 2;  // +2 bf16: odd word stride, no bank conflicts
  float* q_s = smem;                                                            // [kQueryTile, hd]
  bf16_bits* k_s = reinterpret_cast<bf16_bits*>(q_s + kQueryTile * hd);         // [kKeyChunk, hd + 2]
  bf16_bits* v_s = k_s + kKeyChunk * key_stride;                                // [kKeyChunk, hd]

  const int s = blockIdx.x / tiles_per_seq, tile = blockIdx.x % tiles_per_seq;
  const int head = blockIdx.y, kv_head = head / (a.heads / a.kv_heads);
  const int q0 = a.query_start[s], n = a.query_start[s + 1] - q0;
  const int t_begin = tile * kQueryTile;
  if (t_begin >= n) return;  // the whole block leaves together, before any barrier
  const int t_count = min(kQueryTile, n - t_begin);
  const int pos0 = a.context_lens[s] - n + t_begin, last_pos = pos0 + t_count - 1;
  // The last key any row of the tile sees: its last row's own position, or (bidirectional) the
  // sequence's last.
  const int last_key = a.causal ? last_pos : a.context_lens[s] - 1;
  const int window_first_key = a.sliding_window > 0 ? max(0, pos0 - a.sliding_window + 1) : 0;
  // The tile's visible keys split evenly over the grid's partitions, from this tile's own context
  // length (device memory): the launch shape does not depend on it, so a recorded graph replays
  // for any context. Partitions past the keys are empty (they write m = -inf, l = 0).
  const int visible = last_key + 1 - window_first_key;
  const int partition_keys =
      gridDim.z == 1 ? visible
                     : max(kMinPartitionKeys, (visible + static_cast<int>(gridDim.z) * kKeyChunk - 1) /
                                                  (static_cast<int>(gridDim.z) * kKeyChunk) * kKeyChunk);
  const int first_key = window_first_key + static_cast<int>(blockIdx.z) * partition_keys;
  const int end_key = min(last_key + 1, first_key + partition_keys);  // exclusive
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool active = warp < t_count;
  const int my_pos = pos0 + warp;
  const int64_t width = static_cast<int64_t>(a.heads + 2 * a.kv_heads) * hd;
  const int64_t kv_dim = static_cast<int64_t>(a.kv_heads) * hd;
  const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.table_width;
  const Cache* k_cache = static_cast<const Cache*>(a.k_cache);
  const Cache* v_cache = static_cast<const Cache*>(a.v_cache);

  const int64_t q_width = a.q_stride > 0 ? a.q_stride : width;
  for (int i = threadIdx.x; i < t_count * hd; i += blockDim.x) {
    const int r = i / hd, d = i % hd;
    q_s[r * hd + d] = load(a.qkv, (q0 + t_begin + r) * q_width + static_cast<int64_t>(head) * hd + d) * a.scale;
  }
  float m = -INFINITY, l = 0.0f, acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.0f;

  for (int chunk0 = first_key; chunk0 < end_key; chunk0 += kKeyChunk) {
    __syncthreads();  // q loaded / the previous chunk fully read
    const int count = min(kKeyChunk, end_key - chunk0);
    if (vector_kv) {
      // Word loads, all issued before the first store: one memory latency per chunk instead of
      // one per element (with one block per head at batch 1, that latency is the decode step's cost).
      const int vecs_per_row = hd / 8, vecs = count * vecs_per_row;
      using Word = typename KvWord<Cache>::type;
      Word k_r[kVecsPerThread], v_r[kVecsPerThread];
#pragma unroll
      for (int r = 0; r < kVecsPerThread; ++r) {
        const int i = threadIdx.x + r * kQueryTile * 32;
        if (i >= vecs) continue;
        const int j = i / vecs_per_row, d = (i % vecs_per_row) * 8, p = chunk0 + j;
        const int64_t slot = static_cast<int64_t>(__ldg(table + p / a.block_size)) * a.block_size + p % a.block_size;
        const int64_t src = slot * kv_dim + static_cast<int64_t>(kv_head) * hd + d;
        k_r[r] = __ldg(reinterpret_cast<const Word*>(k_cache + src));
        v_r[r] = __ldg(reinterpret_cast<const Word*>(v_cache + src));
      }
#pragma unroll
      for (int r = 0; r < kVecsPerThread; ++r) {
        const int i = threadIdx.x + r * kQueryTile * 32;
        if (i >= vecs) continue;
        const int j = i / vecs_per_row, d = (i % vecs_per_row) * 8;
        // k rows have an odd word stride (hd + 2 bf16): 4-byte stores; v rows are 16-byte aligned.
        const uint4 k_bf16 = widen_kv_word(k_r[r]);
        uint32_t* k_dst = reinterpret_cast<uint32_t*>(k_s + j * key_stride + d);
        k_dst[0] = k_bf16.x;
        k_dst[1] = k_bf16.y;
        k_dst[2] = k_bf16.z;
        k_dst[3] = k_bf16.w;
        *reinterpret_cast<uint4*>(v_s + j * hd + d) = widen_kv_word(v_r[r]);
      }
    } else {
      for (int i = threadIdx.x; i < count * hd; i += blockDim.x) {
        const int j = i / hd, d = i % hd, p = chunk0 + j;
        const int64_t slot = static_cast<int64_t>(table[p / a.block_size]) * a.block_size + p % a.block_size;
        const int64_t src = slot * kv_dim + static_cast<int64_t>(kv_head) * hd + d;
        k_s[j * key_stride + d] = kv_to_bf16(k_cache[src]);
        v_s[j * hd + d] = kv_to_bf16(v_cache[src]);
      }
    }
    __syncthreads();
    if (!active) continue;
    const int p = chunk0 + lane;
    const bool valid =
        lane < count && (!a.causal || p <= my_pos) && (a.sliding_window == 0 || p > my_pos - a.sliding_window);
    float score = -INFINITY;
    if (valid) {
      const float* q = q_s + warp * hd;
      float dot = 0.0f;
      for (int d = 0; d < hd; ++d) dot += q[d] * load(k_s, lane * key_stride + d);
      if (a.position_bias != nullptr)
        dot += a.position_bias[static_cast<int64_t>(relative_position_bucket(p - my_pos, a.bias_buckets, a.bias_max_distance,
                                                                    a.bias_bidirectional)) * a.heads + head];
      score = a.logit_softcap > 0.0f ? a.logit_softcap * tanhf(dot / a.logit_softcap) : dot;
    }
    const float chunk_max = warp_max(score);
    if (chunk_max == -INFINITY) continue;  // no key of this chunk is visible to this row
    const float new_m = fmaxf(m, chunk_max);
    const float correction = __expf(m - new_m);  // 0 on the first visible chunk (m = -inf)
    const float weight = valid ? __expf(score - new_m) : 0.0f;
    l = l * correction + warp_sum(weight);
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= correction;
    for (int j = 0; j < count; ++j) {
      const float w = __shfl_sync(0xffffffffu, weight, j);
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] += w * load(v_s, j * hd + d);
      }
    }
    m = new_m;
  }
  if (!active) return;
  if (partials != nullptr) {
    // A row with no visible key in this partition leaves m = -inf, l = 0, acc = 0: weight 0 in the combine.
    const int64_t row = (static_cast<int64_t>(q0 + t_begin + warp) * a.heads + head) * gridDim.z + blockIdx.z;
    float* dst = partials + row * (hd + 2);
    if (lane == 0) {
      dst[0] = m;
      dst[1] = l;
    }
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) dst[2 + d] = acc[i];
    }
    return;
  }
  const int64_t out_row = static_cast<int64_t>(q0 + t_begin + warp) * a.heads * hd + static_cast<int64_t>(head) * hd;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) store(a.out, out_row + d, acc[i] * inv);
  }
}

// One block per (token, head): out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p over the
// partitions p, M = max_p m_p (finite: the token's own key is visible to it). The weights
// exp(m_p - M) are computed once, a partition per thread, into shared memory; each output dim
// then reads only the partitions that hold keys (a recorded step sizes its split for the cache's
// bound, so at a short context most partitions are empty: weight 0, skipped).
__global__ void attention_combine_kernel(const float* partials, int partitions, int heads, int hd, bf16_bits* out) {
  __shared__ float weights[kMaxAttentionPartitions];
  const int64_t token_head = static_cast<int64_t>(blockIdx.x) * heads + blockIdx.y;
  const float* rows = partials + token_head * partitions * (hd + 2);
  float top = -INFINITY;
  for (int p = threadIdx.x; p < partitions; p += blockDim.x) top = fmaxf(top, rows[p * (hd + 2)]);
  top = block_max(top);
  float denom = 0.0f;
  for (int p = threadIdx.x; p < partitions; p += blockDim.x) {
    const float m = rows[p * (hd + 2)];
    const float w = m == -INFINITY ? 0.0f : __expf(m - top);
    weights[p] = w;
    denom += w * rows[p * (hd + 2) + 1];
  }
  const float inv = 1.0f / block_sum(denom);  // block_sum's barriers also publish `weights`
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int p = 0; p < partitions; ++p) {
      if (weights[p] != 0.0f) acc += weights[p] * rows[p * (hd + 2) + 2 + d];
    }
    store(out, token_head * hd + d, acc * inv);
  }
}

__global__ void activation_kernel(const bf16_bits* x, int act, bool gated, bf16_bits* out, int64_t tokens,
                                  int64_t inner) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * inner) return;
  const int64_t t = i / inner, j = i % inner;
  const int64_t stride = gated ? 2 * inner : inner;
  float v = activate(load(x, t * stride + j), act);
  if (gated) v *= load(x, t * stride + inner + j);
  store(out, i, v);
}

// activation_kernel for inner % 8 == 0 and 16-byte aligned rows: 8 outputs per thread from
// 16-byte loads (the scalar kernel ran at a third of the copy rate at batch 64).
__global__ void activation_vec_kernel(const uint4* x, int act, bool gated, uint4* out, int64_t tokens, int64_t inner_vecs) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * inner_vecs) return;
  const int64_t t = i / inner_vecs, j = i % inner_vecs;
  const int64_t stride = gated ? 2 * inner_vecs : inner_vecs;
  float v[8];
  unpack8(x[t * stride + j], v);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = activate(v[e], act);
  if (gated) {
    float up[8];
    unpack8(x[t * stride + inner_vecs + j], up);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= up[e];
  }
  out[i] = pack8(v);
}

__global__ void gather_rows_kernel(const uint16_t* x, const int32_t* rows, uint16_t* out, int64_t row_elems) {
  const int64_t r = blockIdx.x;
  const uint16_t* src = x + static_cast<int64_t>(rows[r]) * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) out[r * row_elems + i] = src[i];
}

__global__ void scatter_rows_kernel(const uint16_t* x, const int32_t* rows, uint16_t* out, int64_t row_elems) {
  const int64_t r = blockIdx.x;
  uint16_t* dst = out + static_cast<int64_t>(rows[r]) * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) dst[i] = x[r * row_elems + i];
}


// Block (span, column chunk): each thread one column, summed down the span's rows in fp32.
// mode: 0 Cls, 1 Mean, 2 Last.
template <typename T>
__global__ void pool_rows_kernel(const T* x, const int32_t* offsets, int mode, float* out, int64_t cols) {
  const int64_t s = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t begin = offsets[s], end = offsets[s + 1];
  float value;
  if (mode == 1) {
    float sum = 0.0f;
    for (int64_t r = begin; r < end; ++r) sum += load(x, r * cols + c);
    value = sum / static_cast<float>(end - begin);
  } else {
    value = load(x, (mode == 0 ? begin : end - 1) * cols + c);
  }
  out[s * cols + c] = value;
}

}  // namespace

cudaError_t launch_fill_generated_normal(uint64_t key, float stddev, bf16_bits* out_bf16, float* out_f32, int64_t count,
                                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, 65536);
  fill_generated_normal_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(key, stddev, out_bf16, out_f32,
                                                                                       count);
  return cudaGetLastError();
}

cudaError_t launch_embed(const bf16_bits* table, const int32_t* ids, float multiplier, const bf16_bits* pos_table,
                         const int32_t* positions, bf16_bits* out, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  embed_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(table, ids, multiplier, pos_table, positions,
      out, hidden);
  return cudaGetLastError();
}

cudaError_t launch_add_norm(bf16_bits* residual, const bf16_bits* delta, const float* weight, const float* bias,
                            bool layer_norm, float eps, float weight_offset, bf16_bits* out, int64_t tokens,
                            int64_t hidden, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int64_t vecs = hidden / 8;
  const bool aligned = aligned_to(residual, 16) && aligned_to(out, 16) && aligned_to(delta, 16) &&
                       aligned_to(weight, 16) && aligned_to(bias, 16);
  if (hidden % 8 == 0 && aligned && vecs <= int64_t{1024} * kNormVecs) {
    // Enough threads for one word each up to 1024 threads, then up to kNormVecs words per thread.
    const int64_t threads = std::min<int64_t>(1024, (vecs + 31) / 32 * 32);
    add_norm_vec_kernel<<<static_cast<unsigned>(tokens), static_cast<unsigned>(threads), 0, stream>>>(residual, delta,
        weight, bias, layer_norm, eps, weight_offset, out, hidden);
    return cudaGetLastError();
  }
  add_norm_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(residual, delta, weight, bias, layer_norm,
      eps, weight_offset, out, hidden);
  return cudaGetLastError();
}

cudaError_t launch_scale_columns(bf16_bits* w, int64_t rows, int64_t cols, const float* scale, float offset,
                                 cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((rows * cols + kThreads - 1) / kThreads, 65536);
  scale_columns_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(w, rows * cols, cols, scale, offset);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(bf16_bits* y_bf16, float* y_f32, const float* bias, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  add_bias_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(y_bf16, y_f32, bias, rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_rope(bf16_bits* qkv, const float* cos_sin, const int32_t* table_rows, int64_t tokens, int heads,
                        int kv_heads, int head_dim, int rotary_dim, bool interleaved, cudaStream_t stream) {
  const int half = rotary_dim / 2, rotated = heads + kv_heads;
  const int64_t n = tokens * rotated * half;
  if (n == 0) return cudaSuccess;
  rope_kernel<<<grid_for(n), kThreads, 0, stream>>>(qkv, cos_sin, table_rows, tokens, rotated,
      (heads + 2 * kv_heads) * head_dim, head_dim, half, interleaved);
  return cudaGetLastError();
}

cudaError_t launch_rope_write_kv(bf16_bits* qkv, const float* cos_sin, const int32_t* table_rows, const int32_t* slots,
                                 void* k_cache, void* v_cache, bool kv_fp8, int64_t tokens, int heads, int kv_heads,
                                 int head_dim, int rotary_dim, bool interleaved, int64_t capacity_slots,
                                 cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int half = rotary_dim / 2;
  const bool words = head_dim % 8 == 0 && (interleaved ? half % 4 == 0 : half % 8 == 0) && aligned_to(qkv, 16) &&
                     aligned_to(cos_sin, 16) && aligned_to(k_cache, kv_fp8 ? 8 : 16) &&
                     aligned_to(v_cache, kv_fp8 ? 8 : 16);
  if (words) {
    constexpr int kWordThreads = 64;
    const int rotate_units = interleaved ? half / 4 : half / 8, copy_units = (head_dim - 2 * half) / 8 + head_dim / 8;
    const int units = (heads + kv_heads) * rotate_units + kv_heads * copy_units;
    const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>((units + kWordThreads - 1) / kWordThreads));
    return with_kv_element(kv_fp8, [&](auto element) {
      using Cache = decltype(element);
      const auto kernel = interleaved ? rope_write_kv_words_kernel<Cache, true> : rope_write_kv_words_kernel<Cache, false>;
      kernel<<<grid, kWordThreads, 0, stream>>>(qkv, cos_sin, table_rows, slots, static_cast<Cache*>(k_cache),
                                                static_cast<Cache*>(v_cache), heads, kv_heads, head_dim, half,
                                                rotate_units, copy_units, capacity_slots);
      return cudaGetLastError();
    });
  }
  const int threads = std::max(32, std::min(256, (head_dim / 2 + 31) / 32 * 32));
  return with_kv_element(kv_fp8, [&](auto element) {
    using Cache = decltype(element);
    rope_write_kv_kernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(heads + kv_heads)), threads, 0,
                           stream>>>(qkv, cos_sin, table_rows, slots, static_cast<Cache*>(k_cache),
                                     static_cast<Cache*>(v_cache), heads, kv_heads, head_dim, rotary_dim / 2,
                                     interleaved, capacity_slots);
    return cudaGetLastError();
  });
}

cudaError_t launch_write_kv(const bf16_bits* qkv, const int32_t* slots, void* k_cache, void* v_cache, bool kv_fp8,
                            int64_t tokens, int heads, int kv_heads, int head_dim, int64_t capacity_slots,
                            cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int64_t q_dim = static_cast<int64_t>(heads) * head_dim, kv_dim = static_cast<int64_t>(kv_heads) * head_dim;
  const uintptr_t cache_word_bytes = kv_fp8 ? 8 : 16;  // 8 elements
  const int unit = kv_dim % 8 == 0 && q_dim % 8 == 0 && aligned_to(qkv, 16) && aligned_to(k_cache, cache_word_bytes) &&
                           aligned_to(v_cache, cache_word_bytes)
                       ? 8
                       : 1;
  constexpr int kCopyThreads = 128;
  const int64_t pieces = (kv_dim / unit + kCopyThreads - 1) / kCopyThreads;
  return with_kv_element(kv_fp8, [&](auto element) {
    using Cache = decltype(element);
    write_kv_kernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(pieces)), kCopyThreads, 0, stream>>>(
        qkv, slots, static_cast<Cache*>(k_cache), static_cast<Cache*>(v_cache), q_dim + 2 * kv_dim, q_dim, kv_dim,
        capacity_slots, unit);
    return cudaGetLastError();
  });
}

cudaError_t launch_attention(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.seqs == 0 || a.max_query_len == 0) return cudaSuccess;
  // They do not soft-cap, add a position bias or read q apart from k and v.
  const bool tensor_core_paths = a.logit_softcap == 0.0f && a.position_bias == nullptr && a.q_stride == 0;
  if (tensor_core_paths && a.max_query_len >= kFlashMinQueryLen && flash_prefill_supported(a)) {
    // A mixed (SplitFuse) batch: the decode kernel takes the one-token spans, reading each kv
    // head once for its whole GQA group instead of a 64-row tile per query head. Unsplit, so no
    // combine pass touches the prompt rows.
    const bool split_decodes = a.causal && attention_decode_supported(a);
    const cudaError_t err = launch_flash_prefill(a, split_decodes, stream);
    if (err != cudaSuccess || !split_decodes) return err;
    return launch_attention_decode(a, 1, stream);
  }
  if (tensor_core_paths && a.causal && a.max_query_len == 1 && attention_decode_supported(a))
    return launch_attention_decode(a, attention_decode_partitions(a), stream);
  const int tiles_per_seq = (a.max_query_len + kQueryTile - 1) / kQueryTile;
  const int64_t base_blocks = int64_t{a.seqs} * tiles_per_seq * a.heads;
  // Split the key range when the grid would not fill the SMs twice over (decode, short chunks):
  // enough partitions for ~2 waves, no more than max_context_len allows at kMinPartitionKeys
  // keys each. Each block sizes its partition from its tile's context (attention_kernel).
  int partitions = 1;
  if (a.partials != nullptr && base_blocks < 2 * int64_t{a.sm_count} && a.max_context_len > kMinPartitionKeys) {
    const int64_t wanted = (2 * int64_t{a.sm_count} + base_blocks - 1) / base_blocks;
    const int64_t parts = std::min<int64_t>({wanted, (a.max_context_len + kMinPartitionKeys - 1) / kMinPartitionKeys,
                                             int64_t{kMaxAttentionPartitions}});
    const int64_t floats = int64_t{a.tokens} * a.heads * parts * (a.head_dim + 2);
    if (parts > 1 && floats <= a.partials_floats) partitions = static_cast<int>(parts);
  }
  const dim3 grid(static_cast<unsigned>(a.seqs * tiles_per_seq), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>(partitions));
  const uintptr_t cache_word_bytes = a.kv_fp8 ? 8 : 16;  // 8 elements
  const bool vector_kv = a.head_dim % 8 == 0 && aligned_to(a.k_cache, cache_word_bytes) &&
                         aligned_to(a.v_cache, cache_word_bytes);
  float* partials = partitions > 1 ? a.partials : nullptr;
  const cudaError_t err = with_kv_element(a.kv_fp8, [&](auto element) {
    attention_kernel<decltype(element)><<<grid, kQueryTile * 32, attention_smem_bytes(a.head_dim), stream>>>(
        a, tiles_per_seq, vector_kv, partials);
    return cudaGetLastError();
  });
  if (err != cudaSuccess || partitions == 1) return err;
  attention_combine_kernel<<<dim3(static_cast<unsigned>(a.tokens), static_cast<unsigned>(a.heads)), 128, 0, stream>>>(
      partials, partitions, a.heads, a.head_dim, a.out);
  return cudaGetLastError();
}

cudaError_t launch_activation(const bf16_bits* x, int act, bool gated, bf16_bits* out, int64_t tokens, int64_t inner,
                              cudaStream_t stream) {
  if (tokens * inner == 0) return cudaSuccess;
  if (inner % 8 == 0 && aligned_to(x, 16) && aligned_to(out, 16)) {
    const int64_t vecs = tokens * inner / 8;
    activation_vec_kernel<<<grid_for(vecs), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(x), act, gated,
        reinterpret_cast<uint4*>(out), tokens, inner / 8);
    return cudaGetLastError();
  }
  activation_kernel<<<grid_for(tokens * inner), kThreads, 0, stream>>>(x, act, gated, out, tokens, inner);
  return cudaGetLastError();
}

cudaError_t launch_pool_rows(const void* x, bool x_f32, const int32_t* offsets, int mode, float* out, int64_t spans,
                             int64_t cols, cudaStream_t stream) {
  if (spans == 0 || cols == 0) return cudaSuccess;
  constexpr int kColumns = 128;
  const dim3 grid(static_cast<unsigned>(spans), static_cast<unsigned>((cols + kColumns - 1) / kColumns));
  if (x_f32)
    pool_rows_kernel<<<grid, kColumns, 0, stream>>>(static_cast<const float*>(x), offsets, mode, out, cols);
  else
    pool_rows_kernel<<<grid, kColumns, 0, stream>>>(static_cast<const bf16_bits*>(x), offsets, mode, out, cols);
  return cudaGetLastError();
}

cudaError_t launch_scatter_rows(const void* x, const int32_t* rows, void* out, int64_t count, int64_t row_bytes,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  scatter_rows_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(static_cast<const uint16_t*>(x), rows,
                                                                             static_cast<uint16_t*>(out), row_bytes / 2);
  return cudaGetLastError();
}

cudaError_t launch_gather_rows(const void* x, const int32_t* rows, void* out, int64_t count, int64_t row_bytes,
                               cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  gather_rows_kernel<<<static_cast<unsigned>(count), kThreads, 0, stream>>>(static_cast<const uint16_t*>(x), rows,
      static_cast<uint16_t*>(out), row_bytes / 2);
  return cudaGetLastError();
}

}  // namespace splitflow::cuda
