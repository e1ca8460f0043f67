// comm/custom_allreduce.h — the latency-optimal allreduce over CUDA IPC (one process per GPU, all
// GPUs of one node with peer access): one-shot, two-shot and half-butterfly kernels, the fused
// allreduce + residual (+ RMSNorm) variants, and CUDA-graph support. Device code and the
// synchronization protocol are described in comm/custom_allreduce_kernels.cuh.
//
// Memory. Each rank cudaMallocs, zeroes and exports (cudaIpcGetMemHandle) four allocations:
//   meta:    the barrier flags, then the tmp buffer (two-shot partitions, half-butterfly partials)
//   staging: three buffers of max_bytes: two that eager calls alternate between, one for captured
//            calls whose input cannot be read in place
//   ll, ll128: receive buffers of the one-shot LL and LL128 protocols (two parities per sender),
//            into which peers push their input with flags: those calls need no staging, barrier
//            or graph registration
// and opens every peer's, all through the bootstrap store at construction.
//
// Eager calls launch one kernel, which first copies this rank's input into a staging buffer (the
// two alternate from call to call) and then reads every peer's.
// Inside stream capture, a call records its input pointer instead (a plain cudaMalloc allocation,
// 16-byte aligned, not overlapping the outputs; otherwise the copy is captured too) and reads a
// pointer slot that register_graph_buffers() fills after capture by exchanging the IPC handles of
// the recorded buffers: no host synchronization ever happens inside a kernel or a graph. Every
// rank must issue the same sequence of calls (same algorithm, size and dtype), eager or captured.
#pragma once

#include "comm/allreduce_selection.h"
#include "comm/file_store.h"
#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

namespace splitflow::comm {

class CustomAllreduce {
 public:
  static constexpr int kDefaultMaxBlocks = 96;  // bench/results/allreduce: 64 to 132 within 2% on H200

  // Collective over `store` (every rank calls it); `device` must be current. `max_bytes`: largest
  // message. `max_blocks`: grid limit of a kernel (the same on every rank).
  CustomAllreduce(FileStore& store, int device, size_t max_bytes, int max_blocks = kDefaultMaxBlocks);
  ~CustomAllreduce();
  CustomAllreduce(const CustomAllreduce&) = delete;
  CustomAllreduce& operator=(const CustomAllreduce&) = delete;

  int rank() const;
  int world_size() const;
  size_t max_bytes() const;
  int max_blocks() const;
  // For the benchmark's sweep; every rank must set the same value between the same calls.
  void set_max_blocks(int max_blocks);
  // One-shot calls up to this many bytes use the LL protocol (pushed packs with flags, no
  // barriers); set (for the benchmark's comparison) up to ll_capacity_bytes(), the same on every
  // rank.
  size_t ll_max_bytes() const;
  size_t ll_capacity_bytes() const;
  void set_ll_max_bytes(size_t bytes);
  // One-shot calls above the LL limit, and two-shot calls, up to this many bytes use LL128 (pushed
  // 128-byte lines with their flags): NVLink only, 0 elsewhere (CommGroup sets it from the
  // topology); set (for the benchmark's comparison) up to ll128_capacity_bytes(), the same on
  // every rank.
  size_t ll128_max_bytes() const;
  size_t ll128_capacity_bytes() const;
  void set_ll128_max_bytes(size_t bytes);

  // out = sum over ranks of `in` (+ `residual` when not null; tensor parallelism keeps it identical
  // on every rank, as two-shot adds it where each partition is reduced). `count` elements of F32,
  // F16 or BF16; 1 <= count * size <= max_bytes; `algorithm` must not be Nccl, HalfButterfly
  // needs a power-of-two world size. `out` may alias `in` or `residual`.
  void allreduce(AllreduceAlgorithm algorithm, const void* in, void* out, size_t count, DType dtype,
                 cudaStream_t stream, const void* residual = nullptr);

  // Whether allreduce_add_rmsnorm handles rows of `hidden` elements (a whole number of 16-byte
  // packs, at most 2048 packs: 16384 bf16).
  static bool fused_rmsnorm_supported(size_t hidden, DType dtype);
  // Whether its two-shot kernel takes [rows, hidden] too: LL128 on (NVLink) and the message within
  // its limit, every rank owning a row (rows >= world size), the rows' lines within the LL128 buffers.
  bool two_shot_rmsnorm_supported(size_t rows, size_t hidden, DType dtype) const;
  // Whether its one-shot LL128 kernel takes [rows, hidden]: LL128 on (NVLink) and the message
  // within its limit, at most 32 rows (a cluster of blocks each) of at most 48 line groups (11520
  // bf16), the rows' lines within the LL128 buffers. The one-shot call runs it there when it is
  // enabled (below), and otherwise reads the peers' staged inputs.
  bool one_shot_rmsnorm_ll128(size_t rows, size_t hidden, DType dtype) const;
  // The one-shot LL128 kernel is enabled by default on two GPUs only, the one world it has been
  // timed and tested on; tests and the benchmark enable it to run it on more (issue 7). Set it
  // the same on every rank.
  bool one_shot_rmsnorm_ll128_enabled() const;
  void set_one_shot_rmsnorm_ll128(bool enabled);
  // One kernel: residual_out = sum over ranks of `in` + residual_in;
  // norm_out = residual_out * rsqrt(mean(residual_out^2) + eps) * weight, per row. `algorithm`:
  // OneShot (every rank gets every peer's rows, pushed over LL128 or read after a barrier, and
  // normalizes all of them) or TwoShot (LL128: each row's owner reduces and normalizes it, then
  // pushes it with its scale; see two_shot_rmsnorm_supported). Shapes: in, residual_in,
  // residual_out, norm_out [rows, hidden] of `dtype`; weight [hidden] f32. residual_out may alias
  // residual_in.
  void allreduce_add_rmsnorm(AllreduceAlgorithm algorithm, const void* in, const void* residual_in, void* residual_out,
                             void* norm_out, const float* weight, float eps, size_t rows, size_t hidden, DType dtype,
                             cudaStream_t stream);

  // Collective, after capturing graphs that contain custom allreduces (before replaying them):
  // exchanges the IPC handles of the buffers those captures recorded and fills their slots.
  void register_graph_buffers();
  size_t unregistered_graph_buffers() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace splitflow::comm
