#include "parallel/local_pipeline.h"

#include "backend/host_mailboxes.h"
#include "core/error.h"
#include "parallel/partition.h"
#include "parallel/shm_step_channel.h"
#include "runtime/step_command.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <random>

namespace splitflow {

LocalPipeline::LocalPipeline(const ModelSpec& spec, const ModelWeights& weights, std::vector<LocalStage> stages,
                             KvCacheConfig kv, RunnerLimits limits) {
  const int count = static_cast<int>(stages.size());
  SF_CHECK(count >= 1, "local pipeline: no stages");
  SF_CHECK(!kv.memory_budget && kv.num_blocks > 0, "local pipeline: the KV cache needs a block count");
  ParallelLayout layout{1, count, {}};
  for (const LocalStage& stage : stages) layout.stage_layers.push_back(stage.num_layers);
  stage_layer_ranges(spec.num_layers, layout);  // checks the counts before any thread starts
  limits.record_decode = false;

  dir_ = (std::filesystem::temp_directory_path() /
          fmt::format("splitflow-local-pipeline-{}-{:08x}", getpid(), std::random_device{}())).string();
  std::filesystem::create_directories(dir_);
  auto mailboxes = std::make_shared<HostMailboxes>();
  errors_.resize(count);
  std::vector<std::promise<void>> built(count);
  std::vector<std::future<void>> ready;
  for (int s = 1; s < count; ++s) ready.push_back(built[s].get_future());
  for (int s = 1; s < count; ++s) {
    threads_.emplace_back([&, s, promise = std::move(built[s])]() mutable {
      try {
        comm::FileStore store(dir_, s, count, std::chrono::minutes(30));
        SharedMemoryStepChannel channel(store, "steps");
        std::unique_ptr<Backend> backend;
        std::unique_ptr<ModelRunner> runner;
        try {
          const PartitionedModel part = partition_model(spec, weights, layout, s);
          backend = stages[s].backend(mailboxes, s);
          runner = std::make_unique<ModelRunner>(part.spec, part.weights, *backend, kv, limits, part.runner);
        } catch (...) {
          promise.set_exception(std::current_exception());
          channel.receive();  // the leader's Stop
          return;
        }
        promise.set_value();
        runner->follow(channel);
      } catch (const std::exception& e) {
        errors_[s] = e.what();
      }
    });
  }
  store_ = std::make_unique<comm::FileStore>(dir_, 0, count, std::chrono::minutes(30));
  channel_ = std::make_unique<SharedMemoryStepChannel>(*store_, "steps");
  try {
    const PartitionedModel part = partition_model(spec, weights, layout, 0);
    backend_ = stages[0].backend(mailboxes, 0);
    runner_ = std::make_unique<ModelRunner>(part.spec, part.weights, *backend_, kv, limits, part.runner);
    for (int s = 1; s < count; ++s) {
      try {
        ready[s - 1].get();
      } catch (const std::exception& e) {
        fail("pipeline stage {}: {}", s, e.what());
      }
    }
  } catch (...) {
    runner_.reset();
    stop_followers();
    throw;
  }
  runner_->lead(channel_.get());
  const std::vector<std::pair<int, int>> ranges = stage_layer_ranges(spec.num_layers, layout);
  for (int s = 0; s < count; ++s) {
    description_ += fmt::format("{}layers {}-{} on stage {}", s ? ", " : "", ranges[s].first,
                                ranges[s].first + ranges[s].second - 1, s);
  }
}

void LocalPipeline::stop_followers() {
  // Every follower either follows (and takes the Stop as its next call) or failed to build and
  // waits for it; publish() returns once the previous message was taken.
  if (channel_ != nullptr) {
    try {
      channel_->publish(encode_step_call(StepCall{StepCallKind::Stop}));
    } catch (const std::exception& e) {
      spdlog::warn("local pipeline: could not stop the stages: {}", e.what());
    }
  }
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  std::filesystem::remove_all(dir_);
}

LocalPipeline::~LocalPipeline() {
  if (runner_ != nullptr) runner_->release_followers();
  runner_.reset();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  for (size_t s = 1; s < errors_.size(); ++s)
    if (!errors_[s].empty()) spdlog::error("pipeline stage {}: {}", s, errors_[s]);
  std::filesystem::remove_all(dir_);
}

}  // namespace splitflow
