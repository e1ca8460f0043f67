// parallel/local_pipeline.h — a parallel job inside one process, one thread per rank, each with a
// backend of its own: how a model larger than the GPU runs with some layers on the CPU (llama.cpp's
// -ngl / --gpu-layers, Inferflow's hybrid partition extended to a CPU device), and how tests run
// any grid of pipeline stages x tensor-parallel ranks without processes. The ranks' parts are
// parallel/partition.h's (the first stage embeds, the last has the head), their links go through
// host memory (backend/host_mailboxes.h) and whatever the backends' factory gives them (a
// CpuRankGroup per stage for tensor parallelism), and rank 0's runner leads the others over the step
// channel exactly as rank 0 leads a multi-process job, so the Engine and Generator above it see one
// ModelRunner. Owns the rank threads; never schedules.
#pragma once

#include "backend/backend.h"
#include "comm/file_store.h"
#include "model/spec.h"
#include "model/weights.h"
#include "parallel/partition.h"
#include "runtime/model_runner.h"
#include "runtime/step_channel.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace splitflow {

// Makes stage `job_rank`'s backend on the calling thread (the stage's thread: a CUDA backend
// makes its device current there), its send / recv going through `mailboxes`.
using StageBackendFactory = std::function<std::unique_ptr<Backend>(std::shared_ptr<HostMailboxes> mailboxes, int job_rank)>;
// The same for any rank of a grid, knowing its part (stage, tp rank).
using RankBackendFactory = std::function<std::unique_ptr<Backend>(std::shared_ptr<HostMailboxes> mailboxes, int job_rank,
                                                                  const PartitionedModel& part)>;

struct LocalStage {
  StageBackendFactory backend;
  int num_layers = 0;
};

class LocalPipeline {
 public:
  // Stages of one rank each (tensor parallelism 1), in order. Builds every stage's runner (KV cache
  // `kv`, a fixed block count, and `limits` for all; no recorded decode steps: a host hop cannot
  // sit inside a CUDA graph). Throws, after stopping the threads already started, naming the stage
  // whose model or backend could not be built.
  LocalPipeline(const ModelSpec& spec, const ModelWeights& weights, std::vector<LocalStage> stages, KvCacheConfig kv,
                RunnerLimits limits);
  // Any grid (`layout`), each rank's backend from `backends`; otherwise as above.
  LocalPipeline(const ModelSpec& spec, const ModelWeights& weights, const ParallelLayout& layout,
                const RankBackendFactory& backends, KvCacheConfig kv, RunnerLimits limits);
  // finish(), logging what the other ranks failed with.
  ~LocalPipeline();

  // Releases the other ranks and joins their threads; returns what each failed with while
  // following ("" for none; rank 0's entry is always ""). Once; the leader is gone afterwards.
  std::vector<std::string> finish();
  LocalPipeline(const LocalPipeline&) = delete;
  LocalPipeline& operator=(const LocalPipeline&) = delete;

  // Stage 0's runner: the one the Engine, Generator or benchmark drives.
  ModelRunner& leader() { return *runner_; }
  Backend& leader_backend() { return *backend_; }
  // The links between the ranks' threads (what each pair has sent: HostMailboxes::bytes_sent).
  const HostMailboxes& mailboxes() const { return *mailboxes_; }
  // "layers 0-17 on stage 0, layers 18-21 on stage 1" for logs.
  const std::string& description() const { return description_; }

 private:
  void stop_followers();

  std::string dir_;
  std::shared_ptr<HostMailboxes> mailboxes_;
  std::unique_ptr<comm::FileStore> store_;
  std::unique_ptr<StepChannel> channel_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<std::thread> threads_;
  std::vector<std::string> errors_;
  std::string description_;
};

}  // namespace splitflow
