#include "engine/stop_checker.h"

#include "core/error.h"

#include <algorithm>

namespace splitflow {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, std::span<const int32_t> eos_token_ids)
    : stop_strings_(params.stop), stop_token_ids_(params.stop_token_ids), max_tokens_(params.max_tokens) {
  params.validate();
  if (!params.ignore_eos) stop_token_ids_.insert(stop_token_ids_.end(), eos_token_ids.begin(), eos_token_ids.end());
}

bool StopChecker::is_stop_token(int32_t token_id) const {
  return std::find(stop_token_ids_.begin(), stop_token_ids_.end(), token_id) != stop_token_ids_.end();
}

void StopChecker::append(int32_t token_id, std::string_view text) {
  SF_CHECK(!finished(), "stop checker: token {} appended after the sequence finished ({})", token_id,
           finish_reason_name(reason_));
  ++num_tokens_;
  if (is_stop_token(token_id)) {
    reason_ = FinishReason::Stop;
    matched_stop_token_ = token_id;
    safe_bytes_ = text_.size();
    return;
  }
  const size_t old_size = text_.size();
  text_.append(text);
  scan(old_size, /*may_start_before=*/true);
  if (!finished() && num_tokens_ >= max_tokens_) {
    reason_ = FinishReason::Length;
    safe_bytes_ = text_.size();
  }
}

void StopChecker::append_final_text(std::string_view text) {
  SF_CHECK(finished(), "stop checker: append_final_text before the sequence finished");
  if (!matched_stop_string_.empty()) return;
  const size_t old_size = text_.size();
  text_.append(text);
  const FinishReason reason = reason_;
  reason_ = FinishReason::None;
  scan(old_size, /*may_start_before=*/false);
  if (!finished()) reason_ = reason;
  safe_bytes_ = text_.size();
}

void StopChecker::finish(FinishReason reason) {
  SF_CHECK(reason != FinishReason::None, "stop checker: finish() needs a reason");
  if (finished()) return;
  reason_ = reason;
  safe_bytes_ = text_.size();
}

void StopChecker::scan(size_t old_size, bool may_start_before) {
  // A stop string completed by this text ends in it, so it starts at most len-1 bytes earlier;
  // the earliest start among all stop strings wins.
  size_t stop_at = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& stop : stop_strings_) {
    const size_t reach_back = may_start_before ? stop.size() - 1 : 0;
    const size_t from = old_size >= reach_back ? old_size - reach_back : 0;
    const size_t at = text_.find(stop, from);
    if (at < stop_at) {
      stop_at = at;
      matched = &stop;
    }
  }
  if (matched != nullptr) {
    text_.resize(stop_at);
    reason_ = FinishReason::Stop;
    matched_stop_string_ = *matched;
    safe_bytes_ = text_.size();
    return;
  }
  // Hold back the longest suffix that could still grow into a stop string.
  size_t held = 0;
  for (const std::string& stop : stop_strings_) {
    for (size_t length = std::min(stop.size() - 1, text_.size()); length > held; --length) {
      if (std::string_view(text_).substr(text_.size() - length) == std::string_view(stop).substr(0, length)) {
        held = length;
        break;
      }
    }
  }
  safe_bytes_ = text_.size() - held;
}

}  // namespace splitflow
