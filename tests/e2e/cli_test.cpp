// The splitflow binary as a user runs it: real output on a real checkpoint, and a clean
// "error: ..." with exit status 1 (never a crash) for each kind of bad input.
#include "formats/safetensors_writer.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "splitflow_command.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace splitflow;

namespace {

using test::CommandResult;
using test::run_splitflow;

void expect_error(const std::vector<std::string>& args, const std::string& message_part) {
  test::expect_command_error(run_splitflow(args), message_part);
}

const std::string kStories = test::shared_path("models/stories260K-hf");

TEST(Cli, GenerateStreamsTheReferenceGreedyText) {
  const nlohmann::json expected = read_json_file(test::shared_path("models/stories260K/golden.json")).at("prompt_greedy");
  const CommandResult result = run_splitflow({"generate", "--model", kStories, "--prompt", "Once upon a time",
                                              "--temperature", "0", "--max-tokens", "64"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, expected.at("generated_text").get<std::string>() + "\n");
  EXPECT_NE(result.err.find("tok/s"), std::string::npos) << result.err;
}

// generate warms up by default (one eager decode step on the CPU, its KV write at block 0): the
// text must be the reference's with and without it.
TEST(Cli, GenerateWarmUpLeavesTheTextUnchanged) {
  const nlohmann::json expected = read_json_file(test::shared_path("models/stories260K/golden.json")).at("prompt_greedy");
  const CommandResult result = run_splitflow({"generate", "--model", kStories, "--prompt", "Once upon a time",
                                              "--temperature", "0", "--max-tokens", "64", "--no-warmup"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, expected.at("generated_text").get<std::string>() + "\n");
}

TEST(Cli, GenerateWithSamplingIsReproducibleBySeed) {
  const std::vector<std::string> args = {"generate", "--model", kStories, "--prompt", "Once upon a time", "--temperature",
                                         "0.9", "--top-p", "0.9", "--seed", "7", "--max-tokens", "40"};
  const CommandResult first = run_splitflow(args), second = run_splitflow(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.out, second.out);
  EXPECT_FALSE(first.out.empty());
}

TEST(Cli, InspectPrintsSpecPlanAndTensors) {
  const CommandResult result = run_splitflow({"inspect", "--model", kStories});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("\"num_kv_heads\": 4"), std::string::npos);
  EXPECT_NE(result.out.find("model.layers.4.mlp.down_proj.weight"), std::string::npos);
  EXPECT_NE(result.out.find("parameters: "), std::string::npos);
}

TEST(Cli, DummyWeightsRunAnyShapeWithoutACheckpoint) {
  const std::string config = test::fixture_path("model/configs/llama-2-7b/config.json");
  const CommandResult result = run_splitflow({"inspect", "--config", config, "--dummy-weights"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("\"hidden_size\": 4096"), std::string::npos);
  const std::string small = test::fixture_path("hf/llama_gqa_tied/config.json");
  const CommandResult generated = run_splitflow({"generate", "--config", small, "--dummy-weights", "--prompt-ids", "1,2,3",
                                                 "--max-tokens", "5", "--temperature", "0"});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  EXPECT_EQ(std::count(generated.out.begin(), generated.out.end(), ' '), 5) << generated.out;
}

TEST(Cli, BadInputGivesClearErrors) {
  expect_error({"generate", "--model", "/nonexistent/model", "--prompt", "hi"}, "/nonexistent/model");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--temperature", "-1"}, "temperature");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--top-p", "1.5"}, "top_p");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--min-p", "2"}, "min_p");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--max-tokens", "0"}, "max_tokens");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--weight-dtype", "int3"}, "int3");
  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "Once upon a time ";
  expect_error({"generate", "--model", kStories, "--prompt", long_prompt}, "context holds 512");
  expect_error({"generate", "--dummy-weights", "--prompt-ids", "1"}, "--config");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--backend", "tpu"}, "--backend must be cpu or cuda");
  expect_error({"generate", "--config", test::fixture_path("hf/llama/config.json"), "--dummy-weights",
                "--prompt-ids", "1,99999"}, "outside the vocabulary");
  // Parallel jobs: one process per GPU, refused on the CPU before anything starts.
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--tensor-parallel-size", "2"},
               "needs --device cuda");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--pipeline-parallel-size", "0"},
               "--pipeline-parallel-size (0) must be >= 1");
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--pipeline-parallel-size", "2",
                "--pipeline-layers", "2,x"}, "--pipeline-layers: 'x'");
}

// --kv-cache-dtype on every command that runs a model: an unknown value names the flag and the
// accepted values before any model loads; fp8 runs (stories260K keeps its golden greedy text).
TEST(Cli, KvCacheDtypeFlag) {
  const std::string message = "--kv-cache-dtype must be auto, bf16, fp16 or fp8 (fp8_e4m3), not 'fp9'";
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"generate", "--prompt", "hi"}, {"bench", "latency"}, {"bench", "throughput"}
#ifdef SPLITFLOW_HAS_HTTPLIB
        , {"serve", "--port", "0"}
#endif
       }) {
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--model", kStories, "--kv-cache-dtype", "fp9"});
    expect_error(args, message);
  }
  const nlohmann::json golden = read_json_file(test::shared_path("models/stories260K/golden.json"));
  const nlohmann::json& expected = golden.at("prompt_greedy");
  const CommandResult result = run_splitflow({"generate", "--model", kStories, "--prompt", "Once upon a time",
                                              "--temperature", "0", "--max-tokens", "64", "--kv-cache-dtype", "fp8"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, expected.at("generated_text").get<std::string>() + "\n");
}

// --quantization on every command that runs a model: an unknown or float type is an error listing
// the quantized types before any model loads; dummy weights run quantized (the bench use), and
// --logits-out writes one float32 row of logits per generated token.
TEST(Cli, QuantizationFlag) {
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"generate", "--prompt", "hi"}, {"bench", "latency"}, {"bench", "throughput"}
#ifdef SPLITFLOW_HAS_HTTPLIB
        , {"serve", "--port", "0"}
#endif
       }) {
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--model", kStories, "--quantization", "q9_9"});
    expect_error(args, "--quantization: unknown type 'q9_9' (one of: q4_0, q4_1, q5_0");
  }
  expect_error({"generate", "--model", kStories, "--prompt", "hi", "--quantization", "bf16"}, "not a quantized type");
  const std::string small = test::fixture_path("hf/llama_gqa_tied/config.json");
  const std::string logits = (std::filesystem::temp_directory_path() / "splitflow-cli-logits.npy").string();
  for (const char* type : {"q4_k", "q8_0", "q3h_b64", "f8_channel"}) {
    const CommandResult generated =
        run_splitflow({"generate", "--config", small, "--dummy-weights", "--quantization", type, "--prompt-ids", "1,2,3",
                       "--max-tokens", "5", "--temperature", "0", "--logits-out", logits});
    if (std::string(type) == "q4_k") {  // rows of 64 elements: not whole 256-element blocks
      test::expect_command_error(generated, "not a whole number of 256-element blocks");
      continue;
    }
    ASSERT_EQ(generated.exit_code, 0) << type << ": " << generated.err;
    EXPECT_NE(generated.err.find(std::string("projections quantized to ") + type), std::string::npos) << generated.err;
    EXPECT_EQ(std::filesystem::file_size(logits), 128 + 5 * 320 * sizeof(float));  // .npy header + [5, 320]
  }
  std::filesystem::remove(logits);
  // vLLM's spellings: fp8-weight-only is f8_channel; fp8 (W8A8) needs a Hopper GPU's FP8 tensor cores.
  const CommandResult weight_only =
      run_splitflow({"generate", "--config", small, "--dummy-weights", "--quantization", "fp8-weight-only",
                     "--prompt-ids", "1,2,3", "--max-tokens", "2", "--temperature", "0"});
  ASSERT_EQ(weight_only.exit_code, 0) << weight_only.err;
  EXPECT_NE(weight_only.err.find("projections quantized to f8_channel"), std::string::npos) << weight_only.err;
  expect_error({"generate", "--config", small, "--dummy-weights", "--quantization", "fp8", "--prompt-ids", "1,2,3"},
               "--quantization fp8 (W8A8: activations quantized to FP8 for the tensor cores) runs with --device cuda on "
               "a Hopper GPU (sm_90), not on cpu");
}

TEST(Cli, UnknownArchitectureNamesTheSpecFieldsToAdd) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "sf_cli_unknown_arch";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kStories + "/model.safetensors", dir / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "config.json") << R"({"architectures": ["FrobnicatorForCausalLM"], "hidden_size": 64})";
  expect_error({"inspect", "--model", dir.string()}, "FrobnicatorForCausalLM");
  const CommandResult result = run_splitflow({"inspect", "--model", dir.string()});
  EXPECT_NE(result.err.find("--spec"), std::string::npos) << result.err;
  std::filesystem::remove_all(dir);
}

// A model no template knows (every tensor renamed, no config.json) runs from a hand-written spec
// file alone and reproduces the reference text: a new model needs no code.
TEST(Cli, HandWrittenSpecAloneRunsAnUnknownModel) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "sf_cli_renamed";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kStories + "/tokenizer.json", dir / "tokenizer.json", std::filesystem::copy_options::overwrite_existing);
  const std::unique_ptr<WeightSource> source = open_weights(kStories + "/model.safetensors");
  const std::pair<std::string, std::string> per_layer[] = {
      {"input_layernorm", "pre_mix_scale"}, {"self_attn.q_proj", "mix.query"}, {"self_attn.k_proj", "mix.key"},
      {"self_attn.v_proj", "mix.value"}, {"self_attn.o_proj", "mix.merge"}, {"post_attention_layernorm", "pre_ff_scale"},
      {"mlp.gate_proj", "ff.gate"}, {"mlp.up_proj", "ff.lift"}, {"mlp.down_proj", "ff.drop"}};
  std::vector<TensorInfo> renamed;
  for (const TensorInfo& info : source->tensors()) {
    TensorInfo copy = info;
    if (info.name == "model.embed_tokens.weight") copy.name = "net.token_table.w";
    if (info.name == "model.norm.weight") copy.name = "net.out_scale.w";
    for (int layer = 0; layer < 5; ++layer)
      for (const auto& [from, to] : per_layer)
        if (info.name == "model.layers." + std::to_string(layer) + "." + from + ".weight")
          copy.name = "net.blocks." + std::to_string(layer) + "." + to + ".w";
    ASSERT_NE(copy.name, info.name) << "unmapped tensor " << info.name;
    renamed.push_back(copy);
  }
  write_safetensors((dir / "model.safetensors").string(), renamed);

  const nlohmann::json expected = read_json_file(test::shared_path("models/stories260K/golden.json")).at("prompt_greedy");
  const CommandResult result =
      run_splitflow({"generate", "--model", dir.string(), "--spec", test::fixture_path("model/renamed_stories/spec.json"),
                     "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "64"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, expected.at("generated_text").get<std::string>() + "\n");
  std::filesystem::remove_all(dir);
}

TEST(Cli, DamagedCheckpointIsReportedNotCrashed) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "sf_cli_truncated";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kStories + "/config.json", dir / "config.json", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(kStories + "/tokenizer.json", dir / "tokenizer.json", std::filesystem::copy_options::overwrite_existing);
  const std::string weights = test::read_file(kStories + "/model.safetensors");
  std::ofstream(dir / "model.safetensors", std::ios::binary) << weights.substr(0, weights.size() / 2);
  expect_error({"generate", "--model", dir.string(), "--prompt", "hi"}, "model.safetensors");
  std::filesystem::remove_all(dir);
}

}  // namespace
