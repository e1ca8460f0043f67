// runtime/step_command.h — the messages of runtime/step_channel.h: one ModelRunner call and its
// arguments as int32 words, encoded by the leader and decoded by each follower. Malformed words
// (a truncated or foreign message) are a splitflow::Error, never a read past the end.
#pragma once

#include "core/block_copy.h"
#include "runtime/batch.h"
#include "sampling/sampling_rule.h"

#include <cstdint>
#include <span>
#include <vector>

namespace splitflow {

enum class StepCallKind : int32_t {
  Forward = 1,
  ForwardSample,
  ForwardSampleMasked,  // forward_sample with vocabulary masks (the followers allow every token)
  ForwardHidden,
  SwapBlocks,
  WarmUp,
  Stop,  // release_followers()
};

struct StepCall {
  StepCallKind kind = StepCallKind::Stop;
  ForwardBatch batch;                 // the forward calls
  std::vector<SamplingRow> rows;      // ForwardSample, ForwardSampleMasked
  std::vector<BlockCopy> copies;      // SwapBlocks
  CopyDirection direction = CopyDirection::DeviceToHost;
  bool device_sampling = true;        // WarmUp
};

std::vector<int32_t> encode_step_call(const StepCall& call);
StepCall decode_step_call(std::span<const int32_t> words);

}  // namespace splitflow
