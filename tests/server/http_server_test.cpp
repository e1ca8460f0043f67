// The HTTP server end to end over real sockets (httplib's client, and a raw socket where the test
// must drop the connection itself): error statuses and bodies, overload, a client leaving
// mid-stream, drain on shutdown, and the responses of both endpoints against the single-request
// Generator. Tests needing a fixed interleaving drive the engine loop with run_once().
#include "server/http_server.h"
#include "server/openai_api.h"

#include "server_test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <thread>

namespace splitflow {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

struct ServerOptions {
  bool start_engine = true;
  int32_t max_queue = 1024;
  bool chat = false;
  size_t max_body_bytes = size_t{1} << 20;
  std::vector<std::string> api_keys;
  std::vector<std::string> allowed_origins;
};

class TestServer {
 public:
  explicit TestServer(ServerOptions options = {})
      : async_(*stories_.engine, AsyncEngineConfig{options.max_queue}) {
    HttpServerConfig config;
    config.port = 0;
    config.served_model_name = "stories";
    config.limits.max_body_bytes = options.max_body_bytes;
    config.api_keys = options.api_keys;
    config.allowed_origins = options.allowed_origins;
    std::optional<ChatTemplate> chat_template;
    if (options.chat) chat_template = ChatTemplate::from_file(test::shared_path("models/llama3_1-tokenizer/tokenizer_config.json"));
    server_ = std::make_unique<HttpServer>(async_, stories_.tokenizer.get(), std::move(chat_template), config);
    port_ = server_->bind();
    if (options.start_engine) async_.start();
    thread_ = std::thread([this] { server_->serve(); });
  }
  ~TestServer() {
    server_->shutdown(100ms);
    thread_.join();
    async_.stop();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) const {
    return client().Post(path.c_str(), body, "application/json");
  }
  void shutdown(std::chrono::milliseconds timeout) { server_->shutdown(timeout); }

  test::StoriesEngine stories_;
  AsyncEngine async_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

// The "data:" payloads of an SSE body, [DONE] included.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  size_t at = 0;
  while (true) {
    const size_t end = body.find("\n\n", at);
    if (end == std::string::npos) break;
    const std::string event = body.substr(at, end - at);
    EXPECT_TRUE(event.starts_with("data: ")) << event;
    events.push_back(event.substr(6));
    at = end + 2;
  }
  EXPECT_EQ(at, body.size()) << "trailing bytes after the last event";
  return events;
}

void expect_error(const httplib::Result& res, int status, const std::string& param, const std::string& code = "") {
  ASSERT_TRUE(res) << "no response";
  EXPECT_EQ(res->status, status) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const json body = json::parse(res->body);
  ASSERT_TRUE(body.contains("error")) << res->body;
  const json& error = body["error"];
  EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
  EXPECT_TRUE(error["type"].is_string());
  if (param.empty()) {
    EXPECT_TRUE(error["param"].is_null()) << res->body;
  } else {
    EXPECT_EQ(error["param"], param) << res->body;
  }
  if (code.empty()) {
    EXPECT_TRUE(error["code"].is_null()) << res->body;
  } else {
    EXPECT_EQ(error["code"], code) << res->body;
  }
}

TEST(HttpServer, ErrorsHaveOpenAiBodiesAndStatuses) {
  TestServer server(ServerOptions{.max_body_bytes = 4096});
  expect_error(server.post("/v1/completions", "{not json"), 400, "");
  expect_error(server.post("/v1/completions", "[]"), 400, "");
  expect_error(server.post("/v1/completions", R"({"prompt": "hi", "temperature": "hot"})"), 400, "temperature");
  expect_error(server.post("/v1/completions", R"({"prompt": "hi", "n": "2"})"), 400, "n");
  expect_error(server.post("/v1/completions", R"({"prompt": "hi", "top_p": 0})"), 400, "top_p");
  expect_error(server.post("/v1/completions", R"({"prompt": "hi", "max_tokens": -1})"), 400, "max_tokens");
  // Issue 24: numbers past a double or past 64 bits were a 500.
  for (const std::string number : {"1e999", "-1e999", "12345678901234567890123"}) {
    SCOPED_TRACE(number);
    for (const std::string field : {"max_tokens", "temperature", "top_p", "n", "seed", "logprobs", "presence_penalty",
                                    "frequency_penalty"}) {
      expect_error(server.post("/v1/completions", R"({"prompt": "hi", ")" + field + "\": " + number + "}"), 400, field);
    }
    expect_error(server.post("/v1/completions", R"({"prompt": "hi", "logit_bias": {"5": )" + number + "}}"), 400,
                 "logit_bias.5");
    expect_error(server.post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], )"
                                                     R"("logprobs": true, "top_logprobs": )" + number + "}"),
                 400, "top_logprobs");
  }
  expect_error(server.post("/v1/completions", R"({"prompt": [1, 600]})"), 400, "prompt");
  const std::string long_prompt = json{{"prompt", std::vector<int>(513, 5)}}.dump();
  expect_error(server.post("/v1/completions", long_prompt), 400, "prompt", "context_length_exceeded");
  const std::string too_much = json{{"prompt", std::vector<int>(500, 5)}, {"max_tokens", 13}}.dump();
  expect_error(server.post("/v1/completions", too_much), 400, "max_tokens", "context_length_exceeded");
  expect_error(server.post("/v1/completions", R"({"prompt": "hi", "model": "gpt-4"})"), 404, "model", "model_not_found");
  expect_error(server.post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})"), 400,
               "messages");
  expect_error(server.post("/v1/chat/completions", R"({"messages": "hi"})"), 400, "messages");
  expect_error(server.client().Get("/v1/nothing"), 404, "");
  expect_error(server.post("/v1/models", "{}"), 405, "");
  expect_error(server.post("/v1/completions", json{{"prompt", std::string(5000, 'a')}}.dump()), 413, "");
  // The server still answers.
  const auto health = server.client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const auto ok = server.post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

TEST(HttpServer, CompletionsMatchTheGenerator) {
  TestServer server;
  const std::string prompt = "Once upon a time, there was a little girl";
  const GenerationResult expected = server.stories_.reference(server.stories_.tokenizer->encode(prompt, true), 30);

  const auto whole = server.post("/v1/completions",
                                 json{{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0}, {"model", "stories"}}.dump());
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json body = json::parse(whole->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "stories");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["text"], expected.text);
  EXPECT_EQ(body["choices"][0]["finish_reason"], finish_reason_name(expected.finish_reason));
  EXPECT_EQ(body["usage"]["prompt_tokens"], expected.prompt_tokens);
  EXPECT_EQ(body["usage"]["completion_tokens"], expected.output_ids.size());
  EXPECT_EQ(body["usage"]["total_tokens"], expected.prompt_tokens + static_cast<int64_t>(expected.output_ids.size()));

  const auto streamed = server.post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0},
                                                            {"stream", true}, {"stream_options", {{"include_usage", true}}}}
                                                           .dump());
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<std::string> events = sse_events(streamed->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  json finish = nullptr;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    text += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, expected.text);
  EXPECT_EQ(finish, finish_reason_name(expected.finish_reason));
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], expected.output_ids.size());

  // A stop string from the middle of the greedy text.
  const std::string stop = expected.text.substr(expected.text.size() / 2, 3);
  const auto stopped = server.post("/v1/completions",
                                   json{{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0}, {"stop", {stop}}}.dump());
  ASSERT_TRUE(stopped);
  const json stopped_body = json::parse(stopped->body);
  EXPECT_EQ(stopped_body["choices"][0]["text"], expected.text.substr(0, expected.text.find(stop)));
  EXPECT_EQ(stopped_body["choices"][0]["finish_reason"], "stop");

  // n = 3 seeded choices: distinct indexes, usage over all of them; echo puts the prompt first.
  const auto several = server.post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 12}, {"n", 3},
                                                           {"seed", 5}, {"echo", true}}.dump());
  ASSERT_TRUE(several);
  const json several_body = json::parse(several->body);
  ASSERT_EQ(several_body["choices"].size(), 3u);
  int64_t tokens = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(several_body["choices"][i]["index"], i);
    EXPECT_TRUE(several_body["choices"][i]["text"].get<std::string>().starts_with(prompt));
  }
  tokens = several_body["usage"]["completion_tokens"];
  EXPECT_GE(tokens, 3);
  EXPECT_LE(tokens, 36);
  EXPECT_GT(several_body["usage"]["prompt_tokens_details"]["cached_tokens"], -1);
}

// Several prompts in one request: choice p * n + i answers prompt p; each choice is what the prompt
// alone gets (greedy: the single-request Generator's output), usage sums the prompts.
TEST(HttpServer, ListOfPromptsMatchesThePromptsOneByOne) {
  TestServer server;
  const std::vector<std::string> prompts = {"Once upon a time", "Tom had a big red ball.", "The cat sat"};
  const size_t n = 2;
  std::vector<GenerationResult> expected;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const std::string& prompt : prompts) {
    expected.push_back(server.stories_.reference(server.stories_.tokenizer->encode(prompt, true), 12));
    prompt_tokens += expected.back().prompt_tokens;
    completion_tokens += static_cast<int64_t>(n * expected.back().output_ids.size());
  }

  const json request = {{"prompt", prompts}, {"max_tokens", 12}, {"temperature", 0}, {"n", n}, {"logprobs", 1}};
  const auto whole = server.post("/v1/completions", request.dump());
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json body = json::parse(whole->body);
  ASSERT_EQ(body["choices"].size(), prompts.size() * n);
  for (size_t index = 0; index < prompts.size() * n; ++index) {
    SCOPED_TRACE(index);
    const json& choice = body["choices"][index];
    const GenerationResult& reference = expected[index / n];
    EXPECT_EQ(choice["index"], index);
    EXPECT_EQ(choice["text"], reference.text);
    EXPECT_EQ(choice["finish_reason"], finish_reason_name(reference.finish_reason));
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), reference.output_ids.size());
    EXPECT_EQ(choice["logprobs"]["text_offset"][0], 0);
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(body["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(body["usage"]["total_tokens"], prompt_tokens + completion_tokens);

  // Usage equals the sum of the single requests' usage.
  int64_t single_prompt_tokens = 0, single_completion_tokens = 0;
  for (const std::string& prompt : prompts) {
    const auto single = server.post("/v1/completions",
                                    json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"n", n}}.dump());
    ASSERT_TRUE(single);
    const json usage = json::parse(single->body)["usage"];
    single_prompt_tokens += usage["prompt_tokens"].get<int64_t>();
    single_completion_tokens += usage["completion_tokens"].get<int64_t>();
  }
  EXPECT_EQ(single_prompt_tokens, prompt_tokens);
  EXPECT_EQ(single_completion_tokens, completion_tokens);

  // Streamed: chunks carry global indexes; one usage chunk at the end.
  json streamed_request = request;
  streamed_request["stream"] = true;
  streamed_request["stream_options"] = {{"include_usage", true}};
  const auto streamed = server.post("/v1/completions", streamed_request.dump());
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200);
  const std::vector<std::string> events = sse_events(streamed->body);
  ASSERT_GE(events.size(), 2 + prompts.size() * n);
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<std::string> texts(prompts.size() * n);
  std::vector<json> finishes(prompts.size() * n);
  for (size_t e = 0; e + 2 < events.size(); ++e) {
    const json chunk = json::parse(events[e]);
    ASSERT_EQ(chunk["choices"].size(), 1u) << events[e];
    EXPECT_FALSE(chunk.contains("usage")) << events[e];
    const size_t index = chunk["choices"][0]["index"];
    ASSERT_LT(index, texts.size());
    texts[index] += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finishes[index] = chunk["choices"][0]["finish_reason"];
  }
  for (size_t index = 0; index < texts.size(); ++index) {
    EXPECT_EQ(texts[index], expected[index / n].text) << index;
    EXPECT_EQ(finishes[index], finish_reason_name(expected[index / n].finish_reason)) << index;
  }
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(usage["usage"]["completion_tokens"], completion_tokens);

  // Token-id prompts with echo: each choice starts with its own prompt.
  std::vector<std::vector<int32_t>> id_prompts;
  for (const std::string& prompt : prompts) id_prompts.push_back(server.stories_.tokenizer->encode(prompt, false));
  const auto echoed = server.post("/v1/completions",
                                  json{{"prompt", id_prompts}, {"max_tokens", 3}, {"temperature", 0}, {"echo", true}}.dump());
  ASSERT_TRUE(echoed);
  ASSERT_EQ(echoed->status, 200) << echoed->body;
  const json echoed_body = json::parse(echoed->body);
  ASSERT_EQ(echoed_body["choices"].size(), prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::string decoded = server.stories_.tokenizer->decode(id_prompts[p], false);
    EXPECT_TRUE(echoed_body["choices"][p]["text"].get<std::string>().starts_with(decoded)) << p;
  }
}

TEST(HttpServer, BadPromptInAListIsNamed) {
  TestServer server;
  const json too_many = {{"prompt", std::vector<std::string>(kMaxPrompts + 1, "hi")}};
  expect_error(server.post("/v1/completions", too_many.dump()), 400, "prompt");
  expect_error(server.post("/v1/completions", R"({"prompt": ["hi", ""]})"), 400, "prompt[1]");
  expect_error(server.post("/v1/completions", R"({"prompt": ["hi", [5, 6]]})"), 400, "prompt[1]");
  expect_error(server.post("/v1/completions", R"({"prompt": [[5, 6], [7, 600]]})"), 400, "prompt[1]");
  const json over_context = {{"prompt", {std::vector<int>(10, 5), std::vector<int>(10, 5), std::vector<int>(513, 5)}}};
  expect_error(server.post("/v1/completions", over_context.dump()), 400, "prompt[2]", "context_length_exceeded");
  const json no_room = {{"prompt", {std::vector<int>(10, 5), std::vector<int>(500, 5)}}, {"max_tokens", 13}};
  expect_error(server.post("/v1/completions", no_room.dump()), 400, "max_tokens", "context_length_exceeded");
  // Nothing of the refused requests ran.
  EXPECT_EQ(server.async_.num_in_flight(), 0);
  EXPECT_NE(server.async_.render_metrics().find("splitflow_generation_tokens_total 0\n"), std::string::npos);
}

TEST(HttpServer, LogprobsInCompletionsAndChat) {
  TestServer server(ServerOptions{.chat = true});
  const auto res = server.post("/v1/completions", R"({"prompt": "The cat", "max_tokens": 5, "temperature": 0, "logprobs": 2})");
  ASSERT_TRUE(res);
  const json logprobs = json::parse(res->body)["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 5u);
  ASSERT_EQ(logprobs["token_logprobs"].size(), 5u);
  ASSERT_EQ(logprobs["top_logprobs"].size(), 5u);
  EXPECT_EQ(logprobs["text_offset"][0], 0);
  for (size_t t = 0; t < 5; ++t) {
    // Greedy: the sampled token is the most probable, so it tops its alternatives.
    const json& top = logprobs["top_logprobs"][t];
    EXPECT_GE(top.size(), 1u);
    for (const auto& [token, value] : top.items()) EXPECT_LE(value.get<double>(), logprobs["token_logprobs"][t].get<double>() + 1e-6);
  }
  const auto chat = server.post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}],
      "max_tokens": 4, "temperature": 0, "logprobs": true, "top_logprobs": 3})");
  ASSERT_TRUE(chat);
  ASSERT_EQ(chat->status, 200) << chat->body;
  const json content = json::parse(chat->body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 3u);
  EXPECT_TRUE(content[0]["bytes"].is_array());
}

TEST(HttpServer, ChatUsesTheTemplate) {
  TestServer server(ServerOptions{.chat = true});
  const json messages = json::parse(R"([{"role": "system", "content": "You tell stories."},
                                        {"role": "user", "content": "Tell me about a cat."}])");
  const auto whole = server.post("/v1/chat/completions", json{{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}}.dump());
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json body = json::parse(whole->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  const std::string content = body["choices"][0]["message"]["content"];
  // The prompt is the rendered template, tokenized without adding BOS (the template has it).
  const std::string rendered = ChatTemplate::from_file(test::shared_path("models/llama3_1-tokenizer/tokenizer_config.json"))
                                   .render(messages, true);
  EXPECT_TRUE(rendered.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")) << rendered;
  const std::vector<int32_t> prompt_ids = server.stories_.tokenizer->encode(rendered, false);
  EXPECT_EQ(body["usage"]["prompt_tokens"], prompt_ids.size());
  const GenerationResult expected = server.stories_.reference(prompt_ids, 8);
  EXPECT_EQ(content, expected.text);

  const auto streamed = server.post("/v1/chat/completions",
                                    json{{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"stream", true}}.dump());
  ASSERT_TRUE(streamed);
  const std::vector<std::string> events = sse_events(streamed->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json delta = json::parse(events[i])["choices"][0]["delta"];
    if (delta.contains("content")) text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(text, expected.text);

  // Messages the template cannot take are the client's error.
  expect_error(server.post("/v1/chat/completions",
                           R"({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": 5}]})"),
               400, "messages[1].content");
}

TEST(HttpServer, FullQueueGets429) {
  TestServer server(ServerOptions{.start_engine = false, .max_queue = 2});
  std::vector<std::optional<httplib::Result>> answers(2);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] { answers[i] = server.post("/v1/completions", R"({"prompt": "hi", "max_tokens": 3})"); });
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server.async_.num_in_flight() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(server.async_.num_in_flight(), 2);
  expect_error(server.post("/v1/completions", R"({"prompt": "hi", "max_tokens": 3})"), 429, "", "queue_full");
  while (server.async_.num_in_flight() > 0 && std::chrono::steady_clock::now() < deadline) server.async_.run_once();
  for (std::thread& client : clients) client.join();
  for (const auto& answer : answers) {
    ASSERT_TRUE(answer && *answer);
    EXPECT_EQ((*answer)->status, 200);
  }
  const auto metrics = server.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("splitflow_requests_rejected_total{reason=\"queue_full\"} 1"), std::string::npos);
}

TEST(HttpServer, ListOfPromptsIsQueuedWholeOrRefused) {
  TestServer server(ServerOptions{.start_engine = false, .max_queue = 4});
  std::optional<httplib::Result> first, batch;
  std::thread first_client([&] { first = server.post("/v1/completions", R"({"prompt": "hi", "max_tokens": 3})"); });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server.async_.num_in_flight() < 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(server.async_.num_in_flight(), 1);
  // 1 waiting + 4 prompts > 4: the whole request is refused, none of its prompts queued.
  expect_error(server.post("/v1/completions", R"({"prompt": ["a", "b", "c", "d"], "max_tokens": 3})"), 429, "",
               "queue_full");
  EXPECT_EQ(server.async_.num_in_flight(), 1);
  std::thread batch_client([&] { batch = server.post("/v1/completions", R"({"prompt": ["a", "b", "c"], "max_tokens": 3})"); });
  while (server.async_.num_in_flight() < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(server.async_.num_in_flight(), 4);
  while (server.async_.num_in_flight() > 0 && std::chrono::steady_clock::now() < deadline) server.async_.run_once();
  first_client.join();
  batch_client.join();
  ASSERT_TRUE(first && *first && batch && *batch);
  EXPECT_EQ((*first)->status, 200);
  ASSERT_EQ((*batch)->status, 200) << (*batch)->body;
  EXPECT_EQ(json::parse((*batch)->body)["choices"].size(), 3u);
}

// A plain socket, so the test decides when the connection drops.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawClient() { close(); }
  bool connected() const { return connected_; }
  void post(const std::string& path, const std::string& body) {
    const std::string request = "POST " + path + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd_, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  }
  // Reads until `needle` has arrived (or the peer closes).
  bool read_until(const std::string& needle) {
    char buffer[4096];
    while (received_.find(needle) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) return false;
      received_.append(buffer, static_cast<size_t>(n));
    }
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string received_;
};

// Posts a completion of `requests` prompts (400 tokens each) and steps the engine until it is
// under way (streaming: until the first chunk reaches the client), hangs up, then steps on: the
// handler notices (streaming: on its next write or poll; whole response: the socket in
// CLOSE_WAIT) and cancels every prompt, long before 400 tokens run out. Every KV block must be free
// again and each prompt counted as aborted, none as finished.
void expect_disconnect_cancels(const std::string& prompt_json, int requests, bool stream) {
  TestServer server(ServerOptions{.start_engine = false});
  RawClient client(server.port_);
  ASSERT_TRUE(client.connected());
  client.post("/v1/completions", R"({"prompt": )" + prompt_json + R"(, "max_tokens": 400, "ignore_eos": true, "temperature": 0, "stream": )" +
                                     (stream ? "true" : "false") + "}");
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server.async_.num_in_flight() < requests && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(server.async_.num_in_flight(), requests);
  if (stream) {
    std::atomic<bool> got_chunk{false};
    std::thread reader([&] { got_chunk = client.read_until("\"text_completion\""); });
    while (!got_chunk && std::chrono::steady_clock::now() < deadline) {
      server.async_.run_once();
      std::this_thread::sleep_for(2ms);
    }
    reader.join();
    ASSERT_TRUE(got_chunk);
  } else {
    for (int i = 0; i < 5; ++i) server.async_.run_once();  // prompts computed, a few tokens out
  }
  client.close();
  while (server.async_.num_in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    server.async_.run_once();
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(server.async_.num_in_flight(), 0);
  const BlockManager& blocks = server.stories_.engine->scheduler().block_manager();
  EXPECT_EQ(blocks.num_free_blocks(), blocks.num_blocks());
  const std::string metrics = server.async_.render_metrics();
  EXPECT_NE(metrics.find(fmt::format("splitflow_request_finished_total{{finished_reason=\"abort\"}} {}", requests)),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("finished_reason=\"length\""), std::string::npos) << "a request ran to its end";
  EXPECT_NE(metrics.find("splitflow_kv_cache_usage_ratio 0\n"), std::string::npos);
}

TEST(HttpServer, DisconnectMidStreamCancelsAndFreesBlocks) {
  expect_disconnect_cancels(R"("Once upon a time")", 1, true);
}

TEST(HttpServer, DisconnectCancelsEveryPromptOfTheRequest) {
  expect_disconnect_cancels(R"(["Once upon a time", "Tom had", "The cat sat"])", 3, true);
}

// Without streaming nothing is written before the end; the hang-up is read from the socket state.
TEST(HttpServer, DisconnectBeforeAWholeResponseCancelsToo) {
  expect_disconnect_cancels(R"(["Once upon a time", "Tom had"])", 2, false);
}

TEST(HttpServer, ShutdownDrainsInFlightRequestsAndRefusesNewOnes) {
  TestServer server(ServerOptions{.start_engine = false});
  std::optional<httplib::Result> in_flight;
  std::thread client([&] {
    in_flight = server.post("/v1/completions", R"({"prompt": "Tom had", "max_tokens": 20, "ignore_eos": true, "stream": true})");
  });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server.async_.num_in_flight() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  server.async_.run_once();
  std::thread stopper([&] { server.shutdown(10s); });
  // While draining: new work and health checks get 503.
  int health = 0;
  while (health != 503 && std::chrono::steady_clock::now() < deadline) {
    const auto res = server.client().Get("/health");
    health = res ? res->status : 0;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(health, 503);
  expect_error(server.post("/v1/completions", R"({"prompt": "hi"})"), 503, "", "shutting_down");
  while (server.async_.num_in_flight() > 0 && std::chrono::steady_clock::now() < deadline) server.async_.run_once();
  stopper.join();
  client.join();
  ASSERT_TRUE(in_flight && *in_flight);
  EXPECT_EQ((*in_flight)->status, 200);
  const std::vector<std::string> events = sse_events((*in_flight)->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

TEST(HttpServer, ModelsHealthAndMetrics) {
  TestServer server;
  const auto models = server.client().Get("/v1/models");
  ASSERT_TRUE(models);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "stories");
  EXPECT_EQ(list["data"][0]["max_model_len"], 512);
  ASSERT_TRUE(server.post("/v1/completions", R"({"prompt": "hi", "max_tokens": 4})"));
  // The client may read the answer before the server has seen its last byte written (the exchange
  // closes then) and recorded the request's latency: ask again until both show, for up to 2 s.
  auto metrics = server.client().Get("/metrics");
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
       metrics && std::chrono::steady_clock::now() < deadline &&
       (metrics->body.find("splitflow_http_open_requests 1\n") == std::string::npos ||
        metrics->body.find("splitflow_e2e_request_latency_seconds_count 1\n") == std::string::npos);) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    metrics = server.client().Get("/metrics");
  }
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  for (const char* name : {"splitflow_time_to_first_token_seconds_bucket", "splitflow_inter_token_latency_seconds_count",
                           "splitflow_e2e_request_latency_seconds_sum", "splitflow_num_sequences_waiting",
                           "splitflow_num_sequences_running", "splitflow_num_sequences_swapped",
                           "splitflow_kv_cache_usage_ratio", "splitflow_prompt_throughput_tokens_per_second",
                           "splitflow_generation_tokens_total", "splitflow_preemptions_total",
                           "splitflow_prefix_cache_hit_rate"}) {
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name;
  }
  EXPECT_NE(metrics->body.find("splitflow_e2e_request_latency_seconds_count 1\n"), std::string::npos);
  // The front's own: this /metrics request is the one open.
  EXPECT_NE(metrics->body.find("splitflow_http_open_requests 1\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("splitflow_http_refused_connections_total 0\n"), std::string::npos);
}

// Issue 29: --api-key guards /v1/* (OpenAI's 401), /health and /metrics stay open.
TEST(HttpServer, ApiKeyGuardsTheApi) {
  TestServer server(ServerOptions{.api_keys = {"sk-first", "sk-second"}});
  const std::string body = R"({"prompt": [1, 2], "max_tokens": 2})";
  expect_error(server.post("/v1/completions", body), 401, "", "invalid_api_key");
  auto client = server.client();
  for (const std::string key : {"sk-firs", "sk-first2", "", "sk-second!", "Sk-second"}) {
    SCOPED_TRACE(key);
    expect_error(client.Post("/v1/completions", {{"Authorization", "Bearer " + key}}, body, "application/json"), 401,
                 "", "invalid_api_key");
  }
  for (const std::string key : {"sk-first", "sk-second"}) {
    const auto ok = client.Post("/v1/completions", {{"Authorization", "Bearer " + key}}, body, "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
  }
  expect_error(client.Get("/v1/models"), 401, "", "invalid_api_key");
  EXPECT_EQ(client.Get("/v1/models", {{"Authorization", "Bearer sk-second"}})->status, 200);
  EXPECT_EQ(client.Get("/health")->status, 200);
  EXPECT_EQ(client.Get("/metrics")->status, 200);
}

// Issue 29: CORS for the allowed origins: preflights, and the header on whole and streamed answers.
TEST(HttpServer, CorsForAllowedOrigins) {
  TestServer server(ServerOptions{.allowed_origins = {"https://app.example"}});
  auto client = server.client();
  const httplib::Headers preflight = {{"Origin", "https://app.example"},
                                      {"Access-Control-Request-Method", "POST"},
                                      {"Access-Control-Request-Headers", "authorization, content-type"}};
  const auto allowed = client.Options("/v1/chat/completions", preflight);
  ASSERT_TRUE(allowed);
  EXPECT_EQ(allowed->status, 204);
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Methods"), "POST, OPTIONS");
  EXPECT_EQ(allowed->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  const auto refused = client.Options("/v1/chat/completions", {{"Origin", "https://evil.example"},
                                                               {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 403);
  EXPECT_FALSE(refused->has_header("Access-Control-Allow-Origin"));
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    const json body = {{"prompt", {1, 2}}, {"max_tokens", 2}, {"stream", stream}};
    const auto answer = client.Post("/v1/completions", {{"Origin", "https://app.example"}}, body.dump(), "application/json");
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->status, 200);
    EXPECT_EQ(answer->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
    EXPECT_EQ(answer->get_header_value("Vary"), "Origin");
    const auto other = client.Post("/v1/completions", {{"Origin", "https://evil.example"}}, body.dump(), "application/json");
    EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  }
  EXPECT_FALSE(client.Get("/health")->has_header("Access-Control-Allow-Origin"));  // no Origin sent
}

}  // namespace
}  // namespace splitflow
