// StreamDecoder: text comes out as soon as it is complete UTF-8, never a broken sequence, and the
// pieces add up to decode() of the whole sequence.
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace splitflow {
namespace {

std::vector<std::string> corpus_lines() {
  std::ifstream in(test::fixture_path("tokenizer/corpus.jsonl"));
  EXPECT_TRUE(in.good());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line).get<std::string>());
  return lines;
}

// Streams `ids`, checking every piece is valid UTF-8; returns the pieces.
std::vector<std::string> stream(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special) {
  StreamDecoder decoder(tokenizer, skip_special);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    pieces.push_back(decoder.push(id));
    EXPECT_TRUE(unicode::is_valid_utf8(pieces.back())) << "after id " << id;
  }
  pieces.push_back(decoder.finish());
  EXPECT_TRUE(unicode::is_valid_utf8(pieces.back()));
  return pieces;
}

std::string join(const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += p;
  return out;
}

// stories260K's 512-piece vocabulary has no CJK or emoji pieces: those characters become one
// byte-fallback token (<0xNN>, ids 3..258) per UTF-8 byte.
TEST(StreamDecoder, HoldsMultiByteCharactersSplitOverByteFallbackTokens) {
  const auto tokenizer = load_tokenizer_for_model(test::shared_path("models/stories260K/stories260K.bin"));
  const std::string text = "Lily saw 世界 and 😀!";
  const auto ids = tokenizer->encode(text, true);
  const auto pieces = stream(*tokenizer, ids, true);
  EXPECT_EQ(join(pieces), text);
  EXPECT_EQ(join(pieces), tokenizer->decode(ids, true));

  // Find the four byte tokens of 😀 (F0 9F 98 80): nothing comes out until the last one.
  const std::vector<int32_t> emoji = {3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80};
  const auto at = std::search(ids.begin(), ids.end(), emoji.begin(), emoji.end());
  ASSERT_NE(at, ids.end()) << "expected the emoji as byte-fallback tokens";
  const size_t first = size_t(at - ids.begin());
  EXPECT_EQ(pieces[first], "");
  EXPECT_EQ(pieces[first + 1], "");
  EXPECT_EQ(pieces[first + 2], "");
  EXPECT_NE(pieces[first + 3].find("😀"), std::string::npos);

  // 世 (E4 B8 96) likewise.
  const std::vector<int32_t> shi = {3 + 0xE4, 3 + 0xB8, 3 + 0x96};
  const auto at_shi = std::search(ids.begin(), ids.end(), shi.begin(), shi.end());
  ASSERT_NE(at_shi, ids.end());
  const size_t shi_first = size_t(at_shi - ids.begin());
  EXPECT_EQ(pieces[shi_first], "");
  EXPECT_EQ(pieces[shi_first + 1], "");
  EXPECT_NE(pieces[shi_first + 2].find("世"), std::string::npos);
}

// GPT-2's byte-level pieces also split characters: 世界 is four tokens, two bytes in one and one in
// the next.
TEST(StreamDecoder, HoldsCharactersSplitOverByteLevelTokens) {
  const auto tokenizer = load_tokenizer_for_model(test::shared_path("models/gpt2-tokenizer"));
  const auto ids = tokenizer->encode("世界", false);
  ASSERT_EQ(ids.size(), 4u);
  const auto pieces = stream(*tokenizer, ids, false);
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "世", "", "界", ""}));
}

// An unfinished sequence at the very end is flushed as U+FFFD by finish(), as decode() does.
TEST(StreamDecoder, FinishFlushesAnUnfinishedSequenceAsReplacementCharacter) {
  const auto tokenizer = load_tokenizer_for_model(test::shared_path("models/stories260K/stories260K.bin"));
  const std::vector<int32_t> ids = {tokenizer->encode("Hi", false)[0], 3 + 0xE4, 3 + 0xB8};
  StreamDecoder decoder(*tokenizer, false);
  std::string out;
  for (int32_t id : ids) out += decoder.push(id);
  const std::string rest = decoder.finish();
  EXPECT_EQ(rest, "\xEF\xBF\xBD");
  EXPECT_EQ(out + rest, tokenizer->decode(ids, false));
}

TEST(StreamDecoder, AddsUpToDecodeOnTheCorpusForEveryFormat) {
  const std::vector<std::string> models = {
      "models/llama2-tokenizer", "models/gpt2-tokenizer", "models/llama3_1-tokenizer", "models/qwen3-tokenizer",
      "models/deepseek_v3-tokenizer", "models/stories260K/stories260K.bin", "models/stories260K-gguf/stories260K.gguf",
      "tokenizer-vectors/ggml-vocab-bert-bge.gguf", "tokenizer-vectors/ggml-vocab-falcon.gguf"};
  const auto lines = corpus_lines();
  for (const auto& model : models) {
    const auto tokenizer = load_tokenizer_for_model(test::shared_path(model));
    for (const auto& line : lines) {
      const auto ids = tokenizer->encode(line, true);
      for (bool skip_special : {false, true}) {
        ASSERT_EQ(join(stream(*tokenizer, ids, skip_special)), tokenizer->decode(ids, skip_special))
            << model << " skip_special=" << skip_special << " line '" << line << "'";
      }
    }
  }
}

}  // namespace
}  // namespace splitflow
