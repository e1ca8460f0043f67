// comm/nccl_communicator.h — Communicator over NCCL. The unique id travels through the bootstrap
// store (rank 0 creates it, the others read it); nccl.h stays inside the .cu.
#pragma once

#include "comm/communicator.h"
#include "comm/file_store.h"

#include <string>

struct ncclComm;

namespace splitflow::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `store`; the rank's device must be current. `name` keys the unique id in the
  // store (one communicator per name and job).
  NcclCommunicator(FileStore& store, const std::string& name);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  void allreduce(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) override;
  void allgather(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) override;
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) override;
  void broadcast(const void* in, void* out, size_t count, DType dtype, int root, cudaStream_t stream) override;
  void send(const void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) override;
  void recv(void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) override;

  // The NCCL library's version, "2.28.9".
  static std::string library_version();

 private:
  ncclComm* comm_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace splitflow::comm
