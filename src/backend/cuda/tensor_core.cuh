// backend/cuda/tensor_core.cuh — the PTX building blocks the attention kernels share: cp.async
// copies into shared memory, ldmatrix fragment loads, the m16n8k16 bf16 and f16 MMAs, and e4m3
// fragments turned into f16 operands in registers.
//
// Fragment layouts of m16n8k16 (g = lane / 4, t = lane % 4; each 32-bit register holds two 16-bit
// values, the first in the low half): A (16 x 16, row-major) a0 = A[g][2t, 2t+1], a1 = A[g+8][2t,
// 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; B (16 x 8, k x n) b0 = B[2t, 2t+1][g],
// b1 = B[2t+8, 2t+9][g]; C (16 x 8) c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]. ldmatrix
// m8n8.b16 reads 8 rows of 16 bytes (8 16-bit units), row r of matrix i at the address of lane
// 8i + r; lane gets units 2t, 2t+1 of row g, or with .trans units g of rows 2t, 2t+1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace splitflow::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes 0 writes zeros (rows past the range).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}

// c += a (16x16, row) * b (16x8, col), bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same with f16 inputs.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Round to nearest, saturating to +-65504 (cvt's first source is the high half).
__device__ __forceinline__ uint32_t pack_f16_satfinite(float lo, float hi) {
  uint32_t v;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(v) : "f"(hi), "f"(lo));
  return v;
}

// Four e4m3 bytes as two f16x2 words, exactly (every e4m3 value is an f16 value): bytes 0, 1 in
// `low`, bytes 2, 3 in `high` (cvt e4m3x2 puts its low byte in the low half).
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t bytes, uint32_t& low, uint32_t& high) {
  asm("{\n"
      ".reg .b16 e4lo, e4hi;\n"
      "mov.b32 {e4lo, e4hi}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, e4lo;\n"
      "cvt.rn.f16x2.e4m3x2 %1, e4hi;\n"
      "}\n"
      : "=r"(low), "=r"(high)
      : "r"(bytes));
}
// The bytes [x0, x1, x2, x3] as f16x2 words [x0, x2] (`even`) and [x1, x3] (`odd`): what an
// ldmatrix .trans register of e4m3 rows holds (units of two bytes, x0 x1 from one row, x2 x3 from
// the next) split into the two columns' B fragments.
__device__ __forceinline__ void e4m3x4_columns_to_f16x2(uint32_t bytes, uint32_t& even, uint32_t& odd) {
  e4m3x4_to_f16x2(__byte_perm(bytes, 0, 0x3120), even, odd);
}

// 2^x in one MUFU.EX2 (subnormal results flush to zero, -inf gives 0): all a softmax weight
// needs, without exp2f's extra scaling for subnormals.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Sum (Max: maximum) of a row's values in an S tile's accumulators (sc[j][2r], sc[j][2r + 1]) as a
// tree: a chain through all 2 NTiles values is what a warp waits on at low occupancy.
template <bool Max, int NTiles>
__device__ __forceinline__ float reduce_tile_row(const float (&sc)[NTiles][4], int r) {
  static_assert((NTiles & (NTiles - 1)) == 0, "tile count must be a power of two");
  float v[NTiles];
#pragma unroll
  for (int j = 0; j < NTiles; ++j) v[j] = Max ? fmaxf(sc[j][2 * r], sc[j][2 * r + 1]) : sc[j][2 * r] + sc[j][2 * r + 1];
#pragma unroll
  for (int width = NTiles / 2; width >= 1; width /= 2)
#pragma unroll
    for (int j = 0; j < width; ++j) v[j] = Max ? fmaxf(v[j], v[j + width]) : v[j] + v[j + width];
  return v[0];
}

// One online-softmax step over an S tile held in m16n8 accumulators (sc[j]: keys 8j.., rows lane/4
// and lane/4 + 8, masked scores in log2 units, -inf where hidden): the tile's row maxima from the
// quad, the running max and sum updated, sc turned into exp2(s - max), and the D/8 output
// accumulators o rescaled by exp2(old max - new max).
template <int NTiles, int OTiles>
__device__ __forceinline__ void online_softmax_step(float (&sc)[NTiles][4], float (&tile_max)[2], float (&row_max)[2],
                                                    float (&row_sum)[2], float (&o)[OTiles][4]) {
  float correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float new_max = fmaxf(row_max[r], tile_max[r]);
    // A row with nothing visible yet keeps max -inf: use 0 so exp2 gives 0, not NaN.
    const float base = new_max == -INFINITY ? 0.0f : new_max;
    correction[r] = fast_exp2(row_max[r] - base);
    row_max[r] = new_max;
    row_sum[r] *= correction[r];
#pragma unroll
    for (int j = 0; j < NTiles; ++j) {
      sc[j][2 * r] = fast_exp2(sc[j][2 * r] - base);
      sc[j][2 * r + 1] = fast_exp2(sc[j][2 * r + 1] - base);
    }
    row_sum[r] += reduce_tile_row<false>(sc, r);
  }
  // Once the maxima settle (most tiles past the first few), no row of the warp moves: skip
  // multiplying the accumulators by 1. (Warp-uniform; every lane of the warp calls this.)
  if (!__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) return;
#pragma unroll
  for (int i = 0; i < OTiles; ++i) {
    o[i][0] *= correction[0];
    o[i][1] *= correction[0];
    o[i][2] *= correction[1];
    o[i][3] *= correction[1];
  }
}

}  // namespace splitflow::cuda
