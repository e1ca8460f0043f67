// backend/cuda/cuda_backend.cpp — CudaBackend: checks, memory, cuBLASLt GEMMs; kernels in kernels.cu.
#include "backend/cuda/cuda_backend.h"
#include "backend/upload_bytes.h"
#include "backend/cuda/cuda_check.h"

#include "backend/argument_checks.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/gemm_plan.h"
#include "backend/cuda/kernels.h"
#include "backend/host_mailboxes.h"
#include "comm/comm_group.h"
#include "comm/elementwise.h"
#include "core/error.h"

#include <cublasLt.h>
#include <cuda_profiler_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

namespace splitflow {

std::unique_ptr<Backend> make_cuda_backend(int device, CudaJobPlace place) {
  return std::make_unique<cuda::CudaBackend>(device, std::move(place));
}

namespace cuda {
namespace {


constexpr size_t kWorkspaceBytes = 32 << 20;  // cuBLASLt's recommendation for Hopper

void check_dtype(const DeviceTensor& t, DType dtype, const char* kernel, const char* arg) {
  SF_CHECK(t.dtype == dtype, "cuda {}: {} has dtype {}, expected {}", kernel, arg, dtype_name(t.dtype),
           dtype_name(dtype));
}
void check_shape(const DeviceTensor& t, const Shape& expected, const char* kernel, const char* arg) {
  SF_CHECK(t.shape == expected, "cuda {}: {} has shape {}, expected {}", kernel, arg, shape_str(t.shape),
           shape_str(expected));
}
bool is_float(DType dtype) { return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16; }

bf16_bits* bf16_ptr(const DeviceTensor& t) { return static_cast<bf16_bits*>(t.data); }
// A cache the argument checks accepted holds e4m3 (else bf16).
bool is_fp8(const DeviceTensor& cache) { return cache.dtype == DType::F8E4M3; }

// The largest power of two (<= 256) dividing every address: cuBLASLt picks kernels by alignment.
int common_alignment(std::initializer_list<const void*> pointers) {
  int alignment = 256;
  for (const void* p : pointers)
    while (reinterpret_cast<uintptr_t>(p) % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace

CudaBackend::CudaBackend(int device, CudaJobPlace place)
    : device_(device),
      group_(place.tensor_group),
      pipeline_group_(place.pipeline_group),
      mailboxes_(std::move(place.mailboxes)),
      job_rank_(place.job_rank) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) cudaGetLastError();
  SF_CHECK(err == cudaSuccess && device >= 0 && device < count, "cuda backend: device {} is not available ({} GPUs{})",
           device, err == cudaSuccess ? count : 0, err == cudaSuccess ? std::string() : fmt::format(": {}", cudaGetErrorString(err)));
  SF_CUDA_CALL(cudaSetDevice(device), "set device");
  cudaDeviceProp props{};
  SF_CUDA_CALL(cudaGetDeviceProperties(&props, device), "device properties");
  device_name_ = props.name;
  SF_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "create stream");
  cublasLtHandle_t handle = nullptr;
  SF_CUBLAS_CHECK(cublasLtCreate(&handle), "create handle");
  lt_handle_ = handle;
  workspace_bytes_ = kWorkspaceBytes;
  SF_CUDA_CALL(cudaMalloc(&workspace_, workspace_bytes_), "allocate the cuBLASLt workspace");
  sm_count_ = props.multiProcessorCount;
  l2_bytes_ = props.l2CacheSize;
  compute_major_ = props.major;
  // Matmuls of at most this many rows use the GEMV kernel (1..kMaxGemvRows; 0 disables it);
  // SPLITFLOW_GEMV_MAX_ROWS overrides the default for benchmarking the crossover.
  if (const char* rows = std::getenv("SPLITFLOW_GEMV_MAX_ROWS"); rows != nullptr && *rows != '\0') {
    const int value = std::atoi(rows);
    SF_CHECK(value >= 0 && value <= kMaxGemvRows, "SPLITFLOW_GEMV_MAX_ROWS={}: expected 0..{}", rows, kMaxGemvRows);
    gemv_max_rows_ = value;
  }
  SF_CUDA_CALL(cudaMalloc(&attention_partials_, attention_partials_floats(sm_count_) * sizeof(float)),
                "allocate the split-KV attention scratch");
  const size_t counter_bytes = attention_partition_counters(sm_count_) * sizeof(int32_t);
  SF_CUDA_CALL(cudaMalloc(&partition_counters_, counter_bytes), "allocate the split-KV partition counters");
  SF_CUDA_CALL(cudaMemset(partition_counters_, 0, counter_bytes), "zero the split-KV partition counters");
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  gemm_plans_.clear();
  fp8_.reset();
  if (workspace_) cudaFree(workspace_);
  if (attention_partials_) cudaFree(attention_partials_);
  if (partition_counters_) cudaFree(partition_counters_);
  if (scratch_) cudaFree(scratch_);
  if (x_codes_) cudaFree(x_codes_);
  if (lt_handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_handle_));
  if (stream_) cudaStreamDestroy(stream_);
}

bool CudaBackend::set_fp8_activations(bool on) {
  if (!on) {
    fp8_.reset();
    return true;
  }
  if (compute_major_ != 9) return false;  // cuBLASLt's outer-vector FP8 scaling is sm_90's alone
  if (fp8_ == nullptr) fp8_ = std::make_unique<Fp8Gemm>(lt_handle_, workspace_, workspace_bytes_, stream_);
  return true;
}

std::string CudaBackend::name() const { return fmt::format("cuda:{} ({})", device_, device_name_); }

std::span<const DType> CudaBackend::weight_dtypes() const {
  // Float matrices (stored as bf16) and every quantized type, read packed (quant_kernels.h).
  static constexpr DType kDtypes[] = {
      DType::F32,    DType::F16,    DType::BF16,   DType::Q4_0,    DType::Q4_1,      DType::Q5_0,
      DType::Q5_1,   DType::Q8_0,   DType::Q2_K,   DType::Q3_K,    DType::Q4_K,      DType::Q5_K,
      DType::Q6_K,   DType::Q2_B32, DType::Q3_B32, DType::Q4_B32,  DType::Q5_B32,    DType::Q6_B32,
      DType::Q8_B32, DType::Q2_B64, DType::Q3_B64, DType::Q4_B64,  DType::Q5_B64,    DType::Q6_B64,
      DType::Q8_B64, DType::Q3H_B64, DType::F8_CHANNEL, DType::F8_G128, DType::I8_G32, DType::I8_G64,
      DType::I8_G128};
  return kDtypes;
}

std::span<const DType> CudaBackend::kv_cache_dtypes() const {
  static constexpr DType kDtypes[] = {DType::BF16, DType::F8E4M3};
  return kDtypes;
}

DeviceBuffer CudaBackend::allocate(DType dtype, Shape shape) {
  DeviceTensor view{nullptr, dtype, std::move(shape)};
  // At least one byte so a zero-sized tensor is still a non-empty view.
  const size_t bytes = std::max<size_t>(view.nbytes(), 1);
  SF_CUDA_CALL(cudaMalloc(&view.data, bytes), fmt::format("allocate {} bytes for {} {}", bytes, dtype_name(dtype),
                                                           shape_str(view.shape)));
  std::shared_ptr<void> owner(view.data, [](void* p) { cudaFree(p); });
  SF_CUDA_CALL(cudaMemsetAsync(view.data, 0, bytes, stream_), "zero a new buffer");
  return DeviceBuffer(std::move(view), std::move(owner));
}

DeviceBuffer CudaBackend::upload(const Tensor& host) {
  SF_CHECK(!host.empty(), "cuda upload: tensor {} has no data", shape_str(host.shape));
  if (is_quantized(host.dtype) || host.dtype == DType::Mixed) return upload_quantized(host);
  if (!is_float(host.dtype)) {  // generated tensors are always float
    DeviceBuffer buffer = allocate(host.dtype, host.shape);
    copy_to_device(host.data, buffer.view());
    return buffer;
  }
  // Matrices become BF16, vectors F32 (see cuda_backend.h; the rule is backend/upload_bytes.h's).
  const DType stored = cuda_upload_dtype(host);
  DeviceBuffer buffer = allocate(stored, host.shape);
  if (host.generated) {
    // Generated in place as the stored dtype (a bf16 matrix gets the same bits as the host fill in
    // bf16, or in f32 then converted).
    const DeviceTensor view = buffer.view();
    const bool bf16 = stored == DType::BF16;
    SF_CUDA_CALL(launch_fill_generated_normal(host.generated->key, host.generated->stddev,
                                               bf16 ? bf16_ptr(view) : nullptr, bf16 ? nullptr : view.as<float>(),
                                               view.numel(), stream_),
                  "generate dummy weights");
    return buffer;
  }
  if (host.dtype == stored) {
    copy_to_device(host.data, buffer.view());
    return buffer;
  }
  const size_t count = static_cast<size_t>(host.numel());
  std::vector<float> f32(count);
  convert_to_f32(host.dtype, host.data, f32.data(), count);
  if (stored == DType::F32) {
    copy_to_device(f32.data(), buffer.view());
  } else {
    std::vector<uint16_t> bf16(count);
    for (size_t i = 0; i < count; ++i) bf16[i] = f32_to_bf16(f32[i]);
    copy_to_device(bf16.data(), buffer.view());
  }
  return buffer;
}

void CudaBackend::copy_to_device(const void* host, const DeviceTensor& dst) {
  // From pageable memory the copy returns once the host bytes are staged: the caller may reuse them.
  if (dst.nbytes() > 0)
    SF_CUDA_CALL(cudaMemcpyAsync(dst.data, host, dst.nbytes(), cudaMemcpyHostToDevice, stream_), "copy to device");
}

void CudaBackend::copy_to_host(const DeviceTensor& src, void* host) {
  if (src.nbytes() > 0)
    SF_CUDA_CALL(cudaMemcpyAsync(host, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_), "copy to host");
  synchronize();
}

void CudaBackend::profile_region(bool on) {
  synchronize();
  SF_CUDA_CALL(on ? cudaProfilerStart() : cudaProfilerStop(), "profiler region");
}

void CudaBackend::synchronize() { SF_CUDA_CALL(cudaStreamSynchronize(stream_), "synchronize (a kernel failed)"); }

DeviceMemoryInfo CudaBackend::memory_info() const {
  size_t free_bytes = 0, total_bytes = 0;
  SF_CUDA_CALL(cudaSetDevice(device_), "set device");
  SF_CUDA_CALL(cudaMemGetInfo(&free_bytes, &total_bytes), "query device memory");
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

std::shared_ptr<void> CudaBackend::allocate_host(size_t bytes) {
  void* memory = nullptr;
  SF_CUDA_CALL(cudaHostAlloc(&memory, std::max<size_t>(bytes, 1), cudaHostAllocDefault),
                fmt::format("allocate {} bytes of pinned host memory", bytes));
  return std::shared_ptr<void>(memory, [](void* p) { cudaFreeHost(p); });
}

namespace {

class CudaGraph final : public RecordedWork {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream) : graph_(graph), exec_(exec), stream_(stream) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void replay() override { SF_CUDA_CALL(cudaGraphLaunch(exec_, stream_), "replay a recorded graph"); }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<RecordedWork> CudaBackend::record(const std::function<void()>& issue) {
  SF_CUDA_CALL(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin graph capture");
  cudaGraph_t graph = nullptr;
  try {
    issue();
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);  // leaves capture mode; the partial graph is dropped
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  SF_CUDA_CALL(cudaStreamEndCapture(stream_, &graph), "end graph capture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) cudaGraphDestroy(graph);
  SF_CUDA_CALL(err, "instantiate a recorded graph");
  auto recorded = std::make_unique<CudaGraph>(graph, exec, stream_);
  // Collective: the custom allreduce's captured calls read their peers' buffers through slots
  // filled here (every rank records the same steps at the same point).
  if (group_ != nullptr) group_->register_graph_buffers();
  return recorded;
}

int CudaBackend::tensor_parallel_size() const { return group_ ? group_->world_size() : 1; }

void CudaBackend::allgather_rows(const DeviceTensor& x) {
  SF_CHECK(group_ != nullptr, "allgather_rows: the cuda backend belongs to no tensor-parallel group");
  const int size = group_->world_size();
  SF_CHECK(x.shape.size() == 2 && x.dim(0) % size == 0, "cuda allgather_rows: x is {}, expected [a multiple of {} rows, width]",
           shape_str(x.shape), size);
  const size_t block_bytes = x.nbytes() / size;
  char* base = static_cast<char*>(x.data);
  group_->allgather(base + static_cast<size_t>(group_->rank()) * block_bytes, base, block_bytes, DType::U8, stream_);
}

void CudaBackend::send(const DeviceTensor& x, int peer) {
  if (mailboxes_ != nullptr) {  // a stage in this process: through host memory
    std::vector<unsigned char> bytes(x.nbytes());
    copy_to_host(x, bytes.data());
    mailboxes_->send(job_rank_, peer, bytes.data(), x.dtype, x.numel());
    return;
  }
  SF_CHECK(pipeline_group_ != nullptr, "send: the cuda backend belongs to no pipeline");
  pipeline_group_->send(x.data, x.nbytes(), DType::U8, peer, stream_);
}

void CudaBackend::recv(const DeviceTensor& x, int peer) {
  if (mailboxes_ != nullptr) {
    std::vector<unsigned char> bytes(x.nbytes());
    mailboxes_->recv(peer, job_rank_, bytes.data(), x.dtype, x.numel());
    copy_to_device(bytes.data(), x);
    synchronize();  // `bytes` is pageable and goes out of scope
    return;
  }
  SF_CHECK(pipeline_group_ != nullptr, "recv: the cuda backend belongs to no pipeline");
  pipeline_group_->recv(x.data, x.nbytes(), DType::U8, peer, stream_);
}

void CudaBackend::allreduce(const DeviceTensor& partial, const DeviceTensor& residual) {
  SF_CHECK(group_ != nullptr, "allreduce: the cuda backend belongs to no tensor-parallel group");
  check_dtype(partial, DType::BF16, "allreduce", "partial");
  const size_t count = static_cast<size_t>(partial.numel());
  if (residual.empty()) {
    group_->allreduce(partial.data, partial.data, count, DType::BF16, stream_);
    return;
  }
  check_dtype(residual, DType::BF16, "allreduce", "residual");
  check_shape(residual, partial.shape, "allreduce", "residual");
  if (group_->choose_allreduce(count * sizeof(uint16_t)) == comm::AllreduceAlgorithm::Nccl) {
    // NCCL writes its output before an add could read the residual: sum in place, then add.
    group_->allreduce(partial.data, partial.data, count, DType::BF16, stream_);
    comm::add(residual.data, partial.data, residual.data, count, DType::BF16, stream_);
  } else {
    group_->allreduce_add(partial.data, residual.data, residual.data, count, DType::BF16, stream_);
  }
}

void CudaBackend::gather_columns(const DeviceTensor& parts, const DeviceTensor& full) {
  SF_CHECK(group_ != nullptr, "gather_columns: the cuda backend belongs to no tensor-parallel group");
  const int size = group_->world_size();
  const int64_t rows = check_gather_columns_args("cuda", parts, full, size);
  const int64_t shard = parts.shape[1];
  const size_t part_count = static_cast<size_t>(rows * shard);
  float* base = parts.as<float>();
  // In place: this rank's part already sits at its offset of the gathered buffer.
  group_->allgather(base + static_cast<size_t>(group_->rank()) * part_count, base, part_count, DType::F32, stream_);
  const size_t width = static_cast<size_t>(shard) * sizeof(float);
  for (int r = 0; r < size; ++r) {
    SF_CUDA_CALL(cudaMemcpy2DAsync(full.as<float>() + static_cast<size_t>(r) * shard, static_cast<size_t>(size) * width,
                                    base + static_cast<size_t>(r) * part_count, width, width, static_cast<size_t>(rows),
                                    cudaMemcpyDeviceToDevice, stream_),
                  "place a rank's logits columns");
  }
}

void CudaBackend::embed(const DeviceTensor& table, const DeviceTensor& token_ids, float multiplier,
                        const DeviceTensor& pos_table, const DeviceTensor& positions, const DeviceTensor& out) {
  if (is_quant_matrix(table)) {
    quant_embed(table, token_ids, multiplier, pos_table, positions, out);
    return;
  }
  check_dtype(table, DType::BF16, "embed", "table");
  check_dtype(token_ids, DType::I32, "embed", "token_ids");
  check_dtype(out, DType::BF16, "embed", "out");
  SF_CHECK(table.shape.size() == 2, "cuda embed: table has shape {}, expected [vocab, hidden]", shape_str(table.shape));
  const int64_t tokens = token_ids.numel(), hidden = table.dim(1);
  check_shape(out, {tokens, hidden}, "embed", "out");
  if (!pos_table.empty()) {
    check_dtype(pos_table, DType::BF16, "embed", "pos_table");
    check_dtype(positions, DType::I32, "embed", "positions");
    SF_CHECK(pos_table.shape.size() == 2 && pos_table.dim(1) == hidden,
             "cuda embed: pos_table has shape {}, expected [positions, {}]", shape_str(pos_table.shape), hidden);
    check_shape(positions, {tokens}, "embed", "positions");
  }
  SF_CUDA_CALL(launch_embed(bf16_ptr(table), token_ids.as<int32_t>(), multiplier,
                             pos_table.empty() ? nullptr : bf16_ptr(pos_table),
                             pos_table.empty() ? nullptr : positions.as<int32_t>(), bf16_ptr(out), tokens, hidden,
                             stream_),
                "embed");
}

void CudaBackend::add_norm(const DeviceTensor& residual, const DeviceTensor& delta, const DeviceTensor& weight,
                           const DeviceTensor& bias, const NormParams& params, const DeviceTensor& out) {
  check_dtype(residual, DType::BF16, "add_norm", "residual");
  check_dtype(weight, DType::F32, "add_norm", "weight");
  check_dtype(out, DType::BF16, "add_norm", "out");
  SF_CHECK(residual.shape.size() == 2, "cuda add_norm: residual has shape {}, expected [tokens, hidden]",
           shape_str(residual.shape));
  const int64_t tokens = residual.dim(0), hidden = residual.dim(1);
  check_shape(out, residual.shape, "add_norm", "out");
  check_shape(weight, {hidden}, "add_norm", "weight");
  if (!delta.empty()) {
    check_dtype(delta, DType::BF16, "add_norm", "delta");
    check_shape(delta, residual.shape, "add_norm", "delta");
  }
  if (!bias.empty()) {
    check_dtype(bias, DType::F32, "add_norm", "bias");
    check_shape(bias, {hidden}, "add_norm", "bias");
  }
  SF_CUDA_CALL(launch_add_norm(bf16_ptr(residual), delta.empty() ? nullptr : bf16_ptr(delta), weight.as<float>(),
                                bias.empty() ? nullptr : bias.as<float>(), params.type == NormType::LayerNorm,
                                params.eps, params.weight_offset, bf16_ptr(out), tokens, hidden, stream_),
                "add_norm");
}

namespace {

// Decode-sized GEMMs (m <= kTunedMaxRows) time cuBLASLt's first kGemmCandidates heuristic choices
// once, at the shape's first use, and keep the fastest: the first choice ran the skinny QKV and o
// projections of an 8B batch-64 step at 2.0-2.3 TB/s. Each timed run starts from a flushed L2, as
// in a decode step the weights stream from memory (timed back to back, a 33 MB matrix stays in the
// 50 MB L2 and the fastest cached algorithm wins: measured slower). Only while set_tuning() is on
// (ModelRunner: the eager first step of each decode bucket, before it is recorded; serving steps
// of other shapes keep the heuristic's first choice rather than stall), never inside stream
// capture (nothing can be timed there), and not for prefill shapes.
constexpr int kGemmCandidates = 8;
constexpr int64_t kTunedMaxRows = 256;
constexpr int kTimedRuns = 3;

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

}  // namespace

const CudaBackend::GemmPlan& CudaBackend::gemm_plan(const GemmKey& key, const void* x, const void* w) {
  auto found = gemm_plans_.find(key);
  if (found != gemm_plans_.end()) return *found->second;
  const auto [m, n, k, f32_out, alignment, ldy] = key;
  auto plan = std::make_unique<GemmPlan>();
  plan->create(CUDA_R_16BF, f32_out ? CUDA_R_32F : CUDA_R_16BF, m, n, k, k, ldy);
  const bool tune = tuning_ && m <= kTunedMaxRows && !capturing(stream_);
  cublasLtMatmulHeuristicResult_t results[kGemmCandidates] = {};
  int found_count = 0;
  const cublasStatus_t status =
      plan->find_algorithms(static_cast<cublasLtHandle_t>(lt_handle_), workspace_bytes_, static_cast<uint32_t>(alignment),
                            tune ? kGemmCandidates : 1, results, &found_count);
  SF_CUBLAS_CHECK(status, "matmul heuristic");
  SF_CHECK(found_count > 0, "cuda matmul: cuBLASLt has no algorithm for m {} n {} k {} ({} output, {}-byte alignment)",
           m, n, k, f32_out ? "f32" : "bf16", alignment);
  const int chosen = found_count > 1 ? fastest_candidate(*plan, results, found_count, x, w, m * ldy * (f32_out ? 4 : 2)) : 0;
  plan->algo = results[chosen].algo;
  return *gemm_plans_.emplace(key, std::move(plan)).first->second;
}

int CudaBackend::fastest_candidate(const GemmPlan& plan, const void* results_ptr, int count, const void* x,
                                   const void* w, int64_t y_bytes) {
  const auto* results = static_cast<const cublasLtMatmulHeuristicResult_t*>(results_ptr);
  // A scratch output, so a call that accumulates into y does not see the trial runs, and a buffer
  // written before each timed run: twice the L2, so no weight line survives from the last run.
  // Tuning is best effort: where memory is short (a KV cache sized to the last GiB) the heuristic's
  // first choice stands.
  const size_t flush_bytes = 2 * static_cast<size_t>(std::max(l2_bytes_, 1));
  void *scratch = nullptr, *flush = nullptr;
  if (cudaMalloc(&scratch, static_cast<size_t>(y_bytes)) != cudaSuccess || cudaMalloc(&flush, flush_bytes) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(scratch);
    return 0;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  SF_CUDA_CALL(cudaEventCreate(&start), "GEMM tuning event");
  SF_CUDA_CALL(cudaEventCreate(&stop), "GEMM tuning event");
  const float alpha = 1.0f, beta = 0.0f;
  const auto run = [&](int i) {
    return cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_handle_), plan.op, &alpha, w, plan.w, x, plan.x, &beta,
                          scratch, plan.y, scratch, plan.y, &results[i].algo, workspace_, workspace_bytes_, stream_);
  };
  int best = 0;
  float best_ms = std::numeric_limits<float>::infinity();
  for (int i = 0; i < count; ++i) {
    if (run(i) != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that cannot run this problem
    float total_ms = 0.0f;
    for (int r = 0; r < kTimedRuns; ++r) {
      SF_CUDA_CALL(cudaMemsetAsync(flush, r, flush_bytes, stream_), "flush L2");
      SF_CUDA_CALL(cudaEventRecord(start, stream_), "GEMM tuning event");
      run(i);
      SF_CUDA_CALL(cudaEventRecord(stop, stream_), "GEMM tuning event");
      SF_CUDA_CALL(cudaEventSynchronize(stop), "GEMM tuning");
      float ms = 0.0f;
      SF_CUDA_CALL(cudaEventElapsedTime(&ms, start, stop), "GEMM tuning");
      total_ms += ms;
    }
    if (total_ms < best_ms) best_ms = total_ms, best = i;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  SF_CUDA_CALL(cudaFree(flush), "free the L2 flush buffer");
  SF_CUDA_CALL(cudaFree(scratch), "free the GEMM tuning output");
  return best;
}

void CudaBackend::matmul(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& bias,
                         const DeviceTensor& y, bool accumulate) {
  check_dtype(x, DType::BF16, "matmul", "x");
  if (is_quant_matrix(w)) {
    quant_matmul(x, w, bias, y, accumulate);
    return;
  }
  SF_CHECK(w.dtype == DType::BF16, "cuda matmul: w has dtype {}, expected bf16 (upload() stores matrices as bf16)",
           dtype_name(w.dtype));
  SF_CHECK(y.dtype == DType::BF16 || y.dtype == DType::F32, "cuda matmul: y has dtype {}, expected bf16 or f32",
           dtype_name(y.dtype));
  SF_CHECK(x.shape.size() == 2 && w.shape.size() == 2 && x.dim(1) == w.dim(1),
           "cuda matmul: x {} and w {} do not agree (expected [m, k] and [n, k])", shape_str(x.shape),
           shape_str(w.shape));
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  check_shape(y, {m, n}, "matmul", "y");
  if (!bias.empty()) {
    check_dtype(bias, DType::F32, "matmul", "bias");
    check_shape(bias, {n}, "matmul", "bias");
  }
  if (m == 0 || n == 0) return;
  const bool f32_out = y.dtype == DType::F32;
  const float* bias_f32 = bias.empty() ? nullptr : bias.as<float>();
  if (m <= gemv_max_rows_ && gemv_supported(x.data, w.data, m, k)) {
    SF_CUDA_CALL(launch_gemv(bf16_ptr(x), bf16_ptr(w), bias_f32, f32_out ? nullptr : bf16_ptr(y),
                              f32_out ? y.as<float>() : nullptr, m, n, k, accumulate, stream_),
                  "matmul (gemv)");
    return;
  }
  const GemmPlan& plan =
      gemm_plan({m, n, k, f32_out, common_alignment({x.data, w.data, y.data}), n}, x.data, w.data);
  // beta = 1 reads y as C: the residual add happens in cuBLASLt's epilogue, in fp32.
  run_gemm(plan, x.data, w.data, y.data, 1.0f, accumulate ? 1.0f : 0.0f);
  if (bias_f32 != nullptr)
    SF_CUDA_CALL(launch_add_bias(f32_out ? nullptr : bf16_ptr(y), f32_out ? y.as<float>() : nullptr, bias_f32, m, n,
                                  stream_),
                  "matmul bias");
}

void CudaBackend::run_gemm(const GemmPlan& plan, const void* x, const void* w, void* y, float alpha, float beta) {
  SF_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_handle_), plan.op, &alpha, w, plan.w, x, plan.x, &beta,
                                 y, plan.y, y, plan.y, &plan.algo, workspace_, workspace_bytes_, stream_),
                  "matmul");
}

void CudaBackend::rope(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                       const RopeParams& params) {
  check_rope_args("cuda", DType::BF16, qkv, cos_sin, table_rows, params);
  SF_CUDA_CALL(launch_rope(bf16_ptr(qkv), cos_sin.as<float>(), table_rows.as<int32_t>(), qkv.dim(0), params.num_heads,
                            params.num_kv_heads, params.head_dim, params.rotary_dim,
                            params.style == RopeStyle::Interleaved, stream_),
                "rope");
}

void CudaBackend::write_kv(const DeviceTensor& qkv, const DeviceTensor& slots, const AttentionParams& params,
                           const DeviceTensor& k_cache, const DeviceTensor& v_cache) {
  check_write_kv_args("cuda", DType::BF16, kv_cache_dtypes(), qkv, slots, params, k_cache, v_cache);
  SF_CUDA_CALL(launch_write_kv(bf16_ptr(qkv), slots.as<int32_t>(), k_cache.data, v_cache.data, is_fp8(k_cache),
                                qkv.dim(0), params.num_heads, params.num_kv_heads, params.head_dim,
                                k_cache.dim(0) * params.block_size, stream_),
                "write_kv");
}

void CudaBackend::rope_write_kv(const DeviceTensor& qkv, const DeviceTensor& cos_sin, const DeviceTensor& table_rows,
                                const RopeParams& rope_params, const DeviceTensor& slots,
                                const AttentionParams& attention_params, const DeviceTensor& k_cache,
                                const DeviceTensor& v_cache) {
  check_rope_write_kv_args("cuda", "rope_write_kv", DType::BF16, kv_cache_dtypes(), qkv, cos_sin, table_rows,
                           rope_params, slots, attention_params, k_cache, v_cache);
  SF_CUDA_CALL(launch_rope_write_kv(bf16_ptr(qkv), cos_sin.as<float>(), table_rows.as<int32_t>(), slots.as<int32_t>(),
                                     k_cache.data, v_cache.data, is_fp8(k_cache), qkv.dim(0), rope_params.num_heads,
                                     rope_params.num_kv_heads, rope_params.head_dim, rope_params.rotary_dim,
                                     rope_params.style == RopeStyle::Interleaved,
                                     k_cache.dim(0) * attention_params.block_size, stream_),
                "rope_write_kv");
}

namespace {

// The GEMV form of an input norm: an RMSNorm whose weight was folded into the matrix; nullopt when
// the norm must run apart (a weight of its own, LayerNorm, a bias).
std::optional<GemvNorm> gemv_norm(const InputNorm& norm) {
  if (norm.empty()) return GemvNorm{};
  if (!norm.unit_weight || norm.params.type != NormType::RMSNorm || !norm.bias.empty()) return std::nullopt;
  return GemvNorm{true, norm.params.eps};
}

}  // namespace

bool CudaBackend::fold_norm_weight(const DeviceTensor& w, const DeviceTensor& norm_weight, float weight_offset) {
  // A quantized matrix keeps its bytes: its GEMVs apply the norm weight to x instead.
  if (is_quant_matrix(w)) return false;
  check_dtype(w, DType::BF16, "fold_norm_weight", "w");
  check_dtype(norm_weight, DType::F32, "fold_norm_weight", "norm_weight");
  SF_CHECK(w.shape.size() == 2, "cuda fold_norm_weight: w has shape {}, expected a matrix", shape_str(w.shape));
  check_shape(norm_weight, {w.dim(1)}, "fold_norm_weight", "norm_weight");
  SF_CUDA_CALL(launch_scale_columns(bf16_ptr(w), w.dim(0), w.dim(1), norm_weight.as<float>(), weight_offset, stream_),
                "fold_norm_weight");
  return true;
}

void CudaBackend::matmul_rope_write_kv(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                                       const DeviceTensor& bias, const DeviceTensor& qkv, const DeviceTensor& cos_sin,
                                       const DeviceTensor& table_rows, const RopeParams& rope_params,
                                       const DeviceTensor& slots, const AttentionParams& attention_params,
                                       const DeviceTensor& k_cache, const DeviceTensor& v_cache) {
  const int64_t m = x.shape.size() == 2 ? x.dim(0) : 0, k = x.shape.size() == 2 ? x.dim(1) : 0;
  if (is_quant_matrix(w) && quant_matmul_rope_write_kv(norm, x, w, bias, qkv, cos_sin, table_rows, rope_params, slots,
                                                       attention_params, k_cache, v_cache))
    return;
  const std::optional<GemvNorm> fused_norm = gemv_norm(norm);
  const bool fused = m >= 1 && m <= gemv_max_rows_ && x.dtype == DType::BF16 && w.dtype == DType::BF16 &&
                     w.shape.size() == 2 && w.dim(1) == k && gemv_supported(x.data, w.data, m, k) && fused_norm;
  if (!fused) {
    Backend::matmul_rope_write_kv(norm, x, w, bias, qkv, cos_sin, table_rows, rope_params, slots, attention_params,
                                  k_cache, v_cache);
    return;
  }
  check_rope_write_kv_args("cuda", "matmul_rope_write_kv", DType::BF16, kv_cache_dtypes(), qkv, cos_sin, table_rows,
                           rope_params, slots, attention_params, k_cache, v_cache);
  check_shape(w, {qkv.dim(1), k}, "matmul_rope_write_kv", "w");
  SF_CHECK(qkv.dim(0) == m, "cuda matmul_rope_write_kv: x has {} rows, qkv {}", m, qkv.dim(0));
  if (!bias.empty()) {
    check_dtype(bias, DType::F32, "matmul_rope_write_kv", "bias");
    check_shape(bias, {qkv.dim(1)}, "matmul_rope_write_kv", "bias");
  }
  const QkvRopeLaunch launch{bf16_ptr(x),
                             bf16_ptr(w),
                             bias.empty() ? nullptr : bias.as<float>(),
                             bf16_ptr(qkv),
                             cos_sin.as<float>(),
                             table_rows.as<int32_t>(),
                             slots.as<int32_t>(),
                             k_cache.data,
                             v_cache.data,
                             is_fp8(k_cache),
                             k,
                             k_cache.dim(0) * attention_params.block_size,
                             static_cast<int>(m),
                             rope_params.num_heads,
                             rope_params.num_kv_heads,
                             rope_params.head_dim,
                             rope_params.rotary_dim,
                             rope_params.style == RopeStyle::Interleaved,
                             *fused_norm};
  SF_CUDA_CALL(launch_gemv_qkv_rope(launch, stream_), "matmul_rope_write_kv (gemv)");
}

namespace {

AttentionLaunch attention_launch(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                 const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out,
                                 int64_t seqs, int sm_count, float* partials, int32_t* partition_counters) {
  SF_CHECK(params.head_dim <= kMaxHeadDim, "cuda attention: head_dim {} is above {}", params.head_dim, kMaxHeadDim);
  AttentionLaunch launch{bf16_ptr(q),
                         k_cache.data,
                         v_cache.data,
                         is_fp8(k_cache),
                         batch.query_start.as<int32_t>(),
                         batch.context_lens.as<int32_t>(),
                         batch.block_tables.as<int32_t>(),
                         bf16_ptr(out),
                         static_cast<int>(seqs),
                         static_cast<int>(batch.block_tables.dim(1)),
                         batch.max_query_len,
                         params.num_heads,
                         params.num_kv_heads,
                         params.head_dim,
                         params.block_size,
                         params.sliding_window,
                         params.scale,
                         static_cast<int>(q.dim(0)),
                         batch.max_context_len,
                         sm_count,
                         partials,
                         attention_partials_floats(sm_count),
                         partition_counters};
  launch.logit_softcap = params.logit_softcap;
  launch.causal = params.causal;
  return launch;
}

}  // namespace

void CudaBackend::attention(const DeviceTensor& qkv, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                            const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
  const int64_t seqs =
      check_attention_args("cuda", DType::BF16, kv_cache_dtypes(), qkv, k_cache, v_cache, batch, params, out);
  AttentionLaunch launch = attention_launch(qkv, k_cache, v_cache, batch, params, out, seqs, sm_count_,
                                            attention_partials_, partition_counters_);
  SF_CUDA_CALL(launch_attention(launch, stream_), "attention");
}

void CudaBackend::attention_with_position_bias(const DeviceTensor& qkv, const DeviceTensor& k_cache,
                                               const DeviceTensor& v_cache, const AttentionBatch& batch,
                                               const AttentionParams& params, const RelativePositionBias& bias,
                                               const DeviceTensor& out) {
  const int64_t seqs = check_biased_attention_args("cuda", DType::BF16, kv_cache_dtypes(), qkv, k_cache, v_cache,
                                                   batch, params, bias, out);
  AttentionLaunch launch = attention_launch(qkv, k_cache, v_cache, batch, params, out, seqs, sm_count_,
                                            attention_partials_, partition_counters_);
  launch.position_bias = bias.table.as<float>();
  launch.bias_buckets = bias.num_buckets;
  launch.bias_max_distance = bias.max_distance;
  launch.bias_bidirectional = bias.bidirectional;
  SF_CUDA_CALL(launch_attention(launch, stream_), "attention with position bias");
}

void CudaBackend::cross_attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                  const AttentionBatch& batch, const AttentionParams& params, const DeviceTensor& out) {
  const int64_t seqs =
      check_cross_attention_args("cuda", DType::BF16, kv_cache_dtypes(), q, k_cache, v_cache, batch, params, out);
  AttentionParams all_keys = params;  // every decoder token sees its sequence's whole encoder output
  all_keys.causal = false;
  all_keys.sliding_window = 0;
  all_keys.logit_softcap = 0;
  AttentionLaunch launch = attention_launch(q, k_cache, v_cache, batch, all_keys, out, seqs, sm_count_,
                                            attention_partials_, partition_counters_);
  launch.q_stride = q.dim(1);
  SF_CUDA_CALL(launch_attention(launch, stream_), "cross attention");
}

namespace {

int activation_code(Activation act) {
  switch (act) {
    case Activation::SiLU: return 0;
    case Activation::GELU: return 1;
    case Activation::GELUTanh: return 2;
    case Activation::ReLU: return 3;
  }
  return 0;
}

}  // namespace

void CudaBackend::activation(const DeviceTensor& x, Activation act, bool gated, const DeviceTensor& out) {
  check_dtype(x, DType::BF16, "activation", "x");
  check_dtype(out, DType::BF16, "activation", "out");
  SF_CHECK(out.shape.size() == 2, "cuda activation: out has shape {}, expected [tokens, inner]", shape_str(out.shape));
  const int64_t tokens = out.dim(0), inner = out.dim(1);
  check_shape(x, {tokens, gated ? 2 * inner : inner}, "activation", "x");
  SF_CUDA_CALL(launch_activation(bf16_ptr(x), activation_code(act), gated, bf16_ptr(out), tokens, inner, stream_),
                "activation");
}

void CudaBackend::matmul_activation(const InputNorm& norm, const DeviceTensor& x, const DeviceTensor& w,
                                    const DeviceTensor& bias, Activation act, bool gated, const DeviceTensor& product,
                                    const DeviceTensor& out) {
  const int64_t m = x.shape.size() == 2 ? x.dim(0) : 0, k = x.shape.size() == 2 ? x.dim(1) : 0;
  if (is_quant_matrix(w) && quant_matmul_activation(norm, x, w, bias, activation_code(act), gated, out)) return;
  const std::optional<GemvNorm> fused_norm = gemv_norm(norm);
  const bool fused = gated && m >= 1 && m <= gemv_max_rows_ && x.dtype == DType::BF16 && w.dtype == DType::BF16 &&
                     out.dtype == DType::BF16 && w.shape.size() == 2 && w.dim(1) == k && w.dim(0) % 2 == 0 &&
                     gemv_supported(x.data, w.data, m, k) && fused_norm;
  if (!fused) {
    Backend::matmul_activation(norm, x, w, bias, act, gated, product, out);
    return;
  }
  const int64_t inner = w.dim(0) / 2;
  check_shape(out, {m, inner}, "matmul_activation", "out");
  if (!bias.empty()) {
    check_dtype(bias, DType::F32, "matmul_activation", "bias");
    check_shape(bias, {2 * inner}, "matmul_activation", "bias");
  }
  SF_CUDA_CALL(launch_gemv_gated(bf16_ptr(x), bf16_ptr(w), bias.empty() ? nullptr : bias.as<float>(),
                                  activation_code(act), bf16_ptr(out), m, inner, k, *fused_norm, stream_),
                "matmul_activation (gated gemv)");
}

namespace {

// The checks gather_rows and scatter_rows share: packed [R, C] of table [T, C]'s dtype, rows [R] I32;
// returns the row's bytes (even: the kernels move 16-bit words).
int64_t checked_row_bytes(const char* kernel, const DeviceTensor& table, const DeviceTensor& rows,
                          const DeviceTensor& packed, const char* packed_name) {
  check_dtype(packed, table.dtype, kernel, packed_name);
  check_dtype(rows, DType::I32, kernel, "rows");
  check_shape(packed, {rows.numel(), table.row_numel()}, kernel, packed_name);
  const int64_t row_bytes = static_cast<int64_t>(table.nbytes()) / std::max<int64_t>(table.dim(0), 1);
  SF_CHECK(row_bytes % 2 == 0, "cuda {}: rows of {} bytes (the kernel moves 16-bit words)", kernel, row_bytes);
  return row_bytes;
}

}  // namespace

void CudaBackend::gather_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) {
  const int64_t row_bytes = checked_row_bytes("gather_rows", x, rows, out, "out");
  SF_CUDA_CALL(launch_gather_rows(x.data, rows.as<int32_t>(), out.data, rows.numel(), row_bytes, stream_),
                "gather_rows");
}

void CudaBackend::scatter_rows(const DeviceTensor& x, const DeviceTensor& rows, const DeviceTensor& out) {
  const int64_t row_bytes = checked_row_bytes("scatter_rows", out, rows, x, "x");
  SF_CUDA_CALL(launch_scatter_rows(x.data, rows.as<int32_t>(), out.data, rows.numel(), row_bytes, stream_),
                "scatter_rows");
}

void CudaBackend::pool_rows(const DeviceTensor& x, const DeviceTensor& offsets, Pooling pooling,
                            const DeviceTensor& out) {
  SF_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, "cuda pool_rows: x has dtype {}, expected bf16 or f32",
           dtype_name(x.dtype));
  check_dtype(offsets, DType::I32, "pool_rows", "offsets");
  check_dtype(out, DType::F32, "pool_rows", "out");
  const int64_t spans = offsets.numel() - 1, cols = x.row_numel();
  SF_CHECK(spans >= 0, "cuda pool_rows: offsets is empty (it holds spans + 1 row starts)");
  check_shape(out, {spans, cols}, "pool_rows", "out");
  const int mode = pooling == Pooling::Cls ? 0 : pooling == Pooling::Mean ? 1 : 2;
  SF_CUDA_CALL(launch_pool_rows(x.data, x.dtype == DType::F32, offsets.as<int32_t>(), mode, out.as<float>(), spans,
                                 cols, stream_),
                "pool_rows");
}

void CudaBackend::sample(const DeviceTensor& logits, const DeviceTensor& rows, const DeviceTensor& tokens) {
  check_dtype(logits, DType::F32, "sample", "logits");
  check_dtype(rows, DType::I32, "sample", "rows");
  check_dtype(tokens, DType::I32, "sample", "tokens");
  SF_CHECK(logits.shape.size() == 2, "cuda sample: logits has shape {}, expected [rows, vocab]",
           shape_str(logits.shape));
  const int64_t count = logits.dim(0), vocab = logits.dim(1);
  check_shape(rows, {count, kSamplingRowWords}, "sample", "rows");
  check_shape(tokens, {count}, "sample", "tokens");
  SF_CUDA_CALL(launch_sample(logits.as<float>(), static_cast<const SamplingRow*>(rows.data), tokens.as<int32_t>(),
                              count, vocab, stream_),
                "sample");
}

}  // namespace cuda
}  // namespace splitflow
