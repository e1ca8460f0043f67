// tests/parallel/parallel_harness.h — a parallel job inside one test process: each rank a thread
// with its own CPU backend and part of the model (parallel/partition.h), the stages' tensor-parallel
// ranks meeting in a CpuRankGroup each, stages passing the residual stream through the job's
// HostMailboxes, rank 0 leading the others through a shared-memory step channel, as the GPU ranks
// do (one process each).
#pragma once

#include "backend/backend.h"
#include "backend/cpu/rank_group.h"
#include "backend/host_mailboxes.h"
#include "comm/file_store.h"
#include "parallel/partition.h"
#include "parallel/shm_step_channel.h"
#include "runtime/model_runner.h"
#include "runtime/step_command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace splitflow::test {

// Runs `lead` on rank 0's runner while the job's other ranks follow it, each a thread with its
// own CPU backend and part of `fixture` (parallel/partition.h), meeting in a CpuRankGroup per
// pipeline stage (allreduce), the job's HostMailboxes (stage to stage) and a shared-memory step
// channel.
inline void run_parallel(const ModelSpec& spec, const ModelWeights& weights, const ParallelLayout& layout,
                         const KvCacheConfig& kv, const RunnerLimits& limits,
                         const std::function<void(ModelRunner&)>& lead) {
  const int size = layout.world_size();
  const std::string dir = (std::filesystem::temp_directory_path() /
                           fmt::format("splitflow-parallel-{}-{}", getpid(), std::random_device{}())).string();
  std::filesystem::create_directories(dir);
  std::vector<std::shared_ptr<CpuRankGroup>> groups;
  for (int s = 0; s < layout.pipeline_parallel; ++s) groups.push_back(std::make_shared<CpuRankGroup>(layout.tensor_parallel));
  auto mailboxes = std::make_shared<HostMailboxes>();
  std::vector<std::string> errors(size);
  auto rank_main = [&](int rank) {
    try {
      comm::FileStore store(dir, rank, size, std::chrono::seconds(30));
      SharedMemoryStepChannel channel(store, "steps");
      bool led = false;
      try {
        const PartitionedModel part = partition_model(spec, weights, layout, rank);
        auto backend = make_cpu_backend(1, CpuJobPlace{groups[part.stage], part.tp_rank, mailboxes, rank});
        ModelRunner runner(part.spec, part.weights, *backend, kv, limits, part.runner);
        if (rank == 0) {
          runner.lead(&channel);
          led = true;
          lead(runner);
          runner.release_followers();
        } else {
          runner.follow(channel);
        }
      } catch (const std::exception& e) {
        errors[rank] = e.what();
        // A leader that fails before it leads still releases the followers (a leading runner's
        // destructor already did).
        if (rank == 0 && !led)
          channel.publish(encode_step_call(StepCall{StepCallKind::Stop}));
      }
    } catch (const std::exception& e) {
      errors[rank] += e.what();
    }
  };
  std::vector<std::thread> followers;
  for (int r = 1; r < size; ++r) followers.emplace_back(rank_main, r);
  rank_main(0);
  for (std::thread& t : followers) t.join();
  std::filesystem::remove_all(dir);
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace splitflow::test
