// tests/parallel/parallel_harness.h — a parallel job inside one test process (parallel/local_pipeline.h):
// each rank a thread with its own one-thread CPU backend and part of the model, the stages'
// tensor-parallel ranks meeting in a CpuRankGroup each, stages passing the residual stream through
// the job's HostMailboxes, rank 0 leading the others through a shared-memory step channel, as the
// GPU ranks do (one process each).
#pragma once

#include "backend/backend.h"
#include "backend/cpu/rank_group.h"
#include "parallel/local_pipeline.h"
#include "runtime/model_runner.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace splitflow::test {

// Runs `lead` on rank 0's runner while the job's other ranks follow it, then `inspect` on the job
// (if given); every rank must end without an error.
inline void run_parallel(const ModelSpec& spec, const ModelWeights& weights, const ParallelLayout& layout,
                         const KvCacheConfig& kv, const RunnerLimits& limits,
                         const std::function<void(ModelRunner&)>& lead,
                         const std::function<void(const LocalPipeline&)>& inspect = {}) {
  std::vector<std::shared_ptr<CpuRankGroup>> groups;
  for (int s = 0; s < layout.pipeline_parallel; ++s) groups.push_back(std::make_shared<CpuRankGroup>(layout.tensor_parallel));
  LocalPipeline job(spec, weights, layout,
                    [&groups](std::shared_ptr<HostMailboxes> mailboxes, int rank, const PartitionedModel& part) {
                      return make_cpu_backend(1, CpuJobPlace{groups[part.stage], part.tp_rank, std::move(mailboxes), rank});
                    },
                    kv, limits);
  lead(job.leader());
  if (inspect) inspect(job);
  const std::vector<std::string> errors = job.finish();
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace splitflow::test
