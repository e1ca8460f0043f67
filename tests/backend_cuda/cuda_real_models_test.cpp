// The real checkpoints in ../shared/models on both backends: the CUDA backend (bf16) and the CPU
// backend (f32) read the same prompt, then the CPU's greedy continuation token by token (teacher
// forcing, so both see the same sequence), through prefill, decode replays and a mixed batch.
// Each row must agree within the bf16 tolerance of the HF fixture test (hf_fixture_runner.h's
// numbers, re-stated here) and pick the CPU's top-1 unless the CPU's own margin is a near tie.
// Skips without a GPU or without ../shared.
#include "backend_cuda/cuda_test_util.h"

#include "engine/model_loader.h"
#include "engine/generator.h"
#include "runtime/model_runner.h"
#include "test_paths.h"

#include <algorithm>
#include <filesystem>

using namespace splitflow;

namespace {

constexpr double kRowTolerance = 0.25;  // max |diff| / max |logit| per row
constexpr double kTop1Margin = 0.05;    // a top-1 flip is allowed when the CPU's margin is below this

struct Agreement {
  int rows = 0, flips = 0;
  double worst = 0;
};

void compare(const Tensor& gpu, const Tensor& cpu, Agreement& agreement, const std::string& what) {
  ASSERT_EQ(gpu.shape, cpu.shape) << what;
  const int64_t vocab = cpu.dim(1);
  for (int64_t r = 0; r < cpu.dim(0); ++r) {
    const float* g = gpu.as<float>() + r * vocab;
    const float* c = cpu.as<float>() + r * vocab;
    double max_abs = 0, max_diff = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      max_abs = std::max(max_abs, std::abs(static_cast<double>(c[v])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(g[v]) - c[v]));
    }
    agreement.worst = std::max(agreement.worst, max_diff / max_abs);
    ++agreement.rows;
    EXPECT_LE(max_diff / max_abs, kRowTolerance) << what << " row " << r;
    const int64_t want = std::max_element(c, c + vocab) - c, got = std::max_element(g, g + vocab) - g;
    if (want == got) continue;
    std::vector<float> sorted(c, c + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] < kTop1Margin * max_abs) {
      ++agreement.flips;
    } else {
      ADD_FAILURE() << what << " row " << r << ": GPU top-1 " << got << ", CPU " << want;
    }
  }
}

class CudaRealModels : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaRealModels, AgreesWithTheCpuBackend) {
  SF_REQUIRE_GPU();
  const std::string path = test::shared_path(GetParam());
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found";
  ModelLoadOptions options;
  options.model_path = path;
  options.weight_dtype = DType::F32;
  LoadedModel cpu_model = load_model(options);
  LoadedModel gpu_model = load_model(options);
  auto cpu = make_cpu_backend(0);
  auto gpu = test::make_test_cuda_backend();
  const int kPrompt = 40, kSteps = 60, kBlockSize = 16;
  const int blocks = blocks_for_tokens(kPrompt + kSteps + 1, kBlockSize);
  // Two copies of the sequence: the second one decodes in the same batch as the first.
  ModelRunner cpu_runner(cpu_model.spec, std::move(cpu_model.weights), *cpu, {2 * blocks, kBlockSize});
  ModelRunner gpu_runner(gpu_model.spec, std::move(gpu_model.weights), *gpu, {2 * blocks, kBlockSize});
  const std::vector<int32_t> table_a = [&] {
    std::vector<int32_t> t(blocks);
    for (int b = 0; b < blocks; ++b) t[b] = 2 * b;  // interleaved with the other sequence's blocks
    return t;
  }();
  std::vector<int32_t> table_b(blocks);
  for (int b = 0; b < blocks; ++b) table_b[b] = 2 * b + 1;

  std::vector<int32_t> tokens = {1};
  for (int i = 1; i < kPrompt; ++i) tokens.push_back(static_cast<int32_t>((i * 37 + 11) % cpu_runner.spec().vocab_size));
  Agreement agreement;
  ForwardBatch prefill;
  prefill.token_ids = tokens;
  prefill.logits_mode = LogitsMode::All;
  prefill.spans.push_back({kPrompt, 0, table_a, true});
  prefill.spans.push_back({kPrompt, 0, table_b, true});
  prefill.token_ids.insert(prefill.token_ids.end(), tokens.begin(), tokens.end());
  Tensor cpu_logits = cpu_runner.forward(prefill);
  compare(gpu_runner.forward(prefill), cpu_logits, agreement, "prefill");
  const int64_t vocab = cpu_logits.dim(1);
  const float* last = cpu_logits.as<float>() + (kPrompt - 1) * vocab;
  int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
  for (int step = 0; step < kSteps; ++step) {
    ForwardBatch decode;
    decode.token_ids = {next, next};
    decode.spans.push_back({1, kPrompt + step, table_a, true});
    decode.spans.push_back({1, kPrompt + step, table_b, true});
    cpu_logits = cpu_runner.forward(decode);
    compare(gpu_runner.forward(decode), cpu_logits, agreement, "decode step " + std::to_string(step));
    next = static_cast<int32_t>(std::max_element(cpu_logits.as<float>(), cpu_logits.as<float>() + vocab) -
                                cpu_logits.as<float>());
  }
  std::cout << GetParam() << ": " << agreement.rows << " rows, worst max|diff|/max|logit| " << agreement.worst
            << ", near-tie top-1 flips " << agreement.flips << "\n";
  EXPECT_LE(agreement.flips, agreement.rows / 20);
}

INSTANTIATE_TEST_SUITE_P(Shared, CudaRealModels,
                         ::testing::Values("models/stories260K/stories260K.bin", "models/stories260K-hf",
                                           "models/stories260K-gguf/stories260K-f16.gguf",
                                           "models/aidreams260K/aidreams260K.bin"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = std::filesystem::path(info.param).filename().string();
                           std::replace_if(name.begin(), name.end(), [](char c) { return !std::isalnum(c); }, '_');
                           return name;
                         });

}  // namespace
