// The OpenAI request parsers: every field's type and range errors name the field; values land in
// SamplingParams as the OpenAI API defines them; unsupported features are refused.
#include "server/openai_api.h"

#include <gtest/gtest.h>

namespace splitflow {
namespace {

using nlohmann::json;

// The ApiError a completions body raises (status 0 when it parses).
ApiError completion_error(const std::string& body) {
  try {
    parse_completion_request(parse_json_body(body));
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "");
}

ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(parse_json_body(body));
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "");
}

TEST(OpenAiApi, InvalidJsonAndNonObjectBodies) {
  for (const std::string body : {"{bad", "", "[1, 2]", "\"text\"", "{\"prompt\": \"a\"} trailing"}) {
    SCOPED_TRACE(body);
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  EXPECT_NE(std::string(completion_error("{bad").what()).find("not valid JSON"), std::string::npos);
  EXPECT_NE(std::string(completion_error("[1]").what()).find("not array"), std::string::npos);
  // Deep nesting is refused before anything recurses over it.
  const std::string deep = R"({"prompt": "a", "chat_template_kwargs": )" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  const ApiError e = completion_error(deep);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("nests more than 64"), std::string::npos) << e.what();
}

TEST(OpenAiApi, WrongTypesNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "a", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "a", "top_p": true})", "top_p"},
      {R"({"prompt": "a", "n": 1.5})", "n"},
      {R"({"prompt": "a", "max_tokens": "10"})", "max_tokens"},
      {R"({"prompt": "a", "seed": 0.5})", "seed"},
      {R"({"prompt": "a", "stop": 5})", "stop"},
      {R"({"prompt": "a", "stop": ["x", 1]})", "stop[1]"},
      {R"({"prompt": "a", "stream": "yes"})", "stream"},
      {R"({"prompt": "a", "echo": 1})", "echo"},
      {R"({"prompt": "a", "logprobs": true})", "logprobs"},
      {R"({"prompt": "a", "model": 3})", "model"},
      {R"({"prompt": "a", "stream": true, "stream_options": []})", "stream_options"},
      {R"({"prompt": "a", "logit_bias": 1})", "logit_bias"},
      {R"({"prompt": {"text": "a"}})", "prompt"},
      {R"({"prompt": [1, "a"]})", "prompt[1]"},
      {R"({"prompt": "a", "stop_token_ids": [1.5]})", "stop_token_ids[0]"},
  };
  for (const auto& [body, field] : cases) {
    SCOPED_TRACE(body);
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, field);
    EXPECT_NE(std::string(e.what()).find("'" + field + "' must be"), std::string::npos) << e.what();
  }
}

TEST(OpenAiApi, BadValuesNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": "a", "temperature": -0.1})", "temperature"},
      {R"({"prompt": "a", "temperature": 2.5})", "temperature"},
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "top_p": 1.01})", "top_p"},
      {R"({"prompt": "a", "min_p": 2})", "min_p"},
      {R"({"prompt": "a", "top_k": -2})", "top_k"},
      {R"({"prompt": "a", "presence_penalty": 3})", "presence_penalty"},
      {R"({"prompt": "a", "frequency_penalty": -2.5})", "frequency_penalty"},
      {R"({"prompt": "a", "n": 0})", "n"},
      {R"({"prompt": "a", "n": 17})", "n"},
      {R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "a", "stop": ""})", "stop"},
      {R"({"prompt": "a", "stop": ["x", ""]})", "stop[1]"},
      {R"({"prompt": "a", "stop_token_ids": [-1]})", "stop_token_ids[0]"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [-3]})", "prompt[0]"},
      {R"({"prompt": ["a", ""]})", "prompt[1]"},
      {R"({"prompt": [[1], []]})", "prompt[1]"},
      {R"({"prompt": [[1], [2, -1]]})", "prompt[1][1]"},
      {R"({"prompt": [[1], [2.5]]})", "prompt[1][0]"},
      {R"({"prompt": ["a", [1]]})", "prompt[1]"},
      {R"({"prompt": [[1], "a"]})", "prompt[1]"},
      {R"({"prompt": ["a", 5]})", "prompt[1]"},
      {R"({"prompt": ["a", null]})", "prompt[1]"},
      {R"({"prompt": true})", "prompt"},
      {R"({"prompt": "a", "best_of": 3})", "best_of"},
      {R"({"prompt": "a", "logit_bias": {"5": 10}})", "logit_bias"},
      {R"({"prompt": "a", "suffix": "end"})", "suffix"},
      {R"({"prompt": "a", "echo": true, "logprobs": 2})", "echo"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "a", "response_format": {"type": "xml"}})", "response_format.type"},
      {R"({"prompt": "a", "response_format": {"type": "json_schema"}})", "response_format.json_schema"},
  };
  for (const auto& [body, field] : cases) {
    SCOPED_TRACE(body);
    const ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, field);
  }
  const ApiError missing = completion_error(R"({"max_tokens": 3})");
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(missing.param, "prompt");
}

// Issue 24: 1e999 and -1e999 (beyond a double: the JSON parser refuses them), a 22-digit integer
// (past 64 bits: nlohmann::json makes it a double) and NaN (no JSON literal) in any numeric field
// are a 400 naming the field, never a 500.
TEST(OpenAiApi, OverflowingNumbersNameTheField) {
  const std::vector<std::string> huge_numbers = {"1e999", "-1e999", "12345678901234567890123",
                                                 "-12345678901234567890123", "18446744073709551615"};
  // field -> the body around it; the number replaces @.
  const std::vector<std::pair<std::string, std::string>> completion_fields = {
      {"max_tokens", R"({"prompt": "a", "max_tokens": @})"},
      {"temperature", R"({"prompt": "a", "temperature": @})"},
      {"top_p", R"({"prompt": "a", "top_p": @})"},
      {"min_p", R"({"prompt": "a", "min_p": @})"},
      {"top_k", R"({"prompt": "a", "top_k": @})"},
      {"n", R"({"prompt": "a", "n": @})"},
      {"best_of", R"({"prompt": "a", "best_of": @})"},
      {"seed", R"({"prompt": "a", "seed": @})"},
      {"logprobs", R"({"prompt": "a", "logprobs": @})"},
      {"presence_penalty", R"({"prompt": "a", "presence_penalty": @})"},
      {"frequency_penalty", R"({"prompt": "a", "frequency_penalty": @})"},
      {"repetition_penalty", R"({"prompt": "a", "repetition_penalty": @})"},
      {"logit_bias.5", R"({"prompt": "a", "logit_bias": {"5": @}})"},
      {"stop_token_ids[1]", R"({"prompt": "a", "stop_token_ids": [2, @]})"},
      {"prompt[2]", R"({"prompt": [1, 2, @]})"},
      {"prompt[1][0]", R"({"prompt": [[1], [@]]})"},
  };
  const std::vector<std::pair<std::string, std::string>> chat_fields = {
      {"max_completion_tokens", R"({"messages": [{"role": "user"}], "max_completion_tokens": @})"},
      {"top_logprobs", R"({"messages": [{"role": "user"}], "logprobs": true, "top_logprobs": @})"},
      {"messages[0].content", R"({"messages": [{"role": "user", "content": @}]})"},
  };
  auto check = [](const ApiError& e, const std::string& field) {
    EXPECT_EQ(e.status, 400) << e.what();
    EXPECT_EQ(e.param, field) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + field + "'"), std::string::npos) << e.what();
  };
  for (const std::string& number : huge_numbers) {
    for (const auto& [field, body] : completion_fields) {
      std::string filled = body;
      filled.replace(filled.find('@'), 1, number);
      SCOPED_TRACE(filled);
      // The seed takes any int64, so only what lies beyond it is refused.
      check(completion_error(filled), field);
    }
    for (const auto& [field, body] : chat_fields) {
      std::string filled = body;
      filled.replace(filled.find('@'), 1, number);
      SCOPED_TRACE(filled);
      check(chat_error(filled), field);
    }
  }
  // The parser's overflow says what it refused.
  const std::string message = completion_error(R"({"prompt": "a", "max_tokens": 1e999})").what();
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
  EXPECT_NE(message.find("1e999"), std::string::npos) << message;
  // A nested overflow names its path; one outside any field names none.
  check(chat_error(R"({"messages": [{"role": "user"}], "chat_template_kwargs": {"a": [0, {"b": -1e999}]}})"),
        "chat_template_kwargs.a[1].b");
  const ApiError bare = completion_error("1e999");
  EXPECT_EQ(bare.status, 400);
  EXPECT_EQ(bare.param, "");
  // NaN and Infinity are not JSON: a parse error, 400.
  for (const std::string body : {R"({"prompt": "a", "temperature": NaN})", R"({"prompt": "a", "top_p": Infinity})",
                                 R"({"prompt": "a", "max_tokens": -Infinity})"}) {
    SCOPED_TRACE(body);
    EXPECT_EQ(completion_error(body).status, 400);
  }
  // The integer fields' own limits, at and just past the edges.
  EXPECT_EQ(completion_error(R"({"prompt": "a", "max_tokens": 2147483647})").status, 0);
  EXPECT_EQ(completion_error(R"({"prompt": "a", "max_tokens": 2147483648})").param, "max_tokens");
  EXPECT_EQ(completion_error(R"({"prompt": "a", "seed": -9223372036854775808})").status, 0);
  EXPECT_EQ(completion_error(R"({"prompt": "a", "seed": 9223372036854775808})").param, "seed");
  EXPECT_EQ(completion_error(R"({"prompt": "a", "seed": -9223372036854775809})").param, "seed");
  EXPECT_EQ(completion_error(R"({"prompt": "a", "stop_token_ids": [2147483648]})").param, "stop_token_ids[0]");
  // A fraction in an integer field is a type error; a tiny float underflows to 0, which is in range.
  EXPECT_NE(std::string(completion_error(R"({"prompt": "a", "n": 1.000001})").what()).find("must be an integer"),
            std::string::npos);
  EXPECT_EQ(completion_error(R"({"prompt": "a", "temperature": 1e-999})").status, 0);
}

TEST(OpenAiApi, CompletionFieldsLandInSamplingParams) {
  const CompletionRequest r = parse_completion_request(parse_json_body(R"({
      "model": "m", "prompt": [[5, 6, 7]], "max_tokens": 12, "temperature": 0.5, "top_p": 0.9, "top_k": -1,
      "min_p": 0.05, "seed": -3, "n": 2, "stop": "END", "presence_penalty": 0.5, "frequency_penalty": -0.5,
      "repetition_penalty": 1.1, "logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
      "ignore_eos": true, "stop_token_ids": [9], "user": "ignored", "best_of": 2, "logit_bias": {},
      "temperature_unit": "ignored too"})"));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(r.prompts[0]), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_EQ(r.params.max_tokens, 12);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 0);  // -1 is vLLM's "off"
  EXPECT_FLOAT_EQ(r.params.min_p, 0.05f);
  EXPECT_EQ(r.params.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(r.params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.1f);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.params.stop_token_ids, std::vector<int32_t>{9});

  // Defaults: OpenAI's, and null counts as absent.
  const CompletionRequest d = parse_completion_request(parse_json_body(R"({"prompt": "hi", "temperature": null, "stop": null})"));
  ASSERT_EQ(d.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(d.prompts[0]), "hi");
  EXPECT_FALSE(d.max_tokens_given);
  EXPECT_FLOAT_EQ(d.params.temperature, 1.0f);
  EXPECT_EQ(d.n, 1);
  EXPECT_FALSE(d.stream);
  EXPECT_FALSE(d.logprobs.has_value());
  EXPECT_FALSE(d.params.logprobs);
  EXPECT_TRUE(d.params.stop.empty());
  const CompletionRequest one = parse_completion_request(parse_json_body(R"({"prompt": ["one"]})"));
  ASSERT_EQ(one.prompts.size(), 1u);
  EXPECT_EQ(std::get<std::string>(one.prompts[0]), "one");
  // A lone empty text is a prompt of the BOS token alone.
  EXPECT_EQ(std::get<std::string>(parse_completion_request(parse_json_body(R"({"prompt": ""})")).prompts.at(0)), "");
}

TEST(OpenAiApi, ListsOfPromptsKeepTheirOrderAndKind) {
  const CompletionRequest texts = parse_completion_request(parse_json_body(R"({"prompt": ["a", "bc", "d"], "n": 2})"));
  ASSERT_EQ(texts.prompts.size(), 3u);
  EXPECT_EQ(std::get<std::string>(texts.prompts[0]), "a");
  EXPECT_EQ(std::get<std::string>(texts.prompts[1]), "bc");
  EXPECT_EQ(std::get<std::string>(texts.prompts[2]), "d");
  EXPECT_EQ(texts.n, 2);
  const CompletionRequest ids = parse_completion_request(parse_json_body(R"({"prompt": [[1, 2], [3]]})"));
  ASSERT_EQ(ids.prompts.size(), 2u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids.prompts[0]), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids.prompts[1]), (std::vector<int32_t>{3}));
}

TEST(OpenAiApi, PromptsPerRequestAreLimited) {
  json at_limit = {{"prompt", std::vector<std::string>(kMaxPrompts, "x")}};
  EXPECT_EQ(parse_completion_request(at_limit).prompts.size(), kMaxPrompts);
  const json over = {{"prompt", std::vector<std::vector<int>>(kMaxPrompts + 1, std::vector<int>{1})}};
  try {
    parse_completion_request(over);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "prompt");
    EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxPrompts)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxPrompts + 1)), std::string::npos) << e.what();
  }
}

TEST(OpenAiApi, ChatRequests) {
  const ChatRequest r = parse_chat_request(parse_json_body(R"({
      "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                   {"role": "assistant", "content": null}],
      "max_completion_tokens": 7, "max_tokens": 99, "logprobs": true, "top_logprobs": 2, "stop": ["a", "b"],
      "tools": [], "chat_template_kwargs": {"enable_thinking": false}})"));
  EXPECT_EQ(r.params.max_tokens, 7);  // max_completion_tokens supersedes max_tokens
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_TRUE(r.params.logprobs);
  EXPECT_EQ(r.params.top_logprobs, 2);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "b"}));

  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [5]})", "messages[0]"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0]"},
      {R"({"messages": [{"role": 1, "content": "hi"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 2})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 30})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})", "tools[0].function"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": []})", "chat_template_kwargs"},
  };
  for (const auto& [body, field] : cases) {
    SCOPED_TRACE(body);
    const ApiError e = chat_error(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, field);
  }
}

TEST(OpenAiApi, ErrorBodyShape) {
  const json body = error_body(ApiError(404, "no such model", "model", "invalid_request_error", "model_not_found"));
  EXPECT_EQ(body, json::parse(R"({"error": {"message": "no such model", "type": "invalid_request_error",
                                            "param": "model", "code": "model_not_found"}})"));
  const json plain = error_body(ApiError(400, "bad"));
  EXPECT_TRUE(plain["error"]["param"].is_null());
  EXPECT_TRUE(plain["error"]["code"].is_null());
}

TEST(OpenAiApi, LogprobsObjects) {
  std::vector<TokenOutput> tokens(2);
  tokens[0] = {7, -0.5f, {{7, -0.5f}, {8, -1.25f}}};
  tokens[1] = {9, -INFINITY, {}};
  size_t offset = 3;
  const json completion = completion_logprobs(nullptr, tokens, offset);
  EXPECT_EQ(completion["tokens"], json::parse(R"(["token_id:7", "token_id:9"])"));
  EXPECT_EQ(completion["token_logprobs"], json::parse("[-0.5, -9999.0]"));
  EXPECT_EQ(completion["top_logprobs"][0], json::parse(R"({"token_id:7": -0.5, "token_id:8": -1.25})"));
  EXPECT_EQ(completion["top_logprobs"][1], json::parse(R"({"token_id:9": -9999.0})"));  // the sampled token
  EXPECT_EQ(completion["text_offset"], json::parse("[3, 13]"));
  EXPECT_EQ(offset, 23u);

  const json chat = chat_logprobs(nullptr, tokens);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], "token_id:7");
  EXPECT_EQ(chat["content"][0]["logprob"], -0.5);
  EXPECT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["logprob"], -1.25);
  const std::string text = "token_id:7";
  EXPECT_EQ(chat["content"][0]["bytes"], json(std::vector<int>(text.begin(), text.end())));
}

TEST(OpenAiApi, DumpReplacesInvalidUtf8) {
  EXPECT_EQ(dump_json(json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace splitflow
