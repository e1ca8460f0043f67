// Constrained decoding with random logits over real vocabularies (stories260K's 512 SentencePiece
// tokens; SmolLM2's 49k byte-level BPE tokens when its GGUF is in .cache/models): whatever the
// draws, the decoded text must parse as JSON (nlohmann::json, not our grammar) and have the
// schema's shape, checked here by hand.
#include "grammar/constraint_cache.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <regex>

namespace splitflow::grammar {
namespace {

using nlohmann::json;

// Draws tokens uniformly among those allowed (EOS, when allowed, half the time) until EOS.
// Returns the decoded text, or nullopt when max_steps ran out.
std::optional<std::string> random_decode(ConstraintCache& cache, const Tokenizer& tokenizer, ConstraintKind kind,
                                         const std::string& source, uint64_t seed, int max_steps = 400) {
  auto compiled = cache.get(kind, source);
  auto constraint = compiled->start();
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(compiled->mask_words());
  std::vector<int32_t> ids;
  const std::vector<int32_t> eos = tokenizer.eos_ids();
  for (int step = 0; step < max_steps; ++step) {
    constraint->fill_next_token_mask(mask);
    if (constraint->can_end() && (rng() % 2 == 0 || std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }))) {
      return tokenizer.decode(ids, /*skip_special=*/true);
    }
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < mask.size() * 32; ++t) {
      if ((mask[t / 32] >> (t % 32)) & 1u) allowed.push_back(static_cast<int32_t>(t));
    }
    if (allowed.empty()) return std::nullopt;
    const int32_t token = allowed[rng() % allowed.size()];
    constraint->accept_token(token);
    ids.push_back(token);
  }
  return std::nullopt;
}

void check_tokenizer(const Tokenizer& tokenizer) {
  ConstraintCache cache(tokenizer, tokenizer.vocab_size());
  const nlohmann::ordered_json schema = {{"type", "object"},
                       {"properties",
                        {{"id", {{"type", "integer"}}},
                         {"name", {{"type", "string"}, {"maxLength", 5}}},
                         {"ok", {{"type", "boolean"}}},
                         {"kind", {{"enum", {"a", "b"}}}},
                         {"xs", {{"type", "array"}, {"items", {{"type", "number"}}}, {"maxItems", 3}}}}},
                       {"required", {"id", "name", "ok", "kind", "xs"}},
                       {"additionalProperties", false}};
  int finished = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto text = random_decode(cache, tokenizer, ConstraintKind::JsonSchema, schema.dump(), seed);
    if (!text) continue;
    ++finished;
    json value;
    ASSERT_NO_THROW(value = json::parse(*text)) << *text;
    ASSERT_TRUE(value.is_object()) << *text;
    EXPECT_EQ(value.size(), 5u) << *text;
    EXPECT_TRUE(value["id"].is_number_integer()) << *text;
    ASSERT_TRUE(value["name"].is_string()) << *text;
    // maxLength counts characters; the decoded text is valid UTF-8 characters of at most 5.
    const std::string name = value["name"].get<std::string>();
    EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }), 5) << *text;
    EXPECT_TRUE(value["ok"].is_boolean()) << *text;
    EXPECT_TRUE(value["kind"] == "a" || value["kind"] == "b") << *text;
    ASSERT_TRUE(value["xs"].is_array()) << *text;
    EXPECT_LE(value["xs"].size(), 3u);
    for (const json& x : value["xs"]) EXPECT_TRUE(x.is_number()) << *text;
  }
  EXPECT_GE(finished, 15);
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const auto text = random_decode(cache, tokenizer, ConstraintKind::Regex, R"([A-Z][a-z]{1,4}-[0-9]{2}(!|\?))", seed);
    ASSERT_TRUE(text);
    EXPECT_TRUE(std::regex_match(*text, std::regex(R"([A-Z][a-z]{1,4}-[0-9]{2}(!|\?))"))) << *text;
  }
}

TEST(RandomDecoding, Stories260KVocabulary) {
  const std::string model = splitflow::test::shared_dir() + "/models/stories260K-hf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "no " << model;
  check_tokenizer(*load_tokenizer_for_model(model));
}

TEST(RandomDecoding, SmolLM2Vocabulary) {
  const std::filesystem::path gguf = std::filesystem::path(SPLITFLOW_TEST_FIXTURES) / "../../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(gguf)) GTEST_SKIP() << "no " << gguf;
  check_tokenizer(*load_tokenizer_for_model(gguf.string()));
}

}  // namespace
}  // namespace splitflow::grammar
