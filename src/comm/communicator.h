// comm/communicator.h — the collectives tensor and pipeline parallelism use, one process per GPU:
// every call is collective over the ranks of the job (send/recv over the pair), enqueued on
// `stream`, and returns without waiting for the device. Buffers are device memory.
#pragma once

#include "core/dtype.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace splitflow::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // out = sum over ranks of in; `count` elements of F32, F16 or BF16. out may equal in.
  virtual void allreduce(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) = 0;
  // out [world_size, count] = every rank's in [count], in rank order.
  virtual void allgather(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) = 0;
  // out [count] = sum over ranks of in[rank * count .. (rank + 1) * count); in is [world_size, count].
  virtual void reduce_scatter(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) = 0;
  // out = root's in on every rank (`in` is read on the root only).
  virtual void broadcast(const void* in, void* out, size_t count, DType dtype, int root, cudaStream_t stream) = 0;
  // Point to point: `peer` must post the matching recv / send.
  virtual void send(const void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) = 0;
  virtual void recv(void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) = 0;
};

}  // namespace splitflow::comm
