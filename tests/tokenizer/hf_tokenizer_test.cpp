// HF tokenizer.json specifics the Python comparison does not see: special ids from
// tokenizer_config.json, vocabulary size, token lookups, per-token bytes, and load/encode speed.
// (Encoding and decoding themselves are checked against HF tokenizers in tests/python.)
#include "core/mapped_file.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>

namespace splitflow {
namespace {

std::unique_ptr<Tokenizer> load(const std::string& name) {
  return load_tokenizer_for_model(test::shared_path("models/" + name));
}

// Expected values: the tokenizer_config.json files and HF tokenizers' get_vocab_size().
TEST(HfTokenizer, SpecialIdsComeFromTokenizerConfig) {
  const auto llama3 = load("llama3_1-tokenizer");
  EXPECT_EQ(llama3->vocab_size(), 128256);
  EXPECT_EQ(llama3->bos_id(), 128000);
  EXPECT_EQ(llama3->eos_ids(), std::vector<int32_t>{128009});
  EXPECT_TRUE(llama3->is_special(128009));
  EXPECT_FALSE(llama3->is_special(9906));

  const auto qwen3 = load("qwen3-tokenizer");
  EXPECT_EQ(qwen3->vocab_size(), 151669);
  EXPECT_EQ(qwen3->bos_id(), -1);
  EXPECT_EQ(qwen3->eos_ids(), std::vector<int32_t>{151645});

  const auto deepseek = load("deepseek_v3-tokenizer");
  EXPECT_EQ(deepseek->vocab_size(), 128815);
  EXPECT_EQ(deepseek->bos_id(), 0);
  EXPECT_EQ(deepseek->eos_ids(), std::vector<int32_t>{1});

  const auto llama2 = load("llama2-tokenizer");
  EXPECT_EQ(llama2->bos_id(), 1);
  EXPECT_EQ(llama2->eos_ids(), std::vector<int32_t>{2});
}

TEST(HfTokenizer, TokenLookupsAndBytes) {
  const auto gpt2 = load("gpt2-tokenizer");
  const int32_t world = gpt2->token_id("\xC4\xA0world");  // "Ġworld"
  ASSERT_GE(world, 0);
  EXPECT_EQ(gpt2->token_bytes(world), " world");
  EXPECT_EQ(gpt2->token_bytes(gpt2->token_id("<|endoftext|>")), "<|endoftext|>");
  EXPECT_EQ(gpt2->token_id("no such piece"), -1);

  const auto llama2 = load("llama2-tokenizer");
  EXPECT_EQ(llama2->token_bytes(llama2->token_id("<0x0A>")), "\n");
  EXPECT_EQ(llama2->token_bytes(llama2->token_id("\xE2\x96\x81Hello")), " Hello");  // "▁Hello"
  EXPECT_EQ(llama2->token_bytes(llama2->token_id("<0xE4>")), "\xE4");             // a partial character
}

// Speed guard with generous bounds (the shared 2-core machine is noisy); the numbers print.
TEST(HfTokenizer, LoadsLargeVocabularyAndEncodesFast) {
  const auto start = std::chrono::steady_clock::now();
  const auto llama3 = load("llama3_1-tokenizer");
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string text = read_text_file(test::shared_path("data/wiki.test.raw")).substr(0, 1 << 20);
  const auto encode_start = std::chrono::steady_clock::now();
  const auto ids = llama3->encode(text, false);
  const double encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - encode_start).count();
  const double mb_per_s = text.size() / 1e6 / encode_s;
  std::printf("llama3.1 tokenizer.json (128256 tokens, 280147 merges): load %.3f s; encode 1 MiB: %.3f s = %.1f MB/s, "
              "%zu tokens\n", load_s, encode_s, mb_per_s, ids.size());
  EXPECT_LT(load_s, 2.0);
  EXPECT_GT(mb_per_s, 1.0);

  // Llama 2's legacy layout has no pre-tokenizer: each text span is one BPE word (here 1 MiB).
  const auto llama2 = load("llama2-tokenizer");
  const auto llama2_start = std::chrono::steady_clock::now();
  const auto llama2_ids = llama2->encode(text, false);
  const double llama2_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - llama2_start).count();
  std::printf("llama2 tokenizer.json: encode 1 MiB as one BPE word: %.3f s = %.1f MB/s, %zu tokens\n", llama2_s,
              text.size() / 1e6 / llama2_s, llama2_ids.size());
  EXPECT_GT(text.size() / 1e6 / llama2_s, 0.5);
}

}  // namespace
}  // namespace splitflow
