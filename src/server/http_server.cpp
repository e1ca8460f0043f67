#include "server/http_server.h"

#include "core/error.h"
#include "embedding/embedding_input.h"
#include "embedding/pooling.h"
#include "server/chat_page.h"
#include "server/embeddings_api.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/structured_output.h"
#include "server/tokenize_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <numeric>
#include <thread>
#include <variant>

namespace splitflow {

using nlohmann::json;

namespace {

constexpr const char* kJson = "application/json";

void send_error(http::Exchange& exchange, const ApiError& error) {
  exchange.respond(error.status, kJson, dump_json(error_body(error)));
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
  // Chat with tools (tool_choice not "none"): replies are parsed for calls in this format.
  std::optional<ToolCallFormat> tool_format;
  bool return_token_ids = false;  // the "splitflow" extension: each choice carries its token ids
};

// The "splitflow" request extension the router sends (docs/splitwise.md):
//   {"resume_token_ids": [ids], "kv_source": "[layerwise@|serialized@]host:port", "return_token_ids": true}
// resume_token_ids: tokens an instance that failed already streamed (the request continues after
// them); kv_source: the prompt instance computing this request's KV (a Splitwise token instance
// imports it); return_token_ids: every choice (chunk) carries "token_ids".
struct SplitflowExtension {
  std::vector<int32_t> resume_token_ids;
  std::string kv_source;
  bool return_token_ids = false;
};

SplitflowExtension parse_splitflow_extension(const json& body) {
  SplitflowExtension ext;
  const auto it = body.find("splitflow");
  if (it == body.end() || it->is_null()) return ext;
  if (!it->is_object()) throw ApiError(400, "'splitflow' must be an object", "splitflow");
  if (const auto ids = it->find("resume_token_ids"); ids != it->end() && !ids->is_null()) {
    if (!ids->is_array()) throw ApiError(400, "'splitflow.resume_token_ids' must be an array of token ids", "splitflow.resume_token_ids");
    for (const json& id : *ids) {
      if (!id.is_number_integer()) throw ApiError(400, "'splitflow.resume_token_ids' must hold integers", "splitflow.resume_token_ids");
      ext.resume_token_ids.push_back(id.get<int32_t>());
    }
  }
  if (const auto source = it->find("kv_source"); source != it->end() && !source->is_null()) {
    if (!source->is_string() || source->get<std::string>().empty())
      throw ApiError(400, "'splitflow.kv_source' must be a string host:port", "splitflow.kv_source");
    ext.kv_source = source->get<std::string>();
  }
  if (const auto ids = it->find("return_token_ids"); ids != it->end() && !ids->is_null()) {
    if (!ids->is_boolean()) throw ApiError(400, "'splitflow.return_token_ids' must be a boolean", "splitflow.return_token_ids");
    ext.return_token_ids = ids->get<bool>();
  }
  return ext;
}

// A resumed or KV-importing request is one sequence.
void apply_extension(const SplitflowExtension& ext, int32_t n, size_t prompts, PromptSubmission& prompt) {
  if (ext.resume_token_ids.empty() && ext.kv_source.empty()) return;
  if (n != 1 || prompts != 1) throw ApiError(400, "a resumed or KV-importing request has one prompt and n = 1", "splitflow");
  prompt.start.prior_output_ids = ext.resume_token_ids;
  prompt.start.import_kv = !ext.kv_source.empty();
  prompt.kv_source = ext.kv_source;
}

json token_ids_json(const std::vector<TokenOutput>& tokens) {
  json ids = json::array();
  for (const TokenOutput& token : tokens) ids.push_back(token.token_id);
  return ids;
}

// One choice of a finished request, for the non-streaming answer.
struct ChoiceResult {
  std::string text;
  std::vector<TokenOutput> tokens;
  FinishReason finish_reason = FinishReason::None;
};

// finish_reason, "tool_calls" when the reply made calls.
json finish_reason_json(FinishReason reason, bool made_calls) {
  if (made_calls && reason == FinishReason::Stop) return "tool_calls";
  return finish_reason_json(reason);
}

json usage_json(int32_t prompt_tokens, int64_t completion_tokens, int32_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

// The streams of one request (one per prompt, n choices each) read as one: prompt p's choice i is
// choice p * n + i.
class StreamsReader {
 public:
  explicit StreamsReader(std::vector<std::shared_ptr<RequestStream>> streams)
      : streams_(std::move(streams)), ended_(streams_.size(), false) {}

  // Moves every stream's news into `updates` as (prompt index, update); false when there is none.
  // Never waits: the group's listener says when to call again.
  bool poll(std::vector<std::pair<size_t, RequestUpdate>>& updates) {
    updates.clear();
    for (size_t p = 0; p < streams_.size(); ++p) {
      RequestUpdate update;
      if (ended_[p] || !streams_[p]->next(update, std::chrono::milliseconds(0))) continue;
      ended_[p] = update.finished;
      updates.emplace_back(p, std::move(update));
    }
    return !updates.empty();
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
       HttpServerConfig config, http::FrontConfig front_config, AsyncEmbedder* embedder)
      : engine(engine), tokenizer(tokenizer), chat_template(std::move(chat_template)), config(std::move(config)),
        max_model_len(engine.engine().config().max_model_len),
        max_prompt_tokens(engine.engine().max_prompt_tokens()),
        encoder_decoder(engine.engine().encoder_decoder()), front(std::move(front_config)), embedder(embedder),
        embedding_frame(embedder != nullptr && tokenizer != nullptr ? special_frame(*tokenizer) : SpecialFrame{}) {
    if (tokenizer) constraints.emplace(*tokenizer, engine.engine().runner().spec().vocab_size);
    if (this->chat_template) tool_format = detect_tool_call_format(this->chat_template->source());
  }

  AsyncEngine& engine;
  const Tokenizer* tokenizer;
  std::optional<ChatTemplate> chat_template;
  HttpServerConfig config;
  const int32_t max_model_len;  // immutable engine configuration, safe to read on any thread
  const int32_t max_prompt_tokens;
  const bool encoder_decoder;   // the prompt is the encoder's input; the decoder's context is max_model_len
  http::Front front;
  std::atomic<bool> draining{false};
  AsyncEmbedder* embedder;              // an embedding model's; null for a generative one
  const SpecialFrame embedding_frame;   // the tokenizer's special tokens around an input (truncation keeps them)
  std::optional<grammar::ConstraintCache> constraints;  // compiled structured outputs (needs the tokenizer)
  ToolCallFormat tool_format = ToolCallFormat::Hermes;  // as the chat template teaches

  void compile(GenerationRequest& request, const std::string& body) {
    if (!request.constraint) return;
    if (!constraints) throw ApiError(400, "structured outputs need the model's tokenizer", request.constraint->param);
    compile_constraint(*constraints, request, body);
  }

  void install_routes();
  void embeddings(const std::shared_ptr<http::Exchange>& exchange);
  // Generative routes on an embedding model: 400.
  void check_generative(const char* route) const {
    if (embedder != nullptr)
      throw ApiError(400, fmt::format("{} is not available: '{}' is an embedding model (use /v1/embeddings)", route,
                                      config.served_model_name),
                     "model", "invalid_request_error", "model_not_supported");
  }
  void completions(const std::shared_ptr<http::Exchange>& exchange);
  void chat_completions(const std::shared_ptr<http::Exchange>& exchange);
  // llama.cpp's /tokenize and /detokenize (server/tokenize_api.h).
  void tokenize(const std::shared_ptr<http::Exchange>& exchange) {
    exchange->respond(200, kJson, dump_json(tokenize_response(tokenizer, parse_json_body(exchange->request().body))));
  }
  void detokenize(const std::shared_ptr<http::Exchange>& exchange) {
    exchange->respond(200, kJson, dump_json(detokenize_response(tokenizer, parse_json_body(exchange->request().body))));
  }

  void check_model(const std::string& model) const {
    if (!model.empty() && model != config.served_model_name) {
      throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'.", model,
                                      config.served_model_name),
                     "model", "invalid_request_error", "model_not_found");
    }
  }

  // Compares every key in full, whatever matches, so the time taken tells nothing of a key.
  void check_api_key(const http::Request& request) const {
    if (config.api_keys.empty()) return;
    const std::string_view authorization = request.header("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    const std::string_view given = authorization.starts_with(kBearer) ? authorization.substr(kBearer.size()) : "";
    bool match = false;
    for (const std::string& key : config.api_keys) {
      unsigned char differ = given.size() != key.size();
      for (size_t i = 0; i < key.size(); ++i) differ |= static_cast<unsigned char>(key[i] ^ (i < given.size() ? given[i] : 0));
      match |= differ == 0;
    }
    if (!match) {
      throw ApiError(401,
                     authorization.empty() ? "You didn't provide an API key: send it as 'Authorization: Bearer KEY'."
                                           : "Incorrect API key provided.",
                     "", "invalid_request_error", "invalid_api_key");
    }
  }

  void check_draining() const {
    if (draining) throw ApiError(503, "the server is shutting down", "", "service_unavailable", "shutting_down");
  }

  // OpenAI's rule: prompt and max_tokens together must fit the context. Without max_tokens the
  // request gets what is left, at most default_max_tokens (and at least one token). An
  // encoder-decoder's prompt goes to the encoder: it must fit the encoder, and the decoder's
  // context is all the completion's.
  void fit_context(GenerationRequest& request, size_t prompt_tokens, const char* prompt_field,
                   int32_t default_max_tokens) const {
    const int64_t prompt = static_cast<int64_t>(prompt_tokens);
    if (encoder_decoder) return fit_encoder_decoder(request, prompt, prompt_field, default_max_tokens);
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
  void fit_encoder_decoder(GenerationRequest& request, int64_t prompt, const char* prompt_field,
                           int32_t default_max_tokens) const {
    if (prompt > max_prompt_tokens) {
      throw ApiError(400,
                     fmt::format("This model's encoder takes at most {} tokens, but the {} has {} tokens.",
                                 max_prompt_tokens, prompt_field, prompt),
                     prompt_field, "invalid_request_error", "context_length_exceeded");
    }
    if (!request.max_tokens_given) {
      request.params.max_tokens = std::min(default_max_tokens, max_model_len);
    } else if (request.params.max_tokens > max_model_len) {
      throw ApiError(400,
                     fmt::format("This model's decoder generates at most {} tokens, but {} were requested.",
                                 max_model_len, request.params.max_tokens),
                     "max_tokens", "invalid_request_error", "context_length_exceeded");
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

  void respond(std::vector<std::shared_ptr<RequestStream>> streams, const GenerationRequest& request,
               ResponseShape shape, const std::shared_ptr<http::Exchange>& exchange);
};

namespace {

// Drives one response from the engine's news. The streams' group listener posts pump() onto the
// exchange's strand (at most one post pending); pump() takes every update and either writes it
// as SSE chunks or collects it for the whole answer. One write is out at a time: news that lands
// meanwhile waits merged in the streams, so a slow reader costs its own output and nothing else.
// The exchange's abort callback (client gone, deadline, server stop) cancels every prompt.
class ResponsePump : public std::enable_shared_from_this<ResponsePump> {
 public:
  ResponsePump(AsyncEngine& engine, const Tokenizer* tokenizer, std::shared_ptr<http::Exchange> exchange,
               std::vector<std::shared_ptr<RequestStream>> streams, ResponseShape shape, bool stream)
      : engine_(engine), tokenizer_(tokenizer), exchange_(std::move(exchange)), reader_(std::move(streams)),
        shape_(std::move(shape)), stream_(stream), n_(static_cast<size_t>(reader_.choices_per_prompt())) {
    const size_t num_prompts = reader_.streams().size();
    results_.resize(num_prompts * n_);
    started_.assign(num_prompts * n_, false);
    for (size_t index = 0; index < num_prompts * n_; ++index) {
      text_offsets_.push_back(shape_.echo_texts[index / n_].size());
    }
    cached_tokens_.assign(num_prompts, 0);
    if (shape_.tool_format) tool_parsers_.assign(num_prompts * n_, ToolCallStreamParser(*shape_.tool_format));
    tool_calls_sent_.assign(num_prompts * n_, 0);
  }

  void start() {
    // The abort callback holds the pump until the exchange ends; the listener only reaches it.
    exchange_->on_abort([self = shared_from_this()] {
      self->done_ = true;
      for (const auto& stream : self->reader_.streams()) self->engine_.cancel(stream);
    });
    reader_.streams().front()->group().set_listener([weak = weak_from_this()] {
      if (auto self = weak.lock()) self->schedule();
    });
    if (stream_) exchange_->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    schedule();  // news that came before the listener
  }

 private:
  void schedule() {
    if (scheduled_.exchange(true)) return;
    exchange_->post([self = shared_from_this()] {
      self->scheduled_ = false;  // before reading: news from now on schedules again
      self->pump();
    });
  }

  void pump() {
    if (done_ || writing_) return;
    std::vector<std::pair<size_t, RequestUpdate>> updates;
    reader_.poll(updates);
    stream_ ? pump_stream(updates) : pump_whole(updates);
  }

  void pump_whole(std::vector<std::pair<size_t, RequestUpdate>>& updates) {
    for (auto& [prompt, update] : updates) {
      for (size_t i = 0; i < n_; ++i) {
        ChoiceDelta& delta = update.choices[i];
        ChoiceResult& result = results_[prompt * n_ + i];
        result.text += delta.text;
        std::move(delta.tokens.begin(), delta.tokens.end(), std::back_inserter(result.tokens));
        if (delta.finish_reason != FinishReason::None) result.finish_reason = delta.finish_reason;
      }
      cached_tokens_[prompt] = update.num_cached_prompt_tokens;
      if (error_.empty()) error_ = update.error;
    }
    if (!reader_.all_ended()) return;
    done_ = true;
    if (!error_.empty()) return send_error(*exchange_, ApiError(500, error_, "", "internal_error"));
    exchange_->respond(200, kJson, dump_json(whole_body()));
  }

  json whole_body() const {
    json choices = json::array();
    int64_t completion_tokens = 0;
    for (size_t index = 0; index < results_.size(); ++index) {
      const ChoiceResult& result = results_[index];
      const std::string& echo_text = shape_.echo_texts[index / n_];
      completion_tokens += static_cast<int64_t>(result.tokens.size());
      json choice = {{"index", index}, {"finish_reason", finish_reason_json(result.finish_reason)}};
      if (shape_.chat && shape_.tool_format) {
        const ParsedReply reply = parse_tool_calls(*shape_.tool_format, result.text);
        json message = {{"role", "assistant"}, {"content", reply.calls.empty() || !reply.content.empty() ? json(reply.content) : json(nullptr)}};
        if (!reply.calls.empty()) message["tool_calls"] = tool_calls_json(reply.calls, 0, /*with_index=*/false, *shape_.tool_format);
        choice["message"] = std::move(message);
        choice["finish_reason"] = finish_reason_json(result.finish_reason, !reply.calls.empty());
        choice["logprobs"] = shape_.logprobs ? chat_logprobs(tokenizer_, result.tokens) : json(nullptr);
      } else if (shape_.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", result.text}};
        choice["logprobs"] = shape_.logprobs ? chat_logprobs(tokenizer_, result.tokens) : json(nullptr);
      } else {
        choice["text"] = echo_text + result.text;
        size_t offset = echo_text.size();
        choice["logprobs"] = shape_.logprobs ? completion_logprobs(tokenizer_, result.tokens, offset) : json(nullptr);
      }
      if (shape_.return_token_ids) choice["token_ids"] = token_ids_json(result.tokens);
      choices.push_back(std::move(choice));
    }
    const int32_t all_cached = std::accumulate(cached_tokens_.begin(), cached_tokens_.end(), 0);
    return {{"id", shape_.id},
            {"object", shape_.chat ? "chat.completion" : "text_completion"},
            {"created", shape_.created},
            {"model", shape_.model},
            {"choices", std::move(choices)},
            {"usage", usage_json(reader_.num_prompt_tokens(), completion_tokens, all_cached)}};
  }

  // Chunks of different prompts interleave as their tokens come; each names its global choice index.
  void pump_stream(std::vector<std::pair<size_t, RequestUpdate>>& updates) {
    std::string out;
    for (auto& [prompt, update] : updates) {
      const std::string& echo_text = shape_.echo_texts[prompt];
      for (size_t i = 0; i < update.choices.size(); ++i) {
        const size_t index = prompt * n_ + i;
        const ChoiceDelta& delta = update.choices[i];
        if (!started_[index]) {
          // Chat opens each choice with the assistant's role; completions with the echoed prompt.
          if (shape_.chat) {
            out += chunk(index, {{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                                 {"finish_reason", nullptr}});
          } else if (!echo_text.empty()) {
            out += chunk(index, {{"text", echo_text}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
          }
          started_[index] = true;
        }
        if (delta.tokens.empty() && delta.text.empty() && delta.finish_reason == FinishReason::None) continue;
        completion_tokens_ += static_cast<int64_t>(delta.tokens.size());
        json fields = {{"finish_reason", finish_reason_json(delta.finish_reason)}};
        if (shape_.chat && shape_.tool_format) {
          // Content is released as it comes; a call once it is whole (OpenAI's delta format:
          // the call's id, type and name, and its arguments in one piece).
          ToolCallStreamParser& parser = tool_parsers_[index];
          std::string content;
          std::vector<ParsedToolCall> calls;
          parser.push(delta.text, content, calls);
          if (delta.finish_reason != FinishReason::None) parser.finish(content, calls);
          json message = json::object();
          if (!content.empty()) message["content"] = content;
          if (!calls.empty()) message["tool_calls"] = tool_calls_json(calls, tool_calls_sent_[index], /*with_index=*/true, *shape_.tool_format);
          tool_calls_sent_[index] += calls.size();
          fields["delta"] = std::move(message);
          fields["logprobs"] = shape_.logprobs ? chat_logprobs(tokenizer_, delta.tokens) : json(nullptr);
          fields["finish_reason"] = finish_reason_json(delta.finish_reason, parser.made_calls());
        } else if (shape_.chat) {
          fields["delta"] = delta.text.empty() ? json::object() : json{{"content", delta.text}};
          fields["logprobs"] = shape_.logprobs ? chat_logprobs(tokenizer_, delta.tokens) : json(nullptr);
        } else {
          fields["text"] = delta.text;
          fields["logprobs"] =
              shape_.logprobs ? completion_logprobs(tokenizer_, delta.tokens, text_offsets_[index]) : json(nullptr);
        }
        if (shape_.return_token_ids) fields["token_ids"] = token_ids_json(delta.tokens);
        out += chunk(index, std::move(fields));
      }
      cached_tokens_[prompt] = update.num_cached_prompt_tokens;
      if (!update.error.empty()) out += sse_event(error_body(ApiError(500, update.error, "", "internal_error")));
    }
    const bool finished = reader_.all_ended();
    if (finished) {
      if (shape_.include_usage) {
        const int32_t cached = std::accumulate(cached_tokens_.begin(), cached_tokens_.end(), 0);
        out += sse_event({{"id", shape_.id},
                          {"object", shape_.chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", shape_.created},
                          {"model", shape_.model},
                          {"choices", json::array()},
                          {"usage", usage_json(reader_.num_prompt_tokens(), completion_tokens_, cached)}});
      }
      out += "data: [DONE]\n\n";
      done_ = true;
    }
    if (out.empty()) return;
    writing_ = true;
    exchange_->write(std::move(out), [self = shared_from_this(), finished] {
      self->writing_ = false;
      if (finished) return self->exchange_->end_stream();
      self->pump();
    });
  }

  std::string chunk(size_t index, json fields) const {
    json choice = {{"index", index}};
    choice.update(fields);
    return sse_event({{"id", shape_.id},
                      {"object", shape_.chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", shape_.created},
                      {"model", shape_.model},
                      {"choices", json::array({std::move(choice)})}});
  }

  AsyncEngine& engine_;
  const Tokenizer* tokenizer_;
  const std::shared_ptr<http::Exchange> exchange_;
  StreamsReader reader_;
  const ResponseShape shape_;
  const bool stream_;
  const size_t n_;  // choices per prompt
  std::atomic<bool> scheduled_{false};
  // The strand's own.
  bool writing_ = false;
  bool done_ = false;  // the response is complete (or aborted): nothing more to read
  std::vector<ChoiceResult> results_;  // whole: (prompts * n) by global choice index
  std::string error_;
  std::vector<bool> started_;         // stream: (prompts * n) the choice's opening chunk was sent
  std::vector<size_t> text_offsets_;  // stream: (prompts * n) completions logprobs' text_offset
  std::vector<int32_t> cached_tokens_;  // (prompts)
  std::vector<ToolCallStreamParser> tool_parsers_;  // stream with tools: (prompts * n)
  std::vector<size_t> tool_calls_sent_;              // stream with tools: (prompts * n) calls so far
  int64_t completion_tokens_ = 0;
};

}  // namespace

void HttpServer::Impl::install_routes() {
  using Route = void (Impl::*)(const std::shared_ptr<http::Exchange>&);
  auto guarded = [this](Route handler) {
    return [this, handler](const std::shared_ptr<http::Exchange>& exchange) {
      try {
        check_api_key(exchange->request());
        check_draining();
        (this->*handler)(exchange);
      } catch (const ApiError& e) {
        send_error(*exchange, e);
      } catch (const Error& e) {
        send_error(*exchange, ApiError(400, e.what()));
      } catch (const std::exception& e) {
        send_error(*exchange, ApiError(500, e.what(), "", "internal_error"));
      }
    };
  };
  front.route("POST", "/v1/completions", guarded(&Impl::completions), http::Dispatch::kWorker);
  front.route("POST", "/v1/chat/completions", guarded(&Impl::chat_completions), http::Dispatch::kWorker);
  front.route("POST", "/v1/embeddings", guarded(&Impl::embeddings), http::Dispatch::kWorker);
  front.route("POST", "/tokenize", guarded(&Impl::tokenize), http::Dispatch::kWorker);
  front.route("POST", "/detokenize", guarded(&Impl::detokenize), http::Dispatch::kWorker);
  // The chat page (server/chat_page.h) holds no secret: its requests carry the key typed into it.
  for (const char* path : {"/", "/index.html"}) {
    front.route(
        "GET", path,
        [](const std::shared_ptr<http::Exchange>& exchange) {
          exchange->respond(200, "text/html; charset=utf-8", std::string(chat_page_html()));
        },
        http::Dispatch::kInline);
  }
  // The quick routes answer on the I/O threads: /health stays fast whatever the workers do.
  front.route(
      "GET", "/v1/models",
      [this](const std::shared_ptr<http::Exchange>& exchange) {
        try {
          check_api_key(exchange->request());
        } catch (const ApiError& e) {
          return send_error(*exchange, e);
        }
        const json model = {{"id", config.served_model_name}, {"object", "model"}, {"created", 0},
                            {"owned_by", "splitflow"}, {"max_model_len", max_model_len}};
        exchange->respond(200, kJson, dump_json({{"object", "list"}, {"data", json::array({model})}}));
      },
      http::Dispatch::kInline);
  front.route(
      "GET", "/health",
      [this](const std::shared_ptr<http::Exchange>& exchange) {
        if (draining) {
          return send_error(*exchange,
                            ApiError(503, "the server is shutting down", "", "service_unavailable", "shutting_down"));
        }
        exchange->respond(200, kJson, R"({"status":"ok"})");
      },
      http::Dispatch::kInline);
  if (config.splitwise_info) {
    front.route(
        "GET", "/splitwise/info",
        [this](const std::shared_ptr<http::Exchange>& exchange) { exchange->respond(200, kJson, config.splitwise_info()); },
        http::Dispatch::kInline);
  }
  front.route(
      "GET", "/metrics",
      [this](const std::shared_ptr<http::Exchange>& exchange) {
        std::string text = engine.render_metrics();
        if (embedder != nullptr) text += embedder->render_metrics();
        if (config.extra_metrics) text += config.extra_metrics();
        const http::FrontStats stats = front.stats();
        render_gauge(text, "splitflow_http_open_connections", "connections open now",
                     static_cast<double>(stats.open_connections));
        render_gauge(text, "splitflow_http_open_requests", "requests read whose response is not sent whole yet",
                     static_cast<double>(stats.open_exchanges));
        render_counter(text, "splitflow_http_refused_connections_total",
                       "connections answered 503 beyond --max-connections", stats.refused_connections);
        render_counter(text, "splitflow_http_deadline_closes_total",
                       "connections closed at a header, body, write or request deadline", stats.deadline_closes);
        exchange->respond(200, "text/plain; version=0.0.4; charset=utf-8", std::move(text));
      },
      http::Dispatch::kInline);
}

void HttpServer::Impl::completions(const std::shared_ptr<http::Exchange>& exchange) {
  check_generative("/v1/completions");
  const json body = parse_json_body(exchange->request().body);
  CompletionRequest request = parse_completion_request(body);
  const SplitflowExtension ext = parse_splitflow_extension(body);
  check_model(request.model);
  compile(request, exchange->request().body);
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
    apply_extension(ext, request.n, count, prompt);
    if (!ext.resume_token_ids.empty() && request.echo) throw ApiError(400, "a resumed request cannot echo", "echo");
    prompts.push_back(std::move(prompt));
    shape.echo_texts.push_back(std::move(echo_text));
  }
  auto streams = submit(std::move(prompts), request.n, "prompt");
  shape.id = fmt::format("cmpl-{}", streams.front()->id());
  shape.logprobs = request.logprobs.has_value();
  shape.return_token_ids = ext.return_token_ids;
  respond(std::move(streams), request, std::move(shape), exchange);
}

void HttpServer::Impl::chat_completions(const std::shared_ptr<http::Exchange>& exchange) {
  check_generative("/v1/chat/completions");
  const json body = parse_json_body(exchange->request().body);
  ChatRequest request = parse_chat_request(body);
  const SplitflowExtension ext = parse_splitflow_extension(body);
  check_model(request.model);
  if (!chat_template) {
    throw ApiError(400,
                   "this model has no chat template: start the server with --chat-template FILE "
                   "(a tokenizer_config.json, chat_template.json or .jinja file)",
                   "messages");
  }
  if (!tokenizer) throw ApiError(400, "this model has no tokenizer, which chat needs", "messages");
  compile(request, exchange->request().body);
  // Rendered from the body parsed again keeping key order: `tojson` in a template prints keys in
  // the client's order, as transformers does.
  const auto ordered = nlohmann::ordered_json::parse(exchange->request().body);  // parse_json_body accepted it: depth <= 64
  const bool use_tools = request.tool_choice != ToolChoice::None && !request.tools.empty();
  if (use_tools) compile_tool_choice(*constraints, tool_format, request, ordered.at("tools"));
  const auto kwargs = ordered.find("chat_template_kwargs");
  nlohmann::ordered_json variables =
      kwargs != ordered.end() && kwargs->is_object() ? *kwargs : nlohmann::ordered_json::object();
  // As transformers' apply_chat_template(tools=...): the template decides how to show them.
  if (use_tools) variables["tools"] = ordered.at("tools");
  std::string prompt;
  try {
    prompt = chat_template->render(template_messages(ordered.at("messages")), /*add_generation_prompt=*/true, variables);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("the chat template rejected these messages: {}", e.what()), "messages");
  }
  // The template writes the BOS token itself, as transformers' apply_chat_template assumes.
  std::vector<int32_t> prompt_ids = tokenizer->encode(prompt, /*add_special=*/false);
  fit_context(request, prompt_ids.size(), "messages", max_model_len);
  std::vector<PromptSubmission> prompts;
  prompts.push_back({std::move(prompt_ids), request.params});
  apply_extension(ext, request.n, 1, prompts.front());
  auto streams = submit(std::move(prompts), request.n, "messages");
  ResponseShape shape;
  shape.chat = true;
  shape.id = fmt::format("chatcmpl-{}", streams.front()->id());
  shape.echo_texts.assign(1, "");
  shape.logprobs = request.logprobs;
  if (use_tools) shape.tool_format = tool_format;
  shape.return_token_ids = ext.return_token_ids;
  respond(std::move(streams), request, std::move(shape), exchange);
}

void HttpServer::Impl::embeddings(const std::shared_ptr<http::Exchange>& exchange) {
  const EmbeddingRequest request = parse_embedding_request(parse_json_body(exchange->request().body));
  check_model(request.model);
  if (embedder == nullptr) {
    throw ApiError(400,
                   fmt::format("'{}' is a generative model: /v1/embeddings needs an embedding (encoder_only) model",
                               config.served_model_name),
                   "model", "invalid_request_error", "model_not_supported");
  }
  const ModelSpec& spec = embedder->spec();
  if (request.dimensions) {
    if (!spec.embedding.matryoshka)
      throw ApiError(400,
                     fmt::format("'{}' does not support 'dimensions': it was not trained for shorter (Matryoshka) "
                                 "embeddings", config.served_model_name),
                     "dimensions");
    if (*request.dimensions > spec.hidden_size)
      throw ApiError(400, fmt::format("'dimensions' {} exceeds the model's {}", *request.dimensions, spec.hidden_size),
                     "dimensions");
  }
  std::vector<std::vector<int32_t>> inputs;
  for (const Prompt& input : request.inputs) {
    if (const auto* text = std::get_if<std::string>(&input)) {
      if (!tokenizer) throw ApiError(400, "this model has no tokenizer: send 'input' as token ids", "input");
      // Texts are truncated at the model's limit (sentence-transformers' max_seq_length), specials kept.
      inputs.push_back(encode_for_embedding(*tokenizer, embedding_frame, *text, embedder->max_input_tokens()));
    } else {
      inputs.push_back(std::get<std::vector<int32_t>>(input));
    }
  }
  int64_t tokens = 0;
  for (const auto& ids : inputs) tokens += static_cast<int64_t>(ids.size());
  const EmbeddingEncoding encoding = request.encoding;
  const std::optional<int32_t> dimensions = request.dimensions;
  const std::string model = config.served_model_name;
  std::shared_ptr<EmbeddingJob> job;
  try {
    job = embedder->submit(std::move(inputs), [exchange, encoding, dimensions, model, tokens](
                                                  std::vector<std::vector<float>> embeddings, std::string error) {
      // On the embedder's thread: the body is built on the exchange's strand.
      exchange->post([exchange, embeddings = std::move(embeddings), error = std::move(error), encoding, dimensions,
                      model, tokens]() mutable {
        if (!error.empty()) return send_error(*exchange, ApiError(500, error, "", "internal_error"));
        if (dimensions)
          for (auto& embedding : embeddings) embedding = truncate_dimensions(embedding, *dimensions);
        exchange->respond(200, kJson, embeddings_body(embeddings, encoding, model, tokens));
      });
    });
  } catch (const SubmitRejected& e) {
    if (e.reason == SubmitRejected::Reason::QueueFull) throw ApiError(429, e.what(), "", "rate_limit_error", "queue_full");
    throw ApiError(503, e.what(), "", "service_unavailable", "shutting_down");
  } catch (const PromptRejected& e) {
    throw ApiError(400, e.what(), "input");
  }
  exchange->on_abort([embedder = embedder, job] { embedder->cancel(job); });
}

void HttpServer::Impl::respond(std::vector<std::shared_ptr<RequestStream>> streams, const GenerationRequest& request,
                               ResponseShape shape, const std::shared_ptr<http::Exchange>& exchange) {
  shape.model = config.served_model_name;
  shape.created = static_cast<int64_t>(std::time(nullptr));
  shape.include_usage = request.include_usage;
  std::make_shared<ResponsePump>(engine, tokenizer, exchange, std::move(streams), std::move(shape), request.stream)
      ->start();
}

namespace {

http::FrontConfig front_config(const HttpServerConfig& config) {
  http::FrontConfig front;
  front.host = config.host;
  front.port = config.port;
  front.io_threads = config.io_threads;
  front.worker_threads = config.worker_threads;
  front.backlog = config.backlog;
  front.max_connections = config.max_connections;
  front.limits = config.limits;
  front.allowed_origins = config.allowed_origins;
  // Errors the front answers itself (malformed HTTP, limits, deadlines, routing) in OpenAI's shape.
  front.error_body = [](int status, const std::string& message) {
    const bool unavailable = status == 503 || status == 504;
    return dump_json(error_body(ApiError(status, message, "", unavailable ? "service_unavailable" : "invalid_request_error")));
  };
  front.error_content_type = kJson;
  return front;
}

}  // namespace

HttpServer::HttpServer(AsyncEngine& engine, const Tokenizer* tokenizer, std::optional<ChatTemplate> chat_template,
                       HttpServerConfig config, AsyncEmbedder* embedder) {
  http::FrontConfig front = front_config(config);
  impl_ = std::make_unique<Impl>(engine, tokenizer, std::move(chat_template), std::move(config), std::move(front),
                                 embedder);
  impl_->install_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() { return impl_->front.bind(); }

void HttpServer::serve() { impl_->front.serve(); }

void HttpServer::shutdown(std::chrono::milliseconds drain_timeout) {
  const auto deadline = std::chrono::steady_clock::now() + drain_timeout;
  impl_->draining = true;
  impl_->front.stop_keep_alive();
  impl_->engine.begin_drain();
  if (impl_->embedder != nullptr) {
    impl_->embedder->begin_drain();
    if (!impl_->embedder->wait_until_idle(drain_timeout)) impl_->embedder->stop();
  }
  if (!impl_->engine.wait_until_idle(drain_timeout)) impl_->engine.stop();
  // The engine is idle; the last chunks of finished requests may still be on their way out.
  while (impl_->front.stats().open_exchanges > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->front.stop();
}

http::FrontStats HttpServer::stats() const { return impl_->front.stats(); }

}  // namespace splitflow
