// parallel/launch.h — one process per GPU for a parallel command. Run as usual (`splitflow
// generate ... --tensor-parallel-size 2 --pipeline-parallel-size 2`), the process becomes a
// launcher: it starts one copy of its own command line per rank (comm/local_launcher.h) and
// returns their exit status. Started by that launcher, torchrun, mpirun or Slurm
// (comm/launch_env.h), the process is a rank: it joins the job's collectives (comm::CommGroup)
// and the step channel through which rank 0's ModelRunner leads the others
// (runtime/step_channel.h), and runs its part of the model (parallel/partition.h). Owns start-up
// only: partitions are partition.h's, the steps are the runner's.
#pragma once

#include "comm/launch_env.h"
#include "engine/model_loader.h"
#include "parallel/partition.h"
#include "runtime/model_runner.h"
#include "runtime/step_channel.h"

#include <memory>
#include <optional>

namespace splitflow {

namespace comm {
class CommGroup;
}

// Whether this process should launch the ranks itself: world_size > 1 and no launcher variables
// set. Then starts them, waits, and returns the exit code to leave with (0 when every rank
// succeeded, else the first failing rank's); otherwise returns nullopt (this process is a rank,
// or runs alone).
std::optional<int> launch_local_ranks(int world_size);

class ParallelRank {
 public:
  // This process's place in a job of layout.world_size() ranks. Throws splitflow::Error when the
  // launcher's world size differs, when the ranks span several nodes (the step channel is
  // node-local shared memory), or when this build has no CUDA backend. A grid (both sizes > 1)
  // also joins its stage's tensor-parallel group (a communicator and custom allreduce of its own,
  // bootstrapped in a sub-directory of the job's store). A world of 1: a rank alone, no collectives.
  static ParallelRank join(const ParallelLayout& layout);
  ~ParallelRank();
  ParallelRank(ParallelRank&&) noexcept;
  ParallelRank& operator=(ParallelRank&&) noexcept;

  int rank() const { return launch_.rank; }
  int size() const { return launch_.world_size; }
  bool leader() const { return launch_.rank == 0; }
  int device() const { return launch_.local_rank; }
  const ParallelLayout& layout() const { return layout_; }
  comm::CommGroup* group() const { return group_.get(); }  // the whole job; null for a rank alone
  // Where this rank's allreduce runs: its stage's ranks (null without tensor parallelism).
  comm::CommGroup* tensor_group() const;
  // Where its activations go to other stages (null without pipeline parallelism).
  comm::CommGroup* pipeline_group() const { return layout_.pipeline_parallel > 1 ? group_.get() : nullptr; }
  StepChannel* channel() const { return channel_.get(); }  // null for a rank alone

  // Replaces the model's spec and weights with this rank's part (parallel/partition.h) and keeps
  // its runner partition for runner_partition(). A rank alone: nothing changes.
  void partition(LoadedModel& model);
  const RunnerPartition& runner_partition() const { return runner_partition_; }

  // Rank 0, once its runner exists: announces the runner's KV cache and limits (the other ranks'
  // runners must match them: the leader's scheduler hands out block ids, warm-up's buckets come
  // from the limits) and makes it lead (ModelRunner::lead). Alone: nothing.
  void lead(ModelRunner& runner);
  // Ranks > 0: builds the runner rank 0 announced, on this rank's part, and follows the leader
  // until it is released. Returns when the leader's command is done.
  void follow(const ModelSpec& spec, ModelWeights weights, Backend& backend);

 private:
  ParallelRank() = default;
  ParallelLayout layout_;
  RunnerPartition runner_partition_;
  comm::LaunchInfo launch_;
  std::shared_ptr<comm::CommGroup> group_;  // shared: its type is complete only in CUDA builds
  std::shared_ptr<comm::CommGroup> stage_group_;  // a grid's tensor-parallel group (destroyed first)
  std::unique_ptr<StepChannel> channel_;
};

}  // namespace splitflow
