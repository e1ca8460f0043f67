// POST /tokenize and /detokenize bodies (server/tokenize_api.h) against the tokenizer itself, on
// stories260K's SentencePiece vocabulary (byte fallback: pieces that are parts of a character).
#include "server/openai_api.h"
#include "server/tokenize_api.h"
#include "test_paths.h"

#include <gtest/gtest.h>

using namespace splitflow;
using nlohmann::json;

namespace {

const Tokenizer& stories() {
  static const std::unique_ptr<Tokenizer> tokenizer =
      load_hf_tokenizer(test::shared_path("models/stories260K-hf/tokenizer.json"));
  return *tokenizer;
}

void expect_400(const std::function<void()>& call, const std::string& param, const std::string& message_part) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming " << param;
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status, 400);
    EXPECT_EQ(error.param, param);
    EXPECT_NE(std::string(error.what()).find(message_part), std::string::npos) << error.what();
  }
}

TEST(TokenizeApi, TokensAreTheTokenizersWithAndWithoutSpecialTokens) {
  const std::string text = "Once upon a time, there was a cat.";
  EXPECT_EQ(tokenize_response(&stories(), {{"content", text}}),
            json({{"tokens", stories().encode(text, /*add_special=*/false)}}));
  const json with_bos = tokenize_response(&stories(), {{"content", text}, {"add_special", true}});
  EXPECT_EQ(with_bos.at("tokens"), json(stories().encode(text, /*add_special=*/true)));
  EXPECT_EQ(with_bos.at("tokens").front(), stories().bos_id());
  EXPECT_EQ(tokenize_response(&stories(), {{"content", ""}}), json({{"tokens", json::array()}}));
}

TEST(TokenizeApi, PiecesAreTextOrTheBytesOfAPartialCharacter) {
  const std::string text = "A cat \xE2\x98\x83!";  // U+2603, not in the 512-token vocabulary: byte fallback
  const json result = tokenize_response(&stories(), {{"content", text}, {"with_pieces", true}});
  const std::vector<int32_t> ids = stories().encode(text, false);
  ASSERT_EQ(result.at("tokens").size(), ids.size());
  std::string joined;
  bool saw_bytes = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& token = result.at("tokens")[i];
    EXPECT_EQ(token.at("id"), ids[i]);
    if (token.at("piece").is_string()) {
      joined += token.at("piece").get<std::string>();
    } else {
      saw_bytes = true;
      for (const json& byte : token.at("piece")) joined += static_cast<char>(byte.get<int>());
    }
  }
  EXPECT_TRUE(saw_bytes) << result.dump();
  EXPECT_EQ(joined, " " + text);  // SentencePiece's leading space, as the pieces carry it
}

TEST(TokenizeApi, DetokenizeRoundTripsAndKeepsSpecialTokens) {
  const std::string text = "Lily saw a big dog.";
  const std::vector<int32_t> ids = stories().encode(text, /*add_special=*/true);
  const json result = detokenize_response(&stories(), {{"tokens", ids}});
  EXPECT_EQ(result.at("content"), stories().decode(ids, /*skip_special=*/false));
  EXPECT_NE(result.at("content").get<std::string>().find(text), std::string::npos);
  EXPECT_EQ(detokenize_response(&stories(), {{"tokens", json::array()}}), json({{"content", ""}}));
}

TEST(TokenizeApi, BadBodiesAreA400NamingTheField) {
  const Tokenizer* t = &stories();
  expect_400([&] { tokenize_response(t, json::object()); }, "content", "required");
  expect_400([&] { tokenize_response(t, {{"content", 3}}); }, "content", "must be a string");
  expect_400([&] { tokenize_response(t, {{"content", "hi"}, {"add_special", "yes"}}); }, "add_special", "boolean");
  expect_400([&] { tokenize_response(t, {{"content", "hi"}, {"with_pieces", 1}}); }, "with_pieces", "boolean");
  expect_400([&] { tokenize_response(t, {{"content", "hi"}, {"parse_special", false}}); }, "parse_special",
             "not supported");
  expect_400([&] { detokenize_response(t, json::object()); }, "tokens", "required");
  expect_400([&] { detokenize_response(t, {{"tokens", "1 2"}}); }, "tokens", "list of token ids");
  expect_400([&] { detokenize_response(t, {{"tokens", {1, 2.5}}}); }, "tokens[1]", "integer token id");
  expect_400([&] { detokenize_response(t, {{"tokens", {1, 512}}}); }, "tokens[1]", "outside the vocabulary [0, 512)");
  expect_400([&] { detokenize_response(t, {{"tokens", {-1}}}); }, "tokens[0]", "outside the vocabulary");
  expect_400([&] { detokenize_response(t, {{"tokens", {json(uint64_t{1} << 63)}}}); }, "tokens[0]", "outside");
  expect_400([&] { tokenize_response(nullptr, {{"content", "hi"}}); }, "", "no tokenizer");
  expect_400([&] { detokenize_response(nullptr, {{"tokens", {1}}}); }, "", "no tokenizer");
}

}  // namespace
