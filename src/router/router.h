// router/router.h — `splitflow route`: an OpenAI-compatible front (/v1/completions,
// /v1/chat/completions, streaming or not, /v1/models, /health, /metrics, /router/instances) over
// prompt, token and mixed instances (`splitflow serve --role ...`), placing each request with the
// Splitwise cluster scheduler (router/cluster_scheduler.h) and keeping it alive through faults:
//  - every request goes upstream as a stream with token ids (the "splitflow" extension of
//    docs/splitwise.md), so the router knows every token its client has seen;
//  - when the upstream fails (connection refused or dropped, kill -9, an error event such as a
//    failed KV transfer, a 5xx, the stream ending without [DONE]), the request is placed again,
//    away from the instances it failed on, with resume_token_ids = the tokens already streamed:
//    the new instance recomputes prompt + those tokens and continues, and the client's stream goes
//    on without a gap or a repeat (its ids, created time and the chat role chunk stay the first
//    attempt's; usage counts every token);
//  - instances that fail are left out until their health check (GET /splitwise/info, every
//    health_interval) passes again.
// A request with no seed and temperature > 0 gets one from the router, so a resumed stream keeps
// drawing from the same seeded sequence. The client-facing sockets live on the event-driven front
// (http/); each request's upstream stream is read by a thread of its own, which writes to the
// client through the exchange without waiting on it. It never runs a model.
#pragma once

#include "router/cluster_scheduler.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace splitflow::router {

struct RouterConfig {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> prompt_urls, token_urls, mixed_urls;  // http://host:port
  ClusterSchedulerConfig scheduler;
  int max_attempts = 4;  // placements per request (the first and the failovers)
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds health_timeout{1000};
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds upstream_timeout{120'000};  // the most an upstream stream may stay silent
  std::string kv_transfer;  // "layerwise" / "serialized": asked of every split request ("" : the token instance's default)
  int io_threads = 2;
  int worker_threads = 2;
  std::string served_model_name;  // "" : the first instance's
};

class Router {
 public:
  explicit Router(RouterConfig config);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Checks every instance once (logging what it found), binds, returns the port.
  int bind();
  // Serves on the calling thread until shutdown().
  void serve();
  // Any thread: new requests get 503; in-flight ones finish (at most drain_timeout).
  void shutdown(std::chrono::milliseconds drain_timeout);

  struct Impl;  // router.cpp's (its request jobs reach it)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace splitflow::router
