// comm/custom_allreduce_kernels.cuh — device code of the custom allreduce (comm/custom_allreduce.h).
// Included by custom_allreduce.cu only.
//
// Synchronization. Every rank owns a Signal in its IPC-exported memory. For block b,
// arrived[b][r] holds the latest barrier count that block b of rank r has reached, written by r
// with a plain store into its peers' Signals (no atomics: the same code works over PCIe).
// counter[b] is the rank's own count for block b; every barrier adds one, and since all ranks run
// the same sequence of kernels with the same grid, equal counts mean the same barrier. A waiter
// asks "has the peer reached at least my count?" (wrap-safe), so later barriers may overwrite a
// slot before an earlier value was seen. Slot [b][r] on peer p is only ever written by thread p of
// block b of rank r, which keeps those writes in order.
// - start barrier: relaxed when the inputs were written by earlier stream work (complete at
//   launch: registered graph buffers); release/acquire when the kernel first copied this rank's
//   input into its staging buffer itself (eager calls), to publish that copy.
// - mid barriers (release/acquire): they publish data written inside the kernel (tmp buffers).
// - end barrier (relaxed, only when reading user buffers registered from a CUDA graph): peers
//   finish reading our input before we return and later kernels overwrite it. Eager calls read
//   staging copies that alternate between two buffers from call to call, and tmp buffers are
//   protected by the next call's start barrier, so they need no end barrier. (A buffer is reused
//   two calls later, after a kernel in between whose start barrier every peer reached, which on
//   each peer runs only once the earlier kernel has completed.)
//
// Copy-in. An eager kernel's blocks copy the packs of this rank's input that the same block index
// will read on every rank (so the per-block barrier publishes exactly them) into the staging
// buffer, in.ptr[rank], before the start barrier.
//
// Data. 16-byte packs (LD.128/ST.128); sums in fp32 in rank order 0..N-1, so every rank computes
// bit-identical results; one rounding to T at the end. Elements past the last whole pack (the
// tail, fewer than 16 bytes) are reduced one-shot style by the first threads.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace splitflow::comm::detail {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 160;  // flag slots per rank: at least the SM count of the GPUs we target
constexpr int kThreads = 512;
constexpr int kNormMaxThreads = 1024;
constexpr int kNormPacksPerThread = 2;  // fused RMSNorm keeps a row in registers: hidden <= 2 * 1024 packs

struct Signal {
  uint32_t arrived[kMaxBlocks][kMaxRanks];
  uint32_t counter[kMaxBlocks];
  uint32_t ll_calls[kMaxBlocks];     // the last flag block b used in an LL one-shot call
  uint32_t ll128_calls[kMaxBlocks];  // the same for LL128 calls
};

// One call's input pointers, in every rank's address space (device memory, read by the kernel so a
// captured graph can have them filled in after capture).
struct alignas(16) RankPtrs {
  const void* ptr[kMaxRanks];
};

struct PeerSignals {
  Signal* signal[kMaxRanks];
};

struct PeerTmps {
  void* tmp[kMaxRanks];
};

// The LL one-shot's receive buffers, one per rank: [2 parities][N senders][2 * max packs] lines.
struct LLArgs {
  uint4* recv[kMaxRanks];
  const void* in;           // this rank's input, read in place
  int64_t sender_lines;     // lines per (parity, sender) region
};

// The LL128 receive buffers, one per rank: [2 parities][N senders][sender_slots] 16-byte slots.
struct LL128Args {
  uint4* recv[kMaxRanks];
  const void* in;        // this rank's input, read in place
  int64_t sender_slots;  // 16-byte slots per (parity, sender) region
};

struct KernelArgs {
  const RankPtrs* inputs;
  const void* copy_from;  // eager: this rank's input, copied into in.ptr[rank] first; null: in place
  PeerSignals signals;
  PeerTmps tmps;
  int rank;
  bool end_barrier;
  void* out;
  const void* residual;  // null: none
  int64_t count;         // elements
};

// ---- flags -------------------------------------------------------------------------------------

__device__ __forceinline__ void store_relaxed(uint32_t* address, uint32_t value) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}
__device__ __forceinline__ uint32_t load_relaxed(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ void store_release(uint32_t* address, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ bool reached(uint32_t seen, uint32_t expected) {
  return static_cast<int32_t>(seen - expected) >= 0;
}

__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// A peer that never arrives (a rank died, or ranks issued different calls) would leave the GPU
// spinning forever: after kHangNs the kernel traps, and the launch fails with an error instead.
constexpr uint64_t kHangNs = 20ull * 1000 * 1000 * 1000;

template <bool kAcquire>
__device__ __forceinline__ void wait_for(const uint32_t* flag, uint32_t count) {
  const uint64_t start = global_time_ns();
  while (!reached(kAcquire ? load_acquire(flag) : load_relaxed(flag), count)) {
    if (global_time_ns() - start > kHangNs) {
      printf("splitflow custom allreduce: block %d waited %llu s for a peer's flag %u (seen %u); trapping\n",
             blockIdx.x, static_cast<unsigned long long>(kHangNs / 1000000000ull), count,
             kAcquire ? load_acquire(flag) : load_relaxed(flag));
      __trap();
    }
  }
}

// Waits until block blockIdx.x of every rank has reached this barrier.
template <int N, bool kRelease>
__device__ __forceinline__ void barrier_all(const PeerSignals& signals, int rank) {
  __syncthreads();
  Signal* self = signals.signal[rank];
  const uint32_t count = self->counter[blockIdx.x] + 1;
  if (threadIdx.x < N) {
    uint32_t* remote = &signals.signal[threadIdx.x]->arrived[blockIdx.x][rank];
    const uint32_t* local = &self->arrived[blockIdx.x][threadIdx.x];
    if constexpr (kRelease) {
      store_release(remote, count);
    } else {
      store_relaxed(remote, count);
    }
    wait_for<kRelease>(local, count);
  }
  __syncthreads();
  if (threadIdx.x == 0) self->counter[blockIdx.x] = count;
}

// Waits until block blockIdx.x of `partner` has reached this barrier (publishing its writes).
__device__ __forceinline__ void barrier_pair(const PeerSignals& signals, int rank, int partner) {
  __syncthreads();
  Signal* self = signals.signal[rank];
  const uint32_t count = self->counter[blockIdx.x] + 1;
  if (threadIdx.x == partner) {
    store_release(&signals.signal[partner]->arrived[blockIdx.x][rank], count);
    wait_for<true>(&self->arrived[blockIdx.x][partner], count);
  }
  __syncthreads();
  if (threadIdx.x == 0) self->counter[blockIdx.x] = count;
}

// ---- element types -----------------------------------------------------------------------------

template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static constexpr int kPack = 4;
  static __device__ __forceinline__ float load(const float* p) { return *p; }
  static __device__ __forceinline__ void store(float* p, float v) { *p = v; }
  static __device__ __forceinline__ void unpack(const int4& p, float* f) {
    f[0] = __int_as_float(p.x);
    f[1] = __int_as_float(p.y);
    f[2] = __int_as_float(p.z);
    f[3] = __int_as_float(p.w);
  }
  static __device__ __forceinline__ int4 pack(const float* f) {
    return make_int4(__float_as_int(f[0]), __float_as_int(f[1]), __float_as_int(f[2]), __float_as_int(f[3]));
  }
  static __device__ __forceinline__ float round(float v) { return v; }
};

__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ void from_float2(float2 v, __half2& out) { out = __float22half2_rn(v); }
__device__ __forceinline__ void from_float2(float2 v, __nv_bfloat162& out) { out = __float22bfloat162_rn(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void from_float(float v, __half& out) { out = __float2half_rn(v); }
__device__ __forceinline__ void from_float(float v, __nv_bfloat16& out) { out = __float2bfloat16_rn(v); }

// fp16 and bf16: eight elements per pack, converted two at a time.
template <typename T, typename T2>
struct HalfElem {
  static constexpr int kPack = 8;
  static __device__ __forceinline__ float load(const T* p) { return to_float(*p); }
  static __device__ __forceinline__ void store(T* p, float v) {
    T value;
    from_float(v, value);
    *p = value;
  }
  static __device__ __forceinline__ void unpack(const int4& p, float* f) {
    const int words[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      T2 pair;
      memcpy(&pair, &words[i], 4);
      const float2 v = to_float2(pair);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
  static __device__ __forceinline__ int4 pack(const float* f) {
    int words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      T2 pair;
      from_float2(make_float2(f[2 * i], f[2 * i + 1]), pair);
      memcpy(&words[i], &pair, 4);
    }
    return make_int4(words[0], words[1], words[2], words[3]);
  }
  static __device__ __forceinline__ float round(float v) {
    T value;
    from_float(v, value);
    return to_float(value);
  }
};

template <>
struct Elem<__half> : HalfElem<__half, __half2> {};
template <>
struct Elem<__nv_bfloat16> : HalfElem<__nv_bfloat16, __nv_bfloat162> {};

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---- pack helpers ------------------------------------------------------------------------------

// acc = sum over ranks (in order) of pack `index` of every rank's input. All N loads are issued
// before the first add.
// acc = the ranks' packs summed in rank order.
template <typename T, int N>
__device__ __forceinline__ void sum_packs(const int4 (&loaded)[N], float* acc) {
  constexpr int E = Elem<T>::kPack;
  Elem<T>::unpack(loaded[0], acc);
#pragma unroll
  for (int r = 1; r < N; ++r) {
    float values[E];
    Elem<T>::unpack(loaded[r], values);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += values[e];
  }
}

template <typename T, int N>
__device__ __forceinline__ void reduce_pack(const RankPtrs& in, int64_t index, float* acc) {
  int4 loaded[N];
#pragma unroll
  for (int r = 0; r < N; ++r) loaded[r] = static_cast<const int4*>(in.ptr[r])[index];
  sum_packs<T, N>(loaded, acc);
}

// Adds pack `index` of `residual` (may be null) to acc; `vector_io` says whether it is 16-byte aligned.
template <typename T>
__device__ __forceinline__ void add_residual_pack(const T* residual, int64_t index, bool vector_io, float* acc) {
  constexpr int E = Elem<T>::kPack;
  if (residual == nullptr) return;
  float values[E];
  if (vector_io) {
    Elem<T>::unpack(reinterpret_cast<const int4*>(residual)[index], values);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) values[e] = Elem<T>::load(residual + index * E + e);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] += values[e];
}

template <typename T>
__device__ __forceinline__ void store_pack(T* out, int64_t index, bool vector_io, const float* values) {
  constexpr int E = Elem<T>::kPack;
  if (vector_io) {
    reinterpret_cast<int4*>(out)[index] = Elem<T>::pack(values);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) Elem<T>::store(out + index * E + e, values[e]);
  }
}

// Elements [first, count) (fewer than one pack): reduced from every rank's input, plus the
// residual, by the first threads of block 0.
template <typename T, int N>
__device__ __forceinline__ void reduce_tail(const RankPtrs& in, T* out, const T* residual, int64_t first,
                                            int64_t count) {
  const int64_t element = first + threadIdx.x;
  if (blockIdx.x != 0 || element >= count) return;
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < N; ++r) sum += Elem<T>::load(static_cast<const T*>(in.ptr[r]) + element);
  if (residual != nullptr) sum += Elem<T>::load(residual + element);
  Elem<T>::store(out + element, sum);
}

// Copy-in of pack `index` (and, by block 0, of the tail) from `from` to this rank's staging buffer.
template <typename T>
__device__ __forceinline__ void copy_pack(const T* from, void* staging, int64_t index, bool aligned) {
  constexpr int E = Elem<T>::kPack;
  if (aligned) {
    static_cast<int4*>(staging)[index] = reinterpret_cast<const int4*>(from)[index];
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) static_cast<T*>(staging)[index * E + e] = from[index * E + e];
  }
}

template <typename T>
__device__ __forceinline__ void copy_tail(const T* from, void* staging, int64_t first, int64_t count) {
  const int64_t element = first + threadIdx.x;
  if (blockIdx.x == 0 && element < count) static_cast<T*>(staging)[element] = from[element];
}

// The start barrier, publishing the copy-in when there was one.
template <int N>
__device__ __forceinline__ void start_barrier(const KernelArgs& a) {
  if (a.copy_from != nullptr) {
    barrier_all<N, true>(a.signals, a.rank);
  } else {
    barrier_all<N, false>(a.signals, a.rank);
  }
}

// Copy-in for kernels whose block reads packs tid, tid + stride, ... of every rank.
// This rank's staging buffer, read from the slot in memory (a run-time index into a local copy of
// the slot would put that copy in local memory).
__device__ __forceinline__ void* own_staging(const KernelArgs& a) { return const_cast<void*>(a.inputs->ptr[a.rank]); }

template <typename T>
__device__ __forceinline__ void copy_in_flat(const KernelArgs& a) {
  constexpr int E = Elem<T>::kPack;
  if (a.copy_from == nullptr) return;
  void* staging = own_staging(a);
  const T* from = static_cast<const T*>(a.copy_from);
  const bool aligned = aligned16(from);
  const int64_t packs = a.count / E;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs; i += stride) {
    copy_pack<T>(from, staging, i, aligned);
  }
  copy_tail<T>(from, staging, packs * E, a.count);
}

// ---- one-shot ----------------------------------------------------------------------------------

template <typename T, int N>
__global__ void __launch_bounds__(kThreads, 1) one_shot_kernel(KernelArgs a) {
  constexpr int E = Elem<T>::kPack;
  const RankPtrs in = *a.inputs;
  T* out = static_cast<T*>(a.out);
  const T* residual = static_cast<const T*>(a.residual);
  const bool vector_io = aligned16(out) && aligned16(residual);
  const int64_t packs = a.count / E;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  copy_in_flat<T>(a);
  start_barrier<N>(a);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs; i += stride) {
    float acc[E];
    reduce_pack<T, N>(in, i, acc);
    add_residual_pack<T>(residual, i, vector_io, acc);
    store_pack<T>(out, i, vector_io, acc);
  }
  reduce_tail<T, N>(in, out, residual, packs * E, a.count);
  if (a.end_barrier) barrier_all<N, false>(a.signals, a.rank);
}

// ---- one-shot, LL protocol (small messages) ------------------------------------------------------
// No barriers: every rank pushes each 16-byte pack of its input to every peer as two 16-byte lines
// {data word, flag, data word, flag} (NCCL's LL format: a line's 8-byte halves land whole), and
// reads its peers' packs from its own receive buffer once their flags show this call's value.
// One NVLink write latency instead of three (start flag, remote reads, end flag), for twice the
// bytes on the wire. The flag is block b's call count (ll_calls[b], never 0, the same on every
// rank since they run the same calls); the grid is fixed (kLLBlocks), so pack i always belongs to
// the same block and its flags and parities advance by one per call. Two parities of buffers: a
// rank writes a parity again two calls later, when every peer has started the call in between,
// so has finished reading the earlier one. Sums in rank order as the other kernels.

constexpr int kLLBlocks = 16;
constexpr int kLLThreads = 256;

__device__ __forceinline__ void store_line(uint4* address, uint4 line) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(line.x), "r"(line.y),
               "r"(line.z), "r"(line.w)
               : "memory");
}
__device__ __forceinline__ uint4 load_line(const uint4* address) {
  uint4 line;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(line.x), "=r"(line.y), "=r"(line.z), "=r"(line.w)
               : "l"(address)
               : "memory");
  return line;
}

// The 16-byte pack `index` of `in` (elements past `count` are zero).
template <typename T>
__device__ __forceinline__ int4 load_pack_padded(const T* in, int64_t index, int64_t count, bool aligned) {
  constexpr int E = Elem<T>::kPack;
  if (aligned && (index + 1) * E <= count) return reinterpret_cast<const int4*>(in)[index];
  float values[E];
#pragma unroll
  for (int e = 0; e < E; ++e) values[e] = index * E + e < count ? Elem<T>::load(in + index * E + e) : 0.0f;
  return Elem<T>::pack(values);
}

__device__ __forceinline__ int4 wait_pack(const uint4* lines, uint32_t flag) {
  const uint64_t start = global_time_ns();
  while (true) {
    const uint4 lo = load_line(lines), hi = load_line(lines + 1);
    if (lo.y == flag && lo.w == flag && hi.y == flag && hi.w == flag)
      return make_int4(static_cast<int>(lo.x), static_cast<int>(lo.z), static_cast<int>(hi.x), static_cast<int>(hi.z));
    if (global_time_ns() - start > kHangNs) {
      printf("splitflow custom allreduce (LL): block %d waited %llu s for a peer's pack with flag %u; trapping\n",
             blockIdx.x, static_cast<unsigned long long>(kHangNs / 1000000000ull), flag);
      __trap();
    }
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(kLLThreads) one_shot_ll_kernel(KernelArgs a, LLArgs ll) {
  constexpr int E = Elem<T>::kPack;
  // Every thread reads the block's last flag (its latency overlaps the first input loads below);
  // thread 0 stores the new one once all have read it.
  uint32_t* calls = &a.signals.signal[a.rank]->ll_calls[blockIdx.x];
  uint32_t flag = *reinterpret_cast<volatile uint32_t*>(calls) + 1;
  if (flag == 0) flag = 2;  // 0 is the zeroed buffers' flag; 2 keeps the parity alternating
  const int64_t parity_lines = static_cast<int64_t>(N) * ll.sender_lines;
  const int64_t region = (flag & 1u) * parity_lines + a.rank * ll.sender_lines;  // where peers keep ours
  const T* in = static_cast<const T*>(ll.in);
  T* out = static_cast<T*>(a.out);
  const T* residual = static_cast<const T*>(a.residual);
  const bool in_aligned = aligned16(in);
  const bool vector_io = aligned16(out) && aligned16(residual);
  const int64_t packs = (a.count + E - 1) / E;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) *calls = flag;

  for (int64_t i = first; i < packs; i += stride) {
    const int4 mine = load_pack_padded<T>(in, i, a.count, in_aligned);
    const uint4 lo = make_uint4(mine.x, flag, mine.y, flag), hi = make_uint4(mine.z, flag, mine.w, flag);
#pragma unroll
    for (int step = 1; step < N; ++step) {
      uint4* lines = ll.recv[(a.rank + step) % N] + region + 2 * i;
      store_line(lines, lo);
      store_line(lines + 1, hi);
    }
  }
  const uint4* received = ll.recv[a.rank] + (flag & 1u) * parity_lines;
  for (int64_t i = first; i < packs; i += stride) {
    int4 loaded[N];
#pragma unroll
    for (int r = 0; r < N; ++r) {
      loaded[r] = r == a.rank ? load_pack_padded<T>(in, i, a.count, in_aligned)
                              : wait_pack(received + r * ll.sender_lines + 2 * i, flag);
    }
    float acc[E];
    sum_packs<T, N>(loaded, acc);
    if ((i + 1) * E <= a.count) {
      add_residual_pack<T>(residual, i, vector_io, acc);
      store_pack<T>(out, i, vector_io, acc);
    } else {  // the last, partial pack
      for (int64_t e = 0; i * E + e < a.count; ++e) {
        const float sum = acc[e] + (residual != nullptr ? Elem<T>::load(residual + i * E + e) : 0.0f);
        Elem<T>::store(out + i * E + e, sum);
      }
    }
  }
}

// ---- one-shot, LL128 protocol (NVLink, medium messages) -----------------------------------------
// NCCL's LL128 format: a 128-byte line carries 15 eight-byte data words and, in its last word, the
// flag. A warp stores four whole lines with one 16-byte store per lane (lane l: line l / 8, slot
// l % 8; slot 7 holds the line's last data word and the flag), and reads them back the same way;
// the protocol relies on NVLink delivering each 128-byte line of a warp's store whole, so a reader
// that sees a line's flag sees its data (NCCL enables LL128 on NVLink for the same reason; PCIe
// gives no such guarantee and never uses it: CommGroup switches it off there). No barriers, as
// with LL, for 128/120 of the message on the wire instead of twice it.
// Line group g (4 lines, 60 data words) is pushed and received by warp g mod (kLL128Blocks x
// warps per block), the same on every rank. The kernel always launches kLL128Blocks blocks, each
// advancing its flag (ll128_calls[b]) once per call, so the flags move in lockstep and one names a
// call. Two parities of buffers, reused as with LL: a rank writes a parity again two calls later,
// after it received (in the call between) lines every peer pushed only once it had finished the
// earlier call.

// Fixed grid (bench allreduce on H200 x2: 96 blocks beat 128 at 128-256 KB, 512 threads lose
// everywhere; docs/comm.md).
constexpr int kLL128Blocks = 96;
constexpr int kLL128Threads = 256;
constexpr int kLineDataWords = 15;
constexpr int kGroupSlots = 32;  // 16-byte slots of a line group: one per lane
constexpr int kGroupDataWords = 4 * kLineDataWords;

__device__ __forceinline__ uint32_t next_ll128_flag(const KernelArgs& a) {
  uint32_t* calls = &a.signals.signal[a.rank]->ll128_calls[blockIdx.x];
  uint32_t flag = *reinterpret_cast<volatile uint32_t*>(calls) + 1;
  if (flag == 0) flag = 2;  // 0 is the zeroed buffers' flag; 2 keeps the parity alternating
  __syncthreads();
  if (threadIdx.x == 0) *calls = flag;
  return flag;
}

// Eight-byte word `index` of `p` (`count` elements; elements past it read as zero bits = 0.0).
template <typename T>
__device__ __forceinline__ uint2 load_word(const T* p, int64_t index, int64_t count, bool aligned8) {
  constexpr int W = 8 / sizeof(T);
  if (aligned8 && (index + 1) * W <= count) return *reinterpret_cast<const uint2*>(p + index * W);
  uint2 word = make_uint2(0, 0);
  T* elements = reinterpret_cast<T*>(&word);
#pragma unroll
  for (int e = 0; e < W; ++e)
    if (index * W + e < count) elements[e] = p[index * W + e];
  return word;
}

// acc[0, W) += the word's elements.
template <typename T>
__device__ __forceinline__ void add_word(uint2 word, float* acc) {
  float values[Elem<T>::kPack];
  Elem<T>::unpack(make_int4(static_cast<int>(word.x), static_cast<int>(word.y), 0, 0), values);
#pragma unroll
  for (int e = 0; e < 8 / static_cast<int>(sizeof(T)); ++e) acc[e] += values[e];
}

template <typename T>
__device__ __forceinline__ void store_word(T* p, int64_t index, int64_t count, bool aligned8, const float* values) {
  constexpr int W = 8 / sizeof(T);
  if (aligned8 && (index + 1) * W <= count) {
    float padded[Elem<T>::kPack] = {};
#pragma unroll
    for (int e = 0; e < W; ++e) padded[e] = values[e];
    const int4 packed = Elem<T>::pack(padded);
    *reinterpret_cast<uint2*>(p + index * W) = make_uint2(static_cast<uint32_t>(packed.x), static_cast<uint32_t>(packed.y));
    return;
  }
#pragma unroll
  for (int e = 0; e < W; ++e)
    if (index * W + e < count) Elem<T>::store(p + index * W + e, values[e]);
}

__device__ __forceinline__ bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0; }

// The lane's slot of a line group: its first data word within the group's 60, and whether it
// carries two words (slots 0-6) or one and the flag (slot 7).
struct GroupSlot {
  int first_word;
  bool two_words;
  __device__ explicit GroupSlot(int lane)
      : first_word((lane / 8) * kLineDataWords + 2 * (lane % 8)), two_words(lane % 8 != 7) {}
};

// The slot's 16 bytes: words `word` (and word + 1) of `in`, or word and the flag.
template <typename T>
__device__ __forceinline__ uint4 make_slot(const T* in, int64_t word, int64_t count, bool in_aligned, bool two_words,
                                           uint32_t flag) {
  const uint2 first = load_word<T>(in, word, count, in_aligned);
  const uint2 second = two_words ? load_word<T>(in, word + 1, count, in_aligned) : make_uint2(flag, flag);
  return make_uint4(first.x, first.y, second.x, second.y);
}

// value[k] = this lane's slot at at[k] for every k with want[k] (warp-uniform), once the line
// group there shows `flag` in its four flag slots. The first loads of all groups go out together,
// so a warp waiting on several peers pays one memory latency, not one per peer. kValueInFlagSlot:
// the flag slot's third word carries a value (the fused RMSNorm's row scale) and only its last
// word is the flag; a line arrives whole over NVLink, so one flag word per line suffices.
template <int K, bool kValueInFlagSlot = false>
__device__ __forceinline__ void wait_groups(const uint4* const (&at)[K], const bool (&want)[K], uint32_t flag,
                                            bool flag_lane, uint4 (&value)[K]) {
  bool pending[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    pending[k] = want[k];
    if (pending[k]) value[k] = load_line(at[k]);
  }
  const uint64_t start = global_time_ns();
  while (true) {
    bool any = false;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!pending[k]) continue;
      pending[k] = !__all_sync(0xffffffffu, !flag_lane || ((kValueInFlagSlot || value[k].z == flag) && value[k].w == flag));
      any |= pending[k];
    }
    if (!any) return;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (pending[k]) value[k] = load_line(at[k]);
    if (global_time_ns() - start > kHangNs) {
      printf("splitflow custom allreduce (LL128): block %d waited %llu s for a peer's line with flag %u; trapping\n",
             blockIdx.x, static_cast<unsigned long long>(kHangNs / 1000000000ull), flag);
      __trap();
    }
  }
}

// acc[0, 2W) = the slot's words summed over the ranks in rank order (this rank's from `in`).
template <typename T, int N>
__device__ __forceinline__ void receive_slot(const KernelArgs& a, const uint4* received, int64_t sender_slots,
                                             int64_t slot_index, const T* in, int64_t word, int64_t count,
                                             bool in_aligned, bool two_words, uint32_t flag, float* acc) {
  constexpr int W = 8 / sizeof(T);
#pragma unroll
  for (int e = 0; e < 2 * W; ++e) acc[e] = 0.0f;
  const uint4* at[N];
  bool peer[N];
#pragma unroll
  for (int r = 0; r < N; ++r) {
    at[r] = received + r * sender_slots + slot_index;
    peer[r] = r != a.rank;
  }
  const uint4 own = make_slot<T>(in, word, count, in_aligned, two_words, flag);
  uint4 slots[N];
  wait_groups<N>(at, peer, flag, !two_words, slots);
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const uint4 value = r == a.rank ? own : slots[r];
    add_word<T>(make_uint2(value.x, value.y), acc);
    if (two_words) add_word<T>(make_uint2(value.z, value.w), acc + W);
  }
}

// The slot's data words of `p` at `word` (and word + 1 for two-word slots); zero where p is null
// or past `count`. Kernels load a residual this way before waiting on the peers' lines: the
// waits' volatile polls would hold back any load issued after them until the lines arrive.
template <typename T>
__device__ __forceinline__ uint4 load_slot_words(const T* p, int64_t word, int64_t count, bool aligned8, bool two_words) {
  if (p == nullptr) return make_uint4(0, 0, 0, 0);
  const uint2 first = load_word<T>(p, word, count, aligned8);
  const uint2 second = two_words ? load_word<T>(p, word + 1, count, aligned8) : make_uint2(0, 0);
  return make_uint4(first.x, first.y, second.x, second.y);
}

// acc (a slot's 2W values) += the slot's words.
template <typename T>
__device__ __forceinline__ void add_slot_words(uint4 words, float* acc) {
  float values[Elem<T>::kPack];
  Elem<T>::unpack(make_int4(static_cast<int>(words.x), static_cast<int>(words.y), static_cast<int>(words.z),
                            static_cast<int>(words.w)),
                  values);
#pragma unroll
  for (int e = 0; e < Elem<T>::kPack; ++e) acc[e] += values[e];
}

// What an LL128 kernel derives from its call (every thread; advances the block's flag): the flag,
// the lane's slot, the line groups and the warp's place among the grid's warps, the buffers and
// whether they take 8-byte accesses, and the offset of this call's parity in a receive buffer.
template <typename T, int N>
struct LL128Call {
  static constexpr int W = 8 / sizeof(T);
  uint32_t flag;
  int lane;
  GroupSlot slot;
  int64_t groups, warps, first;
  const T* in;
  T* out;
  const T* residual;
  bool in_aligned, out_aligned, residual_aligned;
  int64_t parity;  // slots before this call's parity: [parity][N senders][sender_slots]

  __device__ LL128Call(const KernelArgs& a, const LL128Args& ll)
      : flag(next_ll128_flag(a)),
        lane(threadIdx.x % 32),
        slot(lane),
        groups(((a.count + W - 1) / W + kGroupDataWords - 1) / kGroupDataWords),
        warps(static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)),
        first(static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32),
        in(static_cast<const T*>(ll.in)),
        out(static_cast<T*>(a.out)),
        residual(static_cast<const T*>(a.residual)),
        in_aligned(aligned8(in)),
        out_aligned(aligned8(out)),
        residual_aligned(aligned8(residual)),
        parity((flag & 1u) * static_cast<int64_t>(N) * ll.sender_slots) {}

  // First data word of group g that this lane carries.
  __device__ int64_t word(int64_t g) const { return g * kGroupDataWords + slot.first_word; }
  // This lane's slot of group g of the input, with the flag.
  __device__ uint4 input_slot(int64_t g, int64_t count) const {
    return make_slot<T>(in, word(g), count, in_aligned, slot.two_words, flag);
  }
  // The residual's words of the slot at `word` (zero without a residual), for add_slot_words.
  __device__ uint4 residual_slot(int64_t word, int64_t count) const {
    return load_slot_words<T>(residual, word, count, residual_aligned, slot.two_words);
  }
};

template <typename T, int N>
__global__ void __launch_bounds__(kLL128Threads) one_shot_ll128_kernel(KernelArgs a, LL128Args ll) {
  constexpr int W = 8 / sizeof(T);
  const LL128Call<T, N> c(a, ll);
  const int64_t region = c.parity + a.rank * ll.sender_slots;  // where peers keep ours

  for (int64_t g = c.first; g < c.groups; g += c.warps) {
    const uint4 value = c.input_slot(g, a.count);
#pragma unroll
    for (int step = 1; step < N; ++step) store_line(ll.recv[(a.rank + step) % N] + region + g * kGroupSlots + c.lane, value);
  }
  const uint4* received = ll.recv[a.rank] + c.parity;
  for (int64_t g = c.first; g < c.groups; g += c.warps) {
    const int64_t word = c.word(g);
    const uint4 residual = c.residual_slot(word, a.count);
    float acc[2 * W];
    receive_slot<T, N>(a, received, ll.sender_slots, g * kGroupSlots + c.lane, c.in, word, a.count, c.in_aligned,
                       c.slot.two_words, c.flag, acc);
    add_slot_words<T>(residual, acc);
    store_word<T>(c.out, word, a.count, c.out_aligned, acc);
    if (c.slot.two_words) store_word<T>(c.out, word + 1, a.count, c.out_aligned, acc + W);
  }
}

// ---- two-shot, LL128 protocol (NVLink, larger worlds) -------------------------------------------
// The line groups split into N contiguous partitions; rank p owns partition p. Stage 1
// (reduce-scatter): every rank pushes each group of partition p to its owner p, into the slots
// where a one-shot call would put it ([parity][sender][group]). The owner sums its partition in rank
// order, adds the residual, rounds once, writes its output and pushes the rounded group to every
// peer (stage 2, allgather), into [parity][owner][group]: slots that stage 1 leaves alone there (a
// rank receives only its own partition in stage 1). Each rank sends 2 (N - 1) / N of the message
// instead of one-shot's N - 1 times it, in two hops whose flags travel in the lines. Flags, grid,
// parities and the reuse argument are the one-shot LL128 kernel's: in every call each rank
// receives lines from every peer, so the two calls ago argument holds unchanged.

// The slot's 16 bytes carrying the two words of `acc` (2W values) rounded to T, or the first word
// and the flag.
template <typename T>
__device__ __forceinline__ uint4 pack_slot(const float* acc, bool two_words, uint32_t flag) {
  static_assert(2 * (8 / sizeof(T)) == Elem<T>::kPack, "a slot's two words are one 16-byte pack");
  const int4 packed = Elem<T>::pack(acc);
  return make_uint4(static_cast<uint32_t>(packed.x), static_cast<uint32_t>(packed.y),
                    two_words ? static_cast<uint32_t>(packed.z) : flag, two_words ? static_cast<uint32_t>(packed.w) : flag);
}

// Eight-byte word `index` of `p` = `word` (elements past `count` are not written).
template <typename T>
__device__ __forceinline__ void store_raw_word(T* p, int64_t index, int64_t count, bool aligned8, uint2 word) {
  constexpr int W = 8 / sizeof(T);
  if (aligned8 && (index + 1) * W <= count) {
    *reinterpret_cast<uint2*>(p + index * W) = word;
    return;
  }
  const T* elements = reinterpret_cast<const T*>(&word);
#pragma unroll
  for (int e = 0; e < W; ++e)
    if (index * W + e < count) p[index * W + e] = elements[e];
}

// The data words of a slot (pack_slot's layout) into `out` at `word`.
template <typename T>
__device__ __forceinline__ void write_slot(T* out, int64_t word, int64_t count, bool aligned8, bool two_words, uint4 v) {
  store_raw_word<T>(out, word, count, aligned8, make_uint2(v.x, v.y));
  if (two_words) store_raw_word<T>(out, word + 1, count, aligned8, make_uint2(v.z, v.w));
}

// First line group of partition p of `groups`.
__device__ __forceinline__ int64_t partition_start(int64_t groups, int p, int n) { return groups * p / n; }

template <typename T, int N>
__global__ void __launch_bounds__(kLL128Threads) two_shot_ll128_kernel(KernelArgs a, LL128Args ll) {
  constexpr int W = 8 / sizeof(T);
  const LL128Call<T, N> c(a, ll);
  const int64_t mine_start = partition_start(c.groups, a.rank, N);
  const int64_t mine_groups = partition_start(c.groups, a.rank + 1, N) - mine_start;

  // Stage 1: the other partitions' groups to their owners. A warp handles the groups i, i + warps,
  // ... of every partition in every stage, so in place (out == in) it overwrites only words it
  // has itself read already.
  for (int step = 1; step < N; ++step) {
    const int owner = (a.rank + step) % N;
    const int64_t start = partition_start(c.groups, owner, N), end = partition_start(c.groups, owner + 1, N);
    uint4* to = ll.recv[owner] + c.parity + a.rank * ll.sender_slots;
    for (int64_t g = start + c.first; g < end; g += c.warps) {
      store_line(to + g * kGroupSlots + c.lane, c.input_slot(g, a.count));
    }
  }
  // Reduce this rank's partition, then push it to every peer.
  const uint4* received = ll.recv[a.rank] + c.parity;
  for (int64_t i = c.first; i < mine_groups; i += c.warps) {
    const int64_t g = mine_start + i;
    const int64_t word = c.word(g);
    const uint4 residual = c.residual_slot(word, a.count);
    float acc[2 * W];
    receive_slot<T, N>(a, received, ll.sender_slots, g * kGroupSlots + c.lane, c.in, word, a.count, c.in_aligned,
                       c.slot.two_words, c.flag, acc);
    add_slot_words<T>(residual, acc);
    const uint4 reduced = pack_slot<T>(acc, c.slot.two_words, c.flag);
#pragma unroll
    for (int step = 1; step < N; ++step)
      store_line(ll.recv[(a.rank + step) % N] + c.parity + a.rank * ll.sender_slots + g * kGroupSlots + c.lane, reduced);
    write_slot<T>(c.out, word, a.count, c.out_aligned, c.slot.two_words, reduced);
  }
  // Stage 2: the other partitions, reduced by their owners; the warp waits on its group of every
  // owner at once (partitions differ by at most one group).
  const int64_t most_groups = (c.groups + N - 1) / N;
  for (int64_t i = c.first; i < most_groups; i += c.warps) {
    const uint4* at[N - 1];
    bool want[N - 1];
    int64_t group[N - 1];
#pragma unroll
    for (int step = 1; step < N; ++step) {
      const int owner = (a.rank + step) % N;
      const int64_t start = partition_start(c.groups, owner, N);
      group[step - 1] = start + i;
      want[step - 1] = group[step - 1] < partition_start(c.groups, owner + 1, N);
      at[step - 1] = received + owner * ll.sender_slots + group[step - 1] * kGroupSlots + c.lane;
    }
    uint4 reduced[N - 1];
    wait_groups<N - 1>(at, want, c.flag, !c.slot.two_words, reduced);
#pragma unroll
    for (int k = 0; k < N - 1; ++k) {
      if (want[k])
        write_slot<T>(c.out, c.word(group[k]), a.count, c.out_aligned, c.slot.two_words, reduced[k]);
    }
  }
}

// ---- two-shot ----------------------------------------------------------------------------------
// Packs are split into N partitions (the last takes the remainder). Stage 1: rank g reduces
// partition g (plus the residual, which tensor parallelism keeps identical on all ranks) into its
// tmp buffer. Stage 2: every rank copies all partitions from the tmp buffers. A block reads in
// stage 2 exactly the tmp packs that the same block index wrote on each rank in stage 1, so the
// per-block barrier in between suffices.

template <typename T, int N>
__global__ void __launch_bounds__(kThreads, 1) two_shot_kernel(KernelArgs a) {
  constexpr int E = Elem<T>::kPack;
  const RankPtrs in = *a.inputs;
  T* out = static_cast<T*>(a.out);
  const T* residual = static_cast<const T*>(a.residual);
  const bool vector_io = aligned16(out) && aligned16(residual);
  const int64_t packs = a.count / E;
  const int64_t part = packs / N;
  const int64_t last_part = packs - part * (N - 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  if (a.copy_from != nullptr) {
    // Rank g's block reads partition g at the offsets this block index owns: copy those of every partition.
    const T* from = static_cast<const T*>(a.copy_from);
    void* staging = own_staging(a);
    const bool aligned = aligned16(from);
    for (int64_t i = tid; i < last_part; i += stride) {
#pragma unroll
      for (int g = 0; g < N; ++g) {
        if (g == N - 1 || i < part) copy_pack<T>(from, staging, g * part + i, aligned);
      }
    }
    copy_tail<T>(from, staging, packs * E, a.count);
  }
  start_barrier<N>(a);
  const int64_t my_start = a.rank * part;
  const int64_t my_len = a.rank == N - 1 ? last_part : part;
  int4* my_tmp = static_cast<int4*>(a.tmps.tmp[a.rank]);
  for (int64_t i = tid; i < my_len; i += stride) {
    float acc[E];
    reduce_pack<T, N>(in, my_start + i, acc);
    add_residual_pack<T>(residual, my_start + i, vector_io, acc);
    my_tmp[i] = Elem<T>::pack(acc);
  }
  // The tail reads peers' inputs: done before the barrier after which they may overwrite them.
  reduce_tail<T, N>(in, out, residual, packs * E, a.count);
  barrier_all<N, true>(a.signals, a.rank);

  for (int64_t i = tid; i < last_part; i += stride) {
#pragma unroll
    for (int g = 0; g < N; ++g) {
      if (g != N - 1 && i >= part) continue;
      const int4 value = static_cast<const int4*>(a.tmps.tmp[g])[i];
      if (vector_io) {
        reinterpret_cast<int4*>(out)[g * part + i] = value;
      } else {
        float values[E];
        Elem<T>::unpack(value, values);
        store_pack<T>(out, g * part + i, false, values);
      }
    }
  }
}

// ---- half-butterfly ----------------------------------------------------------------------------
// Stage s (s = 0 .. log2(N) - 1) exchanges the whole vector with partner rank ^ (1 << s): stage 0
// adds the partner's input to ours, later stages add the partner's previous partial sum (kept in
// fp32 in the tmp buffers, one region of `count` floats per intermediate stage). a + b == b + a in
// floating point, so both partners hold identical partial sums and every rank ends identical.

template <typename T, int N>
__global__ void __launch_bounds__(kThreads, 1) half_butterfly_kernel(KernelArgs a) {
  constexpr int E = Elem<T>::kPack;
  constexpr int kStages = N == 2 ? 1 : N == 4 ? 2 : 3;
  static_assert(N == 2 || N == 4 || N == 8, "half-butterfly needs a power-of-two world size");
  const RankPtrs in = *a.inputs;
  T* out = static_cast<T*>(a.out);
  const T* residual = static_cast<const T*>(a.residual);
  const bool vector_io = aligned16(out) && aligned16(residual);
  const int64_t packs = a.count / E;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t region_floats = packs * E;

  copy_in_flat<T>(a);
  start_barrier<N>(a);
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    const int partner = a.rank ^ (1 << s);
    if (s > 0) barrier_pair(a.signals, a.rank, partner);
    // Read through the slot in memory: a run-time index into `in` would put it in local memory.
    const void* own_input = a.inputs->ptr[a.rank];
    const void* partner_input = a.inputs->ptr[partner];
    // Region s - 1 holds stage s - 1's partial sums (stage 0 reads the inputs instead).
    const int64_t prev_offset = s > 0 ? (s - 1) * region_floats : 0;
    const float* own_prev = static_cast<const float*>(a.tmps.tmp[a.rank]) + prev_offset;
    const float* partner_prev = static_cast<const float*>(a.tmps.tmp[partner]) + prev_offset;
    float* next = static_cast<float*>(a.tmps.tmp[a.rank]) + s * region_floats;
    for (int64_t i = tid; i < packs; i += stride) {
      float acc[E];
      if (s == 0) {
        float other[E];
        Elem<T>::unpack(static_cast<const int4*>(own_input)[i], acc);
        Elem<T>::unpack(static_cast<const int4*>(partner_input)[i], other);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] += other[e];
      } else {
        float4 mine[E / 4], theirs[E / 4];
#pragma unroll
        for (int q = 0; q < E / 4; ++q) {
          mine[q] = reinterpret_cast<const float4*>(own_prev + i * E)[q];
          theirs[q] = reinterpret_cast<const float4*>(partner_prev + i * E)[q];
        }
#pragma unroll
        for (int q = 0; q < E / 4; ++q) {
          acc[4 * q + 0] = mine[q].x + theirs[q].x;
          acc[4 * q + 1] = mine[q].y + theirs[q].y;
          acc[4 * q + 2] = mine[q].z + theirs[q].z;
          acc[4 * q + 3] = mine[q].w + theirs[q].w;
        }
      }
      if (s == kStages - 1) {
        add_residual_pack<T>(residual, i, vector_io, acc);
        store_pack<T>(out, i, vector_io, acc);
      } else {
#pragma unroll
        for (int q = 0; q < E / 4; ++q) {
          reinterpret_cast<float4*>(next + i * E)[q] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
        }
      }
    }
  }
  reduce_tail<T, N>(in, out, residual, packs * E, a.count);
  if (a.end_barrier) barrier_all<N, false>(a.signals, a.rank);
}

// ---- one-shot + residual + RMSNorm ---------------------------------------------------------------
// Rows of `hidden` elements (hidden a multiple of the pack), one block per row at a time; the
// row stays in registers. residual_out = T(sum + residual_in); norm_out = T(residual_out *
// rsqrt(mean(residual_out^2) + eps) * weight), the norm computed from the rounded residual as an
// unfused add-then-norm would.

// The block's total in every thread: warp sums, then warp 0 adds them with shuffles (not each
// thread reading all 32 partial sums in a chain).
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float shared[33];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from the previous row
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    float total = lane < static_cast<int>((blockDim.x + 31) / 32) ? shared[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xffffffffu, total, offset);
    if (lane == 0) shared[32] = total;
  }
  __syncthreads();
  return shared[32];
}

struct NormArgs {
  void* norm_out;
  const float* weight;  // [hidden]
  float eps;
  int64_t rows;
  int hidden;
};

template <typename T, int N>
__global__ void __launch_bounds__(kNormMaxThreads, 1) one_shot_add_rmsnorm_kernel(KernelArgs a, NormArgs n) {
  constexpr int E = Elem<T>::kPack;
  const RankPtrs in = *a.inputs;
  T* residual_out = static_cast<T*>(a.out);
  const T* residual_in = static_cast<const T*>(a.residual);
  T* norm_out = static_cast<T*>(n.norm_out);
  const bool vector_io = aligned16(residual_out) && aligned16(residual_in) && aligned16(norm_out) &&
                         aligned16(n.weight);
  const int row_packs = n.hidden / E;
  if (a.copy_from != nullptr) {
    const T* from = static_cast<const T*>(a.copy_from);
    void* staging = own_staging(a);
    const bool aligned = aligned16(from);
    for (int64_t row = blockIdx.x; row < n.rows; row += gridDim.x) {
      for (int j = threadIdx.x; j < row_packs; j += blockDim.x) {
        copy_pack<T>(from, staging, row * row_packs + j, aligned);
      }
    }
  }
  start_barrier<N>(a);
  for (int64_t row = blockIdx.x; row < n.rows; row += gridDim.x) {
    float v[kNormPacksPerThread][E];
    float w[kNormPacksPerThread][E];
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormPacksPerThread; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= row_packs) continue;
      const int64_t pack = row * row_packs + j;
      reduce_pack<T, N>(in, pack, v[k]);
      add_residual_pack<T>(residual_in, pack, vector_io, v[k]);
      // The weights are loaded here, not after the block reduction, so their latency overlaps it.
      if (vector_io) {
#pragma unroll
        for (int q = 0; q < E / 4; ++q) {
          const float4 w4 = reinterpret_cast<const float4*>(n.weight + j * E)[q];
          w[k][4 * q] = w4.x;
          w[k][4 * q + 1] = w4.y;
          w[k][4 * q + 2] = w4.z;
          w[k][4 * q + 3] = w4.w;
        }
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) w[k][e] = n.weight[j * E + e];
      }
#pragma unroll
      for (int e = 0; e < E; ++e) {
        v[k][e] = Elem<T>::round(v[k][e]);
        squares += v[k][e] * v[k][e];
      }
      store_pack<T>(residual_out, pack, vector_io, v[k]);
    }
    const float scale = rsqrtf(block_sum(squares) / n.hidden + n.eps);
#pragma unroll
    for (int k = 0; k < kNormPacksPerThread; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= row_packs) continue;
#pragma unroll
      for (int e = 0; e < E; ++e) v[k][e] = v[k][e] * scale * w[k][e];
      store_pack<T>(norm_out, row * row_packs + j, vector_io, v[k]);
    }
  }
  if (a.end_barrier) barrier_all<N, false>(a.signals, a.rank);
}

// ---- two-shot LL128 + residual + RMSNorm (NVLink) -----------------------------------------------
// Rows are partitioned among the ranks (rank p owns rows [rows p / N, rows (p + 1) / N)), and each
// row is laid out in line groups of its own (row_groups = row words / 60, rounded up), so that
// every line belongs to one row. Stage 1: every rank pushes its input's groups of each row to the
// row's owner. The owner sums them in rank order, adds residual_in and rounds once (residual_out);
// a cluster of kNormClusterBlocks blocks holds the row (its warp w: groups w, w + 48), and reduces
// the row's sum of squares through distributed shared memory (RowSum), in a fixed order, so every
// warp of the cluster computes the same scale. Stage 2: the owner pushes residual_out's groups to
// every peer with the row's scale in the flag slot of each line, and writes its own outputs;
// every receiver writes residual_out and norm_out = T(residual_out * scale * weight) word by word,
// the owner's expression on the same rounded values, so every rank's outputs are bit-identical
// and no row-wide work follows the exchange. Flags, grid and parities are the other LL128
// kernels'; the reuse argument needs every rank to receive from every peer in every call, which
// holds when every rank owns a row (the launcher requires rows >= N).

constexpr int kNormClusterBlocks = 6;  // 96 blocks: 16 clusters, one row each at N = 2 and 32 rows
constexpr int kNormClusterWarps = kNormClusterBlocks * kLL128Threads / 32;
constexpr int kNormGroupsPerWarp = 2;  // a row of up to 2 x 48 line groups (bf16: 23040 elements)
static_assert(kLL128Blocks % kNormClusterBlocks == 0, "the LL128 grid is a whole number of clusters");

// Line groups of a row of `row_bytes` (a multiple of 16).
__host__ __device__ constexpr int64_t row_line_groups(int64_t row_bytes) {
  return (row_bytes / 8 + kGroupDataWords - 1) / kGroupDataWords;
}

// The slot's 16 bytes of residual_out: two rounded words, or one word, the row's scale and the flag.
template <typename T>
__device__ __forceinline__ uint4 pack_scaled_slot(const float* acc, bool two_words, float scale, uint32_t flag) {
  const int4 packed = Elem<T>::pack(acc);
  return make_uint4(static_cast<uint32_t>(packed.x), static_cast<uint32_t>(packed.y),
                    two_words ? static_cast<uint32_t>(packed.z) : __float_as_uint(scale),
                    two_words ? static_cast<uint32_t>(packed.w) : flag);
}

// norm_out's words at `word` of a row (and word + 1 for two-word slots): values * scale * weight.
template <typename T>
__device__ __forceinline__ void store_norm_slot(T* norm_row, const float* weights, int64_t word, int64_t hidden,
                                                bool aligned, bool two_words, float scale, float* values) {
  constexpr int W = 8 / sizeof(T);
#pragma unroll
  for (int e = 0; e < 2 * W; ++e) values[e] = values[e] * scale * weights[e];
  store_word<T>(norm_row, word, hidden, aligned, values);
  if (two_words) store_word<T>(norm_row, word + 1, hidden, aligned, values + W);
}

// The slot's weights (2W floats from element word * W; zero past the row): two 16-byte loads for
// 16-bit types where the row has them all.
template <typename T>
__device__ __forceinline__ void load_slot_weights(const float* weight, int64_t word, int64_t hidden, float* weights) {
  constexpr int W = 8 / sizeof(T);
  if (W == 4 && aligned16(weight) && word * W + 2 * W <= hidden) {
    const float4 lo = reinterpret_cast<const float4*>(weight + word * W)[0];
    const float4 hi = reinterpret_cast<const float4*>(weight + word * W)[1];
    const float all[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int e = 0; e < 2 * W; ++e) weights[e] = all[e];
    return;
  }
#pragma unroll
  for (int e = 0; e < 2 * W; ++e) weights[e] = word * W + e < hidden ? weight[word * W + e] : 0.0f;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A row's sum over the cluster's warps. Each warp's lane 0 stores the warp's partial into every
// block of the cluster with st.async, which counts its bytes on the receiving block's mbarrier;
// a block waits on its own mbarrier, then every warp adds the 48 partials in the same order. A
// cluster barrier would do too, but its release waits until this thread's earlier stores are
// performed, here the NVLink pushes of stage 1: with it the kernel took 0.7-0.8 us longer on
// H200 (N = 2 and 4), although alone it is the cheaper of the two. Two buffers and barriers
// alternate by row, so a block that is a row ahead cannot write into a row still being summed.
template <int kBlocks>
struct RowSum {
  static constexpr int kWarps = kBlocks * kLL128Threads / 32;
  float partials[2][kWarps];
  uint64_t arrived[2];

  // Every thread of the block, before any block of the cluster calls add(); the cluster barrier
  // that publishes the initialized mbarriers is waited on in wait_ready().
  __device__ void init() {
    if (threadIdx.x < 2) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&arrived[threadIdx.x])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
  __device__ void wait_ready() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

  // Every thread of every block of the cluster, once per row, with `value` its own contribution.
  __device__ float add(float value, int iteration, int cluster_warp) {
    const int buffer = iteration & 1, lane = threadIdx.x % 32;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    const uint32_t slot = shared_address(&partials[buffer][cluster_warp]);
    const uint32_t barrier = shared_address(&arrived[buffer]);
    if (lane < kBlocks) {
      uint32_t remote_slot, remote_barrier;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_slot) : "r"(slot), "r"(lane));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_barrier) : "r"(barrier), "r"(lane));
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote_slot),
                   "r"(__float_as_uint(value)), "r"(remote_barrier)
                   : "memory");
    }
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier),
                   "r"(static_cast<uint32_t>(sizeof(float) * kWarps))
                   : "memory");
    }
    const uint32_t phase = (iteration >> 1) & 1;
    uint32_t done = 0;
    const uint64_t start = global_time_ns();
    while (true) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(barrier), "r"(phase)
          : "memory");
      if (done) break;
      if (global_time_ns() - start > kHangNs) {
        printf("splitflow custom allreduce (RMSNorm): block %d waited %llu s for its cluster's row sums; trapping\n",
               blockIdx.x, static_cast<unsigned long long>(kHangNs / 1000000000ull));
        __trap();
      }
    }
    float total = 0.0f;
    for (int i = lane; i < kWarps; i += 32) total += partials[buffer][i];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(0xffffffffu, total, offset);
    return total;
  }
};

template <typename T, int N>
__global__ void __cluster_dims__(kNormClusterBlocks, 1, 1) __launch_bounds__(kLL128Threads)
    two_shot_ll128_add_rmsnorm_kernel(KernelArgs a, LL128Args ll, NormArgs n) {
  constexpr int W = 8 / sizeof(T);
  constexpr int K = kNormGroupsPerWarp;
  __shared__ RowSum<kNormClusterBlocks> row_sum;
  row_sum.init();
  const LL128Call<T, N> c(a, ll);
  const int64_t hidden = n.hidden;
  const int64_t row_groups = row_line_groups(hidden * static_cast<int64_t>(sizeof(T)));
  const int cluster_warp = static_cast<int>(cooperative_groups::this_cluster().block_rank()) * (kLL128Threads / 32) +
                           threadIdx.x / 32;
  const int cluster_index = blockIdx.x / kNormClusterBlocks;
  const int clusters = gridDim.x / kNormClusterBlocks;
  T* norm_out = static_cast<T*>(n.norm_out);
  const bool norm_aligned = aligned8(norm_out);
  const auto first_row = [&](int p) { return n.rows * p / N; };
  // Slot of row r's group j in a (parity, sender) region.
  const auto slot_of = [&](int64_t r, int64_t j) { return (r * row_groups + j) * kGroupSlots + c.lane; };
  const auto word = [&](int64_t j) { return j * kGroupDataWords + c.slot.first_word; };
  // The warp's k-th line group of a row.
  const auto group = [&](int k) { return static_cast<int64_t>(cluster_warp) + k * kNormClusterWarps; };
  // Every stage takes row i of each owner's rows (i = cluster, cluster + clusters, ...) and its
  // groups j = cluster_warp + k * 48, so the same warp pushes, reduces and receives a line on every
  // rank (spreading stages 1 and 2 over the whole grid measured the same on H200).
  const int64_t most_rows = (n.rows + N - 1) / N;

  // Stage 1: the other owners' rows.
  for (int64_t i = cluster_index; i < most_rows; i += clusters) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = group(k);
      if (j >= row_groups) continue;
#pragma unroll
      for (int step = 1; step < N; ++step) {
        const int owner = (a.rank + step) % N;
        const int64_t r = first_row(owner) + i;
        if (r >= first_row(owner + 1)) continue;
        store_line(ll.recv[owner] + c.parity + a.rank * ll.sender_slots + slot_of(r, j),
                   make_slot<T>(c.in + r * hidden, word(j), hidden, c.in_aligned, c.slot.two_words, c.flag));
      }
    }
  }
  // This rank's rows, one per cluster at a time: reduce, scale, push, write.
  const uint4* received = ll.recv[a.rank] + c.parity;
  int iteration = 0;
  for (int64_t r = first_row(a.rank) + cluster_index; r < first_row(a.rank + 1); r += clusters, ++iteration) {
    float acc[K][2 * W] = {};
    float weights[K][2 * W];
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = group(k);
      if (j >= row_groups) continue;
      // Loaded before the wait, as in the other LL128 kernels (load_slot_words).
      load_slot_weights<T>(n.weight, word(j), hidden, weights[k]);
      const uint4 residual = load_slot_words<T>(c.residual == nullptr ? nullptr : c.residual + r * hidden, word(j), hidden,
                                                c.residual_aligned, c.slot.two_words);
      receive_slot<T, N>(a, received, ll.sender_slots, slot_of(r, j), c.in + r * hidden, word(j), hidden, c.in_aligned,
                         c.slot.two_words, c.flag, acc[k]);
      add_slot_words<T>(residual, acc[k]);
#pragma unroll
      for (int e = 0; e < 2 * W; ++e) {
        acc[k][e] = Elem<T>::round(acc[k][e]);
        squares += acc[k][e] * acc[k][e];
      }
    }
    if (iteration == 0) row_sum.wait_ready();  // after the first row's lines arrived: off the critical path
    const float scale = rsqrtf(row_sum.add(squares, iteration, cluster_warp) / hidden + n.eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = group(k);
      if (j >= row_groups) continue;
      const uint4 line = pack_scaled_slot<T>(acc[k], c.slot.two_words, scale, c.flag);
#pragma unroll
      for (int step = 1; step < N; ++step)
        store_line(ll.recv[(a.rank + step) % N] + c.parity + a.rank * ll.sender_slots + slot_of(r, j), line);
      write_slot<T>(c.out + r * hidden, word(j), hidden, c.out_aligned, c.slot.two_words, line);
      store_norm_slot<T>(norm_out + r * hidden, weights[k], word(j), hidden, norm_aligned, c.slot.two_words, scale, acc[k]);
    }
  }
  if (iteration == 0) row_sum.wait_ready();  // a cluster without rows still completes the barrier

  // Stage 2: the other owners' rows, waiting on the group of every owner at once.
  for (int64_t i = cluster_index; i < most_rows; i += clusters) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = group(k);
      if (j >= row_groups) continue;
      float weights[2 * W];
      load_slot_weights<T>(n.weight, word(j), hidden, weights);
      const uint4* at[N - 1];
      bool want[N - 1];
      int64_t row[N - 1];
#pragma unroll
      for (int step = 1; step < N; ++step) {
        const int owner = (a.rank + step) % N;
        row[step - 1] = first_row(owner) + i;
        want[step - 1] = row[step - 1] < first_row(owner + 1);
        at[step - 1] = received + owner * ll.sender_slots + slot_of(row[step - 1], j);
      }
      uint4 lines[N - 1];
      wait_groups<N - 1, true>(at, want, c.flag, !c.slot.two_words, lines);
#pragma unroll
      for (int q = 0; q < N - 1; ++q) {
        if (!want[q]) continue;
        const float scale = __uint_as_float(__shfl_sync(0xffffffffu, lines[q].z, c.lane | 7));
        const int64_t r = row[q];
        write_slot<T>(c.out + r * hidden, word(j), hidden, c.out_aligned, c.slot.two_words, lines[q]);
        float values[Elem<T>::kPack];
        Elem<T>::unpack(make_int4(static_cast<int>(lines[q].x), static_cast<int>(lines[q].y),
                                  static_cast<int>(lines[q].z), static_cast<int>(lines[q].w)),
                        values);
        store_norm_slot<T>(norm_out + r * hidden, weights, word(j), hidden, norm_aligned, c.slot.two_words, scale, values);
      }
    }
  }
}

// ---- one-shot LL128 + residual + RMSNorm (NVLink) -----------------------------------------------
// Every rank pushes its whole input to every peer, in the row-aligned line groups of the two-shot
// kernel above (group j of row r at slot (r row_groups + j) of the sender's region), spread over
// the whole grid; then every rank reduces and normalizes every row itself, a cluster per row: the
// cluster's warp w holds the row's groups w (and w + its warps), waits on them from
// every peer at once, sums in rank order, adds residual_in and rounds once, and the cluster adds
// the row's squares (RowSum). One hop over the links, against two-shot's two, for N - 1 whole
// messages on the wire instead of 2 (N - 1) / N: the faster kernel while the links are not the
// limit (N = 2; docs/comm.md). Every rank computes every row with the same expressions, so the
// outputs are bit-identical across ranks. Flags, grid and parities are the other LL128 kernels';
// every rank receives every row from every peer in every call.
// Up to 32 rows of up to 48 line groups (bf16: 11520 elements), in two cluster shapes: up to 16
// rows, 16 clusters of 6 blocks, a warp per group; above, 32 clusters of 3 blocks, two groups per
// warp. (H200 x2, rows of 8192 bf16: a cluster that took a second row paid the whole chain of
// latencies again, 7.4 against 4.7 us at 32 and 16 rows with the 6-block shape, so more rows go
// to the read kernel; 3 blocks of 512 threads took 6.3 us at 32 rows, of 256 threads 5.9.)

constexpr int kOneShotNormRowGroups = 48;
constexpr int kOneShotNormFewRows = kLL128Blocks / 6;
constexpr int kOneShotNormMaxRows = kLL128Blocks / 3;

template <typename T, int N, int kClusterBlocks>
__global__ void __cluster_dims__(kClusterBlocks, 1, 1) __launch_bounds__(kLL128Threads)
    one_shot_ll128_add_rmsnorm_kernel(KernelArgs a, LL128Args ll, NormArgs n) {
  constexpr int W = 8 / sizeof(T);
  using Sum = RowSum<kClusterBlocks>;
  constexpr int K = kOneShotNormRowGroups / Sum::kWarps;  // groups per warp
  static_assert(K * Sum::kWarps == kOneShotNormRowGroups, "whole groups per warp");
  static_assert(kLL128Blocks % kClusterBlocks == 0, "the LL128 grid is a whole number of clusters");
  __shared__ Sum row_sum;
  row_sum.init();
  const LL128Call<T, N> c(a, ll);
  const int64_t hidden = n.hidden;
  const int64_t row_groups = row_line_groups(hidden * static_cast<int64_t>(sizeof(T)));
  const int64_t region = c.parity + a.rank * ll.sender_slots;  // where peers keep ours

  // Push every group (warp w: groups w, w + warps, ... of the flattened rows), two at a time, both
  // loaded before either is stored: a volatile store holds back the loads after it.
  const int64_t groups = n.rows * row_groups;
  for (int64_t g = c.first; g < groups; g += 2 * c.warps) {
    uint4 values[2];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int64_t h = g + b * c.warps;
      if (h < groups)
        values[b] = make_slot<T>(c.in + h / row_groups * hidden, c.word(h % row_groups), hidden, c.in_aligned,
                                 c.slot.two_words, c.flag);
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int64_t h = g + b * c.warps;
      if (h >= groups) continue;
#pragma unroll
      for (int step = 1; step < N; ++step)
        store_line(ll.recv[(a.rank + step) % N] + region + h * kGroupSlots + c.lane, values[b]);
    }
  }

  const uint4* received = ll.recv[a.rank] + c.parity;
  T* norm_out = static_cast<T*>(n.norm_out);
  const bool norm_aligned = aligned8(norm_out);
  const int cluster_warp = static_cast<int>(cooperative_groups::this_cluster().block_rank()) * (kLL128Threads / 32) +
                           static_cast<int>(threadIdx.x / 32);
  const auto group = [&](int k) { return static_cast<int64_t>(cluster_warp) + k * Sum::kWarps; };
  // The cluster's row: the launcher gives every row a cluster of its own.
  const int64_t r = blockIdx.x / kClusterBlocks;
  if (r >= n.rows) {
    row_sum.wait_ready();  // a cluster without a row still completes the barrier
    return;
  }
  // Everything this rank holds is loaded before the wait (load_slot_words says why). Lines are
  // indexed by sender (this rank's entry unused), so that every index is known at compile time.
  const uint4* at[K * N];
  bool want[K * N];
  uint4 own[K], residual[K];
  float weights[K][2 * W];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = group(k);
#pragma unroll
    for (int p = 0; p < N; ++p) {
      at[k * N + p] = received + p * ll.sender_slots + (r * row_groups + j) * kGroupSlots + c.lane;
      want[k * N + p] = p != a.rank && j < row_groups;
    }
    if (j >= row_groups) continue;
    own[k] = make_slot<T>(c.in + r * hidden, c.word(j), hidden, c.in_aligned, c.slot.two_words, c.flag);
    residual[k] = load_slot_words<T>(c.residual == nullptr ? nullptr : c.residual + r * hidden, c.word(j), hidden,
                                     c.residual_aligned, c.slot.two_words);
    load_slot_weights<T>(n.weight, c.word(j), hidden, weights[k]);
  }
  uint4 lines[K * N];
  wait_groups<K * N>(at, want, c.flag, !c.slot.two_words, lines);

  float acc[K][2 * W] = {};
  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (group(k) >= row_groups) continue;
#pragma unroll
    for (int p = 0; p < N; ++p) {
      const uint4 value = p == a.rank ? own[k] : lines[k * N + p];
      add_word<T>(make_uint2(value.x, value.y), acc[k]);
      if (c.slot.two_words) add_word<T>(make_uint2(value.z, value.w), acc[k] + W);
    }
    add_slot_words<T>(residual[k], acc[k]);
#pragma unroll
    for (int e = 0; e < 2 * W; ++e) {
      acc[k][e] = Elem<T>::round(acc[k][e]);
      squares += acc[k][e] * acc[k][e];
    }
  }
  row_sum.wait_ready();  // after the row's lines arrived: off the critical path
  const float scale = rsqrtf(row_sum.add(squares, 0, cluster_warp) / hidden + n.eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = group(k);
    if (j >= row_groups) continue;
    write_slot<T>(c.out + r * hidden, c.word(j), hidden, c.out_aligned, c.slot.two_words,
                  pack_slot<T>(acc[k], c.slot.two_words, c.flag));
    store_norm_slot<T>(norm_out + r * hidden, weights[k], c.word(j), hidden, norm_aligned, c.slot.two_words, scale,
                       acc[k]);
  }
}

}  // namespace splitflow::comm::detail
