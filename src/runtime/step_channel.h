// runtime/step_channel.h — how the ranks of a tensor-parallel group stay in step: the leader's
// ModelRunner (rank 0, the only one with a scheduler) publishes every call it receives as a
// message, and each follower's runner receives the messages in order and makes the same call, so
// every rank issues the same kernels and collectives. Implementations (shared memory in a node,
// in-process) live in parallel/; this header is only the contract the runner needs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace splitflow {

class StepChannel {
 public:
  virtual ~StepChannel() = default;
  // Leader: makes `message` the next one every follower receives. Returns once it is written (it
  // may wait for the followers to have read the previous one). Throws splitflow::Error when a
  // follower stopped taking messages.
  virtual void publish(std::span<const int32_t> message) = 0;
  // Follower: the next message, waiting for it as long as it takes.
  virtual std::vector<int32_t> receive() = 0;
  // Follower: it stops following for good (it failed): the leader no longer waits for it to take
  // messages, so shutting the group down cannot hang on it. It receives nothing more.
  virtual void leave() {}
};

}  // namespace splitflow
