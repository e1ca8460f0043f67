// A seeded request's text over HTTP is the same whole or streamed, with or without logprobs, and
// as choice i of n (seeded seed - i): the server adds nothing to the engine's one sampling rule
// (issue 29, item 6; the engine-side tests are tests/engine/seed_test.cpp).
#if defined(SPLITFLOW_HAS_HTTP_SERVER) && __has_include(<httplib.h>)

#include "server/http_server.h"

#include "server_test_util.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

namespace splitflow {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

class SeedServer {
 public:
  SeedServer() : async_(*stories_.engine, AsyncEngineConfig{1024}) {
    HttpServerConfig config;
    config.port = 0;
    config.served_model_name = "stories";
    server_ = std::make_unique<HttpServer>(async_, stories_.tokenizer.get(), std::nullopt, config);
    port_ = server_->bind();
    async_.start();
    thread_ = std::thread([this] { server_->serve(); });
  }
  ~SeedServer() {
    server_->shutdown(100ms);
    thread_.join();
    async_.stop();
  }

  json post(json body) const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(60, 0);
    const auto res = client.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return json();
    EXPECT_EQ(res->status, 200) << res->body;
    if (!body.value("stream", false)) return json::parse(res->body);
    // A stream: the texts of its chunks joined per choice index, as a non-streamed body would hold them.
    json choices = json::array();
    size_t at = 0;
    while (true) {
      const size_t end = res->body.find("\n\n", at);
      if (end == std::string::npos) break;
      const std::string data = res->body.substr(at + 6, end - at - 6);
      at = end + 2;
      if (data == "[DONE]") break;
      const json chunk = json::parse(data);
      for (const json& choice : chunk["choices"]) {
        const size_t index = choice["index"];
        while (choices.size() <= index) {
          json empty;
          empty["text"] = "";
          choices.push_back(empty);
        }
        choices[index]["text"] = choices[index]["text"].get<std::string>() + choice["text"].get<std::string>();
      }
    }
    json whole;
    whole["choices"] = choices;
    return whole;
  }

 private:
  test::StoriesEngine stories_;
  AsyncEngine async_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(SeededCompletions, StreamingLogprobsAndNDoNotChangeTheText) {
  SeedServer server;
  const json base = {{"prompt", "Once upon a time, there was a little girl"},
                     {"max_tokens", 32},
                     {"temperature", 0.8},
                     {"top_p", 0.9},
                     {"top_k", 30},
                     {"min_p", 0.02},
                     {"ignore_eos", true},
                     {"seed", 31}};
  const std::string text = server.post(base)["choices"][0]["text"];
  ASSERT_FALSE(text.empty());
  json other_seed = base;
  other_seed["seed"] = 32;
  EXPECT_NE(server.post(other_seed)["choices"][0]["text"], text) << "the seed was meant to matter";

  json streamed = base;
  streamed["stream"] = true;
  EXPECT_EQ(server.post(streamed)["choices"][0]["text"], text);
  json with_logprobs = base;
  with_logprobs["logprobs"] = 3;
  EXPECT_EQ(server.post(with_logprobs)["choices"][0]["text"], text);
  with_logprobs["stream"] = true;
  EXPECT_EQ(server.post(with_logprobs)["choices"][0]["text"], text);

  // Choice i of a request seeded s is the one-choice request seeded s + i: seeded 29, choice 2.
  json several = base;
  several["seed"] = 29;
  several["n"] = 3;
  EXPECT_EQ(server.post(several)["choices"][2]["text"], text);
  several["stream"] = true;
  several["logprobs"] = 1;
  EXPECT_EQ(server.post(several)["choices"][2]["text"], text);
}

}  // namespace
}  // namespace splitflow

#endif
