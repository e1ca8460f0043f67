// parallel/shm_step_channel.h — runtime/step_channel.h over shared memory, for the ranks of one
// node (processes, or threads in the CPU tests): rank 0 writes each message into a mapped file and
// bumps a sequence number; every follower spins briefly, then sleeps in growing steps, until the
// number moves, copies the message out and acknowledges it; rank 0 writes the next message once
// every follower acknowledged the last. Measured against NCCL broadcast in docs/parallel.md.
// Owns the mapping and the protocol; never a device.
#pragma once

#include "comm/file_store.h"
#include "runtime/step_channel.h"

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace splitflow {

class SharedMemoryStepChannel final : public StepChannel {
 public:
  static constexpr int kMaxRanks = 64;

  // Collective over the job's store: rank 0 creates the mapping (in /dev/shm, else the store's
  // directory) and announces its path under `name`; the others open it; the file is unlinked once
  // all have it mapped. capacity_words bounds one message. `timeout` bounds the leader's wait for
  // followers to take a message (a follower waits for messages without limit).
  SharedMemoryStepChannel(comm::FileStore& store, const std::string& name, size_t capacity_words = size_t{1} << 24,
                          std::chrono::milliseconds timeout = std::chrono::minutes(10));
  ~SharedMemoryStepChannel() override;
  SharedMemoryStepChannel(const SharedMemoryStepChannel&) = delete;
  SharedMemoryStepChannel& operator=(const SharedMemoryStepChannel&) = delete;

  void publish(std::span<const int32_t> message) override;
  std::vector<int32_t> receive() override;
  // Its acknowledgement becomes "every message": publish() never waits for it again.
  void leave() override;

 private:
  struct Header;
  Header* header() const;
  int32_t* payload() const;

  int rank_ = 0, world_size_ = 1;
  size_t capacity_words_ = 0;
  std::chrono::milliseconds timeout_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  uint64_t sequence_ = 0;  // messages published (leader) or received (follower) so far
};

}  // namespace splitflow
