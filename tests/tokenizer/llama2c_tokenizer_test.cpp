// llama2.c tokenizer.bin: the ids and texts recorded for stories260K (models/README.md,
// golden.json, expected_greedy_200.txt from llama2.c's test_all.py), and agreement with the same
// vocabulary in other formats (HF tokenizer.json, GGUF) on the test corpus.
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace splitflow {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<std::string> corpus_lines() {
  std::vector<std::string> lines;
  std::istringstream in(read_file(test::fixture_path("tokenizer/corpus.jsonl")));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line).get<std::string>());
  // Story text too: the vocabulary's home ground.
  std::istringstream stories(read_file(test::shared_path("data/tinystories_valid_head.txt")).substr(0, 200000));
  for (std::string line; std::getline(stories, line);) lines.push_back(line);
  return lines;
}

// Lines where llama2.c differs from SentencePiece by design are left out of the format
// comparisons: llama2.c does not parse special tokens in text, and its vocabulary stores "▁" as a
// plain space, so a literal U+2581 in the text is not a space to it.
bool differs_by_design(const std::string& line) {
  return line.find("<s>") != std::string::npos || line.find("</s>") != std::string::npos ||
         line.find("<unk>") != std::string::npos || line.find("\xE2\x96\x81") != std::string::npos;
}

TEST(Llama2cTokenizer, OnceUponATimeMatchesTheRecordedIds) {
  const auto tokenizer = load_tokenizer_for_model(test::shared_path("models/stories260K/stories260K.bin"));
  EXPECT_EQ(tokenizer->vocab_size(), 512);
  EXPECT_EQ(tokenizer->encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->encode("Once upon a time", false), (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_EQ(tokenizer->encode("", true), std::vector<int32_t>{1});
  EXPECT_EQ(tokenizer->bos_id(), 1);
  EXPECT_EQ(tokenizer->eos_ids(), std::vector<int32_t>{2});
}

TEST(Llama2cTokenizer, DecodesTheGoldenGenerations) {
  const auto tokenizer = load_tokenizer_for_model(test::shared_path("models/stories260K/stories260K.bin"));
  const auto golden = nlohmann::json::parse(read_file(test::shared_path("models/stories260K/golden.json")));
  const auto greedy = golden["greedy_from_bos"]["token_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(tokenizer->decode(greedy, true), read_file(test::shared_path("models/stories260K/expected_greedy_200.txt")));

  const auto& prompt = golden["prompt_greedy"];
  auto ids = prompt["prompt_ids_with_bos"].get<std::vector<int32_t>>();
  EXPECT_EQ(tokenizer->encode(prompt["prompt"].get<std::string>(), true), ids);
  const auto generated = prompt["generated_ids"].get<std::vector<int32_t>>();
  ids.insert(ids.end(), generated.begin(), generated.end());
  EXPECT_EQ(tokenizer->decode(ids, true), prompt["prompt"].get<std::string>() + prompt["generated_text"].get<std::string>());
}

TEST(Llama2cTokenizer, FindsItsOwnTokenizerNextToAnotherCheckpoint) {
  // aidreams260K ships a different tok512.bin; its greedy text must round-trip through it.
  const auto tokenizer = load_tokenizer_for_model(test::shared_path("models/aidreams260K/aidreams260K.bin"));
  const std::string text = read_file(test::shared_path("models/aidreams260K/expected_greedy_128.txt"));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(text, true), true), text);
}

void expect_same_encoding(const Tokenizer& reference, const Tokenizer& other, const char* label) {
  size_t compared = 0;
  for (const std::string& line : corpus_lines()) {
    if (differs_by_design(line)) continue;
    ++compared;
    ASSERT_EQ(other.encode(line, true), reference.encode(line, true)) << label << " line: '" << line << "'";
    const auto ids = reference.encode(line, false);
    ASSERT_EQ(other.decode(ids, true), reference.decode(ids, true)) << label << " line: '" << line << "'";
  }
  EXPECT_GT(compared, 1000u);
}

TEST(Llama2cTokenizer, Llama2TokenizerBinAgreesWithTokenizerJson) {
  const auto bin = load_llama2c_tokenizer(test::shared_path("models/llama2-tokenizer/tokenizer.bin"), 32000);
  const auto json = load_hf_tokenizer(test::shared_path("models/llama2-tokenizer/tokenizer.json"));
  expect_same_encoding(*json, *bin, "llama2 tokenizer.bin vs tokenizer.json");
}

TEST(Llama2cTokenizer, Tok512AgreesWithItsHfAndGgufConversions) {
  const auto bin = load_tokenizer_for_model(test::shared_path("models/stories260K/stories260K.bin"));
  const auto hf = load_tokenizer_for_model(test::shared_path("models/stories260K-hf"));
  const auto gguf = load_tokenizer_for_model(test::shared_path("models/stories260K-gguf/stories260K.gguf"));
  expect_same_encoding(*hf, *bin, "tok512.bin vs stories260K-hf tokenizer.json");
  expect_same_encoding(*hf, *gguf, "stories260K.gguf vs stories260K-hf tokenizer.json");
}

}  // namespace
}  // namespace splitflow
