// backend/host_mailboxes.h — point-to-point messages between the ranks of a job that live in one
// process (threads): one FIFO of byte messages per (sender, receiver) pair. The backends' send() /
// recv() use it for pipeline stages inside a process: the CPU tests' jobs, and a GPU stage next to
// a CPU stage (parallel/local_pipeline.h, llama.cpp's -ngl). Host memory only; never a device.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace splitflow {

// One FIFO of byte messages per (sender, receiver) pair of the job's ranks: send() never waits,
// recv() waits for the pair's next message and checks its size. A rank that stops (its thread
// failed) says so with fail(): a recv() that waits on it, now or later, throws naming the rank and
// its error, so a stage never waits forever on a stage that is gone.
class HostMailboxes {
 public:
  void send(int from, int to, const void* data, size_t bytes);
  void recv(int from, int to, void* data, size_t bytes);
  void fail(int rank, const std::string& reason);

 private:
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::pair<int, int>, std::deque<std::vector<unsigned char>>> boxes_;
  std::map<int, std::string> failed_;  // rank -> its error
};

}  // namespace splitflow
