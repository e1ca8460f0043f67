// backend/cuda/quant_staging.cuh — how the decode GEMVs on quantized weights (quant_gemv.cuh) read a
// warp's rows: chunks of kChunkUnits 32-element units copied global -> shared memory with cp.async
// in coalesced 16-byte words (one warp instruction reads 512 contiguous bytes, whatever the block
// size), double-buffered (one chunk's copies in flight while the previous one is decoded) across
// the warp's rows, each lane then handed its units of the staged chunk. Shared by the two dots of quant_gemv.cuh (fp32
// activations, and int8 activations with dp4a: quant_q8x.cuh) and by quant_mma.cuh. Decoding
// straight from global memory instead (each lane 2-byte loads of its own 18-byte block) ran at
// 0.6x bf16's tokens/s on TinyLlama: many narrow loads per byte, and the second row of a pair only
// after the first. Owns no kernel.
#pragma once

#include "backend/cuda/quant_kernels.h"

#include <cuda_bf16.h>

#include <cstdint>

namespace splitflow::cuda::quant_gemv_detail {

// Units of a row staged at a time (two per lane), double-buffered.
constexpr int kChunkUnits = 64;

template <typename Dec>
struct Staging {
  static constexpr int kBlocksPerChunk = kChunkUnits / Dec::kUnitsPerBlock;
  static constexpr int kChunkBytes = kBlocksPerChunk * Dec::kBytes;
  // Whole 16-byte words around a chunk at any address: up to 15 bytes more at each end.
  static constexpr int kStageBytes = (kChunkBytes + 30) / 16 * 16;
};

// Warps a block: as many of 8, 4, 2 as keep the block's stages within 40 KiB of shared memory.
template <typename Dec, int R>
constexpr int kWarps = 2 * R * Staging<Dec>::kStageBytes * 8 <= 40960   ? 8
                       : 2 * R * Staging<Dec>::kStageBytes * 4 <= 40960 ? 4
                                                                         : 2;

// Blocks an SM must hold (a register cap for ptxas): a decode matrix has few rows per SM (4096 rows
// on 132 SMs: 31), and with 80 registers only 24 warps of one row each fit, so the rows took two
// rounds of memory latency instead of one. More rows of x need more accumulators: a lower cap
// (128 registers at 2 blocks of 8 warps) instead of spilling them.
template <int R, int M = 1>
constexpr int kMinBlocks = M >= 8 ? 2 : M >= 4 ? (R == 1 ? 3 : 2) : (R == 1 ? 4 : 3);

template <typename Dec, int R>
using StageBuffers = uint8_t[2][R][Staging<Dec>::kStageBytes];

__device__ __forceinline__ float warp_total(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ void unpack8(const uint4& word, float (&out)[8]) {
  const uint32_t halves[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&halves[i]));
    out[2 * i] = pair.x;
    out[2 * i + 1] = pair.y;
  }
}

// cp.async: global -> shared without registers; .cg: weights bypass L1 (each is read once a step).
__device__ __forceinline__ void copy16_async(void* smem, uintptr_t gmem) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void wait_async_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// The 16-byte words covering global bytes [begin, end) into `stage`, word by word across the warp:
// byte begin lands at stage + begin % 16, so every address keeps its alignment modulo 16.
__device__ __forceinline__ void stage_words(uint8_t* stage, const uint8_t* begin, const uint8_t* end, int lane) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(begin) & ~uintptr_t{15};
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(end) + 15) & ~uintptr_t{15};
  const int words = static_cast<int>((hi - lo) / 16);
  for (int i = lane; i < words; i += 32) copy16_async(stage + 16 * i, lo + 16 * i);
}

// The x operand: m rows of k bf16, and the input norm.
struct XOperand {
  const bf16_bits* x;
  int m;
  int64_t k;
  QuantNorm norm;
};

// The warp's tasks (a task: R rows of w, rows_of(task, rows)) are first, first + stride, ... below
// `tasks`, with first = blockIdx.x * warps + warp and stride = gridDim.x * warps (a grid of at most
// the blocks that fit the GPU at once: each block pays its prologue once). Their rows' chunks are
// streamed through the two stages as one sequence, so the next task's first chunk is in flight
// while the current task's last one is decoded. Calls
//   prologue()                            once, by every thread, after the first chunk's copies
//                                         were issued (so they overlap it; it may sync the block),
//   unit(lu, u, staged, row_at)           for each 32-element unit u this lane decodes (lane + 32 j
//                                         of each chunk): staged[i] is row i's chunk in shared
//                                         memory (a run of whole blocks holding u as its lu-th
//                                         unit), row_at[i] the row's first byte in global memory
//                                         (F8 / I8 read their scales there),
//   end(task)                             after a task's last chunk, by every lane.
template <typename Dec, int R, typename RowsOf, typename Prologue, typename Unit, typename End>
__device__ __forceinline__ void stream_tasks(const QuantRun& w, int64_t k, StageBuffers<Dec, R>& stage, int64_t tasks,
                                             RowsOf&& rows_of, Prologue&& prologue, Unit&& unit, End&& end) {
  using S = Staging<Dec>;
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps;
  const int64_t mine = first < tasks ? (tasks - first + stride - 1) / stride : 0;
  const int64_t units = k / 32, row_blocks = units / Dec::kUnitsPerBlock;
  const int64_t chunks = (row_blocks + S::kBlocksPerChunk - 1) / S::kBlocksPerChunk, items = mine * chunks;
  // Item t: chunk t % chunks of the warp's task t / chunks.
  const auto rows_at = [&](int64_t item, const uint8_t* (&row_at)[R]) {
    int64_t rows[R];
    rows_of(first + item / chunks * stride, rows);
#pragma unroll
    for (int i = 0; i < R; ++i) row_at[i] = w.data + (rows[i] - w.first_row) * w.row_bytes;
  };
  const auto issue = [&](int64_t item) {
    const uint8_t* row_at[R];
    rows_at(item, row_at);
    const int64_t from = item % chunks * S::kBlocksPerChunk, to = min(from + S::kBlocksPerChunk, row_blocks);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const uint8_t* blocks = row_at[i] + Dec::data_offset(k);
      stage_words(stage[item & 1][i], blocks + from * Dec::kBytes, blocks + to * Dec::kBytes, lane);
    }
    commit_async();
  };
  if (items > 0) issue(0);
  prologue();
#pragma unroll 1
  for (int64_t t = 0; t < items; ++t) {
    if (t + 1 < items) {
      issue(t + 1);
    } else {
      commit_async();  // an empty group keeps "all but the newest group" meaning item t
    }
    wait_async_but_one();
    __syncwarp();
    const uint8_t* row_at[R];
    rows_at(t, row_at);
    const int64_t c = t % chunks, first_unit = c * kChunkUnits;
#pragma unroll
    for (int j = 0; j < kChunkUnits / 32; ++j) {
      const int lu = lane + 32 * j;
      const int64_t u = first_unit + lu;
      if (u >= units) break;
      const uint8_t* staged[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const uint8_t* chunk = row_at[i] + Dec::data_offset(k) + c * S::kBlocksPerChunk * Dec::kBytes;
        staged[i] = stage[t & 1][i] + (reinterpret_cast<uintptr_t>(chunk) & 15);
      }
      unit(lu, u, staged, row_at);
    }
    if (c == chunks - 1) end(first + t / chunks * stride);
    __syncwarp();  // this item's stage is refilled by the next iteration's issue(t + 2)
  }
}

// The prologue of the dots that convert x once per block (Q8Dot, F16Dot), by every thread: for
// each of the M rows of x (rows past m read row m - 1) and each 32-element unit u, store(r, u, v,
// amax) with v the unit's values times (offset + norm weight) (x alone without a weight) and amax =
// max |v|; inv_rms[r] (M floats of shared memory) = 1 / rms of x row r before the weight with
// want_rms, else 1. Syncs the block.
template <int M, typename Store>
__device__ __forceinline__ void convert_x_rows(const XOperand& x, bool want_rms, float* inv_rms, Store&& store) {
  const int64_t k = x.k, units = k / 32;
  if (threadIdx.x < M) inv_rms[threadIdx.x] = 0.0f;
  __syncthreads();
  const float* gw = x.norm.weight;
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const int64_t xr = r < x.m ? r : x.m - 1;
    float squares = 0.0f;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
      float v[32];
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        float part[8];
        unpack8(__ldg(reinterpret_cast<const uint4*>(x.x + xr * k + 32 * u) + word), part);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[8 * word + e] = part[e];
      }
      float amax = 0.0f;
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        if (want_rms) squares = fmaf(v[e], v[e], squares);
        if (gw != nullptr) v[e] *= x.norm.offset + __ldg(gw + 32 * u + e);
        amax = fmaxf(amax, fabsf(v[e]));
      }
      store(r, u, v, amax);
    }
    if (want_rms) {
      squares = warp_total(squares);
      if (threadIdx.x % 32 == 0) atomicAdd(inv_rms + r, squares);
    }
  }
  __syncthreads();
  if (threadIdx.x < M)
    inv_rms[threadIdx.x] = want_rms ? rsqrtf(inv_rms[threadIdx.x] / static_cast<float>(k) + x.norm.eps) : 1.0f;
  __syncthreads();
}

// A task's end for those dots: the warp's sums totalled in every lane, end(task, acc, inv_rms) with
// the prologue's inv_rms, then the sums cleared for the next task.
template <int R, int M, typename End>
__device__ __forceinline__ void end_task(float (&acc)[R][M], const float* inv_rms_shared, int64_t task, End&& end) {
  float inv_rms[M];
#pragma unroll
  for (int r = 0; r < M; ++r) {
    inv_rms[r] = inv_rms_shared[r];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i][r] = warp_total(acc[i][r]);
  }
  end(task, acc, inv_rms);
#pragma unroll
  for (int r = 0; r < M; ++r)
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i][r] = 0.0f;
}

}  // namespace splitflow::cuda::quant_gemv_detail
