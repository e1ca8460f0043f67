#include "embedding/embedding_input.h"

#include "core/error.h"

#include <algorithm>

namespace splitflow {

SpecialFrame special_frame(const Tokenizer& tokenizer) {
  // A one-word text: its tokens with specials are prefix + plain + suffix.
  constexpr std::string_view kProbe = "a";
  const std::vector<int32_t> plain = tokenizer.encode(kProbe, /*add_special=*/false);
  const std::vector<int32_t> framed = tokenizer.encode(kProbe, /*add_special=*/true);
  SpecialFrame frame;
  const auto at = std::search(framed.begin(), framed.end(), plain.begin(), plain.end());
  SF_CHECK(!plain.empty() && at != framed.end(),
           "embedding input: the tokenizer's special tokens do not frame the text (cannot truncate it)");
  frame.prefix.assign(framed.begin(), at);
  frame.suffix.assign(at + static_cast<std::ptrdiff_t>(plain.size()), framed.end());
  return frame;
}

std::vector<int32_t> encode_for_embedding(const Tokenizer& tokenizer, const SpecialFrame& frame, std::string_view text,
                                          int32_t max_tokens) {
  const int64_t frame_tokens = static_cast<int64_t>(frame.prefix.size() + frame.suffix.size());
  SF_CHECK(max_tokens > frame_tokens, "embedding input: a limit of {} tokens leaves no room for text beside {} special tokens",
           max_tokens, frame_tokens);
  std::vector<int32_t> ids = tokenizer.encode(text, /*add_special=*/true);
  if (static_cast<int64_t>(ids.size()) <= max_tokens) return ids;
  // The text's tokens sit between the frame (the post-processor added it): keep the first ones.
  std::vector<int32_t> out(frame.prefix);
  const auto text_begin = ids.begin() + static_cast<std::ptrdiff_t>(frame.prefix.size());
  out.insert(out.end(), text_begin, text_begin + (max_tokens - frame_tokens));
  out.insert(out.end(), frame.suffix.begin(), frame.suffix.end());
  return out;
}

}  // namespace splitflow
