// backend/cuda/attention_decode.cu — paged attention for decode steps (one new token per
// sequence) on tensor cores, head_dim 64/80/96/128 and GQA groups of 1 to 16 query heads.
//
// One block of 4 warps per (sequence, kv head, KV partition) serves the kv head's whole group,
// so K and V are read once for all its query heads: the group's G query rows are the M rows of
// an m16n8k16 MMA (rows past G are zeros). Decode attention is bound by reading the cache, and
// this layout keeps the reads coalesced and deep: key tiles of 64 rows are gathered through the
// block table with cp.async (16 bytes per thread, consecutive threads on consecutive bytes of a
// row), three stages in flight, into padded shared rows that ldmatrix reads without conflicts.
// Warp w takes keys 16w..16w+15 of every tile: S = Q K^T, an online softmax per row in
// registers (log2 units), O += P V with P in bf16 straight from the S accumulators. The four
// warps' states merge through shared memory at the end; with several partitions the result goes
// to the split-KV partials (kernels.cu's layout, natural-log maxima), and the last partition of a
// (sequence, kv head) to finish, found with a counter, merges them: no combine launch, which cost
// as much as the attention itself at batch 1.
// An fp8 (e4m3) cache is read the same way at half the bytes: its tiles land in packed staging
// rows, still 16-byte cp.async copies kStages deep, and once a tile has landed the block widens it
// (exactly) into one bf16 tile of the layout above, which the same MMAs read.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/tensor_core.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace splitflow::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileKeys = 16 * kWarps;  // keys per shared-memory tile
constexpr int kStages = 3;
constexpr int kMaxGroup = 16;           // query heads per kv head: the MMA's M
constexpr int kBlocksPerSm = 2;         // resident blocks at head_dim 128 (shared memory bound)

// Shared memory: the Q rows, then the scratch the key loop uses (and the final merges reuse): for
// an e4m3 cache the widened bf16 tile, then the stages.
template <int D, typename Cache>
struct Layout {
  static constexpr int kStride = D + 8;  // bf16 per MMA row: a 16-byte pad, conflict-free ldmatrix
  // bf16 tiles are staged in MMA rows; e4m3 ones in packed rows, widened into kTileElems.
  static constexpr bool kWidened = sizeof(Cache) == 1;
  static constexpr int kStageStride = kWidened ? D : kStride;       // elements per staged row
  static constexpr int kStageElems = 2 * kTileKeys * kStageStride;  // K tile, then V tile
  static constexpr int kTileElems = kWidened ? 2 * kTileKeys * kStride : 0;
  static constexpr size_t kQBytes = sizeof(bf16_bits) * kMaxGroup * kStride;
  static constexpr size_t kScratchBytes = sizeof(bf16_bits) * kTileElems + sizeof(Cache) * kStages * kStageElems;
  static constexpr size_t kBytes = kQBytes + kScratchBytes;
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

// The split-KV merge for the group's heads, run by the last partition's block: warp w takes heads
// w, w + kWarps, ...; out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p with each
// partition's weight computed once into `weights` (kMaxAttentionPartitions floats per warp) and
// empty partitions (weight 0) skipped. Partials are read through L2 (__ldcg): other blocks wrote them.
template <int D>
__device__ void merge_partitions(const AttentionLaunch& a, const float* partials, int q_row, int head0, int group_size,
                                 int parts, float* weights) {
  constexpr int kDimsPerLane = (D + 31) / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  weights += warp * kMaxAttentionPartitions;
  for (int g = warp; g < group_size; g += kWarps) {
    const int64_t token_head = static_cast<int64_t>(q_row) * a.heads + head0 + g;
    const float* rows = partials + token_head * parts * (D + 2);
    float top = -INFINITY;
    for (int p = lane; p < parts; p += 32) top = fmaxf(top, __ldcg(rows + p * (D + 2)));
    for (int offset = 16; offset > 0; offset >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
    float denom = 0.0f;
    for (int p = lane; p < parts; p += 32) {
      const float m = __ldcg(rows + p * (D + 2));
      const float w = m == -INFINITY ? 0.0f : __expf(m - top);
      weights[p] = w;
      denom += w * __ldcg(rows + p * (D + 2) + 1);
    }
    for (int offset = 16; offset > 0; offset >>= 1) denom += __shfl_xor_sync(0xffffffffu, denom, offset);
    __syncwarp();
    float acc[kDimsPerLane] = {};
    for (int p = 0; p < parts; ++p) {
      const float w = weights[p];
      if (w == 0.0f) continue;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i)
        if (lane + 32 * i < D) acc[i] += w * __ldcg(rows + p * (D + 2) + 2 + lane + 32 * i);
    }
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i)
      if (lane + 32 * i < D)
        reinterpret_cast<__nv_bfloat16*>(a.out)[token_head * D + lane + 32 * i] = __float2bfloat16(acc[i] / denom);
    __syncwarp();  // `weights` is rewritten for the warp's next head
  }
}

template <int D, typename Cache>
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(AttentionLaunch a, float* partials) {
  using L = Layout<D, Cache>;
  static_assert(L::kScratchBytes >= kWarps * kMaxAttentionPartitions * sizeof(float) &&
                    L::kScratchBytes >= sizeof(float) * kWarps * kMaxGroup * (D + 2),
                "the merges reuse the key loop's scratch");
  extern __shared__ __align__(16) bf16_bits smem[];
  constexpr int kStride = L::kStride;
  bf16_bits* q_s = smem;                                                  // [kMaxGroup, kStride]
  char* scratch = reinterpret_cast<char*>(smem) + L::kQBytes;
  bf16_bits* widened = reinterpret_cast<bf16_bits*>(scratch);            // e4m3: K, V [kTileKeys, kStride]
  Cache* stages = reinterpret_cast<Cache*>(scratch + sizeof(bf16_bits) * L::kTileElems);  // kStages x (K, V)

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

  // Q rows: the group's heads, zeros past it.
  for (int i = threadIdx.x; i < kMaxGroup * (D / 8); i += kThreads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    const bool valid = r < group_size;
    cp_async16(q_s + r * kStride + c, a.qkv + (valid ? q_row * width + static_cast<int64_t>(head0 + r) * D + c : 0),
               valid ? 16 : 0);
  }
  // Prologue: the first kStages - 1 tiles in flight (a group per stage, empty ones too, so the
  // wait count below holds).
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles) load_tile<D, Cache>(a, table, head_offset, begin + t * kTileKeys, end, stages + t * L::kStageElems);
    cp_async_commit();
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const float scale_log2 = a.scale * 1.4426950408889634f;
  uint32_t q_frag[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // rows lane / 4 and lane / 4 + 8

  for (int t = 0; t < tiles; ++t) {
    const int next = t + kStages - 1;
    if (next < tiles) {
      load_tile<D, Cache>(a, table, head_offset, begin + next * kTileKeys, end,
                          stages + (next % kStages) * L::kStageElems);
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // tile t (and Q) have landed
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) ldmatrix_x4(q_frag[kc], q_s + (lane % 16) * kStride + kc * 16 + (lane / 16) * 8);
    }
    const Cache* staged = stages + (t % kStages) * L::kStageElems;
    const bf16_bits* k_s = tile_rows_bf16<D, kStride, 2 * kTileKeys, kThreads>(staged, widened);
    const bf16_bits* v_s = k_s + kTileKeys * kStride;

    // S for the warp's 16 keys: two n-tiles of 8.
    float sc[2][4] = {};
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      uint32_t b[4];
      ldmatrix_x4(b, k_s + (warp * 16 + (lane % 8) + (lane / 16) * 8) * kStride + kc * 16 + ((lane / 8) % 2) * 8);
      mma_bf16(sc[0], q_frag[kc], b[0], b[1]);
      mma_bf16(sc[1], q_frag[kc], b[2], b[3]);
    }
    const int k0 = begin + t * kTileKeys + warp * 16;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[j][e] = k0 + j * 8 + quad * 2 + (e % 2) < end ? sc[j][e] * scale_log2 : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], sc[j][e]);
      }
    online_softmax_step(sc, tile_max, row_max, row_sum, o);
    // O += P V over the warp's 16 keys.
    const uint32_t p[4] = {pack_bf16(sc[0][0], sc[0][1]), pack_bf16(sc[0][2], sc[0][3]), pack_bf16(sc[1][0], sc[1][1]),
                           pack_bf16(sc[1][2], sc[1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_s + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kStride + dp * 16 + (lane / 16) * 8);
      mma_bf16(o[2 * dp], p, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], p, b[2], b[3]);
    }
    __syncthreads();  // this stage (and the widened tile) is refilled later
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
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      float* dst = warp_o + (static_cast<int64_t>(warp) * group_size + row) * D + i * 8 + quad * 2;
      dst[0] = o[i][2 * r];
      dst[1] = o[i][2 * r + 1];
    }
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
  // Publish the partials, then count this partition done; the last one merges (and resets the
  // counter for the next launch or graph replay).
  __shared__ bool last_partition;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* counter = a.partition_counters + static_cast<int64_t>(s) * a.kv_heads + kv_head;
    last_partition = atomicAdd(counter, 1) == parts - 1;
    if (last_partition) *counter = 0;
  }
  __syncthreads();
  if (!last_partition) return;
  __threadfence();
  merge_partitions<D>(a, partials, q_row, head0, group_size, parts, reinterpret_cast<float*>(scratch));
}

template <int D, typename Cache>
cudaError_t launch_d(const AttentionLaunch& a, int partitions, float* partials, cudaStream_t stream) {
  constexpr size_t smem = Layout<D, Cache>::kBytes;
  // Past the default 48 KB of shared memory; the attribute is per device, so set it every launch
  // (about a microsecond; recorded steps replay without it).
  const cudaError_t opt_in = cudaFuncSetAttribute(attention_decode_kernel<D, Cache>,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (opt_in != cudaSuccess) return opt_in;
  const dim3 grid(static_cast<unsigned>(a.seqs), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(partitions));
  attention_decode_kernel<D, Cache><<<grid, kThreads, smem, stream>>>(a, partials);
  return cudaGetLastError();
}

}  // namespace

bool attention_decode_supported(const AttentionLaunch& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool head_dim = a.head_dim == 64 || a.head_dim == 80 || a.head_dim == 96 || a.head_dim == 128;
  return head_dim && a.heads / a.kv_heads <= kMaxGroup && aligned(a.qkv) && aligned(a.k_cache) && aligned(a.v_cache);
}

int attention_decode_partitions(const AttentionLaunch& a) {
  // A block's time is about its tiles plus a fixed cost (Q load, pipeline fill, merge, launch)
  // worth kBlockOverheadTiles tiles, and blocks run in waves of kBlocksPerSm per SM; splitting
  // also costs the merge by the last partition (about one more tile). Take the partition count with the
  // least estimated time: short blocks at batch 1, few partitions once the grid fills the GPU
  // (batch 64, context 512: 1, where a two-wave rule split in 2 and ran at 35 % of the copy rate).
  constexpr int64_t kBlockOverheadTiles = 2;
  const int64_t blocks = int64_t{a.seqs} * a.kv_heads, wave = int64_t{kBlocksPerSm} * a.sm_count;
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
