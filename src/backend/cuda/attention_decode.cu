// backend/cuda/attention_decode.cu — paged attention for decode steps (one new token per
// sequence) on tensor cores, head_dim 64/80/96/128 and GQA groups of 1 to 16 query heads.
//
// One block of 4 warps per (sequence, kv head, KV partition) serves the kv head's whole group,
// so K and V are read once for all its query heads: the group's G query rows are the M rows of
// an m16n8k16 MMA (rows past G are zeros). Decode attention is bound by reading the cache, and
// this layout keeps the reads coalesced and deep: key tiles of 64 rows are gathered through the
// block table with cp.async (16 bytes per thread, consecutive threads on consecutive bytes of a
// row), kStages - 1 tiles in flight, into padded shared rows that ldmatrix reads without conflicts.
// Warp w takes keys 16w..16w+15 of every tile: S = Q K^T, an online softmax per row in
// registers (log2 units), O += P V with P straight from the S accumulators. The four
// warps' states merge through shared memory at the end; with several partitions the result goes
// to the split-KV partials (kernels.cu's layout, natural-log maxima), and the last partition of a
// (sequence, kv head) to finish, found with a counter, merges them: no combine launch, which cost
// as much as the attention itself at batch 1.
// A bf16 cache runs bf16 MMAs on its staged rows. An fp8 (e4m3) cache, half the bytes, is never
// widened in shared memory: its packed rows are read by ldmatrix as 16-bit units of two e4m3
// values and converted in registers (cvt e4m3x2 -> f16x2, exact) into the B operands of f16 MMAs;
// Q goes to f16 pre-multiplied by scale * log2(e), P is f16 ("e4m3 fragments" below has the index
// map). Its stages are 4 deep and half the size, so more blocks fit an SM (Layout::kBlocksPerSm).
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/tensor_core.cuh"

#include <cuda/atomic>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace splitflow::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileKeys = 16 * kWarps;  // keys per shared-memory tile
constexpr int kMaxGroup = 16;           // query heads per kv head: the MMA's M
// Shared memory of an SM (H100/H200: 228 KB) and what the driver reserves per resident block.
constexpr size_t kSmemPerSm = 228 * 1024;
constexpr size_t kSmemReservedPerBlock = 1024;

// Shared memory: for a bf16 cache the Q rows, then the scratch the key loop uses (and the
// warps' final merge reuses): kStages stages of a K tile and a V tile, kTileKeys rows each, kStageStride
// elements apart. Rows are an odd number of 16-byte pieces apart, so the 8 rows one ldmatrix phase
// reads fall on distinct banks: bf16 rows D + 8 elements; e4m3 rows the smallest odd count of
// 16-byte pieces above D bytes (D + 16, D + 32 at D = 80). An e4m3 cache's Q goes from global
// memory straight to registers.
template <int D, typename Cache>
struct Layout {
  static constexpr bool kFp8 = sizeof(Cache) == 1;
  // e4m3: 4 stages (5 at D = 64, where 5 blocks of 4 stages would leave 96 registers a thread).
  static constexpr int kStages = kFp8 ? (D == 64 ? 5 : 4) : 3;
  static constexpr int kStageStride = kFp8 ? 16 * ((D / 16 + 1) | 1) : D + 8;  // elements per row
  static constexpr int kStageElems = 2 * kTileKeys * kStageStride;           // K tile, then V tile
  static constexpr int kQStride = D + 8;
  static constexpr size_t kQBytes = kFp8 ? 0 : sizeof(bf16_bits) * kMaxGroup * kQStride;
  static constexpr size_t kScratchBytes = sizeof(Cache) * kStages * kStageElems;
  static constexpr size_t kBytes = kQBytes + kScratchBytes;
  // Resident blocks per SM, bound by shared memory (the kernel has no static shared memory): bf16
  // 3 at D = 64/80, 2 at D = 96/128; e4m3 4 at D = 64/80/96, 3 at D = 128. kMinBlocks, the
  // __launch_bounds__ minimum, keeps registers from binding first: e4m3 asks ptxas for kBlocksPerSm
  // (at most 128 registers a thread at 4 blocks, 168 at 3); bf16 gives 0, no minimum, and keeps
  // ptxas's own choice (158 registers at D = 128, 146 at D = 64/80/96: never the bound).
  static constexpr int kBlocksPerSm = static_cast<int>(kSmemPerSm / (kBytes + kSmemReservedPerBlock));
  static constexpr int kMinBlocks = kFp8 ? kBlocksPerSm : 0;
  // Output elements a thread merges at once (merge_partitions): 2 under e4m3's register cap, where
  // 4 spill.
  static constexpr int kMergeElems = kFp8 ? 2 : 4;
  static_assert(kStageStride * sizeof(Cache) % 32 == 16, "rows an odd number of 16-byte pieces apart");
};

// Issues the cp.async gather of keys [k0, k0 + kTileKeys) into a stage (zeros past `end`).
template <int D, typename Cache>
__device__ __forceinline__ void load_tile(const AttentionLaunch& a, const int32_t* table, int64_t head_offset, int k0,
                                          int end, Cache* stage) {
  constexpr int kPerCopy = 16 / sizeof(Cache);  // elements per 16-byte copy
  constexpr int kCopies = D / kPerCopy;
  constexpr int kStageStride = Layout<D, Cache>::kStageStride;
  const Cache* k_cache = static_cast<const Cache*>(a.k_cache);
  const Cache* v_cache = static_cast<const Cache*>(a.v_cache);
  const int64_t kv_dim = static_cast<int64_t>(a.kv_heads) * D;
  for (int i = threadIdx.x; i < kTileKeys * kCopies; i += kThreads) {
    const int j = i / kCopies, c = (i % kCopies) * kPerCopy, p = k0 + j;
    const bool valid = p < end;
    int64_t src = 0;
    if (valid) src = (static_cast<int64_t>(__ldg(table + p / a.block_size)) * a.block_size + p % a.block_size) * kv_dim +
                     head_offset + c;
    cp_async16(stage + j * kStageStride + c, k_cache + src, valid ? 16 : 0);
    cp_async16(stage + (kTileKeys + j) * kStageStride + c, v_cache + src, valid ? 16 : 0);
  }
}

// The split-KV merge for the group's heads, run by the last partition's block: a thread per output
// element (head g, dim d), out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p. It is on the
// critical path of every split launch, so a thread issues the partial loads of its kMergeElems
// elements (i, i + kThreads, ...) over kMergeBatch partitions at once: one L2 round trip for up to
// kMergeBatch partitions and kMergeElems * kThreads elements (Llama-3-8B: 4 heads x 128 dims);
// longer lists fold batch by batch with an online rescale. Empty partitions (m = -inf, l = 0)
// weigh 0. Partials are read through L2 (__ldcg): other blocks wrote them.
template <int D, int kMergeElems>
__device__ void merge_partitions(const AttentionLaunch& a, const float* partials, int q_row, int head0, int group_size,
                                 int parts) {
  constexpr int kMergeBatch = 8;
  const int elems = group_size * D;
  for (int i0 = threadIdx.x; i0 < elems; i0 += kMergeElems * kThreads) {
    float top[kMergeElems], denom[kMergeElems], acc[kMergeElems];
#pragma unroll
    for (int e = 0; e < kMergeElems; ++e) top[e] = -INFINITY, denom[e] = acc[e] = 0.0f;
    for (int p0 = 0; p0 < parts; p0 += kMergeBatch) {
      float m[kMergeElems][kMergeBatch], l[kMergeElems][kMergeBatch], v[kMergeElems][kMergeBatch];
#pragma unroll
      for (int e = 0; e < kMergeElems; ++e) {
        const int i = i0 + e * kThreads;
        const float* rows = partials + ((static_cast<int64_t>(q_row) * a.heads + head0 + i / D) * parts + p0) * (D + 2);
#pragma unroll
        for (int j = 0; j < kMergeBatch; ++j) {
          const bool valid = i < elems && p0 + j < parts;
          m[e][j] = valid ? __ldcg(rows + j * (D + 2)) : -INFINITY;
          l[e][j] = valid ? __ldcg(rows + j * (D + 2) + 1) : 0.0f;
          v[e][j] = valid ? __ldcg(rows + j * (D + 2) + 2 + i % D) : 0.0f;
        }
      }
#pragma unroll
      for (int e = 0; e < kMergeElems; ++e) {
        float batch_top = top[e];
#pragma unroll
        for (int j = 0; j < kMergeBatch; ++j) batch_top = fmaxf(batch_top, m[e][j]);
        if (batch_top == -INFINITY) continue;
        const float rescale = __expf(top[e] - batch_top);  // 0 while top is -inf
        denom[e] *= rescale;
        acc[e] *= rescale;
#pragma unroll
        for (int j = 0; j < kMergeBatch; ++j) {
          const float w = __expf(m[e][j] - batch_top);
          denom[e] += w * l[e][j];
          acc[e] += w * v[e][j];
        }
        top[e] = batch_top;
      }
    }
#pragma unroll
    for (int e = 0; e < kMergeElems; ++e) {
      const int i = i0 + e * kThreads;
      if (i < elems)
        reinterpret_cast<__nv_bfloat16*>(a.out)[(static_cast<int64_t>(q_row) * a.heads + head0) * D + i] =
            __float2bfloat16(acc[e] / denom[e]);
    }
  }
}

// The warp's S tile, sc[j] for keys 8j..8j+7 of its 16 (k_rows: their K rows in the stage).
// bf16: K^T fragments straight from ldmatrix (matrices: keys 0-7 dims 0-7, keys 0-7 dims 8-15,
// then keys 8-15 likewise).
template <int D, int Stride>
__device__ __forceinline__ void warp_scores(float (&sc)[2][4], const uint32_t (&q_frag)[D / 16][4],
                                            const bf16_bits* k_rows, int lane) {
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t b[4];
    ldmatrix_x4(b, k_rows + ((lane % 8) + (lane / 16) * 8) * Stride + kc * 16 + ((lane / 8) % 2) * 8);
    mma_bf16(sc[0], q_frag[kc], b[0], b[1]);
    mma_bf16(sc[1], q_frag[kc], b[2], b[3]);
  }
}
// O += P V over the warp's 16 keys (v_rows: their V rows), P in bf16.
template <int D, int Stride>
__device__ __forceinline__ void warp_accumulate_pv(float (&o)[D / 8][4], const float (&sc)[2][4],
                                                   const bf16_bits* v_rows, int lane) {
  const uint32_t p[4] = {pack_bf16(sc[0][0], sc[0][1]), pack_bf16(sc[0][2], sc[0][3]), pack_bf16(sc[1][0], sc[1][1]),
                         pack_bf16(sc[1][2], sc[1][3])};
#pragma unroll
  for (int dp = 0; dp < D / 16; ++dp) {
    uint32_t b[4];
    ldmatrix_x4_trans(b, v_rows + ((lane % 8) + ((lane / 8) % 2) * 8) * Stride + dp * 16 + (lane / 16) * 8);
    mma_bf16(o[2 * dp], p, b[0], b[1]);
    mma_bf16(o[2 * dp + 1], p, b[2], b[3]);
  }
}

// e4m3 fragments (g = lane / 4, t = lane % 4; tensor_core.cuh has the m16n8k16 and ldmatrix
// layouts). A "chunk" is 16 dims = 16 bytes of a row = one 8 x 8 ldmatrix matrix of 16-bit units
// (unit u = bytes 2u, 2u+1 = dims 2u, 2u+1) over 8 keys.
// S = Q K^T, one k16 step per chunk c: ldmatrix (no .trans) on the K rows of keys 8j..8j+7 gives
// lane units 2t, 2t+1 of key 8j+g = dims 16c+4t .. 16c+4t+3; e4m3x4_to_f16x2 turns them into
// (dims 4t, 4t+1) and (4t+2, 4t+3), taken as b0 = B[2t, 2t+1][g] and b1 = B[2t+8, 2t+9][g]: MMA
// k index 2t+i is dim 4t+i and k index 2t+8+i is dim 4t+2+i (i = 0, 1). The sum over k does not
// care about its order as long as Q's A fragment follows the same map: a0 = Q[g][dims 4t, 4t+1],
// a1 = Q[g+8][4t, 4t+1], a2 = Q[g][4t+2, 4t+3], a3 = Q[g+8][4t+2, 4t+3] (load_q_f16).
// O += P V, chunk c: ldmatrix .trans on the V rows of keys 8h..8h+7 (h = 0, 1) gives lane units g
// of keys 8h+2t, 8h+2t+1, bytes [V[8h+2t][2g], V[8h+2t][2g+1], V[8h+2t+1][2g], V[8h+2t+1][2g+1]]
// (dims relative to the chunk); e4m3x4_columns_to_f16x2 splits them into [V[8h+2t][2g],
// V[8h+2t+1][2g]] and the same of dim 2g+1: b0 (h = 0) and b1 (h = 1) of two n-tiles, n-tile j
// holding column n = g as dim 2g+j. So accumulator o[2c+j] column n is dim 16c+2n+j: c0, c1 (rows
// g, columns 2t, 2t+1) are dims 16c+4t+j and 16c+4t+2+j, and a thread's four o[2c], o[2c+1] values
// of row g (c0, c1) are dims 16c+4t .. 16c+4t+3 as o[2c][0], o[2c+1][0], o[2c][1], o[2c+1][1]
// (row g+8: c2, c3 likewise); store_warp_row writes them back in dim order.

// The group's Q rows (q: the first head's row; rows past group_size zeros) as f16 A fragments in
// the dim order above, times scale_log2 (so S comes out in log2 units), rounded to nearest and
// saturated to the f16 range (with the usual scale 1/sqrt(D), scale_log2 <= 0.18: only absurd q
// saturate).
template <int D>
__device__ __forceinline__ void load_q_f16(uint32_t (&q_frag)[D / 16][4], const bf16_bits* q, int group_size,
                                           float scale_log2, int lane) {
  const int g = lane / 4, t = lane % 4;
  const auto value = [](uint32_t bf16x2, int half) {
    return __uint_as_float(half ? bf16x2 & 0xffff0000u : bf16x2 << 16);
  };
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      // bf16 dims 16kc+4t .. 16kc+4t+3 of the row: x = (4t, 4t+1), y = (4t+2, 4t+3).
      const uint2 dims = row < group_size ? __ldg(reinterpret_cast<const uint2*>(q + row * D + kc * 16 + 4 * t))
                                          : make_uint2(0, 0);
      q_frag[kc][r] = pack_f16_satfinite(value(dims.x, 0) * scale_log2, value(dims.x, 1) * scale_log2);
      q_frag[kc][2 + r] = pack_f16_satfinite(value(dims.y, 0) * scale_log2, value(dims.y, 1) * scale_log2);
    }
}

template <int D, int Stride>
__device__ __forceinline__ void warp_scores(float (&sc)[2][4], const uint32_t (&q_frag)[D / 16][4],
                                            const e4m3_bits* k_rows, int lane) {
  // Lane l addresses row l % 8 of matrix l / 8: keys 8 ((l / 8) % 2) + l % 8, chunk c + l / 16.
  const e4m3_bits* row = k_rows + ((lane % 8) + ((lane / 8) % 2) * 8) * Stride + (lane / 16) * 16;
#pragma unroll
  for (int c = 0; c < D / 16; c += 2) {
    if (c + 1 < D / 16) {
      uint32_t k[4], b0, b1;  // k: (keys 0-7, chunk c), (keys 8-15, c), (keys 0-7, c + 1), (keys 8-15, c + 1)
      ldmatrix_x4(k, row + c * 16);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        e4m3x4_to_f16x2(k[m], b0, b1);
        mma_f16(sc[m % 2], q_frag[c + m / 2], b0, b1);
      }
    } else {  // an odd last chunk (D = 80)
      uint32_t k[2], b0, b1;
      ldmatrix_x2(k, row + c * 16);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        e4m3x4_to_f16x2(k[m], b0, b1);
        mma_f16(sc[m], q_frag[c], b0, b1);
      }
    }
  }
}
// P in f16: in [0, 1], where f16 keeps 3 more bits than bf16.
template <int D, int Stride>
__device__ __forceinline__ void warp_accumulate_pv(float (&o)[D / 8][4], const float (&sc)[2][4],
                                                   const e4m3_bits* v_rows, int lane) {
  const uint32_t p[4] = {pack_f16(sc[0][0], sc[0][1]), pack_f16(sc[0][2], sc[0][3]), pack_f16(sc[1][0], sc[1][1]),
                         pack_f16(sc[1][2], sc[1][3])};
  const e4m3_bits* row = v_rows + ((lane % 8) + ((lane / 8) % 2) * 8) * Stride + (lane / 16) * 16;
#pragma unroll
  for (int c = 0; c < D / 16; c += 2) {
    uint32_t even[4], odd[4];  // per matrix as k above: dims 2g and 2g + 1 of its chunk
    if (c + 1 < D / 16) {
      uint32_t v[4];
      ldmatrix_x4_trans(v, row + c * 16);
#pragma unroll
      for (int m = 0; m < 4; ++m) e4m3x4_columns_to_f16x2(v[m], even[m], odd[m]);
    } else {  // an odd last chunk (D = 80)
      uint32_t v[2];
      ldmatrix_x2_trans(v, row + c * 16);
#pragma unroll
      for (int m = 0; m < 2; ++m) e4m3x4_columns_to_f16x2(v[m], even[m], odd[m]);
    }
#pragma unroll
    for (int m = 0; m < 4; m += 2) {
      if (c + m / 2 >= D / 16) break;
      mma_f16(o[2 * (c + m / 2)], p, even[m], even[m + 1]);
      mma_f16(o[2 * (c + m / 2) + 1], p, odd[m], odd[m + 1]);
    }
  }
}

// The warp's accumulators of one row (r = 0: row lane / 4, r = 1: lane / 4 + 8) into dst[D], in
// dim order: bf16 n-tile i column n is dim 8i + n; e4m3 as mapped above.
template <int D>
__device__ __forceinline__ void store_warp_row(float* dst, const float (&o)[D / 8][4], int r, int quad,
                                               bf16_bits /*cache element*/) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    dst[i * 8 + quad * 2] = o[i][2 * r];
    dst[i * 8 + quad * 2 + 1] = o[i][2 * r + 1];
  }
}
template <int D>
__device__ __forceinline__ void store_warp_row(float* dst, const float (&o)[D / 8][4], int r, int quad,
                                               e4m3_bits /*cache element*/) {
#pragma unroll
  for (int c = 0; c < D / 16; ++c)
    *reinterpret_cast<float4*>(dst + c * 16 + quad * 4) =
        make_float4(o[2 * c][2 * r], o[2 * c + 1][2 * r], o[2 * c][2 * r + 1], o[2 * c + 1][2 * r + 1]);
}

template <int D, typename Cache>
__global__ void __launch_bounds__(kThreads, Layout<D, Cache>::kMinBlocks)
    attention_decode_kernel(AttentionLaunch a, float* partials) {
  using L = Layout<D, Cache>;
  static_assert(L::kScratchBytes >= sizeof(float) * kWarps * kMaxGroup * (D + 2),
                "the warps' merge reuses the key loop's scratch");
  extern __shared__ __align__(16) bf16_bits smem[];
  bf16_bits* q_s = smem;  // bf16 cache: [kMaxGroup, kQStride]
  char* scratch = reinterpret_cast<char*>(smem) + L::kQBytes;
  Cache* stages = reinterpret_cast<Cache*>(scratch);  // kStages x (K, V) [kTileKeys, kStageStride]

  const int s = blockIdx.x, kv_head = blockIdx.y;
  const int group_size = a.heads / a.kv_heads, head0 = kv_head * group_size;
  const int q_row = a.query_start[s];
  // Only one-token spans: padding spans (none) and, in a mixed batch, prompt chunks (the prefill
  // kernel's) are skipped; the whole block leaves, before any barrier.
  if (a.query_start[s + 1] - q_row != 1) return;
  const int pos = a.context_lens[s] - 1;
  const int first_visible = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
  const int visible = pos + 1 - first_visible;
  // Partitions split this sequence's own visible keys (read on the device, so a recorded launch
  // replays for any context); those past the keys are empty and write m = -inf, l = 0.
  const int parts = static_cast<int>(gridDim.z);
  const int partition_keys =
      parts == 1 ? visible : (visible + parts * kTileKeys - 1) / (parts * kTileKeys) * kTileKeys;
  const int begin = first_visible + static_cast<int>(blockIdx.z) * partition_keys;
  const int end = min(pos + 1, begin + partition_keys);
  const int tiles = end > begin ? (end - begin + kTileKeys - 1) / kTileKeys : 0;
  const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.table_width;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * D;
  const int64_t width = static_cast<int64_t>(a.heads + 2 * a.kv_heads) * D;
  const bf16_bits* q = a.qkv + q_row * width + static_cast<int64_t>(head0) * D;  // the group's rows, D apart

  // Q rows (bf16 cache): the group's heads, zeros past it.
  if constexpr (!L::kFp8) {
    for (int i = threadIdx.x; i < kMaxGroup * (D / 8); i += kThreads) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      const bool valid = r < group_size;
      cp_async16(q_s + r * L::kQStride + c, valid ? q + r * D + c : a.qkv, valid ? 16 : 0);
    }
  }
  // Prologue: the first kStages - 1 tiles in flight (a group per stage, empty ones too, so the
  // wait count below holds).
#pragma unroll
  for (int t = 0; t < L::kStages - 1; ++t) {
    if (t < tiles) load_tile<D, Cache>(a, table, head_offset, begin + t * kTileKeys, end, stages + t * L::kStageElems);
    cp_async_commit();
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const float scale_log2 = a.scale * 1.4426950408889634f;
  uint32_t q_frag[D / 16][4];
  if constexpr (L::kFp8) load_q_f16<D>(q_frag, q, group_size, scale_log2, lane);
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // rows lane / 4 and lane / 4 + 8

  for (int t = 0; t < tiles; ++t) {
    const int next = t + L::kStages - 1;
    if (next < tiles) {
      load_tile<D, Cache>(a, table, head_offset, begin + next * kTileKeys, end,
                          stages + (next % L::kStages) * L::kStageElems);
    }
    cp_async_commit();
    cp_async_wait<L::kStages - 1>();  // tile t (and a bf16 cache's Q) have landed
    __syncthreads();
    if constexpr (!L::kFp8) {
      if (t == 0) {
#pragma unroll
        for (int kc = 0; kc < D / 16; ++kc)
          ldmatrix_x4(q_frag[kc], q_s + (lane % 16) * L::kQStride + kc * 16 + (lane / 16) * 8);
      }
    }
    // The warp's 16 keys of the stage.
    const Cache* k_rows = stages + (t % L::kStages) * L::kStageElems + warp * 16 * L::kStageStride;
    const Cache* v_rows = k_rows + kTileKeys * L::kStageStride;

    // S for the warp's 16 keys: two n-tiles of 8.
    float sc[2][4] = {};
    warp_scores<D, L::kStageStride>(sc, q_frag, k_rows, lane);
    const int k0 = begin + t * kTileKeys + warp * 16;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // An e4m3 cache's Q came pre-scaled: its scores are in log2 units already.
        const float score = L::kFp8 ? sc[j][e] : sc[j][e] * scale_log2;
        sc[j][e] = k0 + j * 8 + quad * 2 + (e % 2) < end ? score : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], sc[j][e]);
      }
    online_softmax_step(sc, tile_max, row_max, row_sum, o);
    warp_accumulate_pv<D, L::kStageStride>(o, sc, v_rows, lane);
    __syncthreads();  // this stage is refilled later
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the warps' states per row through shared memory (over the scratch, now free).
  float* warp_m = reinterpret_cast<float*>(scratch);     // [kWarps][kMaxGroup]
  float* warp_l = warp_m + kWarps * kMaxGroup;           // [kWarps][kMaxGroup]
  float* warp_o = warp_l + kWarps * kMaxGroup;           // [kWarps][group_size][D]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = lane / 4 + 8 * r;
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (row >= group_size) continue;
    if (quad == 0) {
      warp_m[warp * kMaxGroup + row] = row_max[r];
      warp_l[warp * kMaxGroup + row] = sum;
    }
    store_warp_row<D>(warp_o + (static_cast<int64_t>(warp) * group_size + row) * D, o, r, quad, Cache{});
  }
  __syncthreads();
  for (int i = threadIdx.x; i < group_size * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, warp_m[w * kMaxGroup + g]);
    float total = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = top == -INFINITY ? 0.0f : exp2f(warp_m[w * kMaxGroup + g] - top);
      total += weight * warp_l[w * kMaxGroup + g];
      acc += weight * warp_o[(static_cast<int64_t>(w) * group_size + g) * D + d];
    }
    const int head = head0 + g;
    if (partials != nullptr) {
      float* dst = partials + ((static_cast<int64_t>(q_row) * a.heads + head) * gridDim.z + blockIdx.z) * (D + 2);
      if (d == 0) {
        dst[0] = top * 0.6931471805599453f;  // log2 -> natural-log units (-inf stays -inf)
        dst[1] = total;
      }
      dst[2 + d] = acc;
    } else {
      reinterpret_cast<__nv_bfloat16*>(a.out)[(static_cast<int64_t>(q_row) * a.heads + head) * D + d] =
          __float2bfloat16(acc / total);
    }
  }
  if (partials == nullptr) return;
  // Count this partition done; the last one merges (and resets the counter for the next launch or
  // graph replay). The barrier orders the block's partials before thread 0's release, and its
  // acquire before the merging block's reads: one acq_rel atomic per block, where a fence by
  // every thread before it and another after cost about 0.4 % of a Llama-2-7B batch-1 step. Thread 0's
  // answer reaches the block through the barrier's predicate, not a static shared flag (which would
  // count against kBlocksPerSm).
  __syncthreads();
  bool last_partition = false;
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> counter(
        a.partition_counters[static_cast<int64_t>(s) * a.kv_heads + kv_head]);
    last_partition = counter.fetch_add(1, ::cuda::memory_order_acq_rel) == parts - 1;
    if (last_partition) counter.store(0, ::cuda::memory_order_relaxed);
  }
  if (!__syncthreads_or(last_partition)) return;
  merge_partitions<D, L::kMergeElems>(a, partials, q_row, head0, group_size, parts);
}

template <int D, typename Cache>
cudaError_t launch_d(const AttentionLaunch& a, int partitions, float* partials, cudaStream_t stream) {
  constexpr size_t smem = Layout<D, Cache>::kBytes;
  // All of the SM's shared memory carved out of L1, so that Layout::kBlocksPerSm blocks fit.
  const cudaError_t opt_in =
      allow_shared_memory(reinterpret_cast<const void*>(attention_decode_kernel<D, Cache>), smem, true);
  if (opt_in != cudaSuccess) return opt_in;
  const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(partitions));
  attention_decode_kernel<D, Cache><<<grid, kThreads, smem, stream>>>(a, partials);
  return cudaGetLastError();
}

// Layout::kBlocksPerSm of a launch's instantiation.
template <typename Cache>
int blocks_per_sm(int head_dim) {
  switch (head_dim) {
    case 64: return Layout<64, Cache>::kBlocksPerSm;
    case 80: return Layout<80, Cache>::kBlocksPerSm;
    case 96: return Layout<96, Cache>::kBlocksPerSm;
    default: return Layout<128, Cache>::kBlocksPerSm;
  }
}

}  // namespace

bool attention_decode_supported(const AttentionLaunch& a) {
  const bool head_dim = a.head_dim == 64 || a.head_dim == 80 || a.head_dim == 96 || a.head_dim == 128;
  return head_dim && a.heads / a.kv_heads <= kMaxGroup && aligned_to(a.qkv, 16) && aligned_to(a.k_cache, 16) &&
         aligned_to(a.v_cache, 16);
}

int attention_decode_partitions(const AttentionLaunch& a) {
  // A block's time is about its tiles plus a fixed cost (Q load, pipeline fill, merge, launch)
  // worth kBlockOverheadTiles tiles, and blocks run in waves of Layout::kBlocksPerSm per SM; splitting
  // also costs the merge by the last partition (about one more tile). Take the partition count with the
  // least estimated time: short blocks at batch 1, few partitions once the grid fills the GPU
  // (batch 64, context 512: 1, where a two-wave rule split in 2 and ran at 35 % of the copy rate).
  constexpr int64_t kBlockOverheadTiles = 2;
  const int per_sm = a.kv_fp8 ? blocks_per_sm<e4m3_bits>(a.head_dim) : blocks_per_sm<bf16_bits>(a.head_dim);
  const int64_t blocks = int64_t{a.seqs} * a.kv_heads, wave = int64_t{per_sm} * a.sm_count;
  const int64_t tiles = (a.max_context_len + kTileKeys - 1) / kTileKeys;
  if (a.partials == nullptr || tiles <= 1 || blocks > attention_partition_counters(a.sm_count)) return 1;
  const auto cost = [&](int64_t parts) {
    const int64_t waves = (blocks * parts + wave - 1) / wave;
    return waves * ((tiles + parts - 1) / parts + kBlockOverheadTiles) + (parts > 1 ? 1 : 0);
  };
  int64_t best = 1;
  for (int64_t parts = 2; parts <= std::min<int64_t>(tiles, kMaxAttentionPartitions); ++parts) {
    const int64_t floats = int64_t{a.tokens} * a.heads * parts * (a.head_dim + 2);
    if (floats > a.partials_floats) break;
    if (cost(parts) < cost(best)) best = parts;
  }
  return static_cast<int>(best);
}

cudaError_t launch_attention_decode(const AttentionLaunch& a, int partitions, cudaStream_t stream) {
  float* partials = partitions > 1 ? a.partials : nullptr;
  return with_kv_element(a.kv_fp8, [&](auto element) {
    using Cache = decltype(element);
    switch (a.head_dim) {
      case 64: return launch_d<64, Cache>(a, partitions, partials, stream);
      case 80: return launch_d<80, Cache>(a, partitions, partials, stream);
      case 96: return launch_d<96, Cache>(a, partitions, partials, stream);
      case 128: return launch_d<128, Cache>(a, partitions, partials, stream);
      default: return cudaErrorInvalidValue;
    }
  });
}

}  // namespace splitflow::cuda
