// What users bring from llama.cpp, vLLM and Ollama to the command line (issue 29, item 5):
// --version, llama.cpp's flag spellings meaning what ours mean, -ngl's clear refusal, and stdout
// carrying only the generated text (every log line on stderr).
#include "splitflow_command.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

using namespace splitflow;

namespace {

using test::CommandResult;
using test::run_splitflow;

const std::string kStories = test::shared_path("models/stories260K-hf");

std::string model_cache() {
  if (const char* env = std::getenv("SPLITFLOW_MODEL_CACHE")) return env;
  return test::fixture_path("../../.cache/models");
}

TEST(CliHabits, VersionNamesReleaseCommitBuildTypeAndCuda) {
  const CommandResult result = run_splitflow({"--version"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::regex line(R"(splitflow \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,40}(-dirty)?|unknown|\S+), \w+ build, CUDA (on|off)\)\n)");
  EXPECT_TRUE(std::regex_match(result.out, line)) << result.out;
  EXPECT_EQ(result.err, "");
}

// Each llama.cpp spelling gives exactly what our own spelling gives.
TEST(CliHabits, LlamaCppSpellingsMeanTheSameAsOurs) {
  const CommandResult ours = run_splitflow({"generate", "--model", kStories, "--prompt", "Once upon a time",
                                            "--max-tokens", "24", "--temperature", "0.9", "--seed", "7", "--top-k",
                                            "20", "--top-p", "0.9", "--threads", "1"});
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  ASSERT_FALSE(ours.out.empty());
  const CommandResult short_forms = run_splitflow({"generate", "-m", kStories, "-p", "Once upon a time", "-n", "24",
                                                   "--temp", "0.9", "-s", "7", "--top-k", "20", "--top-p", "0.9",
                                                   "-t", "1", "-c", "512", "-ngl", "0"});
  ASSERT_EQ(short_forms.exit_code, 0) << short_forms.err;
  EXPECT_EQ(short_forms.out, ours.out);
  const CommandResult long_forms = run_splitflow({"generate", "--model", kStories, "--prompt", "Once upon a time",
                                                  "--n-predict", "24", "--temp", "0.9", "--seed", "7", "--top-k", "20",
                                                  "--top-p", "0.9", "--threads", "1", "--ctx-size", "512",
                                                  "--n-gpu-layers", "0", "--device", "cpu"});
  ASSERT_EQ(long_forms.exit_code, 0) << long_forms.err;
  EXPECT_EQ(long_forms.out, ours.out);
  // The seed is really taken: another one gives another text.
  const CommandResult other_seed = run_splitflow({"generate", "-m", kStories, "-p", "Once upon a time", "-n", "24",
                                                  "--temp", "0.9", "-s", "8", "--top-k", "20", "--top-p", "0.9"});
  ASSERT_EQ(other_seed.exit_code, 0) << other_seed.err;
  EXPECT_NE(other_seed.out, ours.out);
}

TEST(CliHabits, CtxSizeBoundsTheContextAndNPredictMinusOneFillsIt) {
  // -c 32: prompt and output share 32 tokens (two blocks of 16), so -n -1 stops at the context.
  const CommandResult filled = run_splitflow({"generate", "-m", kStories, "-p", "Once upon a time", "-n", "-1", "-c",
                                              "32", "--temp", "0", "--ignore-eos"});
  ASSERT_EQ(filled.exit_code, 0) << filled.err;
  EXPECT_NE(filled.err.find("generated 27 tokens"), std::string::npos) << filled.err;  // 32 - 5 prompt tokens
  EXPECT_NE(filled.err.find("finish: length"), std::string::npos) << filled.err;
  std::string long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt += "Once upon a time ";
  test::expect_command_error(run_splitflow({"generate", "-m", kStories, "-p", long_prompt, "-c", "32"}),
                             "the prompt has");
  test::expect_command_error(run_splitflow({"generate", "-m", kStories, "-p", "hi", "-c", "-4"}), "--ctx-size");
}

// Layers go to a GPU with --device cuda (generate splits the model between the GPU and the CPU
// there, tests/parallel/local_pipeline_test.cpp; -ngl auto picks the split, gpu_layer_fit_test.cpp);
// on the CPU device -ngl N > 0 and -ngl auto say so.
TEST(CliHabits, LayerOffloadWithoutTheGpuDeviceIsAClearError) {
  for (const std::string& spelling : {"-ngl", "--n-gpu-layers"}) {
    const CommandResult result = run_splitflow({"generate", "-m", kStories, "-p", "hi", spelling, "99"});
    test::expect_command_error(result, "layers are offloaded to a GPU with --device cuda");
    EXPECT_NE(result.err.find("-ngl/--n-gpu-layers 99"), std::string::npos) << result.err;
  }
  test::expect_command_error(run_splitflow({"generate", "-m", kStories, "-p", "hi", "-ngl=12"}),
                             "layers are offloaded to a GPU with --device cuda");
  // The engine picks the split itself only for a GPU; values are counts or auto.
  for (const std::string& spelling : {"-ngl", "--gpu-layers"}) {
    test::expect_command_error(run_splitflow({"generate", "-m", kStories, "-p", "hi", spelling, "auto"}),
                               "-ngl/--n-gpu-layers auto with --device cpu");
    test::expect_command_error(run_splitflow({"generate", "-m", kStories, "-p", "hi", spelling, "half"}),
                               "-ngl/--n-gpu-layers 'half': give a layer count or auto");
  }
  // The matmul offload belongs to a split; its row count is a count.
  test::expect_command_error(run_splitflow({"generate", "-m", kStories, "-p", "hi", "--offload-rows", "32"}),
                             "--offload-rows 32: the CPU layers' products go to the GPU only in a GPU/CPU split");
  test::expect_command_error(run_splitflow({"generate", "-m", kStories, "-p", "hi", "--offload-rows", "-3"}),
                             "--offload-rows must be 0 (off) or a row count, not -3");
}

// serve runs until a signal: SIGTERM after `seconds` (it drains and exits), then its stderr.
CommandResult serve_briefly(std::vector<std::string> args, int seconds = 8) {
  args.insert(args.begin(), "serve");
  for (const char* arg : {"--port", "0", "--no-warmup"}) args.emplace_back(arg);
  return run_splitflow(args, "timeout -s TERM " + std::to_string(seconds));
}

TEST(CliHabits, ServeTakesCtxSize) {
  const CommandResult result = serve_briefly({"-m", kStories, "-c", "128"});
  EXPECT_NE(result.err.find("context 128 tokens"), std::string::npos) << result.err;
  const CommandResult long_form = serve_briefly({"-m", kStories, "--ctx-size", "96"});
  EXPECT_NE(long_form.err.find("context 96 tokens"), std::string::npos) << long_form.err;
}

// Issue 29, item 7: the CPU's default KV cache comes from the model (one full-length sequence of
// SmolLM2's 8192 tokens, not 4 GiB), says why, and an explicit size still wins.
TEST(CliHabits, ServeSizesTheCpuKvCacheFromTheModel) {
  const std::string gguf = model_cache() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " is not fetched (scripts/fetch_models.py)";
  const CommandResult chosen = serve_briefly({"-m", gguf}, 20);
  EXPECT_NE(chosen.err.find("KV cache 512 blocks of 16 tokens in f32 (0.35 GiB; 256 sequences at full length would "
                            "take 90.00 GiB: one full-length sequence (8192 tokens)"),
            std::string::npos)
      << chosen.err;
  EXPECT_NE(chosen.err.find("the CPU default"), std::string::npos) << chosen.err;
  EXPECT_EQ(chosen.out, "");
  const CommandResult explicit_size = serve_briefly({"-m", gguf, "--num-blocks", "64"}, 20);
  EXPECT_NE(explicit_size.err.find("KV cache 64 blocks of 16 tokens in f32 (0.04 GiB)"), std::string::npos)
      << explicit_size.err;
}

// The SmolLM2 GGUF ties its output layer to the embedding, which model/ logs (spdlog info): that
// line must reach stderr, and stdout hold only the text and the final newline.
TEST(CliHabits, StdoutCarriesOnlyTheGeneratedText) {
  const std::string gguf = model_cache() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(gguf)) GTEST_SKIP() << gguf << " is not fetched (scripts/fetch_models.py)";
  const CommandResult result =
      run_splitflow({"generate", "-m", gguf, "-p", "The capital of France is", "-n", "6", "--temp", "0"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("tied to the embedding"), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find("[info]"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("tied"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("tok/s"), std::string::npos) << result.out;
  // The same text as the server's completion of the prompt would be is not at hand here; what is:
  // the output starts with the greedy continuation and ends with exactly one newline.
  EXPECT_EQ(result.out.substr(0, 7), " Paris.") << result.out;
  ASSERT_FALSE(result.out.empty());
  EXPECT_EQ(result.out.back(), '\n');
}

}  // namespace
