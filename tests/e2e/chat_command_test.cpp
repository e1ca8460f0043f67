// `splitflow chat` driven through stdin as a user types: each turn's prompt (--verbose-prompt, on
// stderr) is the chat template rendered over the whole conversation so far, the replies are the
// only thing on stdout, /clear forgets the conversation, and a conversation past the context
// drops its oldest exchanges.
#include "chat/chat_template.h"
#include "splitflow_command.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace splitflow;
using nlohmann::ordered_json;

namespace {

using test::CommandResult;
using test::run_splitflow;

const std::string kStories = test::shared_path("models/stories260K-hf");
const std::string kTemplate = test::shared_path("models/llama3_1-tokenizer/tokenizer_config.json");

std::vector<std::string> chat_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"chat", "-m", kStories, "--chat-template", kTemplate, "--temp", "0", "-n", "12",
                                   "--verbose-prompt"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Lines typed into the command's stdin.
std::string typed(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return "printf '%s' " + test::shell_quote(text) + " |";
}

// The prompts the command printed, in order.
std::vector<std::string> prompts(const std::string& err) {
  std::vector<std::string> found;
  size_t at = 0;
  while ((at = err.find("[prompt, ", at)) != std::string::npos) {
    const size_t begin = err.find("]\n", at) + 2;
    const size_t end = err.find("\n[end of prompt]", begin);
    found.push_back(err.substr(begin, end - begin));
    at = end;
  }
  return found;
}

std::string render(const ordered_json& messages) {
  return ChatTemplate::from_file(kTemplate).render(messages, /*add_generation_prompt=*/true);
}

ordered_json message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// The reply a one-turn chat gives (greedy), as the command prints it.
std::string first_reply(const std::string& user) {
  const CommandResult result = run_splitflow(chat_args(), typed({user}));
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_FALSE(result.out.empty());
  return result.out.substr(0, result.out.size() - 1);  // the newline after the reply
}

TEST(ChatCommand, EachTurnSendsTheWholeConversationThroughTheTemplate) {
  const std::string reply = first_reply("Hello there.");
  const CommandResult result = run_splitflow(chat_args({"--system", "Be brief."}), typed({"Hello there.", "Tell me more."}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> sent = prompts(result.err);
  ASSERT_EQ(sent.size(), 2u) << result.err;
  ordered_json conversation = ordered_json::array({message("system", "Be brief."), message("user", "Hello there.")});
  EXPECT_EQ(sent[0], render(conversation));
  // The system message changes the first reply; the history carries what this run replied.
  const std::string first = result.out.substr(0, result.out.find('\n'));
  conversation.push_back(message("assistant", first));
  conversation.push_back(message("user", "Tell me more."));
  if (first.find('\n') == std::string::npos) EXPECT_EQ(sent[1], render(conversation));
  EXPECT_NE(sent[1].find("Hello there."), std::string::npos);
  EXPECT_NE(sent[1].find(first), std::string::npos);

  // Without the system message, the first reply is the one-turn chat's, exactly.
  const CommandResult plain = run_splitflow(chat_args(), typed({"Hello there.", "Tell me more."}));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::vector<std::string> plain_sent = prompts(plain.err);
  ASSERT_EQ(plain_sent.size(), 2u);
  EXPECT_EQ(plain_sent[1], render(ordered_json::array({message("user", "Hello there."), message("assistant", reply),
                                                       message("user", "Tell me more.")})));
  // stdout is the two replies and nothing else: no prompt marker, no log line, no speed.
  EXPECT_EQ(plain.out.rfind(reply + "\n", 0), 0u) << plain.out;
  EXPECT_EQ(plain.out.find("> "), std::string::npos) << plain.out;
  EXPECT_EQ(plain.out.find("tok/s"), std::string::npos) << plain.out;
  EXPECT_NE(plain.err.find("tok/s"), std::string::npos) << plain.err;
}

TEST(ChatCommand, MessageFlagsAreTurnsToo) {
  const std::string reply = first_reply("Hello there.");
  const CommandResult result = run_splitflow(chat_args({"--message", "Hello there.", "--message", "Tell me more."}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> sent = prompts(result.err);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1], render(ordered_json::array({message("user", "Hello there."), message("assistant", reply),
                                                 message("user", "Tell me more.")})));
}

TEST(ChatCommand, ClearForgetsAndExitEnds) {
  const CommandResult result = run_splitflow(chat_args(), typed({"Hello there.", "/clear", "Tell me more.", "/exit",
                                                                 "never sent"}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> sent = prompts(result.err);
  ASSERT_EQ(sent.size(), 2u) << result.err;
  EXPECT_EQ(sent[1], render(ordered_json::array({message("user", "Tell me more.")})));
  EXPECT_NE(result.err.find("[conversation cleared]"), std::string::npos);
  EXPECT_EQ(result.err.find("never sent"), std::string::npos);
}

TEST(ChatCommand, ALongConversationDropsItsOldestExchanges) {
  // stories260K's 512-token vocabulary spends many tokens on the template: 200 tokens of context
  // hold about two exchanges.
  const CommandResult result =
      run_splitflow(chat_args({"-c", "200"}), typed({"One.", "Two.", "Three.", "Four.", "Five."}));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::vector<std::string> sent = prompts(result.err);
  ASSERT_EQ(sent.size(), 5u) << result.err;
  EXPECT_NE(result.err.find("dropped the"), std::string::npos) << result.err;
  EXPECT_EQ(sent[4].find("One."), std::string::npos) << sent[4];
  EXPECT_NE(sent[4].find("Five."), std::string::npos) << sent[4];
}

TEST(ChatCommand, AModelWithoutATemplateIsAClearError) {
  test::expect_command_error(run_splitflow({"chat", "-m", kStories, "--message", "hi"}), "--chat-template");
}

}  // namespace
