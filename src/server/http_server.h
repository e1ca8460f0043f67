// server/http_server.h — the OpenAI-compatible HTTP routes over an AsyncEngine, served by the
// event-driven front in http/:
//   POST /v1/completions, POST /v1/chat/completions (the model's chat template), GET /v1/models,
//   GET /health, GET /metrics (Prometheus text); with an AsyncEmbedder (an encoder_only model)
//   POST /v1/embeddings, and the two generative routes answer 400.
// Each request is parsed and checked on a worker thread (server/openai_api.h), tokenized there,
// submitted to the engine, and answered as one JSON body or as server-sent events
// ("data: {chunk}\n\n" ... "data: [DONE]\n\n"), driven by the engine's news (StreamGroup's
// listener), never by a thread waiting on a client. A completions request with a list of prompts
// runs one engine request per prompt, admitted together, and answers them as one (choice p * n + i).
// A client that goes away, whole or streaming, cancels its request (every prompt), which frees its
// KV blocks. Every failure is an OpenAI error body with its status: 400 bad input, 404 unknown
// model or route, 405, 413 body too large, 415 compressed body, 431 headers too large, 429 queue
// full, 503 draining or too many connections, 504 request timeout, 500 engine failure, 401 a
// missing or wrong API key (--api-key). Browsers are served by CORS (--allowed-origins); TLS is
// left to a proxy in front.
// /health, /metrics and /v1/models answer on the I/O threads, so they stay quick under any load.
// docs/serving.md is the user-facing description.
#pragma once

#include "chat/chat_template.h"
#include "http/http_front.h"
#include "server/async_embedder.h"
#include "server/async_engine.h"
#include "tokenizer/tokenizer.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace splitflow {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0: any free port (bind() returns it)
  std::string served_model_name = "model";  // the only name "model" may give
  int32_t io_threads = 2;      // sockets, and the quick routes
  int32_t worker_threads = 4;  // parsing, tokenizing, chat templates (no thread waits on a client)
  int32_t backlog = 4096;
  int32_t max_connections = 8192;  // beyond: 503 with Retry-After
  http::Limits limits;             // header and body sizes, deadlines
  // Keys a client must send as "Authorization: Bearer KEY" on /v1/* (401 otherwise); empty: no
  // check. /health and /metrics stay open (probes and scrapers carry no key).
  std::vector<std::string> api_keys;
  std::vector<std::string> allowed_origins;  // CORS (http::FrontConfig::allowed_origins)
  // Splitwise (docs/splitwise.md): GET /splitwise/info answers this JSON, and /metrics appends
  // this text (the KV transfer metrics). Empty: no route, nothing appended.
  std::function<std::string()> splitwise_info;
  std::function<std::string()> extra_metrics;
};

class HttpServer {
 public:
  // tokenizer may be null (ids-only models: prompts must be token ids; no chat); chat_template
  // may be empty (the chat endpoint then answers 400). Both must outlive the server.
  // embedder: set for an embedding model (it serves /v1/embeddings; engine then gets no work);
  // null for a generative one (/v1/embeddings answers 400). It must outlive the server.
  HttpServer(AsyncEngine& engine, const Tokenizer* tokenizer, std::optional<ChatTemplate> chat_template,
             HttpServerConfig config, AsyncEmbedder* embedder = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and returns the port; throws splitflow::Error when it cannot.
  int bind();
  // Serves on the calling thread until shutdown().
  void serve();
  // Any thread: new requests get 503, in-flight ones run to completion (at most drain_timeout,
  // then they are aborted), and serve() returns once their responses are sent.
  void shutdown(std::chrono::milliseconds drain_timeout);
  http::FrontStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace splitflow
