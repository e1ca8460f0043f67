// backend/cuda/tensor_core.cuh — the PTX building blocks the attention kernels share: cp.async
// copies into shared memory, ldmatrix fragment loads and the m16n8k16 bf16 MMA.
#pragma once

#include <cuda_bf16.h>

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
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
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

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
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
    correction[r] = exp2f(row_max[r] - base);
    row_max[r] = new_max;
    row_sum[r] *= correction[r];
#pragma unroll
    for (int j = 0; j < NTiles; ++j) {
      sc[j][2 * r] = exp2f(sc[j][2 * r] - base);
      sc[j][2 * r + 1] = exp2f(sc[j][2 * r + 1] - base);
      row_sum[r] += sc[j][2 * r] + sc[j][2 * r + 1];
    }
  }
#pragma unroll
  for (int i = 0; i < OTiles; ++i) {
    o[i][0] *= correction[0];
    o[i][1] *= correction[0];
    o[i][2] *= correction[1];
    o[i][3] *= correction[1];
  }
}

}  // namespace splitflow::cuda
