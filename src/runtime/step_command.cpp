#include "runtime/step_command.h"

#include "core/error.h"

#include <cstring>

namespace splitflow {

namespace {

constexpr int32_t kMagic = 0x53465354;  // "SFST"

class Reader {
 public:
  explicit Reader(std::span<const int32_t> words) : words_(words) {}
  int32_t next() {
    SF_CHECK(at_ < words_.size(), "step message: truncated after {} words", words_.size());
    return words_[at_++];
  }
  int32_t count(const char* what) {
    const int32_t n = next();
    SF_CHECK(n >= 0 && static_cast<size_t>(n) <= words_.size() - at_, "step message: {} count {} exceeds the message",
             what, n);
    return n;
  }
  void words(int32_t* out, size_t n) {
    SF_CHECK(n <= words_.size() - at_, "step message: truncated after {} words", words_.size());
    if (n == 0) return;  // `out` may be an empty vector's null data(): memcpy's pointers must not be
    std::memcpy(out, words_.data() + at_, n * sizeof(int32_t));
    at_ += n;
  }
  bool done() const { return at_ == words_.size(); }

 private:
  std::span<const int32_t> words_;
  size_t at_ = 0;
};

}  // namespace

std::vector<int32_t> encode_step_call(const StepCall& call) {
  std::vector<int32_t> out{kMagic, static_cast<int32_t>(call.kind)};
  const ForwardBatch& batch = call.batch;
  switch (call.kind) {
    case StepCallKind::Forward:
    case StepCallKind::ForwardSample:
    case StepCallKind::ForwardSampleMasked:
    case StepCallKind::ForwardHidden: {
      out.push_back(static_cast<int32_t>(batch.logits_mode));
      out.push_back(batch.num_tokens());
      out.insert(out.end(), batch.token_ids.begin(), batch.token_ids.end());
      out.push_back(static_cast<int32_t>(batch.spans.size()));
      for (const SequenceSpan& span : batch.spans) {
        out.insert(out.end(), {span.num_tokens, span.start_position, span.want_logits ? 1 : 0,
                               static_cast<int32_t>(span.block_table.size())});
        out.insert(out.end(), span.block_table.begin(), span.block_table.end());
      }
      out.push_back(static_cast<int32_t>(call.rows.size()));
      static_assert(sizeof(SamplingRow) == kSamplingRowWords * sizeof(int32_t));
      const size_t at = out.size();
      out.resize(at + call.rows.size() * kSamplingRowWords);
      if (!call.rows.empty()) std::memcpy(out.data() + at, call.rows.data(), call.rows.size() * sizeof(SamplingRow));
      break;
    }
    case StepCallKind::SwapBlocks:
      out.push_back(static_cast<int32_t>(call.direction));
      out.push_back(static_cast<int32_t>(call.copies.size()));
      for (const BlockCopy& copy : call.copies) out.insert(out.end(), {copy.device_block, copy.host_block});
      break;
    case StepCallKind::WarmUp:
      out.push_back(call.device_sampling ? 1 : 0);
      break;
    case StepCallKind::Stop:
      break;
  }
  return out;
}

StepCall decode_step_call(std::span<const int32_t> words) {
  Reader in(words);
  SF_CHECK(in.next() == kMagic, "step message: not a step call");
  StepCall call;
  const int32_t kind = in.next();
  SF_CHECK(kind >= static_cast<int32_t>(StepCallKind::Forward) && kind <= static_cast<int32_t>(StepCallKind::Stop),
           "step message: unknown call {}", kind);
  call.kind = static_cast<StepCallKind>(kind);
  switch (call.kind) {
    case StepCallKind::Forward:
    case StepCallKind::ForwardSample:
    case StepCallKind::ForwardSampleMasked:
    case StepCallKind::ForwardHidden: {
      const int32_t mode = in.next();
      SF_CHECK(mode == static_cast<int32_t>(LogitsMode::Last) || mode == static_cast<int32_t>(LogitsMode::All),
               "step message: logits mode {}", mode);
      call.batch.logits_mode = static_cast<LogitsMode>(mode);
      call.batch.token_ids.resize(in.count("token"));
      in.words(call.batch.token_ids.data(), call.batch.token_ids.size());
      call.batch.spans.resize(in.count("span"));
      for (SequenceSpan& span : call.batch.spans) {
        span.num_tokens = in.next();
        span.start_position = in.next();
        span.want_logits = in.next() != 0;
        span.block_table.resize(in.count("block table"));
        in.words(span.block_table.data(), span.block_table.size());
      }
      const int32_t rows = in.count("sampling row");
      call.rows.resize(rows);
      SF_CHECK(static_cast<size_t>(rows) * kSamplingRowWords <= words.size(), "step message: {} sampling rows", rows);
      if (rows > 0) in.words(reinterpret_cast<int32_t*>(call.rows.data()), static_cast<size_t>(rows) * kSamplingRowWords);
      break;
    }
    case StepCallKind::SwapBlocks: {
      const int32_t direction = in.next();
      SF_CHECK(direction == 0 || direction == 1, "step message: copy direction {}", direction);
      call.direction = static_cast<CopyDirection>(direction);
      call.copies.resize(in.count("block copy"));
      for (BlockCopy& copy : call.copies) {
        copy.device_block = in.next();
        copy.host_block = in.next();
      }
      break;
    }
    case StepCallKind::WarmUp:
      call.device_sampling = in.next() != 0;
      break;
    case StepCallKind::Stop:
      break;
  }
  SF_CHECK(in.done(), "step message: {} words left over", words.size());
  return call;
}

}  // namespace splitflow
