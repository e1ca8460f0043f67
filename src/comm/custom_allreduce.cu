#include "comm/custom_allreduce.h"

#include "comm/cuda_check.h"
#include "comm/custom_allreduce_kernels.cuh"

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace splitflow::comm {

namespace {

using detail::KernelArgs;
using detail::RankPtrs;

constexpr int kEagerSlots = 2;         // slots 0, 1: the eager staging buffers of every rank
constexpr int kGraphStagingSlot = 2;   // slot 2: the captured-call staging buffer of every rank
constexpr int kFirstGraphSlot = 3;
constexpr size_t kGraphSlots = 8192;   // captured calls over the communicator's lifetime
constexpr size_t kSignalBytes = (sizeof(detail::Signal) + 255) / 256 * 256;
// The LL protocol's buffers hold messages up to kLLCapacityBytes.
constexpr size_t kLLCapacityBytes = size_t{256} << 10;

// The LL128 protocol's buffers hold messages up to kLL128CapacityBytes.
constexpr size_t kLL128CapacityBytes = size_t{2} << 20;

// One-shot calls above the LL limit, and two-shot calls, up to this size use LL128 where the GPUs
// are linked by NVLink (CommGroup turns it off elsewhere). Measured on H200 (bench allreduce's
// protocol table, docs/comm.md): N = 2 one-shot LL128 wins from 128 KB to 1 MB, reads at 2 MB;
// N = 4 LL128 wins at every size its buffers take, one-shot from 1 KB and two-shot to 2 MB.
// N = 6, 8 were not measured with LL128: off.
size_t ll128_default_max_bytes(int world_size) {
  switch (world_size) {
    case 2: return size_t{1} << 20;
    case 4: return kLL128CapacityBytes;
    default: return 0;
  }
}

// 16-byte slots of a (parity, sender) region of LL128 lines for messages up to `bytes`.
int64_t ll128_sender_slots(size_t bytes) {
  const int64_t words = static_cast<int64_t>((bytes + 7) / 8);
  return (words + detail::kGroupDataWords - 1) / detail::kGroupDataWords * detail::kGroupSlots;
}

// One-shot calls up to this size use LL (custom_allreduce_kernels.cuh). Measured over NVLink on
// H200 (bench allreduce's protocol table, docs/comm.md): N = 2 LL wins to 64 KB (ties at 128 KB);
// N = 4 it pushes three copies at twice the bytes and LL128 is as fast from 1 KB; N = 8 it loses
// at every size. N = 6 was not measured: no LL.
size_t ll_default_max_bytes(int world_size) { return world_size == 2 ? size_t{64} << 10 : 0; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (b == nullptr) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

int log2_exact(int n) {
  int stages = 0;
  while ((1 << stages) < n) ++stages;
  return stages;
}

using GetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);

// The driver's cuPointerGetAttribute, fetched at run time so nothing links libcuda.
GetAttribute pointer_attribute_function() {
  static GetAttribute get_attribute = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SF_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &function, 12000, cudaEnableDefault,
                                                   &found));
    SF_CHECK(found == cudaDriverEntryPointSuccess && function != nullptr,
             "comm: the driver has no cuPointerGetAttribute");
    return reinterpret_cast<GetAttribute>(function);
  }();
  return get_attribute;
}

// What a peer needs to map one of our buffers: the IPC handle of the allocation holding it (handles
// name whole allocations), the buffer's offset in it, and the allocation's base address and size
// here. The base lets a peer recognise memory it mapped already: a process may map an allocation
// only once, and when we free a buffer a peer still maps, the next cudaMalloc can hand the same
// memory back under a new handle, possibly as a larger allocation.
struct ExportedBuffer {
  cudaIpcMemHandle_t handle;
  int64_t offset;
  uint64_t base;
  uint64_t size;
};

std::string export_buffer(const void* ptr) {
  const GetAttribute get_attribute = pointer_attribute_function();
  CUdeviceptr base = 0;
  const CUresult status =
      get_attribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, reinterpret_cast<CUdeviceptr>(ptr));
  SF_CHECK(status == CUDA_SUCCESS, "custom allreduce: {} is not device memory this process allocated (error {})", ptr,
           static_cast<int>(status));
  size_t size = 0;
  SF_CHECK(get_attribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS,
           "custom allreduce: no allocation size for {}", ptr);
  ExportedBuffer exported{};
  SF_CUDA_CHECK(cudaIpcGetMemHandle(&exported.handle, reinterpret_cast<void*>(base)));
  exported.offset = static_cast<const char*>(ptr) - reinterpret_cast<const char*>(base);
  exported.base = static_cast<uint64_t>(base);
  exported.size = static_cast<uint64_t>(size);
  return std::string(reinterpret_cast<const char*>(&exported), sizeof exported);
}

using KernelFn = void (*)(KernelArgs);
using LLKernelFn = void (*)(KernelArgs, detail::LLArgs);

using LL128KernelFn = void (*)(KernelArgs, detail::LL128Args);
using NormKernelFn = void (*)(KernelArgs, detail::NormArgs);

// make(T{}, std::integral_constant<int, N>{}) for the dtype and world size: a kernel instance, or
// null for another dtype or world size.
template <typename Fn, typename Make>
Fn pick_kernel(DType dtype, int world_size, Make&& make) {
  const auto for_type = [&](auto type) -> Fn {
    switch (world_size) {
      case 2: return make(type, std::integral_constant<int, 2>{});
      case 4: return make(type, std::integral_constant<int, 4>{});
      case 6: return make(type, std::integral_constant<int, 6>{});
      case 8: return make(type, std::integral_constant<int, 8>{});
    }
    return nullptr;
  };
  switch (dtype) {
    case DType::F32: return for_type(float{});
    case DType::F16: return for_type(__half{});
    case DType::BF16: return for_type(__nv_bfloat16{});
    default: return nullptr;
  }
}

LLKernelFn ll_kernel_for(int world_size, DType dtype) {
  return pick_kernel<LLKernelFn>(dtype, world_size, [](auto type, auto n) -> LLKernelFn {
    return detail::one_shot_ll_kernel<decltype(type), decltype(n)::value>;
  });
}

// One-shot or two-shot over LL128 lines.
LL128KernelFn ll128_kernel_for(AllreduceAlgorithm algorithm, int world_size, DType dtype) {
  return pick_kernel<LL128KernelFn>(dtype, world_size, [&](auto type, auto n) -> LL128KernelFn {
    if (algorithm == AllreduceAlgorithm::TwoShot) return detail::two_shot_ll128_kernel<decltype(type), decltype(n)::value>;
    return detail::one_shot_ll128_kernel<decltype(type), decltype(n)::value>;
  });
}

using LL128NormKernelFn = void (*)(KernelArgs, detail::LL128Args, detail::NormArgs);

NormKernelFn norm_kernel_for(int world_size, DType dtype) {
  return pick_kernel<NormKernelFn>(dtype, world_size, [](auto type, auto n) -> NormKernelFn {
    return detail::one_shot_add_rmsnorm_kernel<decltype(type), decltype(n)::value>;
  });
}

// The fused RMSNorm over LL128 lines: two-shot, or one-shot in the cluster shape for `rows`.
LL128NormKernelFn ll128_norm_kernel_for(AllreduceAlgorithm algorithm, size_t rows, int world_size, DType dtype) {
  const bool few_rows = rows <= static_cast<size_t>(detail::kOneShotNormFewRows);
  return pick_kernel<LL128NormKernelFn>(dtype, world_size, [&](auto type, auto n) -> LL128NormKernelFn {
    using T = decltype(type);
    constexpr int N = decltype(n)::value;
    if (algorithm == AllreduceAlgorithm::TwoShot) return detail::two_shot_ll128_add_rmsnorm_kernel<T, N>;
    if (few_rows) return detail::one_shot_ll128_add_rmsnorm_kernel<T, N, 6>;
    return detail::one_shot_ll128_add_rmsnorm_kernel<T, N, 3>;
  });
}

template <typename T, int N>
KernelFn kernel_for(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::OneShot: return detail::one_shot_kernel<T, N>;
    case AllreduceAlgorithm::TwoShot: return detail::two_shot_kernel<T, N>;
    case AllreduceAlgorithm::HalfButterfly:
      if constexpr (N == 2 || N == 4 || N == 8) return detail::half_butterfly_kernel<T, N>;
      return nullptr;
    case AllreduceAlgorithm::Nccl: return nullptr;
  }
  return nullptr;
}

KernelFn kernel_for(AllreduceAlgorithm algorithm, int world_size, DType dtype) {
  return pick_kernel<KernelFn>(dtype, world_size, [&](auto type, auto n) {
    return kernel_for<decltype(type), decltype(n)::value>(algorithm);
  });
}

size_t pack_elements(DType dtype) { return 16 / dtype_size(dtype); }

}  // namespace

struct CustomAllreduce::State {
  FileStore& store;
  int rank, world_size, device;
  size_t max_bytes;
  int max_blocks;

  char* meta = nullptr;     // [Signal | tmp]
  char* staging = nullptr;  // 3 x max_bytes
  char* ll = nullptr;       // LL receive buffers: [2][world_size][ll_sender_lines] 16-byte lines
  size_t ll_max_bytes = 0;      // the LL buffers' capacity
  size_t ll_use_max_bytes = 0;  // one-shot calls up to this size use LL
  int64_t ll_sender_lines = 0;
  detail::LLArgs ll_args{};
  char* ll128 = nullptr;           // LL128 receive buffers: [2][world_size][ll128_args.sender_slots] 16-byte slots
  size_t ll128_max_bytes = 0;      // their capacity
  size_t ll128_use_max_bytes = 0;  // one-shot calls above the LL limit and up to this size use LL128
  detail::LL128Args ll128_args{};
  bool one_shot_norm_ll128 = false;  // the fused one-shot kernel may push over LL128
  RankPtrs* slots = nullptr;
  detail::PeerSignals signals{};
  detail::PeerTmps tmps{};

  // Peer allocations mapped here, by (rank, handle bytes) and by (rank, base address on the peer).
  struct Mapping {
    char* base;     // here
    uint64_t size;  // of the allocation it was opened for
  };
  std::map<std::pair<int, std::string>, char*> opened_by_handle;
  std::map<std::pair<int, uint64_t>, Mapping> opened_by_base;
  size_t graph_slots_used = 0;
  std::vector<const void*> pending;  // inputs recorded during capture, in call order
  uint64_t eager_calls = 0;
  int exchanges = 0;

  explicit State(FileStore& s) : store(s) {}

  // `exported` (an export_buffer() record from `rank`) in this process's address space.
  char* import_buffer(int rank, const std::string& exported) {
    SF_CHECK(exported.size() == sizeof(ExportedBuffer), "custom allreduce: rank {} published a malformed buffer record",
             rank);
    ExportedBuffer record;
    std::memcpy(&record, exported.data(), sizeof record);
    const std::pair<int, std::string> handle_key{rank, exported.substr(0, sizeof record.handle)};
    const std::pair<int, uint64_t> base_key{rank, record.base};
    auto known = opened_by_handle.find(handle_key);
    if (known != opened_by_handle.end()) return known->second + record.offset;
    void* base = nullptr;
    cudaError_t status = cudaIpcOpenMemHandle(&base, record.handle, cudaIpcMemLazyEnablePeerAccess);
    if (status == cudaErrorAlreadyMapped) {
      // The peer freed an allocation we still map, and its allocator handed the same memory back
      // at the same address under a new handle.
      cudaGetLastError();
      auto same = opened_by_base.find(base_key);
      SF_CHECK(same != opened_by_base.end(),
               "custom allreduce: rank {}'s buffer at {:#x} is already mapped here under another address", rank,
               record.base);
      if (same->second.size >= record.size) {
        base = same->second.base;  // our mapping covers the new allocation
      } else {
        // The new allocation is larger than the one we mapped, which is dead (two live allocations
        // never share a base): unmap it and map the new one, so no access goes past a mapping.
        close_mapping(same->second.base);
        status = cudaIpcOpenMemHandle(&base, record.handle, cudaIpcMemLazyEnablePeerAccess);
        SF_CHECK(status == cudaSuccess,
                 "custom allreduce: cannot map rank {}'s {}-byte buffer at {:#x} after unmapping the smaller one "
                 "that was there: {}",
                 rank, record.size, record.base, cudaGetErrorString(status));
        opened_by_base[base_key] = {static_cast<char*>(base), record.size};
      }
    } else {
      SF_CUDA_CHECK(status);
      opened_by_base[base_key] = {static_cast<char*>(base), record.size};
    }
    opened_by_handle[handle_key] = static_cast<char*>(base);
    return static_cast<char*>(base) + record.offset;
  }

  // Unmaps a peer allocation and forgets every record that led to it.
  void close_mapping(char* base) {
    SF_CUDA_CHECK(cudaIpcCloseMemHandle(base));
    // (CUDA sources build as C++17 here: no std::erase_if.)
    for (auto it = opened_by_handle.begin(); it != opened_by_handle.end();)
      it = it->second == base ? opened_by_handle.erase(it) : std::next(it);
    for (auto it = opened_by_base.begin(); it != opened_by_base.end();)
      it = it->second.base == base ? opened_by_base.erase(it) : std::next(it);
  }

  // Pointer slot for this call's input. Captured calls record `in` (or enqueue a copy into the
  // graph staging buffer); eager calls set *copy_from for the kernel's copy-in.
  const RankPtrs* input_slot(const void* in, size_t bytes, const void* out_a, const void* out_b, size_t out_bytes,
                             cudaStream_t stream, bool* end_barrier, const void** copy_from) {
    *copy_from = nullptr;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    SF_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    SF_CHECK(capture != cudaStreamCaptureStatusInvalidated, "custom allreduce: the stream's capture was invalidated");
    if (capture == cudaStreamCaptureStatusActive) {
      SF_CHECK(graph_slots_used + pending.size() < kGraphSlots,
               "custom allreduce: more than {} captured calls; create a new communicator", kGraphSlots);
      const void* recorded = in;
      if (!aligned16(in) || overlaps(in, bytes, out_a, out_bytes) || overlaps(in, bytes, out_b, out_bytes)) {
        char* graph_staging = staging + kGraphStagingSlot * max_bytes;
        SF_CUDA_CHECK(cudaMemcpyAsync(graph_staging, in, bytes, cudaMemcpyDeviceToDevice, stream));
        recorded = graph_staging;
      }
      const RankPtrs* slot = slots + kFirstGraphSlot + graph_slots_used + pending.size();
      pending.push_back(recorded);
      *end_barrier = true;
      return slot;
    }
    // Eager: the kernel copies `in` into this parity's staging buffer itself (copy-in).
    const int parity = static_cast<int>(eager_calls++ % kEagerSlots);
    *copy_from = in;
    *end_barrier = false;
    return slots + parity;
  }

  // Whether [rows, hidden] fits the LL128 path of the fused RMSNorm: LL128 on for the message, rows
  // of at most max_row_groups line groups, the row-aligned groups within a sender's region.
  bool ll128_rows_fit(size_t rows, size_t hidden, DType dtype, int64_t max_row_groups) const;

  int blocks_for(size_t work_packs) const {
    const size_t blocks = (work_packs + detail::kThreads - 1) / detail::kThreads;
    return static_cast<int>(std::clamp<size_t>(blocks, 1, static_cast<size_t>(max_blocks)));
  }
};

CustomAllreduce::CustomAllreduce(FileStore& store, int device, size_t max_bytes, int max_blocks)
    : state_(std::make_unique<State>(store)) {
  State& s = *state_;
  s.rank = store.rank();
  s.world_size = store.world_size();
  s.device = device;
  s.max_bytes = (max_bytes + 255) / 256 * 256;
  SF_CHECK(s.world_size >= 2 && s.world_size <= detail::kMaxRanks,
           "custom allreduce: world size {} (2 to {} GPUs)", s.world_size, detail::kMaxRanks);
  SF_CHECK(max_bytes > 0, "custom allreduce: max_bytes must be positive");
  set_max_blocks(max_blocks);

  // Two-shot keeps at most a whole message per rank in tmp; half-butterfly log2(N) - 1 regions of
  // fp32 partial sums, each twice the message for 16-bit inputs.
  const int stages = log2_exact(s.world_size);
  const size_t tmp_bytes = std::max<size_t>(s.max_bytes, (stages > 1 ? stages - 1 : 0) * 2 * s.max_bytes);
  SF_CUDA_CHECK(cudaMalloc(&s.meta, kSignalBytes + tmp_bytes));
  SF_CUDA_CHECK(cudaMemset(s.meta, 0, kSignalBytes));
  SF_CUDA_CHECK(cudaMalloc(&s.staging, 3 * s.max_bytes));
  SF_CUDA_CHECK(cudaMalloc(&s.slots, (kFirstGraphSlot + kGraphSlots) * sizeof(RankPtrs)));
  // LL lines carry 8 bytes of data in 16: two lines per 16-byte pack, zeroed (flag 0: no call).
  s.ll_max_bytes = std::min(s.max_bytes, kLLCapacityBytes);
  s.ll_use_max_bytes = std::min(s.ll_max_bytes, ll_default_max_bytes(s.world_size));
  s.ll_sender_lines = static_cast<int64_t>(2 * ((s.ll_max_bytes + 15) / 16));
  const size_t ll_bytes = 2 * static_cast<size_t>(s.world_size) * static_cast<size_t>(s.ll_sender_lines) * 16;
  SF_CUDA_CHECK(cudaMalloc(&s.ll, ll_bytes));
  SF_CUDA_CHECK(cudaMemset(s.ll, 0, ll_bytes));
  s.ll128_max_bytes = std::min(s.max_bytes, kLL128CapacityBytes);
  s.ll128_use_max_bytes = std::min(s.ll128_max_bytes, ll128_default_max_bytes(s.world_size));
  s.one_shot_norm_ll128 = s.world_size == 2;
  s.ll128_args.sender_slots = ll128_sender_slots(s.ll128_max_bytes);
  const size_t ll128_bytes = 2 * static_cast<size_t>(s.world_size) * static_cast<size_t>(s.ll128_args.sender_slots) * 16;
  SF_CUDA_CHECK(cudaMalloc(&s.ll128, ll128_bytes));
  SF_CUDA_CHECK(cudaMemset(s.ll128, 0, ll128_bytes));
  SF_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<std::string> records = store.allgather(
      "custom_ipc", export_buffer(s.meta) + export_buffer(s.staging) + export_buffer(s.ll) + export_buffer(s.ll128));
  const size_t record_size = sizeof(ExportedBuffer);
  RankPtrs fixed[kFirstGraphSlot] = {};
  s.ll_args.sender_lines = s.ll_sender_lines;
  for (int r = 0; r < s.world_size; ++r) {
    SF_CHECK(records[r].size() == 4 * record_size, "custom allreduce: rank {} published malformed buffer records", r);
    char* meta = r == s.rank ? s.meta : s.import_buffer(r, records[r].substr(0, record_size));
    char* staging = r == s.rank ? s.staging : s.import_buffer(r, records[r].substr(record_size, record_size));
    char* ll = r == s.rank ? s.ll : s.import_buffer(r, records[r].substr(2 * record_size, record_size));
    char* ll128 = r == s.rank ? s.ll128 : s.import_buffer(r, records[r].substr(3 * record_size, record_size));
    s.ll_args.recv[r] = reinterpret_cast<uint4*>(ll);
    s.ll128_args.recv[r] = reinterpret_cast<uint4*>(ll128);
    s.signals.signal[r] = reinterpret_cast<detail::Signal*>(meta);
    s.tmps.tmp[r] = meta + kSignalBytes;
    for (int slot = 0; slot < kFirstGraphSlot; ++slot) fixed[slot].ptr[r] = staging + slot * s.max_bytes;
  }
  SF_CUDA_CHECK(cudaMemcpy(s.slots, fixed, sizeof fixed, cudaMemcpyHostToDevice));
  // No rank launches a kernel before every rank's flags are zeroed and its peers are open.
  store.barrier("custom_ready");
}

CustomAllreduce::~CustomAllreduce() {
  State& s = *state_;
  cudaDeviceSynchronize();
  std::set<char*> mapped;
  for (auto& [key, ptr] : s.opened_by_handle) mapped.insert(ptr);
  for (char* ptr : mapped) cudaIpcCloseMemHandle(ptr);
  // An exporter frees its memory only after every importer has closed it.
  try {
    s.store.barrier("custom_closed");
  } catch (const Error&) {
    // A peer that died cannot read our memory any more; free it anyway.
  }
  cudaFree(s.slots);
  cudaFree(s.ll128);
  cudaFree(s.ll);
  cudaFree(s.staging);
  cudaFree(s.meta);
}

int CustomAllreduce::rank() const { return state_->rank; }
int CustomAllreduce::world_size() const { return state_->world_size; }
size_t CustomAllreduce::max_bytes() const { return state_->max_bytes; }
int CustomAllreduce::max_blocks() const { return state_->max_blocks; }

void CustomAllreduce::set_max_blocks(int max_blocks) {
  SF_CHECK(max_blocks >= 1 && max_blocks <= detail::kMaxBlocks, "custom allreduce: max_blocks {} (1 to {})",
           max_blocks, detail::kMaxBlocks);
  state_->max_blocks = max_blocks;
}

size_t CustomAllreduce::ll_max_bytes() const { return state_->ll_use_max_bytes; }
size_t CustomAllreduce::ll_capacity_bytes() const { return state_->ll_max_bytes; }

void CustomAllreduce::set_ll_max_bytes(size_t bytes) {
  SF_CHECK(bytes <= state_->ll_max_bytes, "custom allreduce: LL up to {} bytes, its buffers hold {}", bytes,
           state_->ll_max_bytes);
  state_->ll_use_max_bytes = bytes;
}

size_t CustomAllreduce::ll128_max_bytes() const { return state_->ll128_use_max_bytes; }
size_t CustomAllreduce::ll128_capacity_bytes() const { return state_->ll128_max_bytes; }

void CustomAllreduce::set_ll128_max_bytes(size_t bytes) {
  SF_CHECK(bytes <= state_->ll128_max_bytes, "custom allreduce: LL128 up to {} bytes, its buffers hold {}", bytes,
           state_->ll128_max_bytes);
  state_->ll128_use_max_bytes = bytes;
}

void CustomAllreduce::allreduce(AllreduceAlgorithm algorithm, const void* in, void* out, size_t count, DType dtype,
                                cudaStream_t stream, const void* residual) {
  State& s = *state_;
  SF_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16,
           "custom allreduce: dtype {} (f32, f16 or bf16)", dtype_name(dtype));
  const size_t bytes = count * dtype_size(dtype);
  SF_CHECK(count > 0 && bytes <= s.max_bytes, "custom allreduce: {} bytes (1 to {})", bytes, s.max_bytes);
  const KernelFn kernel = kernel_for(algorithm, s.world_size, dtype);
  SF_CHECK(kernel != nullptr, "custom allreduce: no {} kernel for {} GPUs", algorithm_name(algorithm), s.world_size);
  if (algorithm == AllreduceAlgorithm::OneShot && bytes <= s.ll_use_max_bytes) {
    // Small one-shot calls push their input (LL protocol): nothing to stage or register.
    detail::LLArgs ll = s.ll_args;
    ll.in = in;
    const KernelArgs args{nullptr, nullptr, s.signals, s.tmps, s.rank, false, out, residual, static_cast<int64_t>(count)};
    ll_kernel_for(s.world_size, dtype)<<<detail::kLLBlocks, detail::kLLThreads, 0, stream>>>(args, ll);
    SF_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const bool pushes_lines = algorithm == AllreduceAlgorithm::OneShot || algorithm == AllreduceAlgorithm::TwoShot;
  if (pushes_lines && bytes <= s.ll128_use_max_bytes) {
    // Pushed 128-byte lines with their flags (LL128, NVLink): nothing to stage or register either.
    detail::LL128Args ll = s.ll128_args;
    ll.in = in;
    const KernelArgs args{nullptr, nullptr, s.signals, s.tmps, s.rank, false, out, residual, static_cast<int64_t>(count)};
    ll128_kernel_for(algorithm, s.world_size, dtype)<<<detail::kLL128Blocks, detail::kLL128Threads, 0, stream>>>(args, ll);
    SF_CUDA_CHECK(cudaGetLastError());
    return;
  }

  bool end_barrier = false;
  const void* copy_from = nullptr;
  const RankPtrs* inputs = s.input_slot(in, bytes, out, nullptr, bytes, stream, &end_barrier, &copy_from);
  const KernelArgs args{inputs,     copy_from, s.signals, s.tmps, s.rank, end_barrier,
                        out,        residual,  static_cast<int64_t>(count)};
  const size_t packs = count / pack_elements(dtype);
  const size_t work = algorithm == AllreduceAlgorithm::TwoShot ? packs - packs / s.world_size * (s.world_size - 1) : packs;
  kernel<<<s.blocks_for(work), detail::kThreads, 0, stream>>>(args);
  SF_CUDA_CHECK(cudaGetLastError());
}

bool CustomAllreduce::fused_rmsnorm_supported(size_t hidden, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return false;
  const size_t pack = pack_elements(dtype);
  return hidden > 0 && hidden % pack == 0 &&
         hidden / pack <= static_cast<size_t>(detail::kNormMaxThreads * detail::kNormPacksPerThread);
}

bool CustomAllreduce::State::ll128_rows_fit(size_t rows, size_t hidden, DType dtype, int64_t max_row_groups) const {
  if (!fused_rmsnorm_supported(hidden, dtype)) return false;
  const int64_t row_groups = detail::row_line_groups(static_cast<int64_t>(hidden * dtype_size(dtype)));
  return rows * hidden * dtype_size(dtype) <= ll128_use_max_bytes && row_groups <= max_row_groups &&
         static_cast<int64_t>(rows) * row_groups * detail::kGroupSlots <= ll128_args.sender_slots;
}

bool CustomAllreduce::two_shot_rmsnorm_supported(size_t rows, size_t hidden, DType dtype) const {
  const State& s = *state_;
  return rows >= static_cast<size_t>(s.world_size) &&
         s.ll128_rows_fit(rows, hidden, dtype, detail::kNormGroupsPerWarp * detail::kNormClusterWarps);
}

bool CustomAllreduce::one_shot_rmsnorm_ll128_enabled() const { return state_->one_shot_norm_ll128; }
void CustomAllreduce::set_one_shot_rmsnorm_ll128(bool enabled) { state_->one_shot_norm_ll128 = enabled; }

bool CustomAllreduce::one_shot_rmsnorm_ll128(size_t rows, size_t hidden, DType dtype) const {
  return rows <= static_cast<size_t>(detail::kOneShotNormMaxRows) &&
         state_->ll128_rows_fit(rows, hidden, dtype, detail::kOneShotNormRowGroups);
}

void CustomAllreduce::allreduce_add_rmsnorm(AllreduceAlgorithm algorithm, const void* in, const void* residual_in,
                                            void* residual_out, void* norm_out, const float* weight, float eps,
                                            size_t rows, size_t hidden, DType dtype, cudaStream_t stream) {
  State& s = *state_;
  SF_CHECK(fused_rmsnorm_supported(hidden, dtype),
           "custom allreduce + RMSNorm: hidden {} of {} is not a whole number of 16-byte packs (at most {})", hidden,
           dtype_name(dtype), detail::kNormMaxThreads * detail::kNormPacksPerThread);
  const size_t bytes = rows * hidden * dtype_size(dtype);
  SF_CHECK(rows > 0 && bytes <= s.max_bytes, "custom allreduce + RMSNorm: {} bytes (1 to {})", bytes, s.max_bytes);
  SF_CHECK(algorithm == AllreduceAlgorithm::OneShot || algorithm == AllreduceAlgorithm::TwoShot,
           "custom allreduce + RMSNorm: no {} kernel (one_shot or two_shot)", algorithm_name(algorithm));
  const detail::NormArgs norm{norm_out, weight, eps, static_cast<int64_t>(rows), static_cast<int>(hidden)};
  if (algorithm == AllreduceAlgorithm::TwoShot) {
    SF_CHECK(two_shot_rmsnorm_supported(rows, hidden, dtype),
             "custom allreduce + RMSNorm: two-shot cannot take {} rows of {} {} on {} GPUs (LL128 up to {} bytes, at "
             "least one row per GPU)",
             rows, hidden, dtype_name(dtype), s.world_size, s.ll128_use_max_bytes);
  }
  if (algorithm == AllreduceAlgorithm::TwoShot || (s.one_shot_norm_ll128 && one_shot_rmsnorm_ll128(rows, hidden, dtype))) {
    detail::LL128Args ll = s.ll128_args;
    ll.in = in;
    const KernelArgs args{nullptr,      nullptr,     s.signals, s.tmps, s.rank, false,
                          residual_out, residual_in, static_cast<int64_t>(rows * hidden)};
    ll128_norm_kernel_for(algorithm, rows, s.world_size, dtype)<<<detail::kLL128Blocks, detail::kLL128Threads, 0,
                                                                   stream>>>(args, ll, norm);
    SF_CUDA_CHECK(cudaGetLastError());
    return;
  }
  bool end_barrier = false;
  const void* copy_from = nullptr;
  const RankPtrs* inputs = s.input_slot(in, bytes, residual_out, norm_out, bytes, stream, &end_barrier, &copy_from);
  const KernelArgs args{inputs,       copy_from,   s.signals, s.tmps, s.rank, end_barrier,
                        residual_out, residual_in, static_cast<int64_t>(rows * hidden)};
  const int row_packs = static_cast<int>(hidden / pack_elements(dtype));
  const int threads = std::min(detail::kNormMaxThreads, (row_packs + 31) / 32 * 32);
  const int blocks = static_cast<int>(std::min<size_t>(rows, static_cast<size_t>(s.max_blocks)));
  norm_kernel_for(s.world_size, dtype)<<<blocks, threads, 0, stream>>>(args, norm);
  SF_CUDA_CHECK(cudaGetLastError());
}

void CustomAllreduce::register_graph_buffers() {
  State& s = *state_;
  std::string mine;
  for (const void* ptr : s.pending) mine += export_buffer(ptr);
  const std::vector<std::string> all = s.store.allgather(fmt::format("graph_buffers_{}", s.exchanges++), mine);
  const size_t record = sizeof(ExportedBuffer);
  std::vector<RankPtrs> slots(s.pending.size());
  for (int r = 0; r < s.world_size; ++r) {
    SF_CHECK(all[r].size() == mine.size(),
             "custom allreduce: rank {} captured {} allreduces, rank {} captured {} (every rank must capture the "
             "same calls)",
             r, all[r].size() / record, s.rank, s.pending.size());
    for (size_t i = 0; i < s.pending.size(); ++i) {
      slots[i].ptr[r] = r == s.rank ? s.pending[i] : s.import_buffer(r, all[r].substr(i * record, record));
    }
  }
  if (!slots.empty()) {
    SF_CUDA_CHECK(cudaMemcpy(s.slots + kFirstGraphSlot + s.graph_slots_used, slots.data(),
                             slots.size() * sizeof(RankPtrs), cudaMemcpyHostToDevice));
  }
  s.graph_slots_used += s.pending.size();
  s.pending.clear();
}

size_t CustomAllreduce::unregistered_graph_buffers() const { return state_->pending.size(); }

}  // namespace splitflow::comm
