#include "comm/comm_group.h"

#include "comm/cuda_check.h"
#include "comm/elementwise.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace splitflow::comm {

std::unique_ptr<CommGroup> CommGroup::create(const LaunchInfo& launch, const CommOptions& options) {
  std::unique_ptr<CommGroup> group(new CommGroup());
  group->launch_ = launch;
  int devices = 0;
  SF_CUDA_CHECK(cudaGetDeviceCount(&devices));
  SF_CHECK(launch.local_rank < devices,
           "comm: local rank {} needs GPU {} but this process sees {} GPU(s) (one process per GPU, all GPUs visible)",
           launch.local_rank, launch.local_rank, devices);
  group->device_ = launch.local_rank;
  SF_CUDA_CHECK(cudaSetDevice(group->device_));

  group->forced_ = options.forced;
  if (!group->forced_) {
    const char* env = std::getenv("SPLITFLOW_ALLREDUCE");
    if (env && std::string_view(env) != "auto" && *env) group->forced_ = parse_algorithm(env);
  }

  SF_CHECK(launch.world_size == 1 || !launch.store_dir.empty(), "comm: {} ranks but no rendezvous directory",
           launch.world_size);
  // A world of one still runs the bootstrap, in a directory of its own.
  const std::string store_dir =
      launch.store_dir.empty() ? "/tmp/splitflow-comm-single-" + std::to_string(::getpid()) : launch.store_dir;
  group->store_ = std::make_unique<FileStore>(store_dir, launch.rank, launch.world_size, options.store_timeout);
  group->topology_ = detect_topology(*group->store_, group->device_);
  group->nccl_ = std::make_unique<NcclCommunicator>(*group->store_, "world");

  const int n = launch.world_size;
  const bool custom_world = n == 2 || n == 4 || n == 6 || n == 8;
  if (options.enable_custom && custom_world && group->topology_.link != LinkType::None) {
    group->custom_ = std::make_unique<CustomAllreduce>(*group->store_, group->device_, options.custom_max_bytes,
                                                       options.custom_max_blocks);
    // LL128 needs the 128-byte store atomicity NVLink gives and PCIe does not.
    if (group->topology_.link != LinkType::NVLink) group->custom_->set_ll128_max_bytes(0);
  }
  return group;
}

CommGroup::~CommGroup() {
  custom_.reset();
  nccl_.reset();
  if (store_) {
    try {
      store_->finish();
    } catch (const Error&) {
      // A peer that died never reports; its rendezvous directory is left behind.
    }
  }
}

CustomCapability CommGroup::custom_capability() const {
  CustomCapability capability;
  capability.available = custom_ != nullptr;
  capability.link = topology_.link;
  capability.world_size = launch_.world_size;
  capability.max_bytes = custom_ ? custom_->max_bytes() : 0;
  return capability;
}

AllreduceAlgorithm CommGroup::choose_allreduce(size_t bytes) const {
  return select_allreduce(bytes, custom_capability(), forced_);
}

void CommGroup::allreduce(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  allreduce(choose_allreduce(count * dtype_size(dtype)), in, out, count, dtype, stream);
}

void CommGroup::allreduce(AllreduceAlgorithm algorithm, const void* in, void* out, size_t count, DType dtype,
                          cudaStream_t stream) {
  if (count == 0) return;
  if (algorithm == AllreduceAlgorithm::Nccl) {
    nccl_->allreduce(in, out, count, dtype, stream);
    return;
  }
  SF_CHECK(custom_supports(algorithm, custom_capability(), count * dtype_size(dtype)),
           "comm: {} cannot run {} bytes on {} GPUs linked by {}", algorithm_name(algorithm),
           count * dtype_size(dtype), launch_.world_size, link_name(topology_.link));
  custom_->allreduce(algorithm, in, out, count, dtype, stream);
}

void CommGroup::allreduce_add(const void* in, const void* residual, void* out, size_t count, DType dtype,
                              cudaStream_t stream) {
  if (count == 0) return;
  const AllreduceAlgorithm algorithm = choose_allreduce(count * dtype_size(dtype));
  if (algorithm != AllreduceAlgorithm::Nccl) {
    custom_->allreduce(algorithm, in, out, count, dtype, stream, residual);
    return;
  }
  // NCCL writes `out` before the add reads `residual`: a residual aliasing `out` would be lost.
  SF_CHECK(residual != out, "comm allreduce_add: residual must not alias out on the NCCL path");
  nccl_->allreduce(in, out, count, dtype, stream);
  add(out, residual, out, count, dtype, stream);
}

void CommGroup::allreduce_add_rmsnorm(const void* in, const void* residual_in, void* residual_out, void* norm_out,
                                      const float* weight, float eps, size_t rows, size_t hidden, DType dtype,
                                      cudaStream_t stream) {
  const size_t count = rows * hidden;
  if (count == 0) return;
  const size_t bytes = count * dtype_size(dtype);
  const AllreduceAlgorithm algorithm = choose_allreduce(bytes);
  if (algorithm != AllreduceAlgorithm::Nccl && CustomAllreduce::fused_rmsnorm_supported(hidden, dtype)) {
    // The fused kernel the table picks, the two-shot one only where it takes the rows (LL128 on, a
    // row per GPU).
    const AllreduceAlgorithm fused = select_fused_rmsnorm(bytes, custom_capability(), forced_);
    if (fused == AllreduceAlgorithm::OneShot ||
        (fused == AllreduceAlgorithm::TwoShot && custom_->two_shot_rmsnorm_supported(rows, hidden, dtype))) {
      custom_->allreduce_add_rmsnorm(fused, in, residual_in, residual_out, norm_out, weight, eps, rows, hidden, dtype,
                                     stream);
      return;
    }
  }
  if (algorithm != AllreduceAlgorithm::Nccl) {
    custom_->allreduce(algorithm, in, residual_out, count, dtype, stream, residual_in);
    rms_norm(residual_out, weight, norm_out, rows, hidden, eps, dtype, stream);
    return;
  }
  // norm_out holds the sum until the norm overwrites it.
  allreduce(algorithm, in, norm_out, count, dtype, stream);
  add(norm_out, residual_in, residual_out, count, dtype, stream);
  rms_norm(residual_out, weight, norm_out, rows, hidden, eps, dtype, stream);
}

void CommGroup::allgather(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  nccl_->allgather(in, out, count, dtype, stream);
}

void CommGroup::reduce_scatter(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  nccl_->reduce_scatter(in, out, count, dtype, stream);
}

void CommGroup::broadcast(const void* in, void* out, size_t count, DType dtype, int root, cudaStream_t stream) {
  nccl_->broadcast(in, out, count, dtype, root, stream);
}

void CommGroup::send(const void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) {
  nccl_->send(buffer, count, dtype, peer, stream);
}

void CommGroup::recv(void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) {
  nccl_->recv(buffer, count, dtype, peer, stream);
}

void CommGroup::register_graph_buffers() {
  if (custom_) custom_->register_graph_buffers();
}

}  // namespace splitflow::comm
