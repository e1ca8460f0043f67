#include "parallel/launch.h"

#include "comm/local_launcher.h"
#include "core/error.h"
#include "parallel/shm_step_channel.h"
#include "parallel/tensor_parallel.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "comm/comm_group.h"
#endif

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

namespace splitflow {

std::optional<int> launch_local_ranks(int tensor_parallel_size) {
  SF_CHECK(tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1, not {}", tensor_parallel_size);
  const comm::LaunchInfo launch = comm::parse_launch_env(comm::current_environment());
  if (tensor_parallel_size == 1 || launch.world_size > 1) return std::nullopt;
  comm::WorkerLaunch workers;
  workers.argv = comm::self_command_line();
  workers.world_size = tensor_parallel_size;
  spdlog::info("tensor parallelism: starting {} ranks, one process per GPU", tensor_parallel_size);
  const std::vector<comm::WorkerExit> exits = comm::run_local_workers(workers);
  for (const comm::WorkerExit& exit : exits)
    if (!exit.ok()) {
      spdlog::error("tensor parallelism: rank {} exited with status {}", exit.rank, exit.exit_code);
      return exit.exit_code;
    }
  return 0;
}

TensorParallelRank TensorParallelRank::join(int tensor_parallel_size) {
  TensorParallelRank rank;
  rank.launch_ = comm::parse_launch_env(comm::current_environment());
  if (tensor_parallel_size == 1 && rank.launch_.world_size == 1) return rank;
  SF_CHECK(rank.launch_.world_size == tensor_parallel_size,
           "--tensor-parallel-size {}: the launcher ({}) started {} ranks; they must be equal", tensor_parallel_size,
           rank.launch_.launcher, rank.launch_.world_size);
  SF_CHECK(rank.launch_.local_world_size == rank.launch_.world_size,
           "tensor parallelism: {} ranks over several nodes ({} on this one): a tensor-parallel group runs in one node",
           rank.launch_.world_size, rank.launch_.local_world_size);
#ifdef SPLITFLOW_HAS_CUDA
  // Followers wait in the store while rank 0 loads the model and builds its runner (minutes for
  // a large checkpoint); a rank that dies makes the launcher stop the others long before this.
  comm::CommOptions options;
  options.store_timeout = std::chrono::minutes(30);
  rank.group_ = comm::CommGroup::create(rank.launch_, options);
  rank.channel_ = std::make_unique<SharedMemoryStepChannel>(rank.group_->store(), "step_channel");
  spdlog::info("tensor parallelism: rank {} of {} on GPU {}", rank.rank(), rank.size(), rank.device());
  return rank;
#else
  fail("--tensor-parallel-size {}: this build has no CUDA backend (tensor parallelism runs one process per GPU)",
       tensor_parallel_size);
#endif
}

void TensorParallelRank::shard(LoadedModel& model) {
  if (size() == 1) return;
  ShardedModel sharded = shard_model(model.spec, model.weights, rank(), size());
  model.spec = std::move(sharded.spec);
  model.weights = std::move(sharded.weights);
  plan_ = std::move(sharded.plan);
  model.description += fmt::format(" [tensor-parallel rank {} of {}]", rank(), size());
}

namespace {

constexpr const char* kRunnerShapeKey = "runner_shape";

}  // namespace

void TensorParallelRank::lead(ModelRunner& runner) {
  if (size() == 1) return;
  SF_CHECK(leader(), "tensor parallelism: rank {} cannot lead", rank());
  const KvCacheConfig& kv = runner.kv_config();
  const RunnerLimits& limits = runner.limits();
  const std::string shape = fmt::format("{} {} {} {} {} {} {}", kv.num_blocks, kv.block_size, kv.num_host_blocks,
                                        static_cast<int>(runner.kv_cache_dtype()), limits.max_batch_tokens,
                                        limits.max_seqs, limits.record_decode ? 1 : 0);
#ifdef SPLITFLOW_HAS_CUDA
  group_->store().broadcast(kRunnerShapeKey, shape);
#endif
  runner.lead(channel_.get());
}

void TensorParallelRank::follow(const ModelSpec& spec, ModelWeights weights, Backend& backend) {
  SF_CHECK(!leader() && size() > 1, "tensor parallelism: rank {} of {} does not follow", rank(), size());
  std::string shape;
#ifdef SPLITFLOW_HAS_CUDA
  shape = group_->store().broadcast(kRunnerShapeKey, "");
#endif
  KvCacheConfig kv;
  RunnerLimits limits;
  int dtype = 0, record = 0;
  SF_CHECK(std::sscanf(shape.c_str(), "%d %d %d %d %d %d %d", &kv.num_blocks, &kv.block_size, &kv.num_host_blocks,
                       &dtype, &limits.max_batch_tokens, &limits.max_seqs, &record) == 7,
           "tensor parallelism: rank 0 announced a malformed runner shape '{}'", shape);
  kv.dtype = static_cast<DType>(dtype);
  limits.record_decode = record != 0;
  ModelRunner runner(spec, std::move(weights), backend, kv, limits, plan_);
  runner.follow(*channel_);
}

TensorParallelRank::~TensorParallelRank() = default;
TensorParallelRank::TensorParallelRank(TensorParallelRank&&) noexcept = default;
TensorParallelRank& TensorParallelRank::operator=(TensorParallelRank&&) noexcept = default;

}  // namespace splitflow
