#include "tokenizer/tokenizer.h"

#include "tokenizer/unicode.h"

namespace splitflow {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  const std::string text = tokenizer_.decode(ids_, skip_special_);
  // decode() turns an unfinished UTF-8 sequence at the end into U+FFFD; wait for more bytes.
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  if (text.size() <= context_text_.size() || text.ends_with(kReplacement)) return "";
  // A decoder whose output for the context changes with what follows cannot be streamed exactly;
  // emit from the first difference so the stream at least stays valid UTF-8.
  size_t common = context_text_.size();
  if (text.compare(0, common, context_text_) != 0) {
    common = 0;
    while (common < context_text_.size() && text[common] == context_text_[common]) ++common;
    while (common > 0 && (static_cast<uint8_t>(text[common]) & 0xC0) == 0x80) --common;
  }
  std::string emitted = text.substr(common);
  // The ids just emitted become the context for the next ones.
  ids_.erase(ids_.begin(), ids_.begin() + context_ids_);
  context_ids_ = ids_.size();
  context_text_ = tokenizer_.decode(ids_, skip_special_);
  return emitted;
}

std::string StreamDecoder::finish() {
  const std::string text = tokenizer_.decode(ids_, skip_special_);
  std::string rest = text.size() > context_text_.size() ? text.substr(context_text_.size()) : "";
  ids_.clear();
  context_ids_ = 0;
  context_text_.clear();
  return unicode::make_valid_utf8(rest);
}

}  // namespace splitflow
