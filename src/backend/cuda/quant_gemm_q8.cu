// backend/cuda/quant_gemm_q8.cu — y = x w^T for 9 to 64 rows of x (decode batches, short chunks) on
// quantized weights, through the int8 tensor cores: x is quantized once per call into a scratch
// (quant_q8x.cuh's 32-element blocks, the GEMVs' rule), and each block of kWarps warps owns a tile
// of 16 rows of w, its warps splitting k; a lane turns the codes it holds in the mma A layout (rows
// g and g + 8, bytes 4t .. 4t + 3 and 16 + 4t .. of each 32-element unit: for Q4_0 exactly the low
// and high nibbles of one 4-byte word of the block) into int8 words with a few bit operations, x's
// codes are the B operand (mma.sync m16n8k32, or two m16n8k16 where a unit has a scale per half),
// and each unit's int32 results are scaled in fp32 (weight scale and minimum, x's d and code sums).
// The decode GEMVs (quant_gemv.cuh) go up to 8 rows; past 64 the dequantize + cuBLASLt path runs,
// as it does for the types without a fragment decoder here.
//
// Status (H100, 2026-12-07): correct (CudaQuant tests at 16 to 64 rows), opt-in
// (SPLITFLOW_QUANT_GEMM=1) and slower than the dequantize + cuBLASLt path it would replace: 4096 x
// 4096 Q4_0 at m = 16 27 us, m = 64 49 us (dequantize + cuBLASLt 38 and 37 us; bf16 cuBLASLt 15.6
// and 14.1 us). Each lane loads x's B fragments from global memory per unit and n-tile (8 rows of x
// behind each 4-byte load), and 4096 rows make only 256 blocks of 4 warps. Next: x's chunk staged
// once per block in shared memory in the B layout, more rows per block, k split across blocks.
#include "backend/cuda/quant_decode.cuh"
#include "backend/cuda/quant_kernels.h"
#include "backend/cuda/quant_q8x.cuh"
#include "backend/cuda/quant_staging.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace splitflow::cuda {
namespace quant_gemm_q8_detail {

using namespace quant_decode;
using quant_gemv_detail::commit_async;
using quant_gemv_detail::stage_words;
using quant_gemv_detail::wait_async_but_one;
using quant_q8x::spread4_to_bit4;

constexpr int kWarps = 4, kTileRows = 16, kChunkUnits = 16;
constexpr uint32_t kNibbles = 0x0f0f0f0fu;

// Fragment decoders: words(blocks, lu, t, lo, hi, scale, min) gives lane t's codes of the unit lu
// of a staged run of blocks: lo = elements 4t .. 4t + 3, hi = 16 + 4t .. 16 + 4t + 3, as bytes;
// scale[h] / min[h] as quant_q8x.cuh's decoders (kHalves, kCodeOffset, kSigned, kMin likewise).
struct FQ4_0 : Q4_0 {
  static constexpr int kHalves = 1, kCodeOffset = 8;
  static constexpr bool kSigned = false, kMin = false;
  __device__ static void words(const uint8_t* blocks, int lu, int t, uint32_t& lo, uint32_t& hi, float (&scale)[2],
                               float (&)[2]) {
    const uint8_t* b = blocks + lu * kBytes;
    scale[0] = ldf16(b);
    const uint32_t w = ld32_a2(b + 2 + 4 * t);
    lo = w & kNibbles;
    hi = (w >> 4) & kNibbles;
  }
};

struct FQ5_0 : Q5<false> {
  static constexpr int kHalves = 1, kCodeOffset = 16;
  static constexpr bool kSigned = false, kMin = false;
  __device__ static void words(const uint8_t* blocks, int lu, int t, uint32_t& lo, uint32_t& hi, float (&scale)[2],
                               float (&)[2]) {
    const uint8_t* b = blocks + lu * kBytes;
    scale[0] = ldf16(b);
    const uint32_t qh = ld32_a2(b + 2), w = ld32_a2(b + 6 + 4 * t);
    lo = (w & kNibbles) | spread4_to_bit4(qh >> (4 * t));
    hi = ((w >> 4) & kNibbles) | spread4_to_bit4(qh >> (16 + 4 * t));
  }
};

struct FQ8_0 : Q8_0 {
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = true, kMin = false;
  __device__ static void words(const uint8_t* blocks, int lu, int t, uint32_t& lo, uint32_t& hi, float (&scale)[2],
                               float (&)[2]) {
    const uint8_t* b = blocks + lu * kBytes;
    scale[0] = ldf16(b);
    lo = ld32_a2(b + 2 + 4 * t);
    hi = ld32_a2(b + 18 + 4 * t);
  }
};

struct FQ4_K : QK45<false> {
  static constexpr int kHalves = 1, kCodeOffset = 0;
  static constexpr bool kSigned = false, kMin = true;
  __device__ static void words(const uint8_t* blocks, int lu, int t, uint32_t& lo, uint32_t& hi, float (&scale)[2],
                               float (&min)[2]) {
    const uint8_t* b = blocks + (lu / 8) * kBytes;
    const int s = lu % 8, nibble = 4 * (s % 2);
    const uint32_t dd = ld32(b);
    const uint32_t scales[3] = {ld32(b + 4), ld32(b + 8), ld32(b + 12)};
    uint32_t sc, mn;
    scale_min_k4(scales, s, sc, mn);
    scale[0] = f16(dd & 0xffff) * static_cast<float>(sc);
    min[0] = -f16(dd >> 16) * static_cast<float>(mn);
    const uint8_t* qs = b + 16 + 32 * (s / 2);
    lo = (ld32(qs + 4 * t) >> nibble) & kNibbles;
    hi = (ld32(qs + 16 + 4 * t) >> nibble) & kNibbles;
  }
};

struct FQ6_K : Q6_K {
  static constexpr int kHalves = 2, kCodeOffset = 32;
  static constexpr bool kSigned = false, kMin = false;
  __device__ static void words(const uint8_t* blocks, int lu, int t, uint32_t& lo, uint32_t& hi, float (&scale)[2],
                               float (&)[2]) {
    const uint8_t* b = blocks + (lu / 8) * kBytes;
    const int s = lu % 8, n = s / 4, qd = s % 4, nibble = 4 * (qd / 2);
    const float d = ldf16(b + 208);
    const uint32_t sc = ld16(b + 192 + 2 * s);
    scale[0] = d * static_cast<float>(static_cast<int8_t>(sc & 0xff));
    scale[1] = d * static_cast<float>(static_cast<int8_t>(sc >> 8));
    const uint8_t* ql = b + 64 * n + 32 * (qd % 2);
    const uint8_t* qh = b + 128 + 32 * n;
    lo = ((ld32_a2(ql + 4 * t) >> nibble) & kNibbles) | (((ld32_a2(qh + 4 * t) >> (2 * qd)) & 0x03030303u) << 4);
    hi = ((ld32_a2(ql + 16 + 4 * t) >> nibble) & kNibbles) |
         (((ld32_a2(qh + 16 + 4 * t) >> (2 * qd)) & 0x03030303u) << 4);
  }
};

template <typename F>
__host__ __device__ __forceinline__ bool with_fragment_decoder(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Q4_0: f(FQ4_0{}); return true;
    case DType::Q5_0: f(FQ5_0{}); return true;
    case DType::Q8_0: f(FQ8_0{}); return true;
    case DType::Q4_K: f(FQ4_K{}); return true;
    case DType::Q6_K: f(FQ6_K{}); return true;
    default: return false;
  }
}

// A warp's stages: 16 rows of a chunk of kChunkUnits units, each row's stride 16 more than a
// multiple of 128 bytes (the 8 rows one instruction reads fall in different banks).
template <typename F>
struct Stage {
  static constexpr int kBlocksPerChunk = kChunkUnits / F::kUnitsPerBlock;
  static constexpr int kChunkBytes = kBlocksPerChunk * F::kBytes;
  static constexpr int kRowStride = ((kChunkBytes + 30) / 16 * 16 + 111) / 128 * 128 + 16;
  static constexpr int kWarpBytes = 2 * kTileRows * kRowStride;
  static constexpr int kSharedBytes = kWarps * kWarpBytes + 16;  // + 16: ld32_a2 may read past a row
};

template <bool kSigned>
__device__ __forceinline__ void mma_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  if constexpr (kSigned) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %10, %10, %10};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
  } else {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %10, %10, %10};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
  }
}

template <bool kSigned>
__device__ __forceinline__ void mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  if constexpr (kSigned) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%7, %7, %7, %7};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%7, %7, %7, %7};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
  }
}

// x [m, k] bf16 -> codes [m, k] int8 and info [m, k / 32] (quant_q8x.cuh's layout), one thread a unit.
__global__ void quantize_x_kernel(const bf16_bits* __restrict__ x, int64_t m, int64_t k, int8_t* codes, int2* info) {
  const int64_t units = k / 32, idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * units) return;
  const int64_t r = idx / units, u = idx % units;
  float v[32], amax = 0.0f;
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    float part[8];
    quant_gemv_detail::unpack8(__ldg(reinterpret_cast<const uint4*>(x + r * k + 32 * u) + word), part);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[8 * word + e] = part[e];
      amax = fmaxf(amax, fabsf(part[e]));
    }
  }
  quant_q8x::quantize_unit(v, amax, reinterpret_cast<uint4*>(codes + r * k + 32 * u), info[idx]);
}

// y[:, rows of the tile] for a tile of 16 rows of one run of w and m <= 8 NT rows of x.
template <typename F, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    quant_q8_gemm_kernel(QuantRun w, int64_t n, int64_t k, int m, const int8_t* __restrict__ xq,
                         const int2* __restrict__ xinfo, const float* __restrict__ bias, bf16_bits* y_bf16, float* y_f32,
                         bool accumulate) {
  using S = Stage<F>;
  extern __shared__ __align__(16) uint8_t gemm_shared[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t units = k / 32, row_blocks = units / F::kUnitsPerBlock;
  const int64_t chunks = (row_blocks + S::kBlocksPerChunk - 1) / S::kBlocksPerChunk;
  const int64_t tile_first = w.first_row + static_cast<int64_t>(blockIdx.x) * kTileRows;
  // Rows past the run's end read its last row and are not stored.
  const auto row_at = [&](int i) {
    const int64_t row = min(tile_first + i, w.end_row - 1);
    return w.data + (row - w.first_row) * w.row_bytes;
  };
  auto* stage = reinterpret_cast<uint8_t(*)[kTileRows][S::kRowStride]>(gemm_shared + warp * S::kWarpBytes);
  const int64_t per_warp = (chunks + kWarps - 1) / kWarps, begin = min(warp * per_warp, chunks),
                end = min(begin + per_warp, chunks);
  const auto issue = [&](int64_t c) {
    if (c < end) {
      const int64_t first = c * S::kBlocksPerChunk, last = min(first + S::kBlocksPerChunk, row_blocks);
#pragma unroll 4
      for (int i = 0; i < kTileRows; ++i)
        stage_words(stage[(c - begin) & 1][i], row_at(i) + first * F::kBytes, row_at(i) + last * F::kBytes, lane);
    }
    commit_async();
  };
  const uint8_t* my_rows[2] = {row_at(g), row_at(g + 8)};
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  issue(begin);
#pragma unroll 1
  for (int64_t c = begin; c < end; ++c) {
    issue(c + 1);
    wait_async_but_one();
    __syncwarp();
    const int buffer = static_cast<int>((c - begin) & 1);
#pragma unroll 2
    for (int lu = 0; lu < kChunkUnits; ++lu) {
      const int64_t u = c * kChunkUnits + lu;
      if (u >= units) break;
      uint32_t lo[2], hi[2];
      float scale[2][2], mins[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* chunk = my_rows[h] + c * S::kBlocksPerChunk * F::kBytes;
        F::words(stage[buffer][g + 8 * h] + (reinterpret_cast<uintptr_t>(chunk) & 15), lu, t, lo[h], hi[h], scale[h],
                 mins[h]);
        if constexpr (F::kHalves == 1) scale[h][1] = scale[h][0];
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int64_t col = min(8 * j + g, m - 1);
        const int8_t* xc = xq + col * k + 32 * u;
        const uint32_t b0 = __ldg(reinterpret_cast<const unsigned int*>(xc + 4 * t));
        const uint32_t b1 = __ldg(reinterpret_cast<const unsigned int*>(xc + 16 + 4 * t));
        int c0[4], c1[4];
        if constexpr (F::kHalves == 1) {
          mma_k32<F::kSigned>(c0, lo[0], lo[1], hi[0], hi[1], b0, b1);
        } else {
          mma_k16<F::kSigned>(c0, lo[0], lo[1], b0);
          mma_k16<F::kSigned>(c1, hi[0], hi[1], b1);
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // x rows 8 j + 2 t + e
          const int2 info = __ldg(xinfo + min(8 * j + 2 * t + e, m - 1) * units + u);
          const float dx = __int_as_float(info.x);
          const int s0 = static_cast<int16_t>(info.y & 0xffff), s1 = info.y >> 16;
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // w rows g + 8 h
            const int i = 2 * h + e;
            float v;
            if constexpr (F::kHalves == 1) {
              v = scale[h][0] * static_cast<float>(c0[i] - F::kCodeOffset * (s0 + s1));
              if constexpr (F::kMin) v = fmaf(mins[h][0], static_cast<float>(s0 + s1), v);
            } else {
              v = fmaf(scale[h][0], static_cast<float>(c0[i] - F::kCodeOffset * s0),
                       scale[h][1] * static_cast<float>(c1[i] - F::kCodeOffset * s1));
            }
            acc[j][i] = fmaf(dx, v, acc[j][i]);
          }
        }
      }
    }
    __syncwarp();  // this buffer is refilled by the next iteration's issue
  }
  // The warps' partial sums, over the stages (every copy landed: the last group issued was empty).
  __syncthreads();
  auto* partial = reinterpret_cast<float*>(gemm_shared);  // [kWarps][NT * 4][32]
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[(warp * NT * 4 + 4 * j + i) * 32 + lane] = acc[j][i];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float sum = 0.0f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) sum += partial[(v * NT * 4 + 4 * j + i) * 32 + lane];
      const int64_t row = tile_first + g + 8 * (i / 2);
      const int col = 8 * j + 2 * t + i % 2;
      if (row >= w.end_row || col >= m) continue;
      const float b = bias != nullptr ? bias[row] : 0.0f;
      if (y_f32 != nullptr) {
        float* y = y_f32 + col * n + row;
        *y = sum + b + (accumulate ? *y : 0.0f);
      } else {
        __nv_bfloat16* y = reinterpret_cast<__nv_bfloat16*>(y_bf16) + col * n + row;
        *y = __float2bfloat16(sum + b + (accumulate ? __bfloat162float(*y) : 0.0f));
      }
    }
}

template <auto kKernel>
cudaError_t allow_shared(int bytes) {
  static const cudaError_t result = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return result;
}

}  // namespace quant_gemm_q8_detail

using namespace quant_gemm_q8_detail;

bool quant_q8_gemm_type(DType dtype) { return with_fragment_decoder(dtype, [](auto) {}); }

bool quant_q8_gemm_enabled() {
  const char* value = std::getenv("SPLITFLOW_QUANT_GEMM");
  return value != nullptr && std::string_view(value) == "1";
}

bool quant_q8_gemm_supported(const QuantMatrix& w, int64_t m) {
  if (m <= kMaxQuantGemvRows || m > kMaxQuantGemmRows || !quant_q8_activations_enabled() || !quant_q8_gemm_enabled())
    return false;
  for (int i = 0; i < w.count; ++i)
    if (!quant_q8_gemm_type(w.runs[i].dtype)) return false;
  return true;
}

int64_t quant_q8_gemm_scratch_bytes(int64_t k) { return kMaxQuantGemmRows * (k + k / 32 * 8); }

cudaError_t launch_quant_q8_gemm(const QuantMatrix& w, const bf16_bits* x, int64_t m, const float* bias,
                                 bf16_bits* y_bf16, float* y_f32, bool accumulate, void* scratch, int64_t scratch_bytes,
                                 cudaStream_t stream) {
  const int64_t k = w.k, units = k / 32;
  if (!quant_q8_gemm_supported(w, m) || scratch_bytes < m * (k + units * 8)) return cudaErrorInvalidValue;
  auto* codes = static_cast<int8_t*>(scratch);
  auto* info = reinterpret_cast<int2*>(codes + m * k);  // m k is a multiple of 32: 8-byte aligned
  const int64_t threads = m * units;
  quantize_x_kernel<<<static_cast<unsigned>((threads + 127) / 128), 128, 0, stream>>>(x, m, k, codes, info);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  for (int i = 0; i < w.count; ++i) {
    const QuantRun& run = w.runs[i];
    cudaError_t err = cudaSuccess;
    with_fragment_decoder(run.dtype, [&](auto frag) {
      using F = decltype(frag);
      const auto launch = [&](auto tiles) {
        constexpr int NT = decltype(tiles)::value;
        constexpr auto kernel = quant_q8_gemm_kernel<F, NT>;
        if ((err = allow_shared<kernel>(Stage<F>::kSharedBytes)) != cudaSuccess) return;
        const auto grid = static_cast<unsigned>((run.end_row - run.first_row + kTileRows - 1) / kTileRows);
        kernel<<<grid, kWarps * 32, Stage<F>::kSharedBytes, stream>>>(run, w.n, k, static_cast<int>(m), codes, info,
                                                                    bias, y_bf16, y_f32, accumulate);
        err = cudaGetLastError();
      };
      if (m <= 16) {
        launch(std::integral_constant<int, 2>{});
      } else if (m <= 32) {
        launch(std::integral_constant<int, 4>{});
      } else {
        launch(std::integral_constant<int, 8>{});
      }
    });
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace splitflow::cuda
