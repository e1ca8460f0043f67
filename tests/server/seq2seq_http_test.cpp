// POST /v1/completions on an encoder-decoder model end to end over real sockets: the tiny T5 v1.1
// and BART fixtures (token-id prompts; they have no tokenizer) behind the Engine on a
// Seq2SeqRunner. Several clients at once, batched prompts, n = 2 and streaming, each choice's tokens
// equal to generate_seq2seq's for its request alone; the prompt counts as the encoder's input in
// usage and in the limits (an oversized prompt, too many tokens asked, resumption, chat without a
// template: clear 400s), and the server keeps serving after them.
#include "server/http_server.h"

#include "seq2seq/encdec_fixtures.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

namespace splitflow {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

class EncDecServer {
 public:
  explicit EncDecServer(const std::string& name)
      : model_(name, {.max_model_len = 24}), async_(*model_.engine, AsyncEngineConfig{}) {
    HttpServerConfig config;
    config.port = 0;
    config.served_model_name = name;
    server_ = std::make_unique<HttpServer>(async_, nullptr, std::nullopt, config);
    port_ = server_->bind();
    async_.start();
    thread_ = std::thread([this] { server_->serve(); });
  }
  ~EncDecServer() {
    server_->shutdown(100ms);
    thread_.join();
    async_.stop();
  }
  httplib::Result post(const std::string& path, const json& body) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(60, 0);
    return client.Post(path.c_str(), body.dump(), "application/json");
  }
  const test::EncDecEngine& model() const { return model_; }

 private:
  test::EncDecEngine model_;
  AsyncEngine async_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

std::vector<int32_t> prompt_of(int32_t length, int32_t first) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < length; ++i) ids.push_back(2 + (first + 37 * i) % 120);
  return ids;
}

// The "data:" payloads of an SSE body, [DONE] last.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  size_t at = 0;
  for (size_t end; (end = body.find("\n\n", at)) != std::string::npos; at = end + 2) {
    EXPECT_EQ(body.compare(at, 6, "data: "), 0) << body.substr(at, end - at);
    events.push_back(body.substr(at + 6, end - at - 6));
  }
  EXPECT_EQ(at, body.size()) << "trailing bytes after the last event";
  return events;
}

SamplingParams params_of(const json& body, int32_t choice) {
  SamplingParams p;
  p.max_tokens = body["max_tokens"];
  p.temperature = body.value("temperature", 1.0f);
  p.ignore_eos = body.value("ignore_eos", false);
  if (body.contains("seed")) p.seed = body["seed"].get<uint64_t>() + static_cast<uint64_t>(choice);
  return p;
}

std::string finish_name(FinishReason reason) { return std::string(finish_reason_name(reason)); }

class EncDecHttp : public ::testing::TestWithParam<std::string> {};

// Four clients at once (a batch of three prompts, n = 2, two streams): every choice as alone.
TEST_P(EncDecHttp, ConcurrentCompletionsEqualEachAlone) {
  EncDecServer server(GetParam());
  std::vector<json> bodies;
  bodies.push_back({{"prompt", {prompt_of(7, 1), prompt_of(23, 2), prompt_of(3, 3)}}, {"max_tokens", 10},
                    {"temperature", 0}, {"ignore_eos", true}});
  bodies.push_back({{"prompt", prompt_of(12, 4)}, {"max_tokens", 12}, {"temperature", 0.8}, {"seed", 17}, {"n", 2}});
  bodies.push_back({{"prompt", prompt_of(30, 5)}, {"max_tokens", 9}, {"temperature", 0.9}, {"seed", 3},
                    {"stream", true}, {"ignore_eos", true}});
  bodies.push_back({{"prompt", prompt_of(5, 6)}, {"max_tokens", 16}, {"temperature", 0}, {"stream", true}});
  for (json& body : bodies) body["splitflow"] = {{"return_token_ids", true}};
  struct Reply {
    int status = 0;  // 0: no response
    std::string body;
  };
  std::vector<Reply> results(bodies.size());
  std::vector<std::thread> clients;
  for (size_t b = 0; b < bodies.size(); ++b) {
    clients.emplace_back([&, b] {
      if (const httplib::Result res = server.post("/v1/completions", bodies[b])) results[b] = {res->status, res->body};
    });
  }
  for (std::thread& client : clients) client.join();

  for (size_t b = 0; b < bodies.size(); ++b) {
    SCOPED_TRACE(bodies[b].dump());
    ASSERT_EQ(results[b].status, 200) << results[b].body;
    const json& body = bodies[b];
    const json prompts = body["prompt"][0].is_array() ? body["prompt"] : json::array({body["prompt"]});
    const int32_t n = body.value("n", 1);
    // Per choice index: its tokens and finish reason, from the whole response or the stream.
    std::map<int32_t, std::vector<int32_t>> tokens;
    std::map<int32_t, std::string> finish;
    int64_t prompt_tokens = -1;
    if (body.value("stream", false)) {
      const std::vector<std::string> events = sse_events(results[b].body);
      ASSERT_FALSE(events.empty());
      EXPECT_EQ(events.back(), "[DONE]");
      for (size_t e = 0; e + 1 < events.size(); ++e) {
        const json chunk = json::parse(events[e]);
        for (const json& choice : chunk["choices"]) {
          for (const json& id : choice["token_ids"]) tokens[choice["index"]].push_back(id);
          if (!choice["finish_reason"].is_null()) finish[choice["index"]] = choice["finish_reason"];
        }
      }
    } else {
      const json response = json::parse(results[b].body);
      for (const json& choice : response["choices"]) {
        tokens[choice["index"]] = choice["token_ids"].get<std::vector<int32_t>>();
        finish[choice["index"]] = choice["finish_reason"];
      }
      prompt_tokens = response["usage"]["prompt_tokens"];
      int64_t encoder_tokens = 0;
      for (const json& prompt : prompts) encoder_tokens += static_cast<int64_t>(prompt.size());
      EXPECT_EQ(prompt_tokens, encoder_tokens) << "usage counts each prompt's encoder input once";
    }
    ASSERT_EQ(tokens.size(), prompts.size() * n);
    for (size_t p = 0; p < prompts.size(); ++p) {
      for (int32_t i = 0; i < n; ++i) {
        const int32_t index = static_cast<int32_t>(p) * n + i;
        const GenerationResult want =
            server.model().reference(prompts[p].get<std::vector<int32_t>>(), params_of(body, i));
        EXPECT_EQ(tokens[index], want.output_ids) << "prompt " << p << " choice " << i;
        EXPECT_EQ(finish[index], finish_name(want.finish_reason)) << "prompt " << p << " choice " << i;
      }
    }
  }
}

void expect_error(const httplib::Result& res, const std::string& param, const std::string& fragment) {
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, 400) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["error"]["param"], param) << res->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find(fragment), std::string::npos) << res->body;
}

TEST_P(EncDecHttp, BadRequestsAreRefusedAndTheServerKeepsServing) {
  EncDecServer server(GetParam());
  // One step holds 64 tokens, the decoder's first among them: the encoder takes 63.
  expect_error(server.post("/v1/completions", {{"prompt", prompt_of(64, 1)}, {"max_tokens", 4}}), "prompt",
               "This model's encoder takes at most 63 tokens, but the prompt has 64 tokens.");
  expect_error(server.post("/v1/completions", {{"prompt", {prompt_of(4, 1), prompt_of(80, 2)}}, {"max_tokens", 4}}),
               "prompt[1]", "encoder takes at most 63 tokens");
  // The decoder's context (max_model_len 24) bounds the completion alone, whatever the prompt's length.
  expect_error(server.post("/v1/completions", {{"prompt", prompt_of(4, 1)}, {"max_tokens", 25}}), "max_tokens",
               "This model's decoder generates at most 24 tokens, but 25 were requested.");
  expect_error(server.post("/v1/completions", {{"prompt", json::array()}, {"max_tokens", 4}}), "prompt", "");
  expect_error(server.post("/v1/completions", {{"prompt", {5, 500}}, {"max_tokens", 4}}), "prompt", "vocabulary");
  expect_error(server.post("/v1/completions", {{"prompt", "text"}, {"max_tokens", 4}}), "prompt", "no tokenizer");
  expect_error(server.post("/v1/completions", {{"prompt", prompt_of(4, 1)},
                                               {"max_tokens", 4},
                                               {"splitflow", {{"resume_token_ids", {3}}}}}),
               "prompt", "cannot be resumed");
  expect_error(server.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}),
               "messages", "no chat template");

  // Still serving: a prompt at the limit, and max_tokens defaulting to 16 (the decoder's room).
  const auto res = server.post("/v1/completions", {{"prompt", prompt_of(63, 9)},
                                                   {"temperature", 0},
                                                   {"ignore_eos", true},
                                                   {"splitflow", {{"return_token_ids", true}}}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  SamplingParams params;
  params.temperature = 0;
  params.ignore_eos = true;
  params.max_tokens = 16;
  EXPECT_EQ(body["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            server.model().reference(prompt_of(63, 9), params).output_ids);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 63);
  EXPECT_EQ(body["usage"]["completion_tokens"], 16);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EncDecHttp, ::testing::Values("t5_v1_1", "bart"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace splitflow
