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
#include <utility>

namespace splitflow {

namespace {

ParallelLayout stages_layout(const std::vector<LocalStage>& stages) {
  ParallelLayout layout{1, static_cast<int>(stages.size()), {}};
  for (const LocalStage& stage : stages) layout.stage_layers.push_back(stage.num_layers);
  return layout;
}

}  // namespace

LocalPipeline::LocalPipeline(const ModelSpec& spec, const ModelWeights& weights, std::vector<LocalStage> stages,
                             KvCacheConfig kv, RunnerLimits limits)
    : LocalPipeline(spec, weights, stages_layout(stages),
                    [&stages](std::shared_ptr<HostMailboxes> mailboxes, int rank, const PartitionedModel& part) {
                      return stages[part.stage].backend(std::move(mailboxes), rank);
                    },
                    kv, limits) {}

LocalPipeline::LocalPipeline(const ModelSpec& spec, const ModelWeights& weights, const ParallelLayout& layout,
                             const RankBackendFactory& backends, KvCacheConfig kv, RunnerLimits limits) {
  const int count = layout.world_size();
  SF_CHECK(layout.tensor_parallel >= 1 && layout.pipeline_parallel >= 1, "local job: {} x {} ranks",
           layout.pipeline_parallel, layout.tensor_parallel);
  SF_CHECK(!kv.memory_budget && kv.num_blocks > 0, "local pipeline: the KV cache needs a block count");
  const std::vector<std::pair<int, int>> ranges = stage_layer_ranges(spec.num_layers, layout);  // checked first
  limits.record_decode = false;
  limits.warm_up_steps = false;  // the stages' backends may differ (runtime/model_runner.h)

  dir_ = (std::filesystem::temp_directory_path() /
          fmt::format("splitflow-local-pipeline-{}-{:08x}", getpid(), std::random_device{}())).string();
  std::filesystem::create_directories(dir_);
  mailboxes_ = std::make_shared<HostMailboxes>();
  errors_.resize(count);
  std::vector<std::promise<void>> built(count);
  std::vector<std::future<void>> ready;
  for (int r = 1; r < count; ++r) ready.push_back(built[r].get_future());
  for (int r = 1; r < count; ++r) {
    threads_.emplace_back([&, r, promise = std::move(built[r])]() mutable {
      std::unique_ptr<SharedMemoryStepChannel> channel_holder;
      try {
        comm::FileStore store(dir_, r, count, std::chrono::minutes(30));
        channel_holder = std::make_unique<SharedMemoryStepChannel>(store, "steps");
        SharedMemoryStepChannel& channel = *channel_holder;
        std::unique_ptr<Backend> backend;
        std::unique_ptr<ModelRunner> runner;
        try {
          const PartitionedModel part = partition_model(spec, weights, layout, r);
          backend = backends(mailboxes_, r, part);
          runner = std::make_unique<ModelRunner>(part.spec, part.weights, *backend, kv, limits, part.runner);
        } catch (...) {
          promise.set_exception(std::current_exception());
          channel.receive();  // the leader's Stop
          return;
        }
        promise.set_value();
        runner->follow(channel);
      } catch (const std::exception& e) {
        errors_[r] = e.what();
        // A stage that waits on this one (the next stage, or the leader waiting for the output)
        // gets the error instead of waiting forever.
        spdlog::error("local pipeline rank {} stopped: {}", r, e.what());
        mailboxes_->fail(r, e.what());
        // Nor does the leader wait for it to take its next step call, the Stop at shutdown included.
        if (channel_holder != nullptr) channel_holder->leave();
      }
    });
  }
  store_ = std::make_unique<comm::FileStore>(dir_, 0, count, std::chrono::minutes(30));
  channel_ = std::make_unique<SharedMemoryStepChannel>(*store_, "steps");
  try {
    const PartitionedModel part = partition_model(spec, weights, layout, 0);
    backend_ = backends(mailboxes_, 0, part);
    runner_ = std::make_unique<ModelRunner>(part.spec, part.weights, *backend_, kv, limits, part.runner);
    for (int r = 1; r < count; ++r) {
      try {
        ready[r - 1].get();
      } catch (const std::exception& e) {
        fail("{} {}: {}", layout.tensor_parallel > 1 ? "rank" : "pipeline stage", r, e.what());
      }
    }
  } catch (...) {
    runner_.reset();
    stop_followers();
    throw;
  }
  runner_->lead(channel_.get());
  for (int s = 0; s < layout.pipeline_parallel; ++s) {
    description_ += fmt::format("{}layers {}-{} on stage {}", s ? ", " : "", ranges[s].first,
                                ranges[s].first + ranges[s].second - 1, s);
  }
  if (layout.tensor_parallel > 1) description_ += fmt::format(" (x {} tensor-parallel ranks)", layout.tensor_parallel);
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

std::vector<std::string> LocalPipeline::finish() {
  if (runner_ != nullptr) runner_->release_followers();
  runner_.reset();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  std::filesystem::remove_all(dir_);
  return std::exchange(errors_, {});
}

LocalPipeline::~LocalPipeline() {
  const std::vector<std::string> errors = finish();
  for (size_t r = 1; r < errors.size(); ++r)
    if (!errors[r].empty()) spdlog::error("local pipeline rank {}: {}", r, errors[r]);
}

}  // namespace splitflow
