// parallel/launch.h — one process per GPU for a tensor-parallel command. Run as usual
// (`splitflow generate ... --tensor-parallel-size 2`), the process becomes a launcher: it starts
// one copy of its own command line per rank (comm/local_launcher.h) and returns their exit status.
// Started by that launcher, torchrun, mpirun or Slurm (comm/launch_env.h), the process is a rank:
// it joins the job's collectives (comm::CommGroup) and the step channel through which rank 0's
// ModelRunner leads the others (runtime/step_channel.h). Owns start-up only: sharding is
// parallel/tensor_parallel.h's, the steps are the runner's.
#pragma once

#include "comm/launch_env.h"
#include "engine/model_loader.h"
#include "runtime/layer_plan.h"
#include "runtime/model_runner.h"
#include "runtime/step_channel.h"

#include <memory>
#include <optional>

namespace splitflow {

namespace comm {
class CommGroup;
}

// Whether this process should launch the ranks itself: tensor_parallel_size > 1 and no launcher
// variables set. Then starts them, waits, and returns the exit code to leave with (0 when every
// rank succeeded, else the first failing rank's); otherwise returns nullopt (this process is a
// rank, or runs alone).
std::optional<int> launch_local_ranks(int tensor_parallel_size);

class TensorParallelRank {
 public:
  // This process's place in a job of tensor_parallel_size ranks. Throws splitflow::Error when the
  // launcher's world size differs from it, when the ranks span several nodes (the step channel is
  // node-local shared memory), or when this build has no CUDA backend. Size 1: a rank of one, no
  // collectives.
  static TensorParallelRank join(int tensor_parallel_size);
  ~TensorParallelRank();
  TensorParallelRank(TensorParallelRank&&) noexcept;
  TensorParallelRank& operator=(TensorParallelRank&&) noexcept;

  int rank() const { return launch_.rank; }
  int size() const { return launch_.world_size; }
  bool leader() const { return launch_.rank == 0; }
  int device() const { return launch_.local_rank; }
  comm::CommGroup* group() const { return group_.get(); }    // null for a rank of one
  StepChannel* channel() const { return channel_.get(); }    // null for a rank of one
  // Replaces the model's spec and weights with this rank's shard (parallel/tensor_parallel.h)
  // and keeps its layer plan for plan(). Size 1: nothing changes.
  void shard(LoadedModel& model);
  // The plan a runner of this rank runs (nullopt: the spec's own, size 1).
  const std::optional<LayerPlan>& plan() const { return plan_; }

  // Rank 0, once its runner exists: announces the runner's KV cache and limits (the followers'
  // runners must match them: the leader's scheduler hands out block ids, warm-up's buckets come
  // from the limits) and makes it lead (ModelRunner::lead). Size 1: nothing.
  void lead(ModelRunner& runner);
  // Ranks > 0: builds the runner rank 0 announced, on this rank's shard, and follows the leader
  // until it is released. Returns when the leader's command is done.
  void follow(const ModelSpec& spec, ModelWeights weights, Backend& backend);

 private:
  TensorParallelRank() = default;
  std::optional<LayerPlan> plan_;
  comm::LaunchInfo launch_;
  std::shared_ptr<comm::CommGroup> group_;  // shared: its type is complete only in CUDA builds
  std::unique_ptr<StepChannel> channel_;
};

}  // namespace splitflow
