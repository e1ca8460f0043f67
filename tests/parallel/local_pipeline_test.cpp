// Pipeline stages inside one process (parallel/local_pipeline.h), the GPU/CPU split of llama.cpp's
// -ngl: here two CPU backends with different thread counts stand in for the GPU and the CPU (the
// same host-memory links and step channel). A pipeline computes what one rank computes, so the
// Generator's greedy and seeded outputs must be identical to one rank's (which tests/engine checks
// against transformers and the reference sampler).
#include "parallel/local_pipeline.h"

#include "backend/host_mailboxes.h"
#include "engine/generator.h"
#include "engine/model_loader.h"
#include "backend/forwarding_backend.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

using namespace splitflow;

namespace {

LoadedModel stories() {
  ModelLoadOptions options;
  options.model_path = test::shared_path("models/stories260K-hf");
  return load_model(options);
}

StageBackendFactory cpu_stage(int threads) {
  return [threads](std::shared_ptr<HostMailboxes> mailboxes, int rank) {
    return make_cpu_backend(threads, CpuJobPlace{nullptr, 0, std::move(mailboxes), rank});
  };
}

// A stage on a backend that can record (as CUDA's can), the CPU's kernels behind it: the -ngl
// split's GPU stage, whose warm-up once ran decode steps its CPU leader never ran.
class RecordableStage final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string name() const override { return "cpu (can record)"; }
  bool can_record() const override { return true; }
};

}  // namespace

TEST(LocalPipeline, StagesInOneProcessGiveTheOneRankOutputs) {
  LoadedModel model = stories();
  const KvCacheConfig kv{16, 16};
  const RunnerLimits limits{64, 1};
  auto backend = make_cpu_backend(2);
  ModelRunner one(model.spec, model.weights, *backend, kv, limits);
  Generator one_generator(one, model.tokenizer.get());
  const std::vector<int32_t> prompt = model.tokenizer->encode("Once upon a time, there was a little dog", true);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 60;
  SamplingParams sampled = greedy;
  sampled.temperature = 0.9f;
  sampled.seed = 7;
  const GenerationResult want_greedy = one_generator.generate(prompt, greedy);
  const GenerationResult want_sampled = one_generator.generate(prompt, sampled);

  for (const std::vector<int>& split : {std::vector<int>{3, 2}, std::vector<int>{1, 4}, std::vector<int>{2, 2, 1}}) {
    std::vector<LocalStage> stages;
    for (size_t s = 0; s < split.size(); ++s) stages.push_back({cpu_stage(s == 0 ? 2 : 1), split[s]});
    LocalPipeline pipeline(model.spec, model.weights, stages, kv, limits);
    SCOPED_TRACE(pipeline.description());
    Generator generator(pipeline.leader(), model.tokenizer.get());
    EXPECT_EQ(generator.generate(prompt, greedy).output_ids, want_greedy.output_ids);
    EXPECT_EQ(generator.generate(prompt, sampled).output_ids, want_sampled.output_ids);
  }
}

// The server warms its engine up before it opens its port: over stages whose backends differ (a
// CPU leader, a stage that can record), no stage runs warm-up steps the others do not, and the
// outputs after it are the one rank's; the pipeline then shuts down at once.
TEST(LocalPipeline, WarmUpOverStagesOnDifferentBackendsKeepsThemInStep) {
  LoadedModel model = stories();
  const KvCacheConfig kv{16, 16};
  const RunnerLimits limits{64, 2};
  auto backend = make_cpu_backend(1);
  ModelRunner one(model.spec, model.weights, *backend, kv, limits);
  const std::vector<int32_t> prompt = model.tokenizer->encode("Once upon a time", true);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 12;
  const GenerationResult want = Generator(one, model.tokenizer.get()).generate(prompt, greedy);

  const StageBackendFactory recordable = [](std::shared_ptr<HostMailboxes> mailboxes, int rank) -> std::unique_ptr<Backend> {
    return std::make_unique<RecordableStage>(make_cpu_backend(1, CpuJobPlace{nullptr, 0, std::move(mailboxes), rank}));
  };
  const auto start = std::chrono::steady_clock::now();
  {
    LocalPipeline pipeline(model.spec, model.weights, {{cpu_stage(1), 2}, {recordable, 3}}, kv, limits);
    const WarmupReport report = pipeline.leader().warm_up(false);
    EXPECT_TRUE(report.decode_buckets.empty());
    EXPECT_EQ(report.prefill_tokens, 0);
    Generator generator(pipeline.leader(), model.tokenizer.get());
    EXPECT_EQ(generator.generate(prompt, greedy).output_ids, want.output_ids);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(LocalPipeline, AStageThatCannotBeBuiltIsNamedAndNothingHangs) {
  LoadedModel model = stories();
  std::vector<LocalStage> stages = {
      {cpu_stage(1), 3},
      {[](std::shared_ptr<HostMailboxes>, int) -> std::unique_ptr<Backend> { fail("no such device"); }, 2}};
  try {
    LocalPipeline pipeline(model.spec, model.weights, stages, KvCacheConfig{16, 16}, RunnerLimits{64, 1});
    ADD_FAILURE() << "built a pipeline with a broken stage";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 1: no such device"), std::string::npos) << e.what();
  }
  // Layer counts that do not add up are refused before any thread starts.
  std::vector<LocalStage> wrong = {{cpu_stage(1), 3}, {cpu_stage(1), 3}};
  try {
    LocalPipeline pipeline(model.spec, model.weights, wrong, KvCacheConfig{16, 16}, RunnerLimits{64, 1});
    ADD_FAILURE() << "built a pipeline of 6 layers for a 5-layer model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add up to 6, the model has 5"), std::string::npos) << e.what();
  }
}

namespace {

// A stage that stops (HostMailboxes::fail) does not leave the stages waiting on it waiting forever:
// a recv on it, waiting already or made later, throws naming the rank and its error; messages it
// sent before stopping are still delivered, and other pairs are untouched.
TEST(HostMailboxes, ARecvOnAStoppedRankThrowsNamingIt) {
  HostMailboxes boxes;
  const int32_t sent = 7;
  boxes.send(1, 0, &sent, DType::I32, 1);
  std::string waiting_error;
  std::thread waiter([&] {
    int32_t value = 0;
    try {
      boxes.recv(2, 0, &value, DType::I32, 1);  // rank 2 never sends
    } catch (const Error& e) {
      waiting_error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  boxes.fail(2, "cuda matmul: out of memory");
  waiter.join();
  EXPECT_NE(waiting_error.find("rank 2"), std::string::npos) << waiting_error;
  EXPECT_NE(waiting_error.find("out of memory"), std::string::npos) << waiting_error;
  int32_t value = 0;
  EXPECT_THROW(boxes.recv(2, 0, &value, DType::I32, 1), Error);  // later ones too
  boxes.recv(1, 0, &value, DType::I32, 1);                       // another pair, sent before
  EXPECT_EQ(value, 7);
  boxes.fail(1, "stopped");
  boxes.send(1, 0, &sent, DType::I32, 1);  // queued before a recv: still delivered
  boxes.recv(1, 0, &value, DType::I32, 1);
  EXPECT_EQ(value, 7);
}

// A CPU stage's f32 residual stream arrives at a GPU stage as the bf16 it holds, and back (the
// -ngl split: the hop the CPU-only jobs never take); elements that are not floats are not guessed at.
TEST(HostMailboxes, FloatMessagesArriveInTheReceiversDtype) {
  HostMailboxes boxes;
  const std::vector<float> sent = {1.0f, -2.5f, 3.14159f, 65504.0f, 1e-3f};
  boxes.send(0, 1, sent.data(), DType::F32, static_cast<int64_t>(sent.size()));
  std::vector<uint16_t> as_bf16(sent.size());
  boxes.recv(0, 1, as_bf16.data(), DType::BF16, static_cast<int64_t>(as_bf16.size()));
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(as_bf16[i], f32_to_bf16(sent[i])) << i;

  boxes.send(1, 0, as_bf16.data(), DType::BF16, static_cast<int64_t>(as_bf16.size()));
  std::vector<float> back(sent.size());
  boxes.recv(1, 0, back.data(), DType::F32, static_cast<int64_t>(back.size()));
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_NEAR(back[i], sent[i], std::abs(sent[i]) / 128) << i;

  boxes.send(0, 1, sent.data(), DType::F32, 4);
  EXPECT_THROW(boxes.recv(0, 1, back.data(), DType::F32, 5), Error);  // a count that differs
  const int32_t token = 9;
  boxes.send(0, 1, &token, DType::I32, 1);
  try {
    boxes.recv(0, 1, back.data(), DType::F32, 1);
    ADD_FAILURE() << "an i32 message was taken as f32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
}

}  // namespace
