// parallel/local_pipeline.h — pipeline stages inside one process, one thread each, each with a
// backend of its own: how a model larger than the GPU runs with some layers on the CPU (llama.cpp's
// -ngl / --gpu-layers, Inferflow's hybrid partition extended to a CPU device). The stages are
// parallel/partition.h's (the first embeds, the last has the head), their links go through host
// memory (backend/host_mailboxes.h), and stage 0's runner leads the others over the step channel
// exactly as rank 0 leads a multi-process job, so the Engine and Generator above it see one
// ModelRunner. Owns the stage threads; never schedules.
#pragma once

#include "backend/backend.h"
#include "comm/file_store.h"
#include "model/spec.h"
#include "model/weights.h"
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

struct LocalStage {
  StageBackendFactory backend;
  int num_layers = 0;
};

class LocalPipeline {
 public:
  // Builds every stage's runner (KV cache `kv`, a fixed block count, and `limits` for all; no
  // recorded decode steps: a host hop cannot sit inside a CUDA graph). Throws, after stopping the
  // threads already started, naming the stage whose model or backend could not be built.
  LocalPipeline(const ModelSpec& spec, const ModelWeights& weights, std::vector<LocalStage> stages, KvCacheConfig kv,
                RunnerLimits limits);
  // Releases the other stages and joins their threads.
  ~LocalPipeline();
  LocalPipeline(const LocalPipeline&) = delete;
  LocalPipeline& operator=(const LocalPipeline&) = delete;

  // Stage 0's runner: the one the Engine, Generator or benchmark drives.
  ModelRunner& leader() { return *runner_; }
  Backend& leader_backend() { return *backend_; }
  // "layers 0-17 on cpu, 18-21 on cuda" for logs.
  const std::string& description() const { return description_; }

 private:
  void stop_followers();

  std::string dir_;
  std::unique_ptr<comm::FileStore> store_;
  std::unique_ptr<StepChannel> channel_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<std::thread> threads_;
  std::vector<std::string> errors_;
  std::string description_;
};

}  // namespace splitflow
