// server/http_server.h — the OpenAI-compatible HTTP front end over an AsyncEngine (cpp-httplib):
//   POST /v1/completions, POST /v1/chat/completions (the model's chat template), GET /v1/models,
//   GET /health, GET /metrics (Prometheus text).
// Each request is parsed and checked on its connection's thread (server/openai_api.h), tokenized
// there, submitted to the engine, and answered as one JSON body or as server-sent events
// ("data: {chunk}\n\n" ... "data: [DONE]\n\n"). A completions request with a list of prompts runs
// one engine request per prompt, admitted together, and answers them as one (choice p * n + i).
// A streaming client that goes away cancels its request (every prompt), which frees its KV blocks. Every failure is an OpenAI error body with its status:
// 400 bad input, 404 unknown model or route, 413 body too large, 429 queue full, 503 draining,
// 500 engine failure. docs/serving.md is the user-facing description.
// httplib types stay inside http_server.cpp.
#pragma once

#include "chat/chat_template.h"
#include "server/async_engine.h"
#include "tokenizer/tokenizer.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace splitflow {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0: any free port (bind() returns it)
  std::string served_model_name = "model";  // the only name "model" may give
  // Connection threads: an in-flight request holds one until it is answered, so this bounds the
  // requests served at once (more connections wait for a thread).
  int32_t http_threads = 64;
  size_t max_body_bytes = size_t{32} << 20;
};

class HttpServer {
 public:
  // tokenizer may be null (ids-only models: prompts must be token ids; no chat); chat_template
  // may be empty (the chat endpoint then answers 400). Both must outlive the server.
  HttpServer(AsyncEngine& engine, const Tokenizer* tokenizer, std::optional<ChatTemplate> chat_template,
             HttpServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and returns the port; throws splitflow::Error when it cannot.
  int bind();
  // Serves on the calling thread until shutdown().
  void serve();
  // Any thread: new requests get 503, in-flight ones run to completion (at most drain_timeout,
  // then they are aborted), and serve() returns once their connections are answered.
  void shutdown(std::chrono::milliseconds drain_timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace splitflow
