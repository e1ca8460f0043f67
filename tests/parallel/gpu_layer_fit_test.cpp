// How many layers -ngl auto puts on the GPU (parallel/gpu_layer_fit.h): the placement against
// hand-computed budgets, and the sizes it counts for a real checkpoint against the checkpoint's own
// header (read here with nlohmann::json, not through formats/) and its config.
#include "parallel/gpu_layer_fit.h"

#include "backend/upload_bytes.h"
#include "engine/model_loader.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

using namespace splitflow;

namespace {

// Four layers of 100 weight bytes and 10 KV bytes, a 50-byte head, 40 bytes of embeddings, 20 of
// step buffers; memory_fraction 0.9 of a 1000-byte device and 100 bytes reserved, so
// usable = free - 100 - 100.
GpuLayerFitRequest four_layers(int64_t free_bytes) {
  GpuLayerFitRequest request;
  request.layer_bytes = {100, 100, 100, 100};
  request.layer_kv_bytes = {10, 10, 10, 10};
  request.head_bytes = 50;
  request.embed_bytes = 40;
  request.step_bytes = 20;
  request.memory = {free_bytes, 1000};
  request.budget.memory_fraction = 0.9;
  request.budget.reserve_bytes = 100;
  return request;
}

}  // namespace

TEST(GpuLayerFit, TakesTheMostTrailingLayersThatFit) {
  // usable 400: 70 (head + steps) + 3 x 110 = 400 fits exactly; a fourth layer and the embeddings do not.
  const GpuLayerFit fit = fit_gpu_layers(four_layers(600));
  EXPECT_EQ(fit.usable_bytes, 400);
  EXPECT_EQ(fit.gpu_layers, 3);
  EXPECT_EQ(fit.num_layers, 4);
  EXPECT_EQ(fit.gpu_bytes, 400);
  EXPECT_NE(fit.summary.find("3 of 4 layers"), std::string::npos) << fit.summary;
  EXPECT_EQ(fit_gpu_layers(four_layers(599)).gpu_layers, 2);  // one byte short of the third layer
}

TEST(GpuLayerFit, EveryLayerOnlyWithTheEmbeddings) {
  // All four layers: 70 + 440 + 40 = 550 bytes.
  const GpuLayerFit whole = fit_gpu_layers(four_layers(750));  // usable 550
  EXPECT_EQ(whole.gpu_layers, 4);
  EXPECT_EQ(whole.gpu_bytes, 550);
  // 549 usable: the four layers would fit without the embeddings, which go with the last one.
  EXPECT_EQ(fit_gpu_layers(four_layers(749)).gpu_layers, 3);
}

TEST(GpuLayerFit, OffloadStagingOnlyInASplit) {
  // 30 bytes of staging: every layer with the embeddings (550) holds none and still fits 550 usable;
  // a split holds it beside its layers.
  GpuLayerFitRequest request = four_layers(750);  // usable 550
  request.split_bytes = 30;
  EXPECT_EQ(fit_gpu_layers(request).gpu_layers, 4);
  EXPECT_EQ(fit_gpu_layers(request).gpu_bytes, 550);
  request.memory.free_bytes = 749;  // usable 549: three layers and the staging, 430
  EXPECT_EQ(fit_gpu_layers(request).gpu_layers, 3);
  EXPECT_EQ(fit_gpu_layers(request).gpu_bytes, 430);
  request.memory.free_bytes = 600;  // usable 400: three layers' 400 leave no room for the staging
  EXPECT_EQ(fit_gpu_layers(request).gpu_layers, 2);
  EXPECT_EQ(fit_gpu_layers(request).gpu_bytes, 320);
  // The KV blocks of a split count it; of every layer on the GPU, not.
  GpuLayerFitRequest per_token = four_layers(1000);
  per_token.layer_kv_bytes = {1, 1, 1, 1};
  per_token.budget = {1.0, 0};
  per_token.split_bytes = 30;
  // Two GPU layers: 1000 - (70 + 200 + 30) = 700 over 32 -> 21; all four: 1000 - 470 = 530 over 64 -> 8.
  EXPECT_EQ(split_kv_blocks(per_token, 2, 16, 10000, INT32_MAX), 21);
  EXPECT_EQ(split_kv_blocks(per_token, 4, 16, 10000, INT32_MAX), 8);
}

TEST(GpuLayerFit, CountsFromTheLastLayer) {
  GpuLayerFitRequest request = four_layers(600);  // usable 400
  request.layer_bytes = {10, 10, 30, 300};  // the last layer: 70 + 310 = 380; with the next, 420
  const GpuLayerFit fit = fit_gpu_layers(request);
  EXPECT_EQ(fit.gpu_layers, 1);
  EXPECT_EQ(fit.gpu_bytes, 380);
}

TEST(GpuLayerFit, NothingUsefulFitsOrSizesContradictEachOther) {
  // usable 170 < 70 + 110: not even the last layer.
  try {
    fit_gpu_layers(four_layers(370));
    FAIL() << "no layer fits";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("not even one layer"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("--device cpu"), std::string::npos) << error.what();
  }
  GpuLayerFitRequest uneven = four_layers(600);
  uneven.layer_kv_bytes.pop_back();
  EXPECT_THROW(fit_gpu_layers(uneven), std::exception);
  GpuLayerFitRequest negative = four_layers(600);
  negative.layer_bytes[1] = -1;
  EXPECT_THROW(fit_gpu_layers(negative), std::exception);
  GpuLayerFitRequest impossible = four_layers(600);
  impossible.memory = {2000, 1000};  // more free than there is
  EXPECT_THROW(fit_gpu_layers(impossible), std::exception);
  GpuLayerFitRequest fraction = four_layers(600);
  fraction.budget.memory_fraction = 1.5;
  EXPECT_THROW(fit_gpu_layers(fraction), std::exception);
}

TEST(GpuLayerFit, CountsEveryCheckpointTensorAsTheGpuStoresIt) {
  // stories260K: f32 safetensors, tied embeddings. On the GPU its matrices are bf16 (2 bytes) and
  // its vectors f32 (4): the request's weights must add up to the file's tensors counted so.
  const std::string dir = test::shared_path("models/stories260K-hf");
  std::ifstream file(dir + "/model.safetensors", std::ios::binary);
  ASSERT_TRUE(file) << "missing " << dir;
  uint64_t header_len = 0;
  file.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  file.read(header.data(), static_cast<std::streamsize>(header_len));
  int64_t expected_layers = 0, expected_other = 0;
  const nlohmann::json tensors = nlohmann::json::parse(header);
  for (const auto& [name, entry] : tensors.items()) {
    if (name == "__metadata__") continue;
    int64_t numel = 1;
    for (int64_t d : entry["shape"]) numel *= d;
    const int64_t bytes = numel * (entry["shape"].size() >= 2 ? 2 : 4);
    (name.find(".layers.") != std::string::npos ? expected_layers : expected_other) += bytes;
  }
  std::ifstream config_file(dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);

  ModelLoadOptions options;
  options.model_path = dir;
  const LoadedModel model = load_model(options);
  const int64_t context = 96;
  const RunnerLimits limits{64, 2};
  const GpuLayerFitRequest request = gpu_layer_fit_request(model.spec, model.weights, cuda_upload_bytes, context,
                                                           DType::BF16, limits, {int64_t{1} << 30, int64_t{1} << 31}, {});
  ASSERT_EQ(request.layer_bytes.size(), 5u);
  int64_t layers = 0;
  for (int64_t bytes : request.layer_bytes) layers += bytes;
  EXPECT_EQ(layers, expected_layers);
  // Tied: the embedding table is the head's matrix, counted once (with the head).
  EXPECT_EQ(request.head_bytes + request.embed_bytes, expected_other);
  EXPECT_EQ(request.embed_bytes, 0);
  // K and V of every token: 2 x kv_heads x head_dim bf16 values per layer.
  const int64_t kv = 2 * config["num_key_value_heads"].get<int64_t>() * config["head_dim"].get<int64_t>() * 2 * context;
  for (int64_t bytes : request.layer_kv_bytes) EXPECT_EQ(bytes, kv);
  EXPECT_GT(request.step_bytes, int64_t{2} * config["vocab_size"].get<int64_t>() * 4);  // at least the logits

  // With the matmul offload, the GPU also holds its staging: the largest layer matrix as stored
  // (the fused gate and up projection, [2 x intermediate, hidden] in bf16) twice, a pad, chunks of 512
  // rows of input (bf16) and output (f32) at the widest shape (2 x intermediate), and the helper's
  // reserve.
  MatmulOffloadOptions offload;
  offload.chunk_rows = 512;
  const GpuLayerFitRequest offloading =
      gpu_layer_fit_request(model.spec, model.weights, cuda_upload_bytes, context, DType::BF16, limits,
                            {int64_t{1} << 30, int64_t{1} << 31}, {}, offload);
  const int64_t hidden = config["hidden_size"].get<int64_t>(), gate_up = 2 * config["intermediate_size"].get<int64_t>();
  EXPECT_EQ(offloading.step_bytes, request.step_bytes);
  EXPECT_EQ(request.split_bytes, 0);
  EXPECT_EQ(offloading.split_bytes,
            2 * gate_up * hidden * 2 + 256 + 512 * gate_up * 2 + 512 * gate_up * 4 + (int64_t{512} << 20));
  EXPECT_EQ(offloading.layer_bytes, request.layer_bytes);
}

TEST(GpuLayerFit, SplitKvBlocksFromBothSidesMemory) {
  constexpr int64_t kNoCap = INT32_MAX;
  // Per token: 1 KV byte a layer; 4 layers of 100 bytes, head 50, steps 20; 1000 bytes usable.
  GpuLayerFitRequest per_token = four_layers(1000);
  per_token.layer_kv_bytes = {1, 1, 1, 1};
  per_token.budget.memory_fraction = 1.0;
  per_token.budget.reserve_bytes = 0;
  // Two GPU layers: 1000 - (70 + 200) = 730 bytes over 2 x 16 per block -> 22; the host's 320 bytes
  // over the CPU's 2 x 16 per block -> 10.
  EXPECT_EQ(split_kv_blocks(per_token, 2, 16, 320, kNoCap), 10);
  EXPECT_EQ(split_kv_blocks(per_token, 2, 16, 10000, kNoCap), 22);
  // Three GPU layers: 1000 - 370 = 630 over 48 -> 13; one CPU layer: 320 over 16 -> 20.
  EXPECT_EQ(split_kv_blocks(per_token, 3, 16, 320, kNoCap), 13);
  // What every sequence at full length takes bounds both sides' figures.
  EXPECT_EQ(split_kv_blocks(per_token, 2, 16, 10000, 7), 7);
  EXPECT_EQ(split_kv_blocks(per_token, 2, 16, 320, 12), 10);
  EXPECT_THROW(split_kv_blocks(per_token, 2, 16, 320, 0), std::exception);
  try {
    split_kv_blocks(per_token, 2, 16, 31, kNoCap);  // not one block of the CPU's layers
    FAIL() << "no block fits";
  } catch (const std::exception& error) {
    EXPECT_NE(std::string(error.what()).find("no KV cache block fits"), std::string::npos) << error.what();
  }
  EXPECT_THROW(split_kv_blocks(per_token, 5, 16, 320, kNoCap), std::exception);  // more GPU layers than the model
  EXPECT_THROW(split_kv_blocks(per_token, 0, 16, 320, kNoCap), std::exception);
}
