#include "server/http_server.h"

#include "core/error.h"
#include "server/openai_api.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <ctime>
#include <thread>
#include <variant>

namespace splitflow {

using nlohmann::json;

namespace {

// How often a streaming handler with nothing to send checks that its client is still there.
constexpr std::chrono::milliseconds kDisconnectPoll{50};

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.status;
  res.set_content(dump_json(error_body(error)), "application/json");
}

std::string sse_event(const json& value) { return "data: " + dump_json(value) + "\n\n"; }

json finish_reason_json(FinishReason reason) {
  return reason == FinishReason::None ? json(nullptr) : json(std::string(finish_reason_name(reason)));
}

// What a response needs besides the engine's outputs.
struct ResponseShape {
  bool chat = false;
  std::string id;
  std::string model;
  int64_t created = 0;
  std::string echo_text;  // completions with echo: the prompt, before each choice's text
  bool logprobs = false;
  bool include_usage = false;
};

// One choice of a finished request, for the non-streaming answer.
struct ChoiceResult {
  std::string text;
  std::vector<TokenOutput> tokens;
  FinishReason finish_reason = FinishReason::None;
};

json usage_json(int32_t prompt_tokens, int64_t completion_tokens, int32_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

}  // namespace

struct HttpServer::Impl {
  Impl(AsyncEngine& engine, const Tokenizer* tokenizer, std::optional<ChatTemplate> chat_template,
       HttpServerConfig config)
      : engine(engine), tokenizer(tokenizer), chat_template(std::move(chat_template)), config(std::move(config)),
        max_model_len(engine.engine().config().max_model_len) {}

  AsyncEngine& engine;
  const Tokenizer* tokenizer;
  std::optional<ChatTemplate> chat_template;
  HttpServerConfig config;
  const int32_t max_model_len;  // immutable engine configuration, safe to read on any thread
  httplib::Server server;
  std::atomic<bool> draining{false};
  std::atomic<bool> serve_entered{false}, serve_finished{false};
  // Streaming responses whose provider has not finished: stopping httplib ends their writes, so
  // shutdown waits for them after the engine is idle (their last chunks are still unsent).
  std::atomic<int32_t> open_streams{0};

  void install_routes();
  void completions(const httplib::Request& req, httplib::Response& res);
  void chat_completions(const httplib::Request& req, httplib::Response& res);

  void check_model(const std::string& model) const {
    if (!model.empty() && model != config.served_model_name) {
      throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'.", model,
                                      config.served_model_name),
                     "model", "invalid_request_error", "model_not_found");
    }
  }

  void check_draining() const {
    if (draining) throw ApiError(503, "the server is shutting down", "", "service_unavailable", "shutting_down");
  }

  // OpenAI's rule: prompt and max_tokens together must fit the context. Without max_tokens the
  // request gets what is left, at most default_max_tokens (and at least one token).
  void fit_context(GenerationRequest& request, size_t prompt_tokens, const char* prompt_field,
                   int32_t default_max_tokens) const {
    const int64_t prompt = static_cast<int64_t>(prompt_tokens);
    if (prompt > max_model_len) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens, but the {} has {} tokens.",
                                 max_model_len, prompt_field, prompt),
                     prompt_field, "invalid_request_error", "context_length_exceeded");
    }
    const int64_t room = max_model_len - prompt;
    if (request.max_tokens_given) {
      if (request.params.max_tokens > room) {
        throw ApiError(400,
                       fmt::format("This model's maximum context length is {} tokens, but {} tokens were requested "
                                   "({} in the {}, {} for the completion).",
                                   max_model_len, prompt + request.params.max_tokens, prompt, prompt_field,
                                   request.params.max_tokens),
                       "max_tokens", "invalid_request_error", "context_length_exceeded");
      }
    } else {
      request.params.max_tokens = static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(default_max_tokens, room)));
    }
  }

  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt_ids, const GenerationRequest& request,
                                        const char* prompt_field) {
    try {
      return engine.submit(std::move(prompt_ids), request.params, request.n);
    } catch (const SubmitRejected& e) {
      if (e.reason == SubmitRejected::Reason::QueueFull) throw ApiError(429, e.what(), "", "rate_limit_error", "queue_full");
      throw ApiError(503, e.what(), "", "service_unavailable", "shutting_down");
    } catch (const Error& e) {
      throw ApiError(400, e.what(), prompt_field);
    }
  }

  void respond(const std::shared_ptr<RequestStream>& stream, const GenerationRequest& request, ResponseShape shape,
               httplib::Response& res);
  void respond_whole(RequestStream& stream, const ResponseShape& shape, httplib::Response& res);
  void respond_stream(const std::shared_ptr<RequestStream>& stream, ResponseShape shape, httplib::Response& res);
};

void HttpServer::Impl::install_routes() {
  auto guarded = [this](void (Impl::*handler)(const httplib::Request&, httplib::Response&)) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        check_draining();
        (this->*handler)(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, ApiError(400, e.what()));
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, e.what(), "", "internal_error"));
      }
    };
  };
  server.Post("/v1/completions", guarded(&Impl::completions));
  server.Post("/v1/chat/completions", guarded(&Impl::chat_completions));
  server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", config.served_model_name}, {"object", "model"}, {"created", 0},
                        {"owned_by", "splitflow"}, {"max_model_len", max_model_len}};
    res.set_content(dump_json({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining) {
      send_error(res, ApiError(503, "the server is shutting down", "", "service_unavailable", "shutting_down"));
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(engine.render_metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  // Routing failures (404, 405), oversized bodies (413) and the like get OpenAI-shaped bodies too.
  server.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = fmt::format("{} {}: HTTP {}", req.method, req.path, res.status);
    if (res.status == 404) message = fmt::format("no route for {} {}", req.method, req.path);
    if (res.status == 413) message = "the request body is too large";
    send_error(res, ApiError(res.status, message));
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    std::string message = "unknown error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, message, "", "internal_error"));
  });
}

void HttpServer::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  CompletionRequest request = parse_completion_request(parse_json_body(req.body));
  check_model(request.model);
  std::vector<int32_t> prompt_ids;
  ResponseShape shape;
  if (const auto* text = std::get_if<std::string>(&request.prompt)) {
    if (!tokenizer) throw ApiError(400, "this model has no tokenizer: send 'prompt' as token ids", "prompt");
    prompt_ids = tokenizer->encode(*text, /*add_special=*/true);
    if (request.echo) shape.echo_text = *text;
  } else {
    prompt_ids = std::get<std::vector<int32_t>>(request.prompt);
    if (request.echo && tokenizer) shape.echo_text = tokenizer->decode(prompt_ids, /*skip_special=*/false);
  }
  constexpr int32_t kOpenAiDefaultMaxTokens = 16;  // the completions API's documented default
  fit_context(request, prompt_ids.size(), "prompt", kOpenAiDefaultMaxTokens);
  const auto stream = submit(std::move(prompt_ids), request, "prompt");
  shape.id = fmt::format("cmpl-{}", stream->id());
  shape.logprobs = request.logprobs.has_value();
  respond(stream, request, std::move(shape), res);
}

void HttpServer::Impl::chat_completions(const httplib::Request& req, httplib::Response& res) {
  ChatRequest request = parse_chat_request(parse_json_body(req.body));
  check_model(request.model);
  if (!chat_template) {
    throw ApiError(400,
                   "this model has no chat template: start the server with --chat-template FILE "
                   "(a tokenizer_config.json, chat_template.json or .jinja file)",
                   "messages");
  }
  if (!tokenizer) throw ApiError(400, "this model has no tokenizer, which chat needs", "messages");
  // Rendered from the body parsed again keeping key order: `tojson` in a template prints keys in
  // the client's order, as transformers does.
  const auto ordered = nlohmann::ordered_json::parse(req.body);  // parse_json_body accepted it: depth <= 64
  const auto kwargs = ordered.find("chat_template_kwargs");
  std::string prompt;
  try {
    prompt = chat_template->render(ordered.at("messages"), /*add_generation_prompt=*/true,
                                   kwargs != ordered.end() && kwargs->is_object() ? *kwargs
                                                                                  : nlohmann::ordered_json::object());
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the chat template rejected these messages: {}", e.what()), "messages");
  }
  // The template writes the BOS token itself, as transformers' apply_chat_template assumes.
  std::vector<int32_t> prompt_ids = tokenizer->encode(prompt, /*add_special=*/false);
  fit_context(request, prompt_ids.size(), "messages", max_model_len);
  const auto stream = submit(std::move(prompt_ids), request, "messages");
  ResponseShape shape;
  shape.chat = true;
  shape.id = fmt::format("chatcmpl-{}", stream->id());
  shape.logprobs = request.logprobs;
  respond(stream, request, std::move(shape), res);
}

void HttpServer::Impl::respond(const std::shared_ptr<RequestStream>& stream, const GenerationRequest& request,
                               ResponseShape shape, httplib::Response& res) {
  shape.model = config.served_model_name;
  shape.created = static_cast<int64_t>(std::time(nullptr));
  shape.include_usage = request.include_usage;
  if (request.stream) {
    respond_stream(stream, std::move(shape), res);
  } else {
    respond_whole(*stream, shape, res);
  }
}

void HttpServer::Impl::respond_whole(RequestStream& stream, const ResponseShape& shape, httplib::Response& res) {
  // No disconnect check here: the request runs to its end (max_tokens bounds it).
  std::vector<ChoiceResult> results(static_cast<size_t>(stream.num_choices()));
  RequestUpdate update;
  int32_t cached_tokens = 0;
  while (true) {
    if (!stream.next(update, std::chrono::milliseconds(1000))) continue;
    for (size_t i = 0; i < results.size(); ++i) {
      ChoiceDelta& delta = update.choices[i];
      results[i].text += delta.text;
      std::move(delta.tokens.begin(), delta.tokens.end(), std::back_inserter(results[i].tokens));
      if (delta.finish_reason != FinishReason::None) results[i].finish_reason = delta.finish_reason;
    }
    cached_tokens = update.num_cached_prompt_tokens;
    if (update.finished) break;
  }
  if (!update.error.empty()) throw ApiError(500, update.error, "", "internal_error");

  json choices = json::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const ChoiceResult& result = results[i];
    completion_tokens += static_cast<int64_t>(result.tokens.size());
    json choice = {{"index", i}, {"finish_reason", finish_reason_json(result.finish_reason)}};
    if (shape.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text}};
      choice["logprobs"] = shape.logprobs ? chat_logprobs(tokenizer, result.tokens) : json(nullptr);
    } else {
      choice["text"] = shape.echo_text + result.text;
      size_t offset = shape.echo_text.size();
      choice["logprobs"] = shape.logprobs ? completion_logprobs(tokenizer, result.tokens, offset) : json(nullptr);
    }
    choices.push_back(std::move(choice));
  }
  const json body = {{"id", shape.id},
                     {"object", shape.chat ? "chat.completion" : "text_completion"},
                     {"created", shape.created},
                     {"model", shape.model},
                     {"choices", std::move(choices)},
                     {"usage", usage_json(stream.num_prompt_tokens(), completion_tokens, cached_tokens)}};
  res.set_content(dump_json(body), "application/json");
}

void HttpServer::Impl::respond_stream(const std::shared_ptr<RequestStream>& stream, ResponseShape shape,
                                      httplib::Response& res) {
  struct State {
    ResponseShape shape;
    std::shared_ptr<RequestStream> stream;
    std::vector<bool> started;          // (n) the choice's opening chunk was sent
    std::vector<size_t> text_offsets;   // (n) completions logprobs' text_offset
    int64_t completion_tokens = 0;
  };
  auto state = std::make_shared<State>();
  state->stream = stream;
  state->started.assign(static_cast<size_t>(stream->num_choices()), false);
  state->text_offsets.assign(static_cast<size_t>(stream->num_choices()), shape.echo_text.size());
  state->shape = std::move(shape);

  res.set_header("Cache-Control", "no-cache");
  ++open_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state](size_t, httplib::DataSink& sink) {
        const ResponseShape& shape = state->shape;
        RequestUpdate update;
        while (!state->stream->next(update, kDisconnectPoll)) {
          if (!sink.is_writable()) {
            engine.cancel(state->stream);
            return false;
          }
        }
        auto chunk = [&](size_t index, json fields) {
          json choice = {{"index", index}};
          choice.update(fields);
          return sse_event({{"id", shape.id},
                            {"object", shape.chat ? "chat.completion.chunk" : "text_completion"},
                            {"created", shape.created},
                            {"model", shape.model},
                            {"choices", json::array({std::move(choice)})}});
        };
        std::string out;
        for (size_t i = 0; i < update.choices.size(); ++i) {
          const ChoiceDelta& delta = update.choices[i];
          if (!state->started[i]) {
            // Chat opens each choice with the assistant's role; completions with the echoed prompt.
            if (shape.chat) {
              out += chunk(i, {{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                               {"finish_reason", nullptr}});
            } else if (!shape.echo_text.empty()) {
              out += chunk(i, {{"text", shape.echo_text}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
            }
            state->started[i] = true;
          }
          if (delta.tokens.empty() && delta.text.empty() && delta.finish_reason == FinishReason::None) continue;
          state->completion_tokens += static_cast<int64_t>(delta.tokens.size());
          json fields = {{"finish_reason", finish_reason_json(delta.finish_reason)}};
          if (shape.chat) {
            fields["delta"] = delta.text.empty() ? json::object() : json{{"content", delta.text}};
            fields["logprobs"] = shape.logprobs ? chat_logprobs(tokenizer, delta.tokens) : json(nullptr);
          } else {
            fields["text"] = delta.text;
            fields["logprobs"] =
                shape.logprobs ? completion_logprobs(tokenizer, delta.tokens, state->text_offsets[i]) : json(nullptr);
          }
          out += chunk(i, std::move(fields));
        }
        if (update.finished) {
          if (!update.error.empty()) out += sse_event(error_body(ApiError(500, update.error, "", "internal_error")));
          if (shape.include_usage) {
            out += sse_event({{"id", shape.id},
                              {"object", shape.chat ? "chat.completion.chunk" : "text_completion"},
                              {"created", shape.created},
                              {"model", shape.model},
                              {"choices", json::array()},
                              {"usage", usage_json(state->stream->num_prompt_tokens(), state->completion_tokens,
                                                   update.num_cached_prompt_tokens)}});
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          engine.cancel(state->stream);
          return false;
        }
        if (update.finished) sink.done();
        return true;
      },
      [this, state](bool success) {
        if (!success) engine.cancel(state->stream);
        --open_streams;
      });
}

HttpServer::HttpServer(AsyncEngine& engine, const Tokenizer* tokenizer, std::optional<ChatTemplate> chat_template,
                       HttpServerConfig config)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(chat_template), std::move(config))) {
  SF_CHECK(impl_->config.http_threads > 0, "http_threads must be positive, got {}", impl_->config.http_threads);
  const size_t threads = static_cast<size_t>(impl_->config.http_threads);
  impl_->server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl_->server.set_payload_max_length(impl_->config.max_body_bytes);
  impl_->install_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const HttpServerConfig& config = impl_->config;
  if (config.port == 0) {
    const int port = impl_->server.bind_to_any_port(config.host);
    SF_CHECK(port > 0, "cannot listen on {}: no free port", config.host);
    return port;
  }
  SF_CHECK(impl_->server.bind_to_port(config.host, config.port), "cannot listen on {}:{} (in use, or not an address here)",
           config.host, config.port);
  return config.port;
}

void HttpServer::serve() {
  impl_->serve_entered = true;
  if (!impl_->draining) impl_->server.listen_after_bind();
  impl_->serve_finished = true;
}

void HttpServer::shutdown(std::chrono::milliseconds drain_timeout) {
  const auto deadline = std::chrono::steady_clock::now() + drain_timeout;
  impl_->draining = true;
  impl_->engine.begin_drain();
  if (!impl_->engine.wait_until_idle(drain_timeout)) impl_->engine.stop();
  while (impl_->open_streams > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // httplib's stop() only acts on a running accept loop: wait for serve() to reach it (or return).
  while (impl_->serve_entered && !impl_->serve_finished && !impl_->server.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->server.stop();
}

}  // namespace splitflow
