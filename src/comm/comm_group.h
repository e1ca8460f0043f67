// comm/comm_group.h — one rank's handle on a job's collectives: selects the rank's GPU
// (local_rank), bootstraps NCCL and the custom allreduce through the job's file store, detects the
// GPU links, and routes every allreduce to the algorithm comm/allreduce_selection.h picks. The
// other collectives go to NCCL. This is what tensor and pipeline parallelism hold.
#pragma once

#include "comm/allreduce_selection.h"
#include "comm/communicator.h"
#include "comm/custom_allreduce.h"
#include "comm/file_store.h"
#include "comm/launch_env.h"
#include "comm/nccl_communicator.h"
#include "comm/topology.h"

#include <chrono>
#include <memory>
#include <optional>

namespace splitflow::comm {

struct CommOptions {
  bool enable_custom = true;
  size_t custom_max_bytes = size_t{8} << 20;  // largest message the custom path takes
  int custom_max_blocks = CustomAllreduce::kDefaultMaxBlocks;
  // Pin one algorithm (where supported); unset: SPLITFLOW_ALLREDUCE ("auto" or an algorithm name)
  // when set, else the crossover table.
  std::optional<AllreduceAlgorithm> forced;
  std::chrono::milliseconds store_timeout = std::chrono::seconds(120);
};

class CommGroup final : public Communicator {
 public:
  // Collective: every rank of the job calls it. Makes device local_rank current.
  static std::unique_ptr<CommGroup> create(const LaunchInfo& launch, const CommOptions& options = {});
  ~CommGroup() override;

  int rank() const override { return launch_.rank; }
  int world_size() const override { return launch_.world_size; }
  int device() const { return device_; }
  const Topology& topology() const { return topology_; }
  CustomCapability custom_capability() const;
  AllreduceAlgorithm choose_allreduce(size_t bytes) const;

  void allreduce(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) override;
  // A given algorithm; throws when it cannot run this message.
  void allreduce(AllreduceAlgorithm algorithm, const void* in, void* out, size_t count, DType dtype,
                 cudaStream_t stream);
  // out = allreduce(in) + residual (residual identical on every rank): one kernel on the custom path.
  void allreduce_add(const void* in, const void* residual, void* out, size_t count, DType dtype, cudaStream_t stream);
  // residual_out = allreduce(in) + residual_in; norm_out = RMSNorm(residual_out) * weight. One
  // kernel where select_fused_rmsnorm picks a fused kernel that takes the rows (CustomAllreduce);
  // another custom algorithm: it adds the residual, then the norm; NCCL: allreduce, add and norm.
  // Shapes as CustomAllreduce::allreduce_add_rmsnorm.
  void allreduce_add_rmsnorm(const void* in, const void* residual_in, void* residual_out, void* norm_out,
                             const float* weight, float eps, size_t rows, size_t hidden, DType dtype,
                             cudaStream_t stream);
  void allgather(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) override;
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) override;
  void broadcast(const void* in, void* out, size_t count, DType dtype, int root, cudaStream_t stream) override;
  void send(const void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) override;
  void recv(void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) override;

  // Collective, after capturing graphs with allreduces and before replaying them.
  void register_graph_buffers();

  NcclCommunicator& nccl() { return *nccl_; }
  CustomAllreduce* custom() { return custom_.get(); }  // null when the custom path is off
  FileStore& store() { return *store_; }

 private:
  CommGroup() = default;

  LaunchInfo launch_;
  int device_ = 0;
  std::optional<AllreduceAlgorithm> forced_;
  std::unique_ptr<FileStore> store_;
  Topology topology_;
  std::unique_ptr<NcclCommunicator> nccl_;
  std::unique_ptr<CustomAllreduce> custom_;
};

}  // namespace splitflow::comm
