// backend/cuda/quant_mma.cuh — the decode GEMVs on quantized weights through the tensor cores
// (mma.sync m16n8k16, fp16 inputs, fp32 sums), for the types whose codes convert to fp16 in a few
// bit operations: Q4_0, Q8_0 and FP8 E4M3 (per channel or per 128-group). quant_gemv.cuh's
// one-warp-per-row kernels spend ~9 instructions per weight decoding to fp32 and multiplying
// (docs/quantization.md: issue-bound, 11-17 us for a 4096 x 4096 matrix whatever its bytes); here
// a warp owns a tile of 16 rows and each lane turns its share of the codes into fp16 pairs that
// feed the tensor cores directly, so a weight costs ~1-2 instructions and the x operand is loaded
// once per 16 rows instead of once per row.
//
// Layout of the work: a block of kWarps warps owns one tile of 16 rows (two groups of 8: the gated
// kernel pairs gate row j with up row j, the QKV kernel the two rows of a RoPE pair, so one lane
// holds both for its epilogue); its warps split k by chunks (warp w takes chunks w, w + kWarps,
// ...), each staging its 16 rows' chunk bytes into shared memory with cp.async (double-buffered,
// quant_gemv.cuh's staging) before decoding them in the mma A layout. x rows are the mma's 8
// columns (m <= 8): lane (g, t) loads x row g at k = 2t, 2t + 1, 2t + 8, 2t + 9 of each 16-wide
// tile, converts to fp16 (clamped to +-65504: bf16 activations beyond fp16's range would become
// inf) and multiplies by the input norm's weight on the way.
//
// Exactness: a code is an integer or an e4m3 value, both exact in fp16; the scale of a block is
// applied in fp32 to the block's mma partial sum (c = codes . x, then acc += d c), so the only
// roundings beyond fp32 summation are x's to fp16 (none for bf16 values in fp16's normal range) and
// x * norm weight's (2^-11 relative).
//
// Status (H200, 2026-11-28): correct, opt-in (SPLITFLOW_QUANT_MMA=1), and slower than
// quant_gemv.cuh at m = 1 (Q4_0 4096 x 4096: 28 us against 10.9). Nsight Compute: 0.29 issued
// warps per scheduler, 7.7 active warps per SM (256 blocks are half a wave), ~200 instructions per
// unit per warp instead of the ~85 counted, 42 % of stalls on L1TEX (x loaded by each warp from
// global memory, the tile's row addresses in local memory), 19.5 active lanes (only lanes g < m
// load x). Next: x converted to fp16 fragments once per block in shared memory, row addresses
// computed instead of indexed, a finer k split for more warps (docs/quantization.md).
#pragma once

#include "backend/cuda/activation.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_gemv.cuh"
#include "backend/cuda/quant_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace splitflow::cuda::quant_mma_detail {

using quant_decode::ld16;
using quant_gemv_detail::commit_async;
using quant_gemv_detail::stage_words;
using quant_gemv_detail::wait_async_but_one;
using quant_gemv_detail::XOperand;

// ---- fragment decoders ---------------------------------------------------------------------------
// Frag::unit(blocks, lu, row, u, t, h, scale): the 32-element unit u of a row (lu-th unit of the
// staged run `blocks`, in shared memory; `row` the row's first byte in global memory) as the four
// fp16 pairs lane t (0..3) of a row group holds in the mma A layout: h[0] = elements (2t, 2t + 1),
// h[1] = (2t + 8, 2t + 9), h[2] = (16 + 2t, 17 + 2t), h[3] = (24 + 2t, 25 + 2t); `scale` multiplies
// the unit's partial sum. kRowScale: one scale for the whole row (row_scale(row)), applied once.

// f16x2 of the low bytes of each 16-bit half after a byte permutation: bytes (b0, b1) -> halves.
__device__ __forceinline__ uint32_t spread_bytes(uint32_t two_bytes) { return __byte_perm(two_bytes, 0, 0x4140); }

__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Q4_0 {f16 d; u8 qs[16]}: w[j] = (lo(qs[j]) - 8) d, w[j + 16] = (hi(qs[j]) - 8) d. A nibble ORed
// into the mantissa of fp16 1024 is 1024 + q exactly; subtracting 1032 leaves q - 8.
struct FragQ4_0 : quant_decode::Q4_0 {
  static constexpr bool kRowScale = false;
  static constexpr int kChunkUnits = 16;  // 288 bytes of a row a copy
  __device__ static void unit(const uint8_t* blocks, int lu, const uint8_t*, int64_t, int t, uint32_t (&h)[4],
                              float& scale) {
    const uint8_t* b = blocks + lu * kBytes;
    scale = quant_decode::ldf16(b);
    const uint32_t first = spread_bytes(ld16(b + 2 + 2 * t)), second = spread_bytes(ld16(b + 10 + 2 * t));
    constexpr uint32_t kBias = 0x64086408u;  // fp16 1032 in both halves
    h[0] = hsub2_bits((first & 0x000f000fu) | 0x64006400u, kBias);
    h[1] = hsub2_bits((second & 0x000f000fu) | 0x64006400u, kBias);
    h[2] = hsub2_bits(((first >> 4) & 0x000f000fu) | 0x64006400u, kBias);
    h[3] = hsub2_bits(((second >> 4) & 0x000f000fu) | 0x64006400u, kBias);
  }
};

// Q8_0 {f16 d; i8 qs[32]}: a signed byte with its sign bit flipped is b + 128 in [0, 255], which
// ORed into fp16 1024's mantissa is 1024 + b + 128 exactly; subtracting 1152 leaves b.
struct FragQ8_0 : quant_decode::Q8_0 {
  static constexpr bool kRowScale = false;
  static constexpr int kChunkUnits = 8;  // 272 bytes
  __device__ static uint32_t pair(const uint8_t* p) {
    return hsub2_bits((spread_bytes(ld16(p)) & 0x00ff00ffu) ^ 0x64806480u, 0x64806480u);
  }
  __device__ static void unit(const uint8_t* blocks, int lu, const uint8_t*, int64_t, int t, uint32_t (&h)[4],
                              float& scale) {
    const uint8_t* b = blocks + lu * kBytes;
    scale = quant_decode::ldf16(b);
    const uint8_t* qs = b + 2 + 2 * t;
    h[0] = pair(qs);
    h[1] = pair(qs + 8);
    h[2] = pair(qs + 16);
    h[3] = pair(qs + 24);
  }
};

// Two e4m3 bytes (lower byte: lower element) to an fp16 pair: exact, subnormals included.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  uint32_t out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(static_cast<unsigned short>(two_bytes)));
  return out;
}

// FP8 E4M3 weight-only: a row is its f32 scales (one, or one per 128 elements) padded to 16 bytes,
// then k e4m3 bytes (quant_decode::F8).
template <bool kGrouped>
struct FragF8 : quant_decode::F8<kGrouped> {
  static constexpr bool kRowScale = !kGrouped;
  static constexpr int kChunkUnits = 8;  // 256 bytes
  __device__ static float row_scale(const uint8_t* row) { return __ldg(reinterpret_cast<const float*>(row)); }
  __device__ static void unit(const uint8_t* blocks, int lu, const uint8_t* row, int64_t u, int t, uint32_t (&h)[4],
                              float& scale) {
    const uint8_t* b = blocks + 32 * lu + 2 * t;
    if constexpr (kGrouped) scale = __ldg(reinterpret_cast<const float*>(row) + u / 4);
    h[0] = e4m3x2_to_f16x2(ld16(b));
    h[1] = e4m3x2_to_f16x2(ld16(b + 8));
    h[2] = e4m3x2_to_f16x2(ld16(b + 16));
    h[3] = e4m3x2_to_f16x2(ld16(b + 24));
  }
};

// f(Frag{}) for the types this path decodes; false for the others (quant_gemv.cuh's kernels).
template <typename F>
__host__ __device__ __forceinline__ bool with_fragment_decoder(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Q4_0: f(FragQ4_0{}); return true;
    case DType::Q8_0: f(FragQ8_0{}); return true;
    case DType::F8_CHANNEL: f(FragF8<false>{}); return true;
    case DType::F8_G128: f(FragF8<true>{}); return true;
    default: return false;
  }
}

// ---- the tile product ------------------------------------------------------------------------------

constexpr int kTileRows = 16;
constexpr int kColumns = 8;  // the mma's n: x rows (m <= kMaxQuantGemvRows = 8)
static_assert(kMaxQuantGemvRows <= kColumns);

// A warp stages ~256-300 contiguous bytes of each of its 16 rows a chunk: short copies of many
// rows (72 bytes each at 4 Q4_0 units a chunk) ran at 5 % of the bandwidth on H200.
template <typename Frag>
struct Staging {
  static constexpr int kChunkUnits = Frag::kChunkUnits;
  static_assert(kChunkUnits % Frag::kUnitsPerBlock == 0);
  static constexpr int kBlocksPerChunk = kChunkUnits / Frag::kUnitsPerBlock;
  static constexpr int kChunkBytes = kBlocksPerChunk * Frag::kBytes;
  // A row's stage: the chunk's 16-byte words (up to 15 bytes more at each end), its stride 16 more
  // than a multiple of 128 bytes so the 8 rows a warp instruction reads fall in different banks.
  static constexpr int kWordsBytes = (kChunkBytes + 30) / 16 * 16;
  static constexpr int kRowStride = (kWordsBytes + 111) / 128 * 128 + 16;
};

// Warps a block: they split k into contiguous slices, each warp's two stages in dynamic shared
// memory (kSharedBytes: over the 48 KiB static limit, set by allow_shared_memory()).
template <typename Frag>
constexpr int kWarps = 4;

template <typename Frag>
using WarpStages = uint8_t[2][kTileRows][Staging<Frag>::kRowStride];

template <typename Frag>
constexpr int kSharedBytes = kWarps<Frag> * static_cast<int>(sizeof(WarpStages<Frag>));

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x row `r` at columns (col, col + 1) as an fp16 pair, times the norm weight; squares += their
// squares (of x, before the weight: the norm's statistic).
__device__ __forceinline__ uint32_t x_pair(const XOperand& x, int r, int64_t col, float& squares) {
  const uint32_t bits = __ldg(reinterpret_cast<const unsigned int*>(x.x + r * x.k + col));
  float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
  squares = fmaf(v.x, v.x, fmaf(v.y, v.y, squares));
  if (x.norm.weight != nullptr) {
    v.x *= x.norm.offset + __ldg(x.norm.weight + col);
    v.y *= x.norm.offset + __ldg(x.norm.weight + col + 1);
  }
  v.x = fminf(fmaxf(v.x, -65504.0f), 65504.0f);
  v.y = fminf(fmaxf(v.y, -65504.0f), 65504.0f);
  const __half2 h = __float22half2_rn(v);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The tile's products with x, summed over the block's warps, in warp 0: acc[0], acc[1] = rows
// tile_rows[g] for x rows 2t, 2t + 1; acc[2], acc[3] = rows tile_rows[g + 8] for the same x rows
// (g = lane / 4, t = lane % 4). With want_rms, inv_rms[r] = x row r's 1 / rms (warp 0, every lane).
// Returns whether this thread is in warp 0 (the one that holds the totals).
template <typename Frag>
__device__ __forceinline__ bool tile_dot(const QuantRun& w, const int64_t (&tile_rows)[kTileRows], const XOperand& x,
                                         bool want_rms, float (&acc)[4], float (&inv_rms)[kColumns]) {
  using S = Staging<Frag>;
  constexpr int W = kWarps<Frag>;
  extern __shared__ __align__(16) uint8_t dynamic_shared[];
  auto* stages = reinterpret_cast<WarpStages<Frag>*>(dynamic_shared);
  __shared__ float partial[W][4][32];
  __shared__ float row_squares[W][kColumns];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t k = x.k, units = k / 32, row_blocks = units / Frag::kUnitsPerBlock;
  const int64_t chunks = (row_blocks + S::kBlocksPerChunk - 1) / S::kBlocksPerChunk;
  // This warp's contiguous slice of chunks [begin, end).
  const int64_t per_warp = (chunks + W - 1) / W, begin = min(warp * per_warp, chunks),
                end = min(begin + per_warp, chunks);
  const auto row_at = [&](int i) { return w.data + (tile_rows[i] - w.first_row) * w.row_bytes; };
  const auto blocks_at = [&](int i) { return row_at(i) + Frag::data_offset(k); };
  WarpStages<Frag>& stage = stages[warp];
  const auto issue = [&](int64_t c) {
    if (c < end) {
      const int64_t first = c * S::kBlocksPerChunk, last = min(first + S::kBlocksPerChunk, row_blocks);
#pragma unroll 4
      for (int i = 0; i < kTileRows; ++i)
        stage_words(stage[(c - begin) & 1][i], blocks_at(i) + first * Frag::kBytes, blocks_at(i) + last * Frag::kBytes,
                    lane);
    }
    commit_async();  // an empty group past the end keeps "all but the newest" meaning chunk c
  };
  const uint8_t* my_rows[2] = {row_at(g), row_at(g + 8)};
  const uint8_t* my_blocks[2] = {blocks_at(g), blocks_at(g + 8)};
  const bool has_x = g < x.m;
  float total[4] = {0.0f, 0.0f, 0.0f, 0.0f}, squares = 0.0f;
  issue(begin);
#pragma unroll 1
  for (int64_t c = begin; c < end; ++c) {
    issue(c + 1);
    wait_async_but_one();
    __syncwarp();
    const int buffer = (c - begin) & 1;
#pragma unroll
    for (int lu = 0; lu < S::kChunkUnits; ++lu) {
      const int64_t u = c * S::kChunkUnits + lu;
      if (u >= units) break;
      uint32_t x_lo[2] = {0, 0}, x_hi[2] = {0, 0};  // the unit's two 16-wide tiles
      if (has_x) {
        const int64_t col = 32 * u + 2 * t;
        x_lo[0] = x_pair(x, g, col, squares);
        x_lo[1] = x_pair(x, g, col + 8, squares);
        x_hi[0] = x_pair(x, g, col + 16, squares);
        x_hi[1] = x_pair(x, g, col + 24, squares);
      }
      uint32_t h[2][4];
      float scale[2] = {1.0f, 1.0f};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint8_t* chunk = my_blocks[half] + c * S::kBlocksPerChunk * Frag::kBytes;
        Frag::unit(stage[buffer][g + 8 * half] + (reinterpret_cast<uintptr_t>(chunk) & 15), lu, my_rows[half], u, t,
                   h[half], scale[half]);
      }
      const uint32_t a_lo[4] = {h[0][0], h[1][0], h[0][1], h[1][1]};
      const uint32_t a_hi[4] = {h[0][2], h[1][2], h[0][3], h[1][3]};
      if constexpr (Frag::kRowScale) {
        mma_f16(total, a_lo, x_lo[0], x_lo[1]);
        mma_f16(total, a_hi, x_hi[0], x_hi[1]);
      } else {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_f16(part, a_lo, x_lo[0], x_lo[1]);
        mma_f16(part, a_hi, x_hi[0], x_hi[1]);
        total[0] = fmaf(scale[0], part[0], total[0]);
        total[1] = fmaf(scale[0], part[1], total[1]);
        total[2] = fmaf(scale[1], part[2], total[2]);
        total[3] = fmaf(scale[1], part[3], total[3]);
      }
    }
    __syncwarp();  // this buffer is refilled by the next iteration's issue
  }
  if constexpr (Frag::kRowScale) {
    const float s0 = Frag::row_scale(my_rows[0]), s1 = Frag::row_scale(my_rows[1]);
    total[0] *= s0, total[1] *= s0, total[2] *= s1, total[3] *= s1;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) partial[warp][i][lane] = total[i];
  if (want_rms) {
    squares += __shfl_xor_sync(0xffffffffu, squares, 1);
    squares += __shfl_xor_sync(0xffffffffu, squares, 2);
    if (t == 0) row_squares[warp][g] = squares;
  }
  __syncthreads();
  if (warp != 0) return false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < W; ++v) sum += partial[v][i][lane];
    acc[i] = sum;
  }
  if (want_rms) {
#pragma unroll
    for (int r = 0; r < kColumns; ++r) {
      float sum = 0.0f;
#pragma unroll
      for (int v = 0; v < W; ++v) sum += row_squares[v][r];
      inv_rms[r] = rsqrtf(sum / static_cast<float>(k) + x.norm.eps);
    }
  }
  return true;
}

// ---- kernels ----------------------------------------------------------------------------------------

// Rows [w.first_row, w.end_row) of y's n columns, 16 a block (a partial last tile repeats its last
// row and stores only the real ones).
template <typename Frag>
__global__ void __launch_bounds__(kWarps<Frag> * 32)
    quant_mma_gemv_kernel(QuantRun w, int64_t n, XOperand x, const float* __restrict__ bias, bf16_bits* y_bf16,
                          float* y_f32, bool accumulate) {
  const int64_t first = w.first_row + static_cast<int64_t>(blockIdx.x) * kTileRows;
  int64_t rows[kTileRows];
#pragma unroll
  for (int i = 0; i < kTileRows; ++i) rows[i] = min(first + i, w.end_row - 1);
  float acc[4], unused[kColumns];
  if (!tile_dot<Frag>(w, rows, x, false, acc, unused)) return;
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = first + g + 8 * (i / 2);
    const int r = 2 * t + i % 2;
    if (row >= w.end_row || r >= x.m) continue;
    const float b = bias != nullptr ? bias[row] : 0.0f;
    if (y_f32 != nullptr) {
      y_f32[r * n + row] = acc[i] + b + (accumulate ? y_f32[r * n + row] : 0.0f);
    } else {
      __nv_bfloat16* y = reinterpret_cast<__nv_bfloat16*>(y_bf16) + r * n + row;
      *y = __float2bfloat16(acc[i] + b + (accumulate ? __bfloat162float(*y) : 0.0f));
    }
  }
}

// Gate rows j0..j0+7 and up rows inner + j0.. of a block's tile: lane (g, t) holds gate and up of
// j0 + g for x rows 2t, 2t + 1.
template <typename Frag>
__global__ void __launch_bounds__(kWarps<Frag> * 32)
    quant_mma_gated_kernel(QuantRun w, XOperand x, const float* __restrict__ bias, int act, bf16_bits* y) {
  const int64_t inner = w.end_row / 2, j0 = static_cast<int64_t>(blockIdx.x) * (kTileRows / 2);
  int64_t rows[kTileRows];
#pragma unroll
  for (int i = 0; i < kTileRows / 2; ++i) {
    rows[i] = min(j0 + i, inner - 1);
    rows[i + kTileRows / 2] = inner + rows[i];
  }
  float acc[4], inv_rms[kColumns];
  if (!tile_dot<Frag>(w, rows, x, x.norm.on, acc, inv_rms)) return;
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t j = j0 + g;
  if (j >= inner) return;
  const float gate_bias = bias != nullptr ? bias[j] : 0.0f, up_bias = bias != nullptr ? bias[inner + j] : 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 2 * t + i;
    if (r >= x.m) continue;
    const float s = x.norm.on ? inv_rms[r] : 1.0f;
    reinterpret_cast<__nv_bfloat16*>(y)[r * inner + j] =
        __float2bfloat16(activate(acc[i] * s + gate_bias, act) * (acc[i + 2] * s + up_bias));
  }
}

// quant_gemv.cuh's quant_gemv_qkv_rope_kernel with 8 of its tasks a block: task i's first row is
// tile row i, its second tile row i + 8.
template <typename Frag>
__global__ void __launch_bounds__(kWarps<Frag> * 32)
    quant_mma_qkv_rope_kernel(QuantRun w, XOperand x, QkvRopeLaunch a) {
  const int d = a.head_dim, half = a.rotary_dim / 2, rotated_heads = a.heads + a.kv_heads;
  const int64_t q_dim = static_cast<int64_t>(a.heads) * d, kv_dim = static_cast<int64_t>(a.kv_heads) * d;
  const int64_t width = q_dim + 2 * kv_dim, pair_tasks = static_cast<int64_t>(rotated_heads) * half;
  const int64_t plain_per_head = d - 2 * half;
  const int64_t plain_rows = rotated_heads * plain_per_head + kv_dim;
  const int64_t tasks = pair_tasks + (plain_rows + 1) / 2;
  const auto plain_row = [&](int64_t plain) {
    return plain < rotated_heads * plain_per_head ? plain / plain_per_head * d + 2 * half + plain % plain_per_head
                                                  : q_dim + kv_dim + (plain - rotated_heads * plain_per_head);
  };
  // A task's two rows; `two`: whether its second row is real (a lone last plain row repeats itself).
  const auto task_rows = [&](int64_t task, int64_t& row1, int64_t& row2, bool& two) {
    if (task < pair_tasks) {
      const int64_t head = task / half, i = task % half;
      row1 = head * d + (a.interleaved ? 2 * i : i);
      row2 = head * d + (a.interleaved ? 2 * i + 1 : i + half);
      two = true;
      return;
    }
    const int64_t first_plain = 2 * (task - pair_tasks);
    two = first_plain + 1 < plain_rows;
    row1 = plain_row(first_plain);
    row2 = two ? plain_row(first_plain + 1) : row1;
  };
  const int64_t task0 = static_cast<int64_t>(blockIdx.x) * (kTileRows / 2);
  int64_t rows[kTileRows];
#pragma unroll
  for (int i = 0; i < kTileRows / 2; ++i) {
    bool two;
    task_rows(min(task0 + i, tasks - 1), rows[i], rows[i + kTileRows / 2], two);
  }
  const bool norm = x.norm.on;
  float acc[4], inv_rms[kColumns];
  if (!tile_dot<Frag>(w, rows, x, norm, acc, inv_rms)) return;
  const int g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const int64_t task = task0 + g;
  if (task >= tasks) return;
  int64_t row1, row2;
  bool two;
  task_rows(task, row1, row2, two);
  const auto store = [&](int64_t row, int r, float value) {
    const bf16_bits rounded = __bfloat16_as_ushort(__float2bfloat16(value));
    a.qkv[r * width + row] = rounded;
    const int32_t slot = a.slots[r];
    if (row < q_dim || slot < 0 || slot >= a.capacity_slots) return;
    const int64_t at = static_cast<int64_t>(slot) * kv_dim + (row - q_dim) % kv_dim;
    void* cache = row < q_dim + kv_dim ? a.k_cache : a.v_cache;
    if (a.kv_fp8) {
      store_kv(static_cast<e4m3_bits*>(cache) + at, rounded);
    } else {
      store_kv(static_cast<bf16_bits*>(cache) + at, rounded);
    }
  };
  const float bias1 = a.bias != nullptr ? a.bias[row1] : 0.0f, bias2 = a.bias != nullptr ? a.bias[row2] : 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 2 * t + i;
    if (r >= x.m) continue;
    const float s = norm ? inv_rms[r] : 1.0f;
    const float x1 = acc[i] * s + bias1, x2 = acc[i + 2] * s + bias2;
    if (task < pair_tasks) {
      const int64_t pair_i = task % half;
      const float* cos = a.cos_sin + static_cast<int64_t>(a.table_rows[r]) * 2 * half;
      const float c = cos[pair_i], sn = cos[half + pair_i];
      store(row1, r, x1 * c - x2 * sn);
      store(row2, r, x2 * c + x1 * sn);
    } else {
      store(row1, r, x1);
      if (two) store(row2, r, x2);
    }
  }
}

// Raises the kernel's dynamic shared memory limit to what it uses (once per kernel).
template <auto kKernel>
cudaError_t allow_shared_memory(int bytes) {
  static const cudaError_t result = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return result;
}

inline unsigned tiles_for(int64_t rows, int64_t rows_per_tile) {
  return static_cast<unsigned>((rows + rows_per_tile - 1) / rows_per_tile);
}

}  // namespace splitflow::cuda::quant_mma_detail
