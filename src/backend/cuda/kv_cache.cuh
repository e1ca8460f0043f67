// backend/cuda/kv_cache.cuh — the KV cache's element types on the device: bf16 (bf16_bits) or fp8
// e4m3 (e4m3_bits). Kernels that write the cache store the qkv activation's bf16 values as cache
// elements (e4m3 with core/dtype.h's rounding: nearest even, saturating to +-448, CUDA's
// __NV_SATFINITE); kernels that read it widen elements to bf16 exactly (every e4m3 value is a bf16
// value) and keep their bf16 math, except the decode attention kernel, which turns e4m3 MMA
// fragments into f16 in registers (tensor_core.cuh; every e4m3 value is an f16 value too). Kernels
// template on the element type; with_kv_element picks it.
#pragma once

#include "backend/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace splitflow::cuda {

using e4m3_bits = uint8_t;

// launch(e4m3_bits{}) or launch(bf16_bits{}): the cache element type as a template argument.
template <typename Launch>
cudaError_t with_kv_element(bool kv_fp8, Launch&& launch) {
  return kv_fp8 ? launch(e4m3_bits{}) : launch(bf16_bits{});
}

// A bf16 value as a cache element.
__device__ __forceinline__ void store_kv(bf16_bits* dst, bf16_bits value) { *dst = value; }
__device__ __forceinline__ void store_kv(e4m3_bits* dst, bf16_bits value) {
  *dst = __nv_cvt_float_to_fp8(__uint_as_float(uint32_t{value} << 16), __NV_SATFINITE, __NV_E4M3);
}

// A cache element as bf16 bits.
__device__ __forceinline__ bf16_bits kv_to_bf16(bf16_bits element) { return element; }
__device__ __forceinline__ bf16_bits kv_to_bf16(e4m3_bits element) {
  const float value = __half2float(__half(__nv_cvt_fp8_to_halfraw(element, __NV_E4M3)));
  return __bfloat16_as_ushort(__float2bfloat16(value));
}

// Two e4m3 bytes (the first element in the low byte) as a bf16x2 word: e4m3 -> f16x2 in one
// instruction, then through f32 to bf16, all exact.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t two_bytes) {
  const float2 values = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(two_bytes), __NV_E4M3)));
  const __nv_bfloat162 pair = __floats2bfloat162_rn(values.x, values.y);
  return *reinterpret_cast<const uint32_t*>(&pair);
}
// Two bf16 values (a bf16x2 word) as two e4m3 bytes, in the low half of the result.
__device__ __forceinline__ uint32_t bf16x2_to_e4m3x2(uint32_t word) {
  const float2 values = make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
  return __nv_cvt_float2_to_fp8x2(values, __NV_SATFINITE, __NV_E4M3);
}

// Eight consecutive cache elements as one load: a 16-byte word of bf16, an 8-byte word of e4m3.
template <typename Cache>
struct KvWord;
template <>
struct KvWord<bf16_bits> {
  using type = uint4;
};
template <>
struct KvWord<e4m3_bits> {
  using type = uint2;
};

// Eight cache elements as eight bf16 (a 16-byte word).
__device__ __forceinline__ uint4 widen_kv_word(uint4 bf16x8) { return bf16x8; }
__device__ __forceinline__ uint4 widen_kv_word(uint2 e4m3x8) {
  return make_uint4(e4m3x2_to_bf16x2(e4m3x8.x), e4m3x2_to_bf16x2(e4m3x8.x >> 16), e4m3x2_to_bf16x2(e4m3x8.y),
                    e4m3x2_to_bf16x2(e4m3x8.y >> 16));
}

// Eight bf16 (a 16-byte word) stored as eight consecutive cache elements (aligned to their word).
__device__ __forceinline__ void store_kv_word(bf16_bits* dst, uint4 bf16x8) { *reinterpret_cast<uint4*>(dst) = bf16x8; }
__device__ __forceinline__ void store_kv_word(e4m3_bits* dst, uint4 bf16x8) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(bf16x2_to_e4m3x2(bf16x8.x) | bf16x2_to_e4m3x2(bf16x8.y) << 16,
                                              bf16x2_to_e4m3x2(bf16x8.z) | bf16x2_to_e4m3x2(bf16x8.w) << 16);
}

// The tensor-core prefill kernel's staging: a tile of Rows packed rows of RowElems e4m3 bytes
// (cp.async'd from the cache, RowElems % 8 == 0) widened by the block's Threads threads into bf16
// rows Stride elements apart (16-byte aligned), the layout their ldmatrix loads read. Each thread
// takes 8 bytes in and writes 16 out, consecutive across the warp.
template <int RowElems, int Stride, int Rows, int Threads>
__device__ __forceinline__ void widen_e4m3_rows(const e4m3_bits* staged, bf16_bits* rows) {
  constexpr int kWordsPerRow = RowElems / 8;
  for (int i = threadIdx.x; i < Rows * kWordsPerRow; i += Threads) {
    const int row = i / kWordsPerRow, column = (i % kWordsPerRow) * 8;
    *reinterpret_cast<uint4*>(rows + row * Stride + column) =
        widen_kv_word(*reinterpret_cast<const uint2*>(staged + row * RowElems + column));
  }
}

// A staged K/V tile as the bf16 rows the MMAs read: a bf16 stage as it is; an e4m3 one widened
// into `widened` (followed by the barrier that publishes it).
template <int RowElems, int Stride, int Rows, int Threads>
__device__ __forceinline__ const bf16_bits* tile_rows_bf16(const bf16_bits* staged, bf16_bits* /*widened*/) {
  return staged;
}
template <int RowElems, int Stride, int Rows, int Threads>
__device__ __forceinline__ const bf16_bits* tile_rows_bf16(const e4m3_bits* staged, bf16_bits* widened) {
  widen_e4m3_rows<RowElems, Stride, Rows, Threads>(staged, widened);
  __syncthreads();
  return widened;
}

}  // namespace splitflow::cuda
