// backend/cuda/flash_prefill.cu — paged attention (causal, or bidirectional for encoders) for prompt chunks on tensor cores
// (FlashAttention-2 style): a block of 4 warps takes 64 query rows of one sequence and one query
// head (16 rows per warp), streams the visible keys through shared memory 64 at a time (gathered
// through the block table with cp.async, two stages so the next tile loads during the math),
// computes S = Q K^T and O += P V with mma.sync m16n8k16 (bf16 in, fp32 accumulate) and keeps an
// online softmax per row in registers. Q fragments stay in registers for the whole key loop; P
// goes from the S accumulators to A fragments without shared memory. An fp8 (e4m3) cache's tiles
// are staged in packed rows and widened (exactly) into one bf16 tile before the MMAs read it.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/tensor_core.cuh"

#include <cuda_bf16.h>

#include <cstdint>

namespace splitflow::cuda {
namespace {

constexpr int kRows = 64;     // query rows per block
constexpr int kKeys = 64;     // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlocksPerSm = 3;  // caps registers at 168 a thread; the shared memory fits (Smem)

// Shared memory: for an e4m3 cache the widened bf16 K and V tile, then two stages of K and V.
// Q passes through the region written first after the prologue (the widened tile, or stage 1 of
// a bf16 cache) on its way to registers: three blocks fit on an SM instead of two, and the
// kernel is latency-bound at two warps per scheduler.
template <int D, typename Cache>
struct Smem {
  static constexpr int kStride = D + 8;  // bf16 per MMA row: 16-byte pad, conflict-free ldmatrix
  // bf16 tiles are staged in MMA rows; e4m3 ones in packed rows, widened into kTileElems.
  static constexpr bool kWidened = sizeof(Cache) == 1;
  static constexpr int kStageStride = kWidened ? D : kStride;   // elements per staged row
  static constexpr int kStageElems = 2 * kKeys * kStageStride;  // K tile, then V tile
  static constexpr int kTileElems = kWidened ? 2 * kKeys * kStride : 0;
  static constexpr size_t kBytes = sizeof(bf16_bits) * kTileElems + sizeof(Cache) * 2 * kStageElems;
  static_assert(kRows * kStride <= (kWidened ? kTileElems : kStageElems), "Q must fit where it passes");
};

// Loads key tile [k0, k0 + kKeys) of the sequence (zeros past key_end) into a stage: K rows, then V.
template <int D, typename Cache>
__device__ __forceinline__ void load_kv_tile(const AttentionLaunch& a, const int32_t* table, int block_shift,
                                             int kv_head, int k0, int key_end, Cache* stage) {
  constexpr int kPerCopy = 16 / sizeof(Cache);  // elements per 16-byte copy
  constexpr int kCopies = D / kPerCopy;         // per row
  constexpr int kStageStride = Smem<D, Cache>::kStageStride;
  const Cache* k_cache = static_cast<const Cache*>(a.k_cache);
  const Cache* v_cache = static_cast<const Cache*>(a.v_cache);
  const int64_t kv_dim = static_cast<int64_t>(a.kv_heads) * D;
  for (int i = threadIdx.x; i < kKeys * kCopies; i += kThreads) {
    const int j = i / kCopies, c = (i % kCopies) * kPerCopy, p = k0 + j;
    const bool valid = p < key_end;
    int64_t src = 0;
    if (valid) {
      // A power-of-two block size (the usual) pages by shift and mask, not a division per copy.
      const int page = block_shift >= 0 ? p >> block_shift : p / a.block_size;
      const int offset = block_shift >= 0 ? p & (a.block_size - 1) : p % a.block_size;
      const int64_t slot = static_cast<int64_t>(__ldg(table + page)) * a.block_size + offset;
      src = slot * kv_dim + static_cast<int64_t>(kv_head) * D + c;
    }
    cp_async16(stage + j * kStageStride + c, k_cache + src, valid ? 16 : 0);
    cp_async16(stage + (kKeys + j) * kStageStride + c, v_cache + src, valid ? 16 : 0);
  }
}

template <int D, typename Cache>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) flash_prefill_kernel(AttentionLaunch a, int tiles_per_seq, bool skip_single) {
  using S = Smem<D, Cache>;
  extern __shared__ __align__(16) bf16_bits smem[];
  constexpr int kStride = S::kStride;
  bf16_bits* widened = smem;                                          // e4m3: K, V [kKeys, kStride]
  Cache* stages = reinterpret_cast<Cache*>(widened + S::kTileElems);  // stage s at stages + s kStageElems
  bf16_bits* q_s = S::kWidened ? widened : reinterpret_cast<bf16_bits*>(stages + S::kStageElems);

  // Blocks run in index order; the causal tiles at the end of a prompt see the most keys, so they
  // come first (every head and sequence), and the short ones fill in behind them.
  const int head = blockIdx.x % a.heads, kv_head = head / (a.heads / a.kv_heads);
  const int s = (blockIdx.x / a.heads) % a.seqs;
  const int tile = tiles_per_seq - 1 - static_cast<int>(blockIdx.x / (a.heads * a.seqs));
  const int q0 = a.query_start[s], n = a.query_start[s + 1] - q0;
  const int t_begin = tile * kRows;
  if (t_begin >= n || (skip_single && n == 1)) return;  // the whole block leaves, before any barrier
  const int context = a.context_lens[s];
  const int pos0 = context - n + t_begin;                  // position of the tile's first row
  const int last_pos = min(context, pos0 + kRows) - 1;     // of its last real row
  const int key_begin = a.sliding_window > 0 ? max(0, pos0 - a.sliding_window + 1) : 0;
  const int key_end = a.causal ? last_pos + 1 : context;  // bidirectional: every key of the sequence
  const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.table_width;
  const int block_shift = (a.block_size & (a.block_size - 1)) == 0 ? __ffs(a.block_size) - 1 : -1;
  const int64_t width = static_cast<int64_t>(a.heads + 2 * a.kv_heads) * D;

  // Q tile (rows past the sequence are zeros).
  for (int i = threadIdx.x; i < kRows * (D / 8); i += kThreads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    const bool valid = t_begin + r < n;
    const bf16_bits* src = a.qkv + (valid ? (q0 + t_begin + r) * width + static_cast<int64_t>(head) * D + c : 0);
    cp_async16(q_s + r * kStride + c, src, valid ? 16 : 0);
  }
  load_kv_tile<D, Cache>(a, table, block_shift, kv_head, key_begin, key_end, stages);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  // This thread's two rows (group, group + 8 of the warp's 16) and their positions.
  const int row_pos[2] = {pos0 + warp * 16 + group, pos0 + warp * 16 + group + 8};
  const float scale_log2 = a.scale * 1.4426950408889634f;

  // Q to registers before the loop refills its shared memory.
  uint32_t q_frag[D / 16][4];
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc)
    ldmatrix_x4(q_frag[kc], q_s + (warp * 16 + lane % 16) * kStride + kc * 16 + (lane / 16) * 8);
  __syncthreads();

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const int tiles = (key_end - key_begin + kKeys - 1) / kKeys;
  for (int t = 0; t < tiles; ++t) {
    const int k0 = key_begin + t * kKeys;
    if (t + 1 < tiles)
      load_kv_tile<D, Cache>(a, table, block_shift, kv_head, k0 + kKeys, key_end, stages + ((t + 1) % 2) * S::kStageElems);
    cp_async_commit();
    cp_async_wait<1>();  // everything but the tile just requested has landed
    __syncthreads();
    const Cache* staged = stages + (t % 2) * S::kStageElems;
    const bf16_bits* k_s = tile_rows_bf16<D, kStride, 2 * kKeys, kThreads>(staged, widened);
    const bf16_bits* v_s = k_s + kKeys * kStride;

    // S = Q K^T for this warp's 16 rows and the tile's 64 keys: 8 n-tiles of 8 keys.
    float sc[kKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
      for (int jp = 0; jp < kKeys / 16; ++jp) {
        uint32_t b[4];
        const int key = jp * 16 + (lane % 8) + (lane / 16) * 8;
        ldmatrix_x4(b, k_s + key * kStride + kc * 16 + ((lane / 8) % 2) * 8);
        mma_bf16(sc[2 * jp], q_frag[kc], b[0], b[1]);
        mma_bf16(sc[2 * jp + 1], q_frag[kc], b[2], b[3]);
      }
    }

    // Scale to log2 units and mask (causal, window, range) where some key of the tile is hidden
    // from some row of the warp: only the tiles on the diagonal and at the window's edge. Rows
    // past the chunk are never stored, so the range check (keys past key_end) only guards them.
    const int warp_first_pos = pos0 + warp * 16;
    const bool masked = a.causal ? k0 + kKeys - 1 > warp_first_pos ||
                                       (a.sliding_window > 0 && k0 <= warp_first_pos + 15 - a.sliding_window)
                                 : k0 + kKeys > key_end;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, key = k0 + j * 8 + quad * 2 + (e % 2);
        const bool visible = !masked || (key < key_end && (!a.causal || key <= row_pos[r]) &&
                                         (a.sliding_window == 0 || key > row_pos[r] - a.sliding_window));
        sc[j][e] = visible ? sc[j][e] * scale_log2 : -INFINITY;
      }
    float tile_max[2] = {reduce_tile_row<true>(sc, 0), reduce_tile_row<true>(sc, 1)};
    online_softmax_step(sc, tile_max, row_max, row_sum, o);

    // O += P V: P's accumulators become A fragments, 16 keys per k-step.
#pragma unroll
    for (int kc = 0; kc < kKeys / 16; ++kc) {
      const uint32_t p[4] = {pack_bf16(sc[2 * kc][0], sc[2 * kc][1]), pack_bf16(sc[2 * kc][2], sc[2 * kc][3]),
                             pack_bf16(sc[2 * kc + 1][0], sc[2 * kc + 1][1]),
                             pack_bf16(sc[2 * kc + 1][2], sc[2 * kc + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        const int key = kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
        ldmatrix_x4_trans(b, v_s + key * kStride + dp * 16 + (lane / 16) * 8);
        mma_bf16(o[2 * dp], p, b[0], b[1]);
        mma_bf16(o[2 * dp + 1], p, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is refilled two tiles later (the widened tile at the next one)
  }

  // Normalize and store the rows that exist.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int t = t_begin + warp * 16 + group + 8 * r;
    if (t >= n) continue;
    const float inv = 1.0f / sum;
    bf16_bits* out = a.out + (static_cast<int64_t>(q0 + t) * a.heads + head) * D;
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<uint32_t*>(out + i * 8 + quad * 2) = pack_bf16(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
  }
}

template <int D, typename Cache>
cudaError_t launch_d(const AttentionLaunch& a, bool skip_single, cudaStream_t stream) {
  const int tiles_per_seq = (a.max_query_len + kRows - 1) / kRows;
  const size_t smem = Smem<D, Cache>::kBytes;
  const cudaError_t opt_in =
      allow_shared_memory(reinterpret_cast<const void*>(flash_prefill_kernel<D, Cache>), smem, true);
  if (opt_in != cudaSuccess) return opt_in;
  const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(a.seqs) * tiles_per_seq * a.heads));
  flash_prefill_kernel<D, Cache><<<grid, kThreads, smem, stream>>>(a, tiles_per_seq, skip_single);
  return cudaGetLastError();
}

}  // namespace

bool flash_prefill_supported(const AttentionLaunch& a) {
  const bool head_dim = a.head_dim == 64 || a.head_dim == 80 || a.head_dim == 96 || a.head_dim == 128;
  return head_dim && aligned_to(a.qkv, 16) && aligned_to(a.k_cache, 16) && aligned_to(a.v_cache, 16) &&
         aligned_to(a.out, 16);
}

cudaError_t launch_flash_prefill(const AttentionLaunch& a, bool skip_single, cudaStream_t stream) {
  return with_kv_element(a.kv_fp8, [&](auto element) {
    using Cache = decltype(element);
    switch (a.head_dim) {
      case 64: return launch_d<64, Cache>(a, skip_single, stream);
      case 80: return launch_d<80, Cache>(a, skip_single, stream);
      case 96: return launch_d<96, Cache>(a, skip_single, stream);
      case 128: return launch_d<128, Cache>(a, skip_single, stream);
      default: return cudaErrorInvalidValue;
    }
  });
}

}  // namespace splitflow::cuda
