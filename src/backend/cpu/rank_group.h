// backend/cpu/rank_group.h — the ranks of a tensor-parallel group inside one process, one thread
// each, for the CPU backend's allreduce() (their send() / recv() go through
// backend/host_mailboxes.h). It is how the CPU test suite runs tensor, pipeline and hybrid
// parallelism (the same shards, plans and stage links as the GPU ranks) with nothing but threads.
// Owns only the rendezvous; never a device, never a process.
#pragma once

#include <barrier>
#include <cstdint>
#include <vector>

namespace splitflow {

class CpuRankGroup {
 public:
  explicit CpuRankGroup(int size);
  int size() const { return size_; }

  // Called by every rank with its own partial [count] f32: residual [count] += the sum of every
  // rank's partial, in rank order (so each rank gets the same bits), or, with residual null,
  // partial = that sum. Blocks until every rank has read every partial.
  void allreduce(int rank, float* partial, float* residual, int64_t count);
  // Called by every rank with its own part [rows, shard] f32: full [rows, size x shard] gets rank
  // r's part in columns [r shard, (r+1) shard) on every rank. Blocks until every rank has copied.
  void gather_columns(int rank, const float* part, float* full, int64_t rows, int64_t shard);
  // Called by every rank with its own data [size x count] f32 holding its block [rank count,
  // (rank+1) count): every rank's data gets every block. Blocks until every rank has copied.
  void allgather(int rank, float* data, int64_t count);

 private:
  int size_;
  std::vector<float*> partials_;
  std::vector<const float*> parts_;
  std::vector<float> sum_;  // rank 0 sums, every rank copies out (in place: partials are read first)
  std::barrier<> arrive_, summed_, copied_;
};

}  // namespace splitflow
