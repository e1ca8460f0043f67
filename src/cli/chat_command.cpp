// `splitflow chat`: a conversation with an instruction-tuned model, rendered through the model's own
// chat template (the GGUF's tokenizer.chat_template, or the HF directory's), streamed to stdout.
// Each --message is one user turn; without any, user turns are read from stdin, one per line
// (an empty line or EOF ends the chat).
#include "backend/backend.h"
#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "engine/generator.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

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
  int context = 2048;
  std::string kv_cache_dtype = "auto";
};

void run_chat(const ChatFlags& flags) {
  SamplingParams params = flags.sampling.resolve();
  params.validate();
  SF_CHECK(flags.context > 0, "--context must be positive, not {}", flags.context);
  const std::optional<DType> kv_cache_dtype = parse_kv_cache_dtype_flag(flags.kv_cache_dtype);
  LoadedModel model = load_model(flags.model.options());
  SF_CHECK(model.tokenizer != nullptr, "chat needs the model's tokenizer (pass --tokenizer)");
  const std::optional<ChatTemplate> chat_template = ChatTemplate::find_for_model(flags.model.load.model_path);
  SF_CHECK(chat_template.has_value(), "'{}' has no chat template (use `splitflow generate` for plain text)",
           flags.model.load.model_path);

  const int64_t context = std::min<int64_t>(flags.context, model.spec.max_position);
  std::unique_ptr<Backend> backend = flags.model.make_backend();
  const int32_t block_size = 16;
  KvCacheConfig kv{blocks_for_tokens(context, block_size), block_size, 0, kv_cache_dtype};
  ModelRunner runner(model.spec, std::move(model.weights), *backend, kv, RunnerLimits{512, 1});
  Generator generator(runner, model.tokenizer.get());

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!flags.system.empty()) messages.push_back({{"role", "system"}, {"content", flags.system}});
  const bool interactive = flags.messages.empty() && isatty(STDIN_FILENO);
  size_t next_message = 0;
  const auto next_turn = [&](std::string& text) {
    if (!flags.messages.empty()) {
      if (next_message == flags.messages.size()) return false;
      text = flags.messages[next_message++];
      return true;
    }
    if (interactive) fmt::print(stderr, "> ");
    return static_cast<bool>(std::getline(std::cin, text)) && !text.empty();
  };
  std::string user;
  while (next_turn(user)) {
    if (!interactive) fmt::print("> {}\n", user);
    messages.push_back({{"role", "user"}, {"content", user}});
    const std::string prompt = chat_template->render(messages, /*add_generation_prompt=*/true);
    const std::vector<int32_t> ids = model.tokenizer->encode(prompt, /*add_special=*/false);
    const GenerationResult result = generator.generate(ids, params, [](std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    fmt::print("\n");
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
  command->add_option("--system", flags->system, "a system message first");
  command->add_option("--context", flags->context, "tokens of conversation kept (capped by the model's context)");
  add_kv_cache_dtype_flag(*command, flags->kv_cache_dtype);
  command->callback([flags] { run_chat(*flags); });
}

}  // namespace splitflow::cli
