// Splitwise end to end, as users run it: `splitflow serve --role prompt|token|mixed` processes and
// `splitflow route` in front of them, on the real stories260K model (CPU backend), talked to over
// HTTP. The reference for every output is a mixed instance answering the same request directly
// (greedy: the tokens must be equal). Faults are real: kill -9 of a token instance mid-stream and
// of a prompt instance mid-transfer, SIGSTOP of a prompt instance (a stalled transfer). After each
// fault the router's counts of requests accepted / finished / failed are printed and checked.
#include "test_paths.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace splitflow::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// A splitflow process with its stderr in a file; the port is read from its startup line.
class Process {
 public:
  Process(const std::string& name, std::vector<std::string> args) {
    log_ = (std::filesystem::temp_directory_path() / ("sf_splitwise_" + name + "_" + std::to_string(::getpid()) + ".log")).string();
    args.insert(args.begin(), splitflow_binary());
    pid_ = ::fork();
    if (pid_ == 0) {
      if (!std::freopen(log_.c_str(), "w", stderr) || !std::freopen("/dev/null", "w", stdout)) _exit(127);
      std::vector<char*> argv;
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    const std::regex listening(R"(on http://127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 1200 && port_ == 0; ++i) {
      std::smatch match;
      const std::string text = log();
      if (std::regex_search(text, match, listening)) port_ = std::stoi(match[1]);
      if (port_ == 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      if (port_ == 0) std::this_thread::sleep_for(50ms);
    }
    if (port_ == 0) ADD_FAILURE() << name << " did not start: " << log();
  }
  ~Process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(log_);
  }
  void signal(int sig) { ::kill(pid_, sig); }
  void kill9() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
};

std::vector<std::string> serve_args(const std::string& role, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"serve", "--model", shared_path("models/stories260K-hf"), "--port", "0",
                                   "--kv-port", "0", "--role", role, "--num-blocks", "160", "--max-batch-tokens",
                                   "64", "--max-seqs", "8", "--no-warmup", "--io-threads", "1", "--http-threads", "2",
                                   "--chat-template", shared_path("models/llama3_1-tokenizer/tokenizer_config.json")};
  // A flag given again replaces the default's value.
  for (size_t i = 0; i < extra.size(); ++i) {
    const auto at = std::find(args.begin(), args.end(), extra[i]);
    if (at != args.end() && i + 1 < extra.size() && extra[i].rfind("--", 0) == 0 && extra[i + 1].rfind("--", 0) != 0) {
      *(at + 1) = extra[++i];
    } else {
      args.push_back(extra[i]);
    }
  }
  return args;
}

json get_json(const std::string& url, const std::string& path) {
  httplib::Client client(url);
  client.set_read_timeout(5s);
  auto result = client.Get(path);
  if (!result || result->status != 200) return json();
  return json::parse(result->body, nullptr, false);
}

// Streams a request; `on_event` sees each parsed chunk. Returns the concatenated text, the token
// ids (the request asks for them), the finish reason and whether [DONE] came without an error.
struct Streamed {
  std::string text;
  std::vector<int32_t> ids;
  std::string finish_reason, error;
  bool done = false;
  int role_chunks = 0;
  std::set<std::string> ids_seen;
};

Streamed stream(const std::string& url, const std::string& path, json body,
                const std::function<void(const Streamed&)>& on_event = nullptr) {
  body["stream"] = true;
  body["splitflow"] = {{"return_token_ids", true}};
  httplib::Client client(url);
  client.set_read_timeout(120s);
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.set_header("Content-Type", "application/json");
  request.body = body.dump();
  Streamed out;
  std::string pending;
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    pending.append(data, size);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      std::string event = pending.substr(6, end - 6);  // after "data: "
      pending.erase(0, end + 2);
      if (event == "[DONE]") {
        out.done = true;
        continue;
      }
      const json chunk = json::parse(event);
      if (chunk.contains("error")) {
        out.error = chunk["error"].dump();
        continue;
      }
      if (chunk.contains("id")) out.ids_seen.insert(chunk["id"].get<std::string>());
      if (chunk["choices"].empty()) continue;
      const json& choice = chunk["choices"][0];
      if (choice.contains("token_ids"))
        for (const json& id : choice["token_ids"]) out.ids.push_back(id.get<int32_t>());
      if (choice.contains("text")) out.text += choice["text"].get<std::string>();
      if (choice.contains("delta")) {
        if (choice["delta"].contains("role")) ++out.role_chunks;
        if (choice["delta"].contains("content")) out.text += choice["delta"]["content"].get<std::string>();
      }
      if (choice["finish_reason"].is_string()) out.finish_reason = choice["finish_reason"].get<std::string>();
      if (on_event) on_event(out);
    }
    return true;
  };
  auto result = client.send(request);
  if (!result) out.error = "connection: " + httplib::to_string(result.error());
  return out;
}

json completion(const std::string& prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

json router_counts(const Process& router) { return get_json(router.url(), "/router/instances")["requests"]; }

void print_counts(const char* after, const json& counts) {
  std::printf("[router counts after %s] accepted %lld, finished %lld, failed %lld, failovers %lld, kv transfer "
              "failures %lld, resumed tokens %lld\n",
              after, counts["accepted"].get<long long>(), counts["finished"].get<long long>(),
              counts["failed"].get<long long>(), counts["failovers"].get<long long>(),
              counts["kv_transfer_failures"].get<long long>(), counts["resumed_tokens"].get<long long>());
}

// Gauges are published after the engine's iteration that answered the request: poll a little.
bool eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 100; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

int64_t metric(const std::string& url, const std::string& name) {
  httplib::Client client(url);
  auto result = client.Get("/metrics");
  if (!result) return -1;
  const std::regex line("\n" + name + " ([0-9.e+]+)");
  std::smatch match;
  if (!std::regex_search(result->body, match, line)) return -1;
  return static_cast<int64_t>(std::stod(match[1]));
}

const std::vector<std::string> kPrompts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
    "Tom had a big red ball.",
    "The sun was shining and the birds were singing in the tall green trees. A little dog",
};

TEST(SplitwiseE2E, PromptPlusTokenThroughTheRouterEqualsOneMixedInstance) {
  Process prompt("prompt", serve_args("prompt"));
  Process token("token", serve_args("token", {"--block-size", "8"}));  // re-blocked on receipt
  Process mixed("mixed", serve_args("mixed"));
  Process router("router", {"route", "--port", "0", "--prompt", prompt.url(), "--token", token.url()});
  for (const std::string& text : kPrompts) {
    const Streamed reference = stream(mixed.url(), "/v1/completions", completion(text, 40));
    ASSERT_TRUE(reference.done) << reference.error;
    const Streamed routed = stream(router.url(), "/v1/completions", completion(text, 40));
    EXPECT_TRUE(routed.done) << routed.error;
    EXPECT_EQ(routed.ids, reference.ids);
    EXPECT_EQ(routed.text, reference.text);
    // Not streamed: the router assembles the answer.
    httplib::Client client(router.url());
    client.set_read_timeout(60s);
    json body = completion(text, 40);
    auto whole = client.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200) << whole->body;
    EXPECT_EQ(json::parse(whole->body)["choices"][0]["text"], reference.text);
    EXPECT_EQ(json::parse(whole->body)["usage"]["completion_tokens"], 40);
  }
  // Chat, streamed, serialized transfer.
  json chat = {{"messages", {{{"role", "user"}, {"content", "Tell me about a cat."}}}}, {"max_tokens", 30},
               {"temperature", 0}, {"ignore_eos", true}};
  const Streamed reference = stream(mixed.url(), "/v1/chat/completions", chat);
  const Streamed routed = stream(router.url(), "/v1/chat/completions", chat);
  EXPECT_EQ(routed.ids, reference.ids);
  EXPECT_EQ(routed.text, reference.text);
  EXPECT_EQ(routed.role_chunks, 1);
  const json instances = get_json(router.url(), "/router/instances");
  EXPECT_EQ(instances["requests"]["split"].get<int64_t>(), 7);  // every request went prompt -> token
  EXPECT_EQ(instances["requests"]["failed"], 0);
  const json token_info = get_json(token.url(), "/splitwise/info");
  // The prompt side counts a transfer once it reads the Ack, just after the request runs.
  EXPECT_TRUE(eventually([&] { return get_json(prompt.url(), "/splitwise/info")["transfers"]["sent"] == 7; }));
  const json prompt_info = get_json(prompt.url(), "/splitwise/info");
  EXPECT_EQ(token_info["transfers"]["received"], 7);
  EXPECT_EQ(prompt_info["transfers"]["sent"], 7);
  std::printf("transfers: %lld bytes sent; last prompt compute %.2f ms, visible %.3f ms; mean fetch %.2f ms\n",
              prompt_info["transfers"]["sent_bytes"].get<long long>(),
              prompt_info["transfers"]["last_prompt_compute_ms"].get<double>(),
              prompt_info["transfers"]["last_visible_ms"].get<double>(),
              token_info["transfers"]["mean_fetch_ms"].get<double>());
  print_counts("no fault", instances["requests"]);
  // Bad input gets a clear error and everything goes on.
  httplib::Client client(router.url());
  auto bad = client.Post("/v1/completions", R"({"prompt": "x", "n": 3})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  httplib::Client direct(token.url());
  auto unknown = direct.Post("/v1/completions",
                             R"({"prompt": "x", "splitflow": {"kv_source": "127.0.0.1:1"}, "max_tokens": 2})",
                             "application/json");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 500);  // the transfer from a dead address failed, named
  EXPECT_NE(unknown->body.find("kv_transfer_failed"), std::string::npos) << unknown->body;
  auto malformed = direct.Post("/v1/completions", R"({"prompt": "x", "splitflow": {"kv_source": 7}})", "application/json");
  ASSERT_TRUE(malformed);
  EXPECT_EQ(malformed->status, 400);
  EXPECT_EQ(get_json(token.url(), "/health")["status"], "ok");
}

TEST(SplitwiseE2E, ATokenInstanceKilledMidStreamLosesNoRequest) {
  Process prompt("prompt", serve_args("prompt"));
  // One sequence at a time: the killed instance holds running and queued requests.
  Process token1("token1", serve_args("token", {"--max-seqs", "1"}));
  Process token2("token2", serve_args("token"));
  Process mixed("mixed", serve_args("mixed"));
  Process router("router", {"route", "--port", "0", "--prompt", prompt.url(), "--token", token1.url(), "--token",
                            token2.url(), "--health-interval", "0.3"});
  constexpr int kRequests = 6;
  std::vector<Streamed> references(kRequests), routed(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    references[i] = stream(mixed.url(), "/v1/completions", completion(kPrompts[i % kPrompts.size()], 300 + 20 * i));
  }
  std::atomic<bool> killed{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      routed[i] = stream(router.url(), "/v1/completions", completion(kPrompts[i % kPrompts.size()], 300 + 20 * i));
    });
  }
  // Once token1 has streamed tokens (of a request that wants 300 or more), kill it.
  for (int i = 0; i < 1000 && !killed; ++i) {
    std::this_thread::sleep_for(5ms);
    if (metric(token1.url(), "splitflow_generation_tokens_total") >= 10) {
      token1.kill9();
      killed = true;
    }
  }
  for (std::thread& client : clients) client.join();
  ASSERT_TRUE(killed) << "token1 never held a request";
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(routed[i].done) << i << ": " << routed[i].error;
    EXPECT_EQ(routed[i].error, "") << i;
    EXPECT_EQ(routed[i].ids, references[i].ids) << "request " << i << ": one continuous stream, no gap or repeat";
    EXPECT_EQ(routed[i].text, references[i].text) << i;
    EXPECT_EQ(routed[i].ids_seen.size(), 1u) << "one id for the whole stream";
  }
  const json counts = router_counts(router);
  print_counts("kill -9 of a token instance mid-stream", counts);
  EXPECT_EQ(counts["accepted"], kRequests);
  EXPECT_EQ(counts["finished"], kRequests);
  EXPECT_EQ(counts["failed"], 0);
  EXPECT_GE(counts["failovers"].get<int64_t>(), 1);
  EXPECT_GE(counts["resumed_tokens"].get<int64_t>(), 5);
}

// Waits until the instance has KV transfer bytes staged (a transfer in flight).
bool wait_for_transfer(const Process& instance) {
  for (int i = 0; i < 1000; ++i) {
    const json info = get_json(instance.url(), "/splitwise/info");
    if (info.is_object() && info["transfers"]["staged_bytes"].get<int64_t>() > 0) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST(SplitwiseE2E, APromptInstanceKilledMidTransferIsRetriedElsewhere) {
  // prompt1 sends each layer's rows 400 ms apart: a transfer takes seconds.
  Process prompt1("prompt1", serve_args("prompt", {"--kv-debug-rows-delay-ms", "400"}));
  Process prompt2("prompt2", serve_args("prompt"));
  Process token("token", serve_args("token"));
  Process mixed("mixed", serve_args("mixed"));
  Process router("router", {"route", "--port", "0", "--prompt", prompt1.url(), "--prompt", prompt2.url(), "--token",
                            token.url(), "--health-interval", "0.3"});
  const json body = completion(kPrompts[0], 30);
  const Streamed reference = stream(mixed.url(), "/v1/completions", body);
  Streamed routed;
  std::thread client([&] { routed = stream(router.url(), "/v1/completions", body); });
  ASSERT_TRUE(wait_for_transfer(prompt1));
  prompt1.kill9();
  client.join();
  EXPECT_TRUE(routed.done) << routed.error;
  EXPECT_EQ(routed.ids, reference.ids);
  EXPECT_EQ(routed.text, reference.text);
  const json counts = router_counts(router);
  print_counts("kill -9 of a prompt instance mid-transfer", counts);
  EXPECT_EQ(counts["accepted"], 1);
  EXPECT_EQ(counts["finished"], 1);
  EXPECT_EQ(counts["failed"], 0);
  EXPECT_EQ(counts["kv_transfer_failures"], 1);
  EXPECT_TRUE(eventually([&] { return get_json(prompt2.url(), "/splitwise/info")["transfers"]["sent"] == 1; }));
  // The token instance freed the reservation of the failed transfer.
  const json info = get_json(token.url(), "/splitwise/info");
  EXPECT_EQ(info["transfers"]["receive_failed"], 1);
  EXPECT_EQ(info["transfers"]["staged_bytes"], 0);
}

TEST(SplitwiseE2E, AStalledTransferTimesOutAndFreesItsBlocksOnBothSides) {
  Process prompt1("prompt1", serve_args("prompt", {"--kv-debug-rows-delay-ms", "200"}));
  Process prompt2("prompt2", serve_args("prompt"));
  Process token("token", serve_args("token", {"--kv-transfer-timeout", "0.7"}));
  Process mixed("mixed", serve_args("mixed"));
  Process router("router", {"route", "--port", "0", "--prompt", prompt1.url(), "--prompt", prompt2.url(), "--token",
                            token.url(), "--health-interval", "0.3"});
  const json body = completion(kPrompts[2], 30);
  const Streamed reference = stream(mixed.url(), "/v1/completions", body);
  Streamed routed;
  std::thread client([&] { routed = stream(router.url(), "/v1/completions", body); });
  ASSERT_TRUE(wait_for_transfer(prompt1));
  prompt1.signal(SIGSTOP);  // the link stalls: nothing more comes, the connection stays open
  client.join();
  EXPECT_TRUE(routed.done) << routed.error;
  EXPECT_EQ(routed.ids, reference.ids);
  const json counts = router_counts(router);
  print_counts("a stalled transfer (SIGSTOP of its prompt instance)", counts);
  EXPECT_EQ(counts["finished"], 1);
  EXPECT_EQ(counts["failed"], 0);
  EXPECT_EQ(counts["kv_transfer_failures"], 1);
  // The token side: the timeout counted, every block free again, nothing staged.
  const json token_info = get_json(token.url(), "/splitwise/info");
  EXPECT_EQ(token_info["transfers"]["receive_timeouts"], 1);
  EXPECT_EQ(token_info["transfers"]["staged_bytes"], 0);
  EXPECT_TRUE(eventually([&] { return metric(token.url(), "splitflow_kv_cache_blocks_free") == 160; }));
  // The prompt side, once it runs again, finds its receiver gone and drops what it staged.
  prompt1.signal(SIGCONT);
  json prompt_info;
  for (int i = 0; i < 200; ++i) {
    prompt_info = get_json(prompt1.url(), "/splitwise/info");
    if (prompt_info.is_object() && prompt_info["transfers"]["send_failed"].get<int64_t>() >= 1 &&
        prompt_info["transfers"]["staged_bytes"].get<int64_t>() == 0)
      break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(prompt_info["transfers"]["send_failed"], 1);
  EXPECT_EQ(prompt_info["transfers"]["staged_bytes"], 0);
  EXPECT_EQ(prompt_info["transfers"]["sent"], 0);
  EXPECT_TRUE(eventually([&] { return metric(prompt1.url(), "splitflow_kv_cache_blocks_free") == 160; }));
}

}  // namespace
}  // namespace splitflow::test
