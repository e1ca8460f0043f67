#include "parallel/launch.h"

#include "comm/local_launcher.h"
#include "core/error.h"
#include "parallel/shm_step_channel.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "comm/comm_group.h"
#endif

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>

namespace splitflow {

std::optional<int> launch_local_ranks(int world_size) {
  SF_CHECK(world_size >= 1, "parallel job: {} ranks", world_size);
  const comm::LaunchInfo launch = comm::parse_launch_env(comm::current_environment());
  if (world_size == 1 || launch.world_size > 1) return std::nullopt;
  comm::WorkerLaunch workers;
  workers.argv = comm::self_command_line();
  workers.world_size = world_size;
  spdlog::info("parallel job: starting {} ranks, one process per GPU", world_size);
  const std::vector<comm::WorkerExit> exits = comm::run_local_workers(workers);
  for (const comm::WorkerExit& exit : exits)
    if (!exit.ok()) {
      spdlog::error("parallel job: rank {} exited with status {}", exit.rank, exit.exit_code);
      return exit.exit_code;
    }
  return 0;
}

ParallelRank ParallelRank::join(const ParallelLayout& layout) {
  ParallelRank rank;
  rank.layout_ = layout;
  rank.launch_ = comm::parse_launch_env(comm::current_environment());
  const int world = layout.world_size();
  if (world == 1 && rank.launch_.world_size == 1) return rank;
  SF_CHECK(rank.launch_.world_size == world,
           "--tensor-parallel-size {} x --pipeline-parallel-size {} = {} ranks, but the launcher ({}) started {}",
           layout.tensor_parallel, layout.pipeline_parallel, world, rank.launch_.launcher, rank.launch_.world_size);
  SF_CHECK(rank.launch_.local_world_size == rank.launch_.world_size,
           "parallel job: {} ranks over several nodes ({} on this one): the step channel is one node's shared memory",
           rank.launch_.world_size, rank.launch_.local_world_size);
#ifdef SPLITFLOW_HAS_CUDA
  // The other ranks wait in the store while rank 0 loads the model and builds its runner
  // (minutes for a large checkpoint); a rank that dies makes the launcher stop the others first.
  comm::CommOptions options;
  options.store_timeout = std::chrono::minutes(30);
  const bool grid = layout.tensor_parallel > 1 && layout.pipeline_parallel > 1;
  comm::CommOptions world_options = options;
  world_options.enable_custom = layout.pipeline_parallel == 1;  // the job's allreduce group only then
  rank.group_ = comm::CommGroup::create(rank.launch_, world_options);
  if (grid) {
    // The stage's ranks as a job of their own: same GPU, rank = tensor-parallel rank, its store a
    // sub-directory of the job's (every stage bootstraps at once, each in its own directory).
    const int stage = layout.stage_of(rank.rank());
    comm::LaunchInfo stage_launch = rank.launch_;
    stage_launch.rank = layout.tp_rank_of(rank.rank());
    stage_launch.world_size = layout.tensor_parallel;
    stage_launch.local_world_size = layout.tensor_parallel;
    stage_launch.store_dir = rank.launch_.store_dir + "/stage-" + std::to_string(stage);
    rank.stage_group_ = comm::CommGroup::create(stage_launch, options);
  }
  rank.channel_ = std::make_unique<SharedMemoryStepChannel>(rank.group_->store(), "step_channel");
  spdlog::info("parallel job: rank {} of {} (stage {}, tensor-parallel rank {}) on GPU {}", rank.rank(), rank.size(),
               layout.stage_of(rank.rank()), layout.tp_rank_of(rank.rank()), rank.device());
  return rank;
#else
  fail("a parallel job of {} ranks: this build has no CUDA backend (one process per GPU)", world);
#endif
}

void ParallelRank::partition(LoadedModel& model) {
  if (layout_.world_size() == 1) return;
  PartitionedModel part = partition_model(model.spec, model.weights, layout_, rank());
  model.spec = std::move(part.spec);
  model.weights = std::move(part.weights);
  runner_partition_ = std::move(part.runner);
  model.description += fmt::format(" [rank {} of {}: layers {}-{}, heads {}-{}]", rank(), size(), part.first_layer,
                                   part.first_layer + part.num_layers - 1, part.shard.head_begin,
                                   part.shard.head_begin + part.shard.num_heads - 1);
}

namespace {

constexpr const char* kRunnerShapeKey = "runner_shape";

}  // namespace

void ParallelRank::lead(ModelRunner& runner) {
  if (size() == 1) return;
  SF_CHECK(leader(), "parallel job: rank {} cannot lead", rank());
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

void ParallelRank::follow(const ModelSpec& spec, ModelWeights weights, Backend& backend) {
  SF_CHECK(!leader() && size() > 1, "parallel job: rank {} of {} does not follow", rank(), size());
  std::string shape;
#ifdef SPLITFLOW_HAS_CUDA
  shape = group_->store().broadcast(kRunnerShapeKey, "");
#endif
  KvCacheConfig kv;
  RunnerLimits limits;
  int dtype = 0, record = 0;
  SF_CHECK(std::sscanf(shape.c_str(), "%d %d %d %d %d %d %d", &kv.num_blocks, &kv.block_size, &kv.num_host_blocks,
                       &dtype, &limits.max_batch_tokens, &limits.max_seqs, &record) == 7,
           "parallel job: rank 0 announced a malformed runner shape '{}'", shape);
  kv.dtype = static_cast<DType>(dtype);
  limits.record_decode = record != 0;
  ModelRunner runner(spec, std::move(weights), backend, kv, limits, runner_partition_);
  runner.follow(*channel_);
}

comm::CommGroup* ParallelRank::tensor_group() const {
  if (layout_.tensor_parallel == 1) return nullptr;
  return stage_group_ != nullptr ? stage_group_.get() : group_.get();
}

ParallelRank::~ParallelRank() = default;
ParallelRank::ParallelRank(ParallelRank&&) noexcept = default;
ParallelRank& ParallelRank::operator=(ParallelRank&&) noexcept = default;

}  // namespace splitflow
