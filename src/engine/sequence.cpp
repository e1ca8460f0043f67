#include "engine/sequence.h"

#include "core/error.h"

#include <utility>

namespace splitflow {

Sequence::Sequence(int64_t id, std::vector<int32_t> prompt_ids, SamplingParams params, double arrival_time_s)
    : id(id),
      token_ids(std::move(prompt_ids)),
      num_prompt_tokens(static_cast<int32_t>(token_ids.size())),
      params(std::move(params)),
      arrival_time_s(arrival_time_s) {
  SF_CHECK(!token_ids.empty(), "sequence {}: the prompt is empty", id);
}

}  // namespace splitflow
