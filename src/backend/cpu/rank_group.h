// backend/cpu/rank_group.h — the ranks of a job inside one process, one thread each: a
// tensor-parallel group for the CPU backend's allreduce(), and the job's point-to-point mailboxes
// for its send() / recv() (pipeline stages). It is how the CPU test suite runs tensor, pipeline
// and hybrid parallelism (the same shards, plans and stage links as the GPU ranks) with nothing
// but threads. Owns only the rendezvous; never a device, never a process.
#pragma once

#include <barrier>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <utility>
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

 private:
  int size_;
  std::vector<float*> partials_;
  std::vector<float> sum_;  // rank 0 sums, every rank copies out (in place: partials are read first)
  std::barrier<> arrive_, summed_, copied_;
};

// One FIFO of byte messages per (sender, receiver) pair of the job's ranks: send() never waits,
// recv() waits for the pair's next message and checks its size.
class CpuMailboxes {
 public:
  void send(int from, int to, const void* data, size_t bytes);
  void recv(int from, int to, void* data, size_t bytes);

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::pair<int, int>, std::deque<std::vector<unsigned char>>> boxes_;
};

}  // namespace splitflow
