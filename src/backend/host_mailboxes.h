// backend/host_mailboxes.h — point-to-point messages between the ranks of a job that live in one
// process (threads): one FIFO of byte messages per (sender, receiver) pair. The backends' send() /
// recv() use it for pipeline stages inside a process: the CPU tests' jobs, and a GPU stage next to
// a CPU stage (parallel/local_pipeline.h, llama.cpp's -ngl). Host memory only; never a device.
// Messages are typed: the CPU backend's residual stream is f32 and a GPU's bf16, so a float message
// arrives converted to the dtype its receiver holds (on the host, where the bytes pass anyway).
#pragma once

#include "core/dtype.h"

#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace splitflow {

// One FIFO of messages (`count` elements of `dtype`) per (sender, receiver) pair of the job's ranks:
// send() never waits; recv() waits for the pair's next message, checks its element count, and
// converts it when sender and receiver hold different float types (f32, f16, bf16); any other
// difference of dtype throws naming both. A rank that stops (its thread
// failed) says so with fail(): a recv() that waits on it, now or later, throws naming the rank and
// its error, so a stage never waits forever on a stage that is gone.
class HostMailboxes {
 public:
  void send(int from, int to, const void* data, DType dtype, int64_t count);
  void recv(int from, int to, void* data, DType dtype, int64_t count);
  void fail(int rank, const std::string& reason);
  // Bytes `from` has sent `to` so far (what a stage-to-stage transfer costs).
  int64_t bytes_sent(int from, int to) const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  struct Message {
    DType dtype;
    int64_t count;
    std::vector<unsigned char> bytes;
  };
  std::map<std::pair<int, int>, std::deque<Message>> boxes_;
  std::map<int, std::string> failed_;  // rank -> its error
  std::map<std::pair<int, int>, int64_t> bytes_sent_;
};

}  // namespace splitflow
