#include "comm/nccl_communicator.h"

#include "comm/cuda_check.h"

#include <fmt/format.h>
#include <nccl.h>

#include <cstring>

namespace splitflow::comm {

namespace {

#define SF_NCCL_CHECK(call)                                                                      \
  do {                                                                                           \
    const ncclResult_t sf_nccl_status = (call);                                                  \
    if (sf_nccl_status != ncclSuccess)                                                           \
      ::splitflow::fail("comm: {} failed: {}", #call, ncclGetErrorString(sf_nccl_status));       \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::F64: return ncclFloat64;
    case DType::I8: return ncclInt8;
    case DType::U8: return ncclUint8;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    default: fail("NCCL: dtype {} has no NCCL type", dtype_name(dtype));
  }
}

void check_peer(int peer, int world_size) {
  SF_CHECK(peer >= 0 && peer < world_size, "NCCL: peer {} is not a rank of this world of {}", peer, world_size);
}

}  // namespace

NcclCommunicator::NcclCommunicator(FileStore& store, const std::string& name)
    : rank_(store.rank()), world_size_(store.world_size()) {
  ncclUniqueId id{};
  std::string bytes;
  if (rank_ == 0) {
    SF_NCCL_CHECK(ncclGetUniqueId(&id));
    bytes.assign(id.internal, sizeof id.internal);
  }
  bytes = store.broadcast(name + "_nccl_id", bytes);
  SF_CHECK(bytes.size() == sizeof id.internal, "NCCL: malformed unique id in the store ({} bytes)", bytes.size());
  std::memcpy(id.internal, bytes.data(), sizeof id.internal);
  ncclComm_t comm = nullptr;
  SF_NCCL_CHECK(ncclCommInitRank(&comm, world_size_, id, rank_));
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(comm_);
}

void NcclCommunicator::allreduce(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  SF_NCCL_CHECK(ncclAllReduce(in, out, count, nccl_type(dtype), ncclSum, comm_, stream));
}

void NcclCommunicator::allgather(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  SF_NCCL_CHECK(ncclAllGather(in, out, count, nccl_type(dtype), comm_, stream));
}

void NcclCommunicator::reduce_scatter(const void* in, void* out, size_t count, DType dtype, cudaStream_t stream) {
  SF_NCCL_CHECK(ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum, comm_, stream));
}

void NcclCommunicator::broadcast(const void* in, void* out, size_t count, DType dtype, int root, cudaStream_t stream) {
  check_peer(root, world_size_);
  SF_NCCL_CHECK(ncclBroadcast(in, out, count, nccl_type(dtype), root, comm_, stream));
}

void NcclCommunicator::send(const void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) {
  check_peer(peer, world_size_);
  SF_NCCL_CHECK(ncclSend(buffer, count, nccl_type(dtype), peer, comm_, stream));
}

void NcclCommunicator::recv(void* buffer, size_t count, DType dtype, int peer, cudaStream_t stream) {
  check_peer(peer, world_size_);
  SF_NCCL_CHECK(ncclRecv(buffer, count, nccl_type(dtype), peer, comm_, stream));
}

std::string NcclCommunicator::library_version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

}  // namespace splitflow::comm
