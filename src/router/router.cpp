#include "router/router.h"

#include "core/error.h"
#include "http/http_front.h"
#include "server/metrics.h"
#include "server/openai_api.h"

#include <fmt/format.h>
#ifdef SPLITFLOW_HAS_HTTPLIB
#include <httplib.h>
#endif
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

namespace splitflow::router {

#ifdef SPLITFLOW_HAS_HTTPLIB

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kJson = "application/json";

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void send_error(http::Exchange& exchange, const ApiError& error) {
  exchange.respond(error.status, kJson, dump_json(error_body(error)));
}

std::string sse(const json& value) { return "data: " + dump_json(value) + "\n\n"; }

// Writes to one client's exchange from the upstream thread without waiting on the client: data
// merges while a write is out; the stream starts at the first push and ends after the last write.
class ClientStream : public std::enable_shared_from_this<ClientStream> {
 public:
  explicit ClientStream(std::shared_ptr<http::Exchange> exchange) : exchange_(std::move(exchange)) {}

  void push(std::string data) {
    std::lock_guard lock(mutex_);
    if (!started_) {
      exchange_->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      started_ = true;
    }
    pending_ += data;
    if (!writing_) flush_locked();
  }

  void end() {
    std::lock_guard lock(mutex_);
    ending_ = true;
    if (!writing_ && pending_.empty()) exchange_->end_stream();
  }

  bool started() const {
    std::lock_guard lock(mutex_);
    return started_;
  }

 private:
  void flush_locked() {
    writing_ = true;
    exchange_->write(std::move(pending_), [self = shared_from_this()] {
      std::lock_guard lock(self->mutex_);
      self->writing_ = false;
      if (!self->pending_.empty()) return self->flush_locked();
      if (self->ending_) self->exchange_->end_stream();
    });
    pending_.clear();
  }

  std::shared_ptr<http::Exchange> exchange_;
  mutable std::mutex mutex_;
  std::string pending_;
  bool started_ = false, writing_ = false, ending_ = false;
};

// What the router counts (Prometheus text at /metrics).
struct RouterMetrics {
  std::atomic<int64_t> accepted{0}, finished{0}, failed{0}, cancelled{0}, rejected{0};
  std::atomic<int64_t> failovers{0}, resumed_tokens{0}, split{0}, whole{0}, kv_failures{0};
  std::mutex mutex;
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}};
  Histogram e2e{{0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}};
};

}  // namespace

struct Router::Impl : std::enable_shared_from_this<Impl> {
  explicit Impl(RouterConfig config)
      : config(std::move(config)), scheduler(make_instances(this->config), this->config.scheduler),
        front(front_config(this->config)) {}

  static std::vector<InstanceState> make_instances(const RouterConfig& config) {
    std::vector<InstanceState> instances;
    auto add = [&](const std::vector<std::string>& urls, Pool pool) {
      for (std::string url : urls) {
        while (!url.empty() && url.back() == '/') url.pop_back();
        SF_CHECK(url.rfind("http://", 0) == 0, "instance URL '{}' must start with http://", url);
        InstanceState state;
        state.url = url;
        state.pool = pool;
        instances.push_back(std::move(state));
      }
    };
    add(config.prompt_urls, Pool::Prompt);
    add(config.token_urls, Pool::Token);
    add(config.mixed_urls, Pool::Mixed);
    SF_CHECK(!instances.empty(), "route: give instances with --prompt, --token or --mixed");
    SF_CHECK(config.prompt_urls.empty() == config.token_urls.empty() || !config.mixed_urls.empty(),
             "route: prompt instances need token instances and the reverse (or a mixed pool to fall back to)");
    return instances;
  }

  static http::FrontConfig front_config(const RouterConfig& config) {
    http::FrontConfig front;
    front.host = config.host;
    front.port = config.port;
    front.io_threads = config.io_threads;
    front.worker_threads = config.worker_threads;
    front.limits.request_timeout = std::chrono::milliseconds(0);
    front.error_body = [](int status, const std::string& message) {
      return dump_json(error_body(ApiError(status, message, "", status == 503 ? "service_unavailable" : "invalid_request_error")));
    };
    front.error_content_type = kJson;
    return front;
  }

  RouterConfig config;
  std::mutex mutex;  // the scheduler
  ClusterScheduler scheduler;
  http::Front front;
  RouterMetrics metrics;
  std::atomic<bool> draining{false}, stopping{false};
  std::atomic<int64_t> jobs{0};
  std::thread health_thread;
  std::mutex health_mutex;
  std::condition_variable health_wake;
  std::string model_name;

  void check_health();
  void health_loop();
  void install_routes();
  void route_request(const std::shared_ptr<http::Exchange>& exchange, bool chat);
  std::string render_metrics();
  json instances_json();
};

void Router::Impl::check_health() {
  std::vector<std::string> urls;
  {
    std::lock_guard lock(mutex);
    for (const InstanceState& s : scheduler.instances()) urls.push_back(s.url);
  }
  for (size_t i = 0; i < urls.size(); ++i) {
    httplib::Client client(urls[i]);
    const auto timeout = config.health_timeout;
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    bool healthy = false;
    std::string kv_address;
    bool imports_kv = false;
    int64_t capacity = 0;
    if (auto result = client.Get("/splitwise/info"); result && result->status == 200) {
      const json info = json::parse(result->body, nullptr, false);
      if (info.is_object()) {
        healthy = true;
        kv_address = info.value("kv_address", std::string());
        imports_kv = info.value("imports_kv", false);
        capacity = info.value("num_blocks", int64_t{0}) * info.value("block_size", int64_t{0});
        // A listener on every interface is reached at the host the router reaches the instance at.
        if (kv_address.rfind("0.0.0.0:", 0) == 0) {
          const std::string host = urls[i].substr(7, urls[i].rfind(':') - 7);
          kv_address = host + kv_address.substr(7);
        }
      }
    } else if (auto health = client.Get("/health"); health && health->status == 200) {
      healthy = true;  // an instance without Splitwise endpoints: whole requests only
    }
    if (healthy && model_name.empty()) {
      if (auto models = client.Get("/v1/models"); models && models->status == 200) {
        const json body = json::parse(models->body, nullptr, false);
        if (body.is_object() && body.contains("data") && !body["data"].empty())
          model_name = body["data"][0].value("id", std::string());
      }
    }
    std::lock_guard lock(mutex);
    InstanceState& s = scheduler.instances()[i];
    if (healthy != s.healthy) {
      spdlog::info("route: {} ({}) is {}", s.url, pool_name(s.pool), healthy ? "up" : "down");
    }
    s.healthy = healthy;
    if (healthy) {
      s.kv_address = kv_address;
      s.imports_kv = imports_kv;
      s.kv_capacity_tokens = capacity;
    }
  }
}

void Router::Impl::health_loop() {
  while (!stopping) {
    {
      std::unique_lock lock(health_mutex);
      health_wake.wait_for(lock, config.health_interval, [&] { return stopping.load(); });
    }
    if (stopping) return;
    check_health();
  }
}

json Router::Impl::instances_json() {
  std::lock_guard lock(mutex);
  json list = json::array();
  for (const InstanceState& s : scheduler.instances()) {
    list.push_back({{"url", s.url},
                    {"pool", std::string(pool_name(s.pool))},
                    {"healthy", s.healthy},
                    {"kv_address", s.kv_address},
                    {"imports_kv", s.imports_kv},
                    {"kv_capacity_tokens", s.kv_capacity_tokens},
                    {"pending_prompt_tokens", s.pending_prompt_tokens},
                    {"kv_tokens", s.kv_tokens},
                    {"active_requests", s.active_requests},
                    {"placed", s.placed},
                    {"failed", s.failed}});
  }
  return {{"instances", list},
          {"requests",
           {{"accepted", metrics.accepted.load()},
            {"finished", metrics.finished.load()},
            {"failed", metrics.failed.load()},
            {"cancelled", metrics.cancelled.load()},
            {"rejected", metrics.rejected.load()},
            {"failovers", metrics.failovers.load()},
            {"resumed_tokens", metrics.resumed_tokens.load()},
            {"kv_transfer_failures", metrics.kv_failures.load()},
            {"split", metrics.split.load()},
            {"whole", metrics.whole.load()}}}};
}

std::string Router::Impl::render_metrics() {
  std::string out;
  render_counter(out, "splitflow_router_requests_total", "requests accepted", metrics.accepted);
  render_counter(out, "splitflow_router_requests_finished_total", "requests answered whole", metrics.finished);
  render_counter(out, "splitflow_router_requests_failed_total", "requests that failed on every attempt",
                 metrics.failed);
  render_counter(out, "splitflow_router_requests_cancelled_total", "requests whose client went away",
                 metrics.cancelled);
  render_counter(out, "splitflow_router_requests_rejected_total", "requests refused (bad input, draining)",
                 metrics.rejected);
  render_counter(out, "splitflow_router_failovers_total", "requests placed again after their instance failed",
                 metrics.failovers);
  render_counter(out, "splitflow_router_resumed_tokens_total",
                 "tokens already streamed that a failover handed to the new instance", metrics.resumed_tokens);
  render_counter(out, "splitflow_router_kv_transfer_failures_total", "attempts that failed in the KV transfer",
                 metrics.kv_failures);
  render_counter(out, "splitflow_router_split_placements_total", "placements on a prompt + token pair",
                 metrics.split);
  render_counter(out, "splitflow_router_whole_placements_total", "placements of a whole request on one instance",
                 metrics.whole);
  {
    std::lock_guard lock(metrics.mutex);
    metrics.ttft.render(out, "splitflow_router_time_to_first_token_seconds", "time to first token seen by the router");
    metrics.e2e.render(out, "splitflow_router_e2e_latency_seconds", "request latency seen by the router");
  }
  std::lock_guard lock(mutex);
  auto family = [&](const char* name, const char* help, const char* type, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const InstanceState& s : scheduler.instances()) {
      out += fmt::format("{}{{instance=\"{}\",pool=\"{}\"}} {}\n", name, s.url, pool_name(s.pool), value(s));
    }
  };
  family("splitflow_router_instance_healthy", "1 when the instance's latest check or request succeeded", "gauge",
         [](const InstanceState& s) { return s.healthy ? 1 : 0; });
  family("splitflow_router_instance_pending_prompt_tokens", "prompt tokens placed and not yet computed", "gauge",
         [](const InstanceState& s) { return s.pending_prompt_tokens; });
  family("splitflow_router_instance_kv_tokens", "KV tokens (prompt + max_tokens) of requests decoding there", "gauge",
         [](const InstanceState& s) { return s.kv_tokens; });
  family("splitflow_router_instance_active_requests", "requests streaming from the instance", "gauge",
         [](const InstanceState& s) { return s.active_requests; });
  family("splitflow_router_instance_placed_total", "requests placed on the instance", "counter",
         [](const InstanceState& s) { return s.placed; });
  family("splitflow_router_instance_failures_total", "failures seen on the instance", "counter",
         [](const InstanceState& s) { return s.failed; });
  return out;
}

namespace {

// One client request, from its arrival to its last byte, over as many placements as it takes.
class RouteJob {
 public:
  RouteJob(std::shared_ptr<Router::Impl> router, std::shared_ptr<http::Exchange> exchange, json body, bool chat)
      : router_(std::move(router)), exchange_(std::move(exchange)), body_(std::move(body)), chat_(chat),
        client_stream_(std::make_shared<ClientStream>(exchange_)) {
    stream_ = body_.value("stream", false);
    if (body_.contains("stream_options") && body_["stream_options"].is_object())
      include_usage_ = body_["stream_options"].value("include_usage", false);
    if (body_.contains("splitflow") && body_["splitflow"].is_object())
      client_token_ids_ = body_["splitflow"].value("return_token_ids", false);
    prompt_tokens_ = estimate_prompt_tokens();
    max_tokens_ = body_.contains("max_tokens") && body_["max_tokens"].is_number_integer()
                      ? body_["max_tokens"].get<int64_t>()
                      : body_.contains("max_completion_tokens") && body_["max_completion_tokens"].is_number_integer()
                            ? body_["max_completion_tokens"].get<int64_t>()
                            : 256;
    id_ = fmt::format("{}-route{}", chat_ ? "chatcmpl" : "cmpl", next_id_++);
    created_ = static_cast<int64_t>(std::time(nullptr));
  }

  void run() {
    start_ = Clock::now();
    exchange_->on_abort([aborted = aborted_] { *aborted = true; });
    std::vector<int> exclude;
    std::string last_error = "no instance is available";
    int last_status = 503;
    for (int attempt = 0; attempt < router_->config.max_attempts && !*aborted_; ++attempt) {
      if (attempt > 0) {
        ++router_->metrics.failovers;
        router_->metrics.resumed_tokens += static_cast<int64_t>(token_ids_.size());
        std::this_thread::sleep_for(std::chrono::milliseconds(50 * attempt));
      }
      Placement placement;
      std::string upstream_url, kv_address;
      {
        std::lock_guard lock(router_->mutex);
        placement = router_->scheduler.place(prompt_tokens_, max_tokens_, exclude);
        if (placement.token >= 0) {
          upstream_url = router_->scheduler.instances()[placement.token].url;
          if (placement.split()) kv_address = router_->scheduler.instances()[placement.prompt].kv_address;
        }
      }
      if (placement.token < 0) {
        // Every instance is down or excluded: let the health checks catch up, then try them all again.
        last_error = "no instance is available";
        exclude.clear();
        std::this_thread::sleep_for(router_->config.health_interval);
        continue;
      }
      ++(placement.split() ? router_->metrics.split : router_->metrics.whole);
      placement_ = placement;
      prompt_pending_ = true;
      const Outcome outcome = attempt_on(upstream_url, kv_address);
      {
        std::lock_guard lock(router_->mutex);
        router_->scheduler.release(placement, prompt_tokens_, max_tokens_, prompt_pending_);
        if (outcome.kind == Outcome::kDone) return finish();
        if (outcome.kind == Outcome::kClientError) break;
        if (outcome.kind == Outcome::kInstanceDown) router_->scheduler.mark_failed(placement.token);
        if (outcome.kind == Outcome::kKvFailed && placement.split()) router_->scheduler.mark_failed(placement.prompt);
      }
      if (outcome.kind == Outcome::kKvFailed) ++router_->metrics.kv_failures;
      // A failed transfer is the prompt instance's (or the link's): the token instance stays eligible.
      if (outcome.kind == Outcome::kKvFailed && placement.split()) {
        exclude.push_back(placement.prompt);
      } else {
        exclude.push_back(placement.token);
      }
      last_error = outcome.message;
      last_status = outcome.status;
      spdlog::warn("route: {} attempt {} on {}{} failed after {} tokens: {}", id_, attempt + 1, upstream_url,
                   kv_address.empty() ? "" : " (KV from " + kv_address + ")", token_ids_.size(), outcome.message);
      if (outcome.kind == Outcome::kClientError) break;
    }
    if (*aborted_) {
      ++router_->metrics.cancelled;
      return;
    }
    ++router_->metrics.failed;
    fail(last_status, last_error);
  }

 private:
  struct Outcome {
    enum Kind { kDone, kClientError, kInstanceDown, kKvFailed, kRetry } kind = kRetry;
    std::string message;
    int status = 503;
  };

  int64_t estimate_prompt_tokens() const {
    // Without the tokenizer: 4 bytes a token for text, exact for token ids.
    int64_t bytes = 0;
    if (chat_) {
      if (body_.contains("messages") && body_["messages"].is_array()) {
        for (const json& message : body_["messages"]) bytes += static_cast<int64_t>(message.dump().size());
      }
    } else if (body_.contains("prompt")) {
      const json& prompt = body_["prompt"];
      if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) return static_cast<int64_t>(prompt.size());
      bytes = static_cast<int64_t>(prompt.dump().size());
    }
    return std::max<int64_t>(1, bytes / 4);
  }

  json upstream_body(const std::string& kv_address) const {
    json body = body_;
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    json ext = {{"return_token_ids", true}};
    if (!token_ids_.empty()) ext["resume_token_ids"] = token_ids_;
    if (!kv_address.empty()) {
      ext["kv_source"] = router_->config.kv_transfer.empty() ? kv_address : router_->config.kv_transfer + "@" + kv_address;
    }
    body["splitflow"] = std::move(ext);
    return body;
  }

  Outcome attempt_on(const std::string& url, const std::string& kv_address) {
    Outcome outcome;
    httplib::Client client(url);
    client.set_connection_timeout(router_->config.connect_timeout);
    client.set_read_timeout(router_->config.upstream_timeout);
    client.set_write_timeout(router_->config.connect_timeout);
    httplib::Request request;
    request.method = "POST";
    request.path = chat_ ? "/v1/chat/completions" : "/v1/completions";
    request.set_header("Content-Type", kJson);
    request.set_header("Accept", "text/event-stream");
    request.body = dump_json(upstream_body(kv_address));
    int status = 0;
    std::string pending, error_body_text, stream_error;
    bool done = false;
    finish_reason_.clear();
    request.response_handler = [&](const httplib::Response& response) {
      status = response.status;
      return true;
    };
    request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      if (*aborted_) return false;
      if (status != 200) {
        error_body_text.append(data, size);
        return true;
      }
      pending.append(data, size);
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (event.rfind("data:", 0) != 0) continue;
        std::string payload = event.substr(5);
        payload.erase(0, payload.find_first_not_of(' '));
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        json chunk = json::parse(payload, nullptr, false);
        if (!chunk.is_object()) {
          stream_error = "the upstream sent an event that is not JSON";
          return false;
        }
        if (chunk.contains("error")) {
          stream_error = chunk["error"].is_object() ? chunk["error"].value("message", payload) : payload;
          continue;
        }
        on_chunk(std::move(chunk));
      }
      return !*aborted_;
    };
    const httplib::Result result = client.send(request);
    if (*aborted_) return {Outcome::kRetry, "the client went away", 499};
    if (!result) {
      // Refused, reset or cut mid-stream (kill -9), or silent past the upstream timeout.
      outcome.kind = Outcome::kInstanceDown;
      outcome.message = fmt::format("{}: {}", url, httplib::to_string(result.error()));
      return outcome;
    }
    if (status != 200) {
      const json error = json::parse(error_body_text, nullptr, false);
      outcome.message = error.is_object() && error.contains("error") ? error["error"].value("message", error_body_text)
                                                                     : error_body_text;
      outcome.status = status;
      // The client's own mistake goes back to it; overload and failures go elsewhere.
      outcome.kind = status >= 400 && status < 500 && status != 408 && status != 429 ? Outcome::kClientError
                                                                                      : Outcome::kRetry;
      if (outcome.kind == Outcome::kClientError && !token_ids_.empty()) outcome.kind = Outcome::kRetry;
      return outcome;
    }
    if (!stream_error.empty()) {
      outcome.kind = stream_error.find("kv_transfer_failed") != std::string::npos ? Outcome::kKvFailed : Outcome::kRetry;
      outcome.message = stream_error;
      return outcome;
    }
    if (!done || finish_reason_.empty() || finish_reason_ == "abort") {
      outcome.kind = Outcome::kInstanceDown;
      outcome.message = fmt::format("{}: the stream ended early ({})", url,
                                    finish_reason_.empty() ? "no finish reason" : "finish reason " + finish_reason_);
      return outcome;
    }
    outcome.kind = Outcome::kDone;
    return outcome;
  }

  void on_chunk(json chunk) {
    if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) {
      if (chunk.contains("usage") && chunk["usage"].is_object()) upstream_prompt_tokens_ = chunk["usage"].value("prompt_tokens", 0);
      return;
    }
    json& choice = chunk["choices"][0];
    if (choice.contains("token_ids") && choice["token_ids"].is_array()) {
      for (const json& id : choice["token_ids"]) token_ids_.push_back(id.get<int32_t>());
      if (!choice["token_ids"].empty() && prompt_pending_) {  // the prompt left its instance's queue
        std::lock_guard lock(router_->mutex);
        router_->scheduler.prompt_done(placement_, prompt_tokens_);
        prompt_pending_ = false;
      }
      if (!choice["token_ids"].empty() && !first_token_seen_) {
        first_token_seen_ = true;
        std::lock_guard lock(router_->metrics.mutex);
        router_->metrics.ttft.observe(seconds_since(start_));
      }
    }
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
      finish_reason_ = choice["finish_reason"].get<std::string>();
    }
    if (chat_ && choice.contains("delta") && choice["delta"].is_object()) {
      json& delta = choice["delta"];
      if (delta.contains("role")) {
        if (role_sent_) return;  // a failover's new opening: the client has had it
        role_sent_ = true;
      }
      if (delta.contains("content") && delta["content"].is_string()) text_ += delta["content"].get<std::string>();
    } else if (choice.contains("text") && choice["text"].is_string()) {
      text_ += choice["text"].get<std::string>();
    }
    if (finish_reason_ == "abort") return;  // an instance that stopped: the failover continues the stream
    if (!client_token_ids_) choice.erase("token_ids");
    chunk["id"] = id_;
    chunk["created"] = created_;
    if (stream_) client_stream_->push(sse(chunk));
  }

  void finish() {
    ++router_->metrics.finished;
    {
      std::lock_guard lock(router_->metrics.mutex);
      router_->metrics.e2e.observe(seconds_since(start_));
    }
    const int64_t completion = static_cast<int64_t>(token_ids_.size());
    const json usage = {{"prompt_tokens", upstream_prompt_tokens_},
                        {"completion_tokens", completion},
                        {"total_tokens", upstream_prompt_tokens_ + completion}};
    const std::string model = body_.value("model", router_->model_name);
    if (stream_) {
      if (include_usage_) {
        client_stream_->push(sse({{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                                  {"created", created_}, {"model", model}, {"choices", json::array()},
                                  {"usage", usage}}));
      }
      client_stream_->push("data: [DONE]\n\n");
      client_stream_->end();
      return;
    }
    json choice = {{"index", 0}, {"finish_reason", finish_reason_}, {"logprobs", nullptr}};
    if (chat_) {
      choice["message"] = {{"role", "assistant"}, {"content", text_}};
    } else {
      choice["text"] = text_;
    }
    if (client_token_ids_) choice["token_ids"] = token_ids_;
    exchange_->respond(200, kJson,
                       dump_json({{"id", id_}, {"object", chat_ ? "chat.completion" : "text_completion"},
                                  {"created", created_}, {"model", model}, {"choices", json::array({choice})},
                                  {"usage", usage}}));
  }

  void fail(int status, const std::string& message) {
    const ApiError error(status >= 400 ? status : 503, message, "",
                         status >= 400 && status < 500 ? "invalid_request_error" : "service_unavailable");
    if (client_stream_->started()) {
      client_stream_->push(sse(error_body(error)));
      client_stream_->push("data: [DONE]\n\n");
      client_stream_->end();
      return;
    }
    send_error(*exchange_, error);
  }

  static inline std::atomic<int64_t> next_id_{0};

  std::shared_ptr<Router::Impl> router_;
  std::shared_ptr<http::Exchange> exchange_;
  json body_;
  const bool chat_;
  std::shared_ptr<ClientStream> client_stream_;
  bool stream_ = false, include_usage_ = false, client_token_ids_ = false;
  int64_t prompt_tokens_ = 1, max_tokens_ = 256;
  std::string id_;
  int64_t created_ = 0;
  Clock::time_point start_;
  std::shared_ptr<std::atomic<bool>> aborted_ = std::make_shared<std::atomic<bool>>(false);
  // The stream so far, over every attempt.
  std::vector<int32_t> token_ids_;
  std::string text_;
  std::string finish_reason_;
  bool role_sent_ = false, first_token_seen_ = false, prompt_pending_ = false;
  Placement placement_;  // the current attempt's
  int upstream_prompt_tokens_ = 0;
};

}  // namespace

void Router::Impl::route_request(const std::shared_ptr<http::Exchange>& exchange, bool chat) {
  if (draining) {
    ++metrics.rejected;
    return send_error(*exchange, ApiError(503, "the router is shutting down", "", "service_unavailable", "shutting_down"));
  }
  json body;
  try {
    body = parse_json_body(exchange->request().body);
    // Checked here what the router itself relies on; the instance checks the rest.
    if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1) && !body["n"].is_null())
      throw ApiError(400, "the router serves n = 1 (one choice per request)", "n");
    if (!chat && body.contains("prompt") && body["prompt"].is_array() && !body["prompt"].empty() &&
        !body["prompt"][0].is_number_integer() && body["prompt"].size() > 1)
      throw ApiError(400, "the router serves one prompt per request", "prompt");
    if (body.value("echo", false)) throw ApiError(400, "the router does not echo prompts", "echo");
    // A seed of its own, so a resumed stream keeps drawing the same sequence.
    const bool sampled = !body.contains("temperature") || !body["temperature"].is_number() ||
                         body["temperature"].get<double>() > 0;
    if (sampled && (!body.contains("seed") || body["seed"].is_null())) {
      body["seed"] = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
    }
  } catch (const ApiError& e) {
    ++metrics.rejected;
    return send_error(*exchange, e);
  }
  ++metrics.accepted;
  ++jobs;
  auto job = std::make_shared<RouteJob>(shared_from_this(), exchange, std::move(body), chat);
  std::thread([self = shared_from_this(), job] {
    try {
      job->run();
    } catch (const std::exception& e) {
      spdlog::error("route: a request failed: {}", e.what());
    }
    --self->jobs;
  }).detach();
}

void Router::Impl::install_routes() {
  front.route("POST", "/v1/completions", [this](const std::shared_ptr<http::Exchange>& e) { route_request(e, false); },
              http::Dispatch::kWorker);
  front.route("POST", "/v1/chat/completions", [this](const std::shared_ptr<http::Exchange>& e) { route_request(e, true); },
              http::Dispatch::kWorker);
  front.route(
      "GET", "/v1/models",
      [this](const std::shared_ptr<http::Exchange>& exchange) {
        const json model = {{"id", model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "splitflow"}};
        exchange->respond(200, kJson, dump_json({{"object", "list"}, {"data", json::array({model})}}));
      },
      http::Dispatch::kInline);
  front.route(
      "GET", "/health",
      [this](const std::shared_ptr<http::Exchange>& exchange) {
        if (draining) return send_error(*exchange, ApiError(503, "the router is shutting down", "", "service_unavailable"));
        exchange->respond(200, kJson, R"({"status":"ok"})");
      },
      http::Dispatch::kInline);
  front.route(
      "GET", "/metrics",
      [this](const std::shared_ptr<http::Exchange>& exchange) {
        exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8", render_metrics());
      },
      http::Dispatch::kWorker);
  front.route(
      "GET", "/router/instances",
      [this](const std::shared_ptr<http::Exchange>& exchange) { exchange->respond(200, kJson, dump_json(instances_json())); },
      http::Dispatch::kWorker);
}

Router::Router(RouterConfig config) : impl_(std::make_shared<Impl>(std::move(config))) {
  SF_CHECK(impl_->config.max_attempts >= 1, "route: --max-attempts must be at least 1");
  impl_->model_name = impl_->config.served_model_name;
  impl_->install_routes();
}

Router::~Router() {
  impl_->stopping = true;
  impl_->health_wake.notify_all();
  if (impl_->health_thread.joinable()) impl_->health_thread.join();
}

int Router::bind() {
  impl_->check_health();
  for (const InstanceState& s : impl_->scheduler.instances()) {
    spdlog::info("route: {} ({}) {}{}", s.url, pool_name(s.pool), s.healthy ? "up" : "down",
                 s.kv_address.empty() ? "" : ", KV at " + s.kv_address);
  }
  const int port = impl_->front.bind();
  impl_->health_thread = std::thread([impl = impl_] { impl->health_loop(); });
  return port;
}

void Router::serve() { impl_->front.serve(); }

void Router::shutdown(std::chrono::milliseconds drain_timeout) {
  impl_->draining = true;
  impl_->front.stop_keep_alive();
  const auto deadline = Clock::now() + drain_timeout;
  while (impl_->jobs > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  while (impl_->front.stats().open_exchanges > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  impl_->stopping = true;
  impl_->health_wake.notify_all();
  impl_->front.stop();
}

#else

// Without cpp-httplib (its client reaches the instances) the router is refused when made.
struct Router::Impl {};
Router::Router(RouterConfig) {
  SF_CHECK(false, "splitflow route: this build has no cpp-httplib, the router's HTTP client (install libcpp-httplib-dev, "
                  "or put a header-only httplib.h in SPLITFLOW_EXTRA_INCLUDE, and rebuild)");
}
Router::~Router() = default;
int Router::bind() { return 0; }
void Router::serve() {}
void Router::shutdown(std::chrono::milliseconds) {}

#endif

}  // namespace splitflow::router
