// `splitflow chat`: a conversation with an instruction-tuned model, rendered through the model's own
// chat template (the GGUF's tokenizer.chat_template, the HF directory's, or --chat-template) and
// streamed to stdout. The whole conversation is sent every turn, so the model sees the history.
// Each --message is one user turn; without any, turns are read from stdin, one per line.
// stdout carries only the replies (one line each); the prompt, notes and speed go to stderr.
//
// Ctrl-C stops the reply being generated (the partial reply stays in the history) and the chat
// goes on; a second Ctrl-C before that reply ends, Ctrl-C at the prompt, EOF or /exit end it.
// /clear forgets the conversation (the system prompt stays). When the conversation outgrows the
// context, the oldest exchanges are dropped (a note on stderr says how many).
#include "backend/backend.h"
#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/generator.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>

namespace splitflow::cli {

namespace {

struct ChatFlags {
  ModelFlags model;
  SamplingFlags sampling;
  std::vector<std::string> messages;
  std::string system;
  std::string chat_template;
  int context = 2048;
  std::string kv_cache_dtype = "auto";
  bool verbose_prompt = false;
  bool no_warmup = false;
};

// SIGINT while a reply is generated asks it to stop; a second one before it stops, or one at the
// prompt, ends the chat. Only async-signal-safe work in the handler.
volatile std::sig_atomic_t g_generating = 0;
volatile std::sig_atomic_t g_stop_reply = 0;
volatile std::sig_atomic_t g_quit = 0;

extern "C" void on_interrupt(int) {
  if (g_generating && g_stop_reply) _exit(130);  // stuck (a long prefill): the user insists
  if (g_generating) {
    g_stop_reply = 1;
  } else {
    g_quit = 1;
  }
}

// Thrown from the generator's per-step callback to abandon a reply; the Generator keeps no state
// between calls, so nothing is left half done.
struct ReplyStopped {};

void install_interrupt_handler() {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a Ctrl-C at the prompt interrupts the read
  sigaction(SIGINT, &action, nullptr);
}

// Turns the conversation into prompt ids, dropping the oldest exchanges (never the system message
// nor the newest user turn) until the prompt leaves room for `reply_room` tokens.
std::vector<int32_t> fit_conversation(nlohmann::ordered_json& messages, const ChatTemplate& chat_template,
                                      const Tokenizer& tokenizer, int64_t context, int64_t reply_room,
                                      std::string& prompt) {
  const size_t first_turn = !messages.empty() && messages.front().at("role") == "system" ? 1 : 0;
  size_t dropped = 0;
  while (true) {
    prompt = chat_template.render(messages, /*add_generation_prompt=*/true);
    std::vector<int32_t> ids = tokenizer.encode(prompt, /*add_special=*/false);
    if (static_cast<int64_t>(ids.size()) + reply_room <= context || messages.size() <= first_turn + 1) {
      if (dropped > 0) fmt::print(stderr, "[the context holds {} tokens: dropped the {} oldest messages]\n", context, dropped);
      return ids;
    }
    // The oldest user message and the reply after it.
    const size_t count = messages.size() - first_turn > 2 ? 2 : 1;
    messages.erase(messages.begin() + first_turn, messages.begin() + first_turn + count);
    dropped += count;
  }
}

void run_chat(const ChatFlags& flags) {
  SamplingParams params = flags.sampling.resolve();
  const bool until_context_full = params.max_tokens == -1;  // llama.cpp's -n -1
  if (until_context_full) params.max_tokens = 1;
  params.validate();
  SF_CHECK(flags.context > 0, "--ctx-size must be positive, not {}", flags.context);
  const std::optional<DType> kv_cache_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);
  std::unique_ptr<Backend> backend = flags.model.make_backend();
  LoadedModel model = load_model(flags.model.options());
  flags.model.check_gpu_layers(model, *backend, flags.context);
  SF_CHECK(model.tokenizer != nullptr, "chat needs the model's tokenizer (pass --tokenizer)");
  const std::optional<ChatTemplate> chat_template =
      flags.chat_template.empty() ? ChatTemplate::find_for_model(flags.model.load.model_path)
                                  : std::optional<ChatTemplate>(ChatTemplate::from_file(flags.chat_template));
  SF_CHECK(chat_template.has_value(),
           "'{}' has no chat template: give one with --chat-template FILE, or use `splitflow generate` for plain text",
           flags.model.load.model_path);

  const int64_t context = std::min<int64_t>(flags.context, model.spec.max_position);
  if (until_context_full) params.max_tokens = static_cast<int32_t>(context);  // the generator stops at the end
  const int32_t block_size = 16;
  KvCacheConfig kv{blocks_for_tokens(context, block_size), block_size, 0, kv_cache_dtype};
  ModelRunner runner(model.spec, std::move(model.weights), *backend, kv, RunnerLimits{512, 1});
  // The one-time costs (decode graphs recorded, the CPU's repacked weights) before the first turn,
  // not inside its reply.
  if (!flags.no_warmup) runner.warm_up(false);
  Generator generator(runner, model.tokenizer.get());

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  const auto start_conversation = [&] {
    messages = nlohmann::ordered_json::array();
    if (!flags.system.empty()) messages.push_back({{"role", "system"}, {"content", flags.system}});
  };
  start_conversation();
  const bool interactive = flags.messages.empty() && isatty(STDIN_FILENO);
  if (interactive) {
    fmt::print(stderr, "[chat with {}: Ctrl-C stops a reply; /clear forgets the conversation; /exit, Ctrl-D or "
               "Ctrl-C here ends]\n", model.description);
  }
  install_interrupt_handler();
  size_t next_message = 0;
  const auto next_turn = [&](std::string& text) {
    if (!flags.messages.empty()) {
      if (next_message == flags.messages.size()) return false;
      text = flags.messages[next_message++];
      return true;
    }
    if (interactive) fmt::print(stderr, "> ");
    const bool read = static_cast<bool>(std::getline(std::cin, text));
    if (!read && interactive) fmt::print(stderr, "\n");
    return read && !g_quit;
  };

  std::string user;
  while (!g_quit && next_turn(user)) {
    if (user.empty()) continue;
    if (user == "/exit" || user == "/quit") break;
    if (user == "/clear") {
      start_conversation();
      fmt::print(stderr, "[conversation cleared]\n");
      continue;
    }
    if (!interactive) fmt::print(stderr, "> {}\n", user);
    messages.push_back({{"role", "user"}, {"content", user}});
    std::string prompt;
    // Room for at least a short reply; the generator stops at the context's end.
    const int64_t reply_room = std::min<int64_t>(params.max_tokens, std::max<int64_t>(context / 4, 1));
    const std::vector<int32_t> ids = fit_conversation(messages, *chat_template, *model.tokenizer, context, reply_room, prompt);
    if (flags.verbose_prompt) fmt::print(stderr, "[prompt, {} tokens]\n{}\n[end of prompt]\n", ids.size(), prompt);

    std::string reply;
    GenerationResult result;
    bool stopped = false;
    g_stop_reply = 0;
    g_generating = 1;
    try {
      result = generator.generate(
          ids, params,
          [&reply](std::string_view text) {
            reply.append(text);
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
          },
          [](std::span<const float>) {
            if (g_stop_reply) throw ReplyStopped{};
          });
    } catch (const ReplyStopped&) {
      stopped = true;
    } catch (...) {
      g_generating = 0;
      throw;
    }
    g_generating = 0;
    fmt::print("\n");
    std::fflush(stdout);
    if (stopped) {
      fmt::print(stderr, "[reply stopped]\n");
      messages.push_back({{"role", "assistant"}, {"content", reply}});
      continue;
    }
    const double tps = result.decode_seconds > 0 ? (result.output_ids.size() - 1) / result.decode_seconds : 0.0;
    fmt::print(stderr, "[{} prompt tokens, {} generated, {:.1f} tok/s]\n", result.prompt_tokens,
               result.output_ids.size(), tps);
    messages.push_back({{"role", "assistant"}, {"content", result.text}});
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  auto flags = std::make_shared<ChatFlags>();
  flags->sampling.params.temperature = 0.7f;
  flags->sampling.params.max_tokens = 256;
  auto* command = app.add_subcommand("chat", "chat with an instruction-tuned model through its chat template");
  add_model_flags(*command, flags->model);
  add_sampling_flags(*command, flags->sampling);
  command->add_option("--message", flags->messages, "a user turn (repeatable); without one, turns come from stdin");
  command->add_option("--system,--system-prompt", flags->system, "a system message first (llama.cpp: -sys)");
  command->add_option("--chat-template", flags->chat_template,
                      "chat template: a tokenizer_config.json, chat_template.json or .jinja file (default: the "
                      "model's)");
  command->add_option("--context,-c,--ctx-size", flags->context,
                      "tokens of conversation kept (capped by the model's context); older exchanges are dropped")
      ->capture_default_str();
  command->add_flag("--verbose-prompt", flags->verbose_prompt, "print each turn's rendered prompt to stderr");
  command->add_flag("--no-warmup", flags->no_warmup,
                    "skip the warm-up before the first turn (decode graphs recorded, weights prepared during it instead)");
  add_kv_cache_dtype_flag(*command, flags->kv_cache_dtype);
  command->callback([flags] { run_chat(*flags); });
}

}  // namespace splitflow::cli
