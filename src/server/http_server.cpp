#include "server/http_server.h"

#include "core/error.h"
#include "server/openai_api.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>
#include <variant>

namespace splitflow {

using nlohmann::json;

namespace {

// nginx's status for a request whose client went away before the response (nobody reads it).
constexpr int kClientClosedRequest = 499;
constexpr std::chrono::milliseconds kHangUpCheckInterval{200};

// Whether the client of the connection (our local_port, its remote_port) has closed its side:
// every matching socket in /proc/self/net/tcp{,6} is in CLOSE_WAIT (the peer's FIN arrived). httplib
// 0.11 gives a handler no socket to poll, and a non-streaming handler writes nothing until the end.
// False when nothing matches (not Linux, or the entry is gone), so a request is never cancelled on
// a guess.
bool client_hung_up(int local_port, int remote_port) {
  constexpr unsigned kCloseWait = 0x08;
  const auto port_of = [](const std::string& address) {  // "0100007F:1F90": hex address, hex port
    const size_t colon = address.rfind(':');
    return colon == std::string::npos ? -1 : static_cast<int>(std::strtoul(address.c_str() + colon + 1, nullptr, 16));
  };
  bool matched = false;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote;
      unsigned state = 0;
      if (!(fields >> slot >> local >> remote >> std::hex >> state)) continue;
      if (port_of(local) != local_port || port_of(remote) != remote_port) continue;
      if (state != kCloseWait) return false;
      matched = true;
    }
  }
  return matched;
}

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
  // Completions with echo: each prompt's text, before each of its choices' text; otherwise empty.
  std::vector<std::string> echo_texts;
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

// The streams of one request (one per prompt, n choices each) read as one: prompt p's choice i is
// choice p * n + i. Wakes on any stream's news through their shared StreamGroup.
class StreamsReader {
 public:
  explicit StreamsReader(std::vector<std::shared_ptr<RequestStream>> streams)
      : streams_(std::move(streams)), ended_(streams_.size(), false) {}

  // Waits up to `timeout` for news on any stream; false on timeout. Otherwise `updates` holds
  // (prompt index, update) for each stream that had news.
  bool next(std::vector<std::pair<size_t, RequestUpdate>>& updates, std::chrono::milliseconds timeout) {
    updates.clear();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    StreamGroup& group = streams_.front()->group();
    while (true) {
      // Read the version before polling: news that lands after a poll moves it, so the wait
      // below cannot sleep through it.
      const uint64_t seen = group.version();
      for (size_t p = 0; p < streams_.size(); ++p) {
        RequestUpdate update;
        if (ended_[p] || !streams_[p]->next(update, std::chrono::milliseconds(0))) continue;
        ended_[p] = update.finished;
        updates.emplace_back(p, std::move(update));
      }
      if (!updates.empty()) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::milliseconds(0) || !group.wait_for_news(seen, left)) return false;
    }
  }

  bool all_ended() const { return std::all_of(ended_.begin(), ended_.end(), [](bool ended) { return ended; }); }
  const std::vector<std::shared_ptr<RequestStream>>& streams() const { return streams_; }
  int32_t choices_per_prompt() const { return streams_.front()->num_choices(); }
  int32_t num_prompt_tokens() const {
    int32_t total = 0;
    for (const auto& stream : streams_) total += stream->num_prompt_tokens();
    return total;
  }

 private:
  std::vector<std::shared_ptr<RequestStream>> streams_;
  std::vector<bool> ended_;
};

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

  // One stream per prompt, admitted together. prompt_field names a prompt in errors ("prompt[i]"
  // when there are several).
  std::vector<std::shared_ptr<RequestStream>> submit(std::vector<PromptSubmission> prompts, int32_t n,
                                                     const std::string& prompt_field) {
    const size_t count = prompts.size();
    try {
      return engine.submit_group(std::move(prompts), n);
    } catch (const SubmitRejected& e) {
      if (e.reason == SubmitRejected::Reason::QueueFull) throw ApiError(429, e.what(), "", "rate_limit_error", "queue_full");
      throw ApiError(503, e.what(), "", "service_unavailable", "shutting_down");
    } catch (const PromptRejected& e) {
      throw ApiError(400, e.what(), count > 1 ? fmt::format("{}[{}]", prompt_field, e.index) : prompt_field);
    }
  }

  void cancel_all(const StreamsReader& reader) {
    for (const auto& stream : reader.streams()) engine.cancel(stream);
  }

  void respond(std::vector<std::shared_ptr<RequestStream>> streams, const GenerationRequest& request,
               ResponseShape shape, const httplib::Request& req, httplib::Response& res);
  void respond_whole(StreamsReader& reader, const ResponseShape& shape, const httplib::Request& req,
                     httplib::Response& res);
  void respond_stream(std::shared_ptr<StreamsReader> reader, ResponseShape shape, httplib::Response& res);
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
  const size_t count = request.prompts.size();
  ResponseShape shape;
  std::vector<PromptSubmission> prompts;
  for (size_t p = 0; p < count; ++p) {
    const std::string field = count == 1 ? "prompt" : fmt::format("prompt[{}]", p);
    PromptSubmission prompt;
    std::string echo_text;
    if (const auto* text = std::get_if<std::string>(&request.prompts[p])) {
      if (!tokenizer) throw ApiError(400, "this model has no tokenizer: send 'prompt' as token ids", field);
      prompt.prompt_ids = tokenizer->encode(*text, /*add_special=*/true);
      if (request.echo) echo_text = *text;
    } else {
      prompt.prompt_ids = std::get<std::vector<int32_t>>(request.prompts[p]);
      if (request.echo && tokenizer) echo_text = tokenizer->decode(prompt.prompt_ids, /*skip_special=*/false);
    }
    // max_tokens' default depends on the room each prompt leaves.
    GenerationRequest fitted = request;
    constexpr int32_t kOpenAiDefaultMaxTokens = 16;  // the completions API's documented default
    fit_context(fitted, prompt.prompt_ids.size(), field.c_str(), kOpenAiDefaultMaxTokens);
    prompt.params = std::move(fitted.params);
    prompts.push_back(std::move(prompt));
    shape.echo_texts.push_back(std::move(echo_text));
  }
  auto streams = submit(std::move(prompts), request.n, "prompt");
  shape.id = fmt::format("cmpl-{}", streams.front()->id());
  shape.logprobs = request.logprobs.has_value();
  respond(std::move(streams), request, std::move(shape), req, res);
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
  std::vector<PromptSubmission> prompts;
  prompts.push_back({std::move(prompt_ids), request.params});
  auto streams = submit(std::move(prompts), request.n, "messages");
  ResponseShape shape;
  shape.chat = true;
  shape.id = fmt::format("chatcmpl-{}", streams.front()->id());
  shape.echo_texts.assign(1, "");
  shape.logprobs = request.logprobs;
  respond(std::move(streams), request, std::move(shape), req, res);
}

void HttpServer::Impl::respond(std::vector<std::shared_ptr<RequestStream>> streams, const GenerationRequest& request,
                               ResponseShape shape, const httplib::Request& req, httplib::Response& res) {
  shape.model = config.served_model_name;
  shape.created = static_cast<int64_t>(std::time(nullptr));
  shape.include_usage = request.include_usage;
  auto reader = std::make_shared<StreamsReader>(std::move(streams));
  if (request.stream) {
    respond_stream(std::move(reader), std::move(shape), res);
  } else {
    respond_whole(*reader, shape, req, res);
  }
}

void HttpServer::Impl::respond_whole(StreamsReader& reader, const ResponseShape& shape, const httplib::Request& req,
                                     httplib::Response& res) {
  const size_t n = static_cast<size_t>(reader.choices_per_prompt());
  std::vector<ChoiceResult> results(reader.streams().size() * n);  // (prompts * n) by global choice index
  std::vector<int32_t> cached_tokens(reader.streams().size(), 0);   // (prompts)
  std::string error;
  std::vector<std::pair<size_t, RequestUpdate>> updates;
  auto next_check = std::chrono::steady_clock::now();
  while (!reader.all_ended()) {
    // Nothing is written until the end, so a client that hung up is found by asking the kernel.
    if (std::chrono::steady_clock::now() >= next_check) {
      if (client_hung_up(req.local_port, req.remote_port)) {
        cancel_all(reader);
        res.status = kClientClosedRequest;
        return;
      }
      next_check = std::chrono::steady_clock::now() + kHangUpCheckInterval;
    }
    if (!reader.next(updates, kHangUpCheckInterval)) continue;
    for (auto& [prompt, update] : updates) {
      for (size_t i = 0; i < n; ++i) {
        ChoiceDelta& delta = update.choices[i];
        ChoiceResult& result = results[prompt * n + i];
        result.text += delta.text;
        std::move(delta.tokens.begin(), delta.tokens.end(), std::back_inserter(result.tokens));
        if (delta.finish_reason != FinishReason::None) result.finish_reason = delta.finish_reason;
      }
      cached_tokens[prompt] = update.num_cached_prompt_tokens;
      if (error.empty()) error = update.error;
    }
  }
  if (!error.empty()) throw ApiError(500, error, "", "internal_error");

  json choices = json::array();
  int64_t completion_tokens = 0;
  for (size_t index = 0; index < results.size(); ++index) {
    const ChoiceResult& result = results[index];
    const std::string& echo_text = shape.echo_texts[index / n];
    completion_tokens += static_cast<int64_t>(result.tokens.size());
    json choice = {{"index", index}, {"finish_reason", finish_reason_json(result.finish_reason)}};
    if (shape.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text}};
      choice["logprobs"] = shape.logprobs ? chat_logprobs(tokenizer, result.tokens) : json(nullptr);
    } else {
      choice["text"] = echo_text + result.text;
      size_t offset = echo_text.size();
      choice["logprobs"] = shape.logprobs ? completion_logprobs(tokenizer, result.tokens, offset) : json(nullptr);
    }
    choices.push_back(std::move(choice));
  }
  const int32_t all_cached = std::accumulate(cached_tokens.begin(), cached_tokens.end(), 0);
  const json body = {{"id", shape.id},
                     {"object", shape.chat ? "chat.completion" : "text_completion"},
                     {"created", shape.created},
                     {"model", shape.model},
                     {"choices", std::move(choices)},
                     {"usage", usage_json(reader.num_prompt_tokens(), completion_tokens, all_cached)}};
  res.set_content(dump_json(body), "application/json");
}

void HttpServer::Impl::respond_stream(std::shared_ptr<StreamsReader> reader, ResponseShape shape,
                                      httplib::Response& res) {
  // Chunks of different prompts interleave as their tokens come; each names its global choice index.
  struct State {
    ResponseShape shape;
    std::shared_ptr<StreamsReader> reader;
    size_t n = 0;                       // choices per prompt
    std::vector<bool> started;          // (prompts * n) the choice's opening chunk was sent
    std::vector<size_t> text_offsets;   // (prompts * n) completions logprobs' text_offset
    std::vector<int32_t> cached_tokens;  // (prompts)
    int64_t completion_tokens = 0;
  };
  auto state = std::make_shared<State>();
  state->n = static_cast<size_t>(reader->choices_per_prompt());
  const size_t num_prompts = reader->streams().size();
  state->started.assign(num_prompts * state->n, false);
  for (size_t index = 0; index < num_prompts * state->n; ++index) {
    state->text_offsets.push_back(shape.echo_texts[index / state->n].size());
  }
  state->cached_tokens.assign(num_prompts, 0);
  state->reader = std::move(reader);
  state->shape = std::move(shape);

  res.set_header("Cache-Control", "no-cache");
  ++open_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state](size_t, httplib::DataSink& sink) {
        const ResponseShape& shape = state->shape;
        StreamsReader& reader = *state->reader;
        std::vector<std::pair<size_t, RequestUpdate>> updates;
        while (!reader.next(updates, kDisconnectPoll)) {
          if (!sink.is_writable()) {
            cancel_all(reader);
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
        for (auto& [prompt, update] : updates) {
          const std::string& echo_text = shape.echo_texts[prompt];
          for (size_t i = 0; i < update.choices.size(); ++i) {
            const size_t index = prompt * state->n + i;
            const ChoiceDelta& delta = update.choices[i];
            if (!state->started[index]) {
              // Chat opens each choice with the assistant's role; completions with the echoed prompt.
              if (shape.chat) {
                out += chunk(index, {{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                                     {"finish_reason", nullptr}});
              } else if (!echo_text.empty()) {
                out += chunk(index, {{"text", echo_text}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
              }
              state->started[index] = true;
            }
            if (delta.tokens.empty() && delta.text.empty() && delta.finish_reason == FinishReason::None) continue;
            state->completion_tokens += static_cast<int64_t>(delta.tokens.size());
            json fields = {{"finish_reason", finish_reason_json(delta.finish_reason)}};
            if (shape.chat) {
              fields["delta"] = delta.text.empty() ? json::object() : json{{"content", delta.text}};
              fields["logprobs"] = shape.logprobs ? chat_logprobs(tokenizer, delta.tokens) : json(nullptr);
            } else {
              fields["text"] = delta.text;
              fields["logprobs"] = shape.logprobs
                                       ? completion_logprobs(tokenizer, delta.tokens, state->text_offsets[index])
                                       : json(nullptr);
            }
            out += chunk(index, std::move(fields));
          }
          state->cached_tokens[prompt] = update.num_cached_prompt_tokens;
          if (!update.error.empty()) out += sse_event(error_body(ApiError(500, update.error, "", "internal_error")));
        }
        const bool finished = reader.all_ended();
        if (finished) {
          if (shape.include_usage) {
            const int32_t cached = std::accumulate(state->cached_tokens.begin(), state->cached_tokens.end(), 0);
            out += sse_event({{"id", shape.id},
                              {"object", shape.chat ? "chat.completion.chunk" : "text_completion"},
                              {"created", shape.created},
                              {"model", shape.model},
                              {"choices", json::array()},
                              {"usage", usage_json(reader.num_prompt_tokens(), state->completion_tokens, cached)}});
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          cancel_all(reader);
          return false;
        }
        if (finished) sink.done();
        return true;
      },
      [this, state](bool success) {
        if (!success) cancel_all(*state->reader);
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
