// Bad tokenizer inputs end in splitflow::Error messages that name the file or field and the problem.
#include "core/error.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

namespace splitflow {
namespace {

namespace fs = std::filesystem;

// A scratch directory removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    path_ = fs::temp_directory_path() / ("splitflow_tokenizer_" + std::to_string(::getpid()) + "_" +
                                         testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
    return (path_ / name).string();
  }
  std::string path(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Runs `load` and returns the Error message ("" when nothing was thrown).
template <typename Fn>
std::string error_of(Fn load) {
  try {
    load();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

#define EXPECT_ERROR_CONTAINS(expr, fragment)                                             \
  do {                                                                                    \
    const std::string message = error_of([&] { (void)(expr); });                          \
    EXPECT_NE(message.find(fragment), std::string::npos) << "message: '" << message << "'"; \
  } while (0)

const std::string kTinyBpe = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";

TEST(TokenizerBadInput, MissingFiles) {
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer("/nonexistent/tokenizer.json"), "'/nonexistent/tokenizer.json' does not exist");
  EXPECT_ERROR_CONTAINS(load_llama2c_tokenizer("/nonexistent/tok.bin", 512), "/nonexistent/tok.bin");
  EXPECT_ERROR_CONTAINS(load_tokenizer_for_model("/nonexistent/model"), "model path '/nonexistent/model' does not exist");
  EXPECT_ERROR_CONTAINS(load_tokenizer_for_model(test::shared_path("models/stories260K/stories260K.bin"), "/nonexistent/tok"),
                        "tokenizer path '/nonexistent/tok' does not exist");
}

TEST(TokenizerBadInput, MalformedTokenizerJson) {
  ScratchDir dir;
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(dir.write("truncated.json", R"({"model": {"type": "BPE", )")), "not valid JSON");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(dir.write("array.json", "[1, 2]")), "not a JSON object");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(dir.write("no_model.json", R"({"normalizer": null})")), "missing field 'model'");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(dir.path()), "is a directory");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("bad_merge.json",
                                  R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}})")),
      "makes 'ab', which is missing from the vocab");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("bad_merge_piece.json",
                                  R"({"model": {"type": "BPE", "vocab": {"a": 0, "ab": 1}, "merges": ["a c"]}})")),
      "uses a piece missing from the vocab");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("bad_id.json", R"({"model": {"type": "BPE", "vocab": {"a": -4}, "merges": []}})")),
      "vocab entry 'a' has a bad id -4");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(dir.write("no_merges.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}}})")),
                        "BPE model without 'merges'");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("bad_regex.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})")),
      "regex '(unclosed' does not compile");
}

TEST(TokenizerBadInput, UnsupportedComponentsAreNamed) {
  ScratchDir dir;
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("wordlevel.json", R"({"model": {"type": "WordLevel", "vocab": {"a": 0}}})")),
      "model type 'WordLevel' is not supported");
  const auto with = [&](const std::string& field, const std::string& component) {
    std::string json = kTinyBpe;
    json.insert(json.size() - 1, ", \"" + field + "\": " + component);
    return dir.write(field + ".json", json);
  };
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("normalizer", R"({"type": "Nmt"})")),
                        "normalizer type 'Nmt' is not supported");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("normalizer", R"({"type": "Precompiled"})")),
                        "missing field 'precompiled_charsmap'");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("normalizer", R"({"type": "Precompiled", "precompiled_charsmap": "AQI="})")),
                        "fewer than its 4-byte header");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("pre_tokenizer", R"({"type": "UnicodeScripts"})")),
                        "pre-tokenizer type 'UnicodeScripts' is not supported");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("decoder", R"({"type": "CTC"})")), "decoder type 'CTC' is not supported");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("post_processor", R"({"type": "Whatever"})")),
                        "post-processor type 'Whatever' is not supported");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("normalizer", R"({"no_type": 1})")), "component without a 'type'");
}

// Issue 24: ids size the id -> piece table, so an id past the entries the file holds (2^31-1 made
// the table 2^31 strings), or two entries sharing an id, is an error naming the entry.
TEST(TokenizerBadInput, IdsOutsideTheEntriesOrShared) {
  ScratchDir dir;
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("huge_vocab_id.json",
                                  R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2147483647}, "merges": []}})")),
      "vocab entry 'b' has a bad id 2147483647 (ids must lie in [0, 2)");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("huge_added_id.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "added_tokens": [{"id": 2147483647, "content": "<s>", "special": true}]})")),
      "token '<s>' has a bad id 2147483647 (ids must lie in [0, 2)");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("wide_added_id.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "added_tokens": [{"id": 9223372036854775807, "content": "<s>"}]})")),
      "token '<s>' has a bad id 9223372036854775807");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("negative_added_id.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "added_tokens": [{"id": -1, "content": "<s>"}]})")),
      "token '<s>' has a bad id -1");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("shared_vocab_id.json",
                                  R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})")),
      "vocab entries 'a' and 'b' share id 0");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("shared_added_id.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "added_tokens": [{"id": 1, "content": "<s>"}, {"id": 1, "content": "</s>"}]})")),
      "tokens '<s>' and '</s>' share id 1");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("post_processor_id.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 2147483647], "sep": ["[SEP]", 0]}})")),
      "special token id 2147483647 is outside the vocabulary [0, 1)");
  // An added token may repeat a vocab id (SentencePiece conversions list <unk>, <s>, </s> in both).
  const auto repeated = load_hf_tokenizer(dir.write("repeated.json", R"({"model": {"type": "BPE", "vocab": {"<s>": 0, "a": 1}, "merges": []},
          "added_tokens": [{"id": 0, "content": "<s>", "special": true}, {"id": 2, "content": "<x>"}]})"));
  EXPECT_EQ(repeated->vocab_size(), 3);
}

// Issue 24: fields HF reads as one character (an empty Metaspace replacement threw std::out_of_range).
TEST(TokenizerBadInput, SingleCharacterFields) {
  ScratchDir dir;
  const auto with = [&](const std::string& name, const std::string& field, const std::string& component) {
    std::string json = kTinyBpe;
    json.insert(json.size() - 1, ", \"" + field + "\": " + component);
    return dir.write(name + ".json", json);
  };
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("pre", "pre_tokenizer", R"({"type": "Metaspace", "replacement": ""})")),
                        "pre_tokenizer Metaspace: 'replacement' must be exactly one character, got ''");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("decoder", "decoder", R"({"type": "Metaspace", "replacement": ""})")),
                        "decoder Metaspace: 'replacement' must be exactly one character");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("two", "pre_tokenizer", R"({"type": "Metaspace", "replacement": "ab"})")),
                        "'replacement' must be exactly one character, got 'ab'");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("delimiter", "pre_tokenizer", R"({"type": "CharDelimiterSplit", "delimiter": ""})")),
                        "'delimiter' must be exactly one character");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(with("strip", "decoder", R"({"type": "Strip", "content": "", "start": 1, "stop": 0})")),
                        "'content' must be exactly one character");
  EXPECT_NO_THROW(load_hf_tokenizer(with("ok", "pre_tokenizer", R"({"type": "Metaspace", "replacement": "\u2581"})")));
}

TEST(TokenizerBadInput, UnigramModel) {
  ScratchDir dir;
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("pair.json", R"({"model": {"type": "Unigram", "vocab": [["a", -1.0], ["b"]]}})")),
      "vocab entry [\"b\"] is not [piece, score]");
  EXPECT_ERROR_CONTAINS(
      load_hf_tokenizer(dir.write("unk.json", R"({"model": {"type": "Unigram", "unk_id": 5, "vocab": [["a", -1.0]]}})")),
      "unk_id 5 is outside the vocab of 1 pieces");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(dir.write("empty.json", R"({"model": {"type": "Unigram", "vocab": []}})")),
                        "Unigram model with an empty vocab");
  const auto tokenizer = load_hf_tokenizer(
      dir.write("ok.json", R"({"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]]}})"));
  EXPECT_EQ(tokenizer->encode("aba", false), (std::vector<int32_t>{1, 0, 1}));
}

TEST(TokenizerBadInput, TinyValidTokenizerJsonWorks) {
  ScratchDir dir;
  const auto tokenizer = load_hf_tokenizer(dir.write("tokenizer.json", kTinyBpe));
  EXPECT_EQ(tokenizer->encode("abab", false), (std::vector<int32_t>{2, 2}));
}

TEST(TokenizerBadInput, GgufMetadata) {
  using nlohmann::json;
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json::object()), "no 'tokenizer.ggml.model'");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "rwkv"}, {"tokenizer.ggml.tokens", {"a"}}}),
                        "tokenizer.ggml.model 'rwkv' is not supported (supported: llama, gpt2, gemma4, bert)");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "llama"}}), "no 'tokenizer.ggml.tokens'");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "gpt2"},
                                                 {"tokenizer.ggml.pre", "no-such-pre"},
                                                 {"tokenizer.ggml.tokens", {"a", "b"}},
                                                 {"tokenizer.ggml.merges", json::array()}}),
                        "pre-tokenizer 'no-such-pre' (tokenizer.ggml.pre) is not supported");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "gpt2"}, {"tokenizer.ggml.tokens", {"a", "b"}}}),
                        "needs a 'tokenizer.ggml.merges' array");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "llama"},
                                                 {"tokenizer.ggml.tokens", {"a", "b"}},
                                                 {"tokenizer.ggml.scores", {0.0}}}),
                        "'tokenizer.ggml.scores' has 1 entries for 2 tokens");
  // Issue 24: arrays written for another vocabulary are refused, longer ones included.
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "llama"},
                                                 {"tokenizer.ggml.tokens", {"a", "b"}},
                                                 {"tokenizer.ggml.scores", {0.0, 0.0, 0.0}}}),
                        "'tokenizer.ggml.scores' has 3 entries for 2 tokens");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "llama"},
                                                 {"tokenizer.ggml.tokens", {"a", "b"}},
                                                 {"tokenizer.ggml.token_type", {1}}}),
                        "'tokenizer.ggml.token_type' has 1 entries for 2 tokens");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "gpt2"},
                                                 {"tokenizer.ggml.tokens", {"a", "b"}},
                                                 {"tokenizer.ggml.merges", {"a b", 7}}}),
                        "'tokenizer.ggml.merges'[1] is not a string");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "llama"},
                                                 {"tokenizer.ggml.tokens", {"a", 7}}}),
                        "'tokenizer.ggml.tokens'[1] is not a string");
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(json{{"tokenizer.ggml.model", "llama"},
                                                 {"tokenizer.ggml.tokens", {"a", "b"}},
                                                 {"tokenizer.ggml.scores", {"x", "y"}}}),
                        "'tokenizer.ggml.scores'[0] is a string, not a number");
}

// Found by fuzz/fuzz_gguf (fuzz/crashes/gguf/token_type_float_beyond_int32.gguf,
// score_double_beyond_f32.gguf): a GGUF array's element type is the file's to choose, so a token
// type may arrive as a float and a score as a double; converting 1e30 to int32 or 1e300 to float is
// undefined behaviour (UBSan), not an error.
TEST(TokenizerBadInput, GgufTokenTypesAndScoresOutOfRange) {
  using nlohmann::json;
  const json base = {{"tokenizer.ggml.model", "llama"}, {"tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"}}};
  json types = base;
  types["tokenizer.ggml.token_type"] = {1.0, 1e30, 3.0, 1.0};
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(types), "'tokenizer.ggml.token_type'[0] is not an int32 token type (number)");
  types["tokenizer.ggml.token_type"] = {1, int64_t(1) << 40, 3, 1};
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(types), "'tokenizer.ggml.token_type'[1] is not an int32 token type");
  json scores = base;
  scores["tokenizer.ggml.scores"] = {1e300, 0.0, 0.0, 0.0};
  EXPECT_ERROR_CONTAINS(load_gguf_tokenizer(scores), "'tokenizer.ggml.scores'[0] is 1e+300, beyond the f32 range");
  // Infinities and NaN convert exactly; llama.cpp files hold -inf scores for unused pieces.
  scores["tokenizer.ggml.scores"] = {-std::numeric_limits<double>::infinity(), 0.0, 1, 2.5};
  EXPECT_NO_THROW(load_gguf_tokenizer(scores));
}

// An eos_token_id in generation_config.json past the vocabulary (or past int32) was kept, truncated
// to int32, as a stop id.
TEST(TokenizerBadInput, GenerationConfigEosIdOutsideTheVocabulary) {
  ScratchDir dir;
  dir.write("tokenizer.json", kTinyBpe);
  dir.write("generation_config.json", R"({"eos_token_id": [2, 4294967298]})");
  EXPECT_ERROR_CONTAINS(load_hf_tokenizer(dir.path("tokenizer.json")),
                        "generation_config.json eos_token_id 4294967298 is outside the vocabulary [0, 3)");
  dir.write("generation_config.json", R"({"eos_token_id": 2})");
  EXPECT_EQ(load_hf_tokenizer(dir.path("tokenizer.json"))->eos_ids(), std::vector<int32_t>{2});
}

TEST(TokenizerBadInput, DamagedLlama2cTokenizer) {
  ScratchDir dir;
  std::ifstream in(test::shared_path("models/stories260K/tok512.bin"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_ERROR_CONTAINS(load_llama2c_tokenizer(dir.write("cut.bin", bytes.substr(0, 1000)), 512), "cut.bin");
  EXPECT_ERROR_CONTAINS(load_llama2c_tokenizer(dir.write("cut.bin", bytes.substr(0, 1000)), 512), "truncated");
  EXPECT_ERROR_CONTAINS(load_llama2c_tokenizer(dir.write("tiny.bin", "ab"), 512), "too short");
  std::string huge_length = bytes;
  const int32_t length = 1 << 30;
  std::memcpy(huge_length.data() + 8, &length, 4);  // token 0's byte length
  EXPECT_ERROR_CONTAINS(load_llama2c_tokenizer(dir.write("huge.bin", huge_length), 512), "token 0 claims 1073741824 bytes");
  // The whole file with the vocab size read from it (no checkpoint): all 512 tokens.
  EXPECT_EQ(load_llama2c_tokenizer(dir.write("whole.bin", bytes), 0)->vocab_size(), 512);
}

TEST(TokenizerBadInput, ModelPathsWithoutTokenizer) {
  ScratchDir dir;
  EXPECT_ERROR_CONTAINS(load_tokenizer_for_model(dir.path()), "has no tokenizer.json; pass --tokenizer PATH");
  fs::copy_file(test::shared_path("models/stories260K/stories260K.bin"), dir.path("model.bin"));
  EXPECT_ERROR_CONTAINS(load_tokenizer_for_model(dir.path("model.bin")), "no tokenizer.bin or tok*.bin next to");
  fs::copy_file(test::shared_path("models/stories260K/tok512.bin"), dir.path("tok512.bin"));
  fs::copy_file(test::shared_path("models/aidreams260K/tok512.bin"), dir.path("tok_other.bin"));
  EXPECT_ERROR_CONTAINS(load_tokenizer_for_model(dir.path("model.bin")), "several tokenizers next to");
  EXPECT_EQ(load_tokenizer_for_model(dir.path("model.bin"), dir.path("tok512.bin"))->encode("Once upon a time", true),
            (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_ERROR_CONTAINS(load_tokenizer_for_model(test::shared_path("models/stories260K-hf/model.safetensors")),
                        "carries no tokenizer");
}

}  // namespace
}  // namespace splitflow
