#include "backend/cuda/fp8_gemm.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_plan.h"
#include "core/dtype.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace splitflow::cuda {

namespace {

// An f8_channel row: its fp32 scale padded to 16 bytes, then k e4m3 codes (quant/, core/dtype.h).
constexpr int64_t kRowScaleBytes = 16;

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

int64_t round_up(int64_t value, int64_t to) { return (value + to - 1) / to * to; }

template <typename T>
void set_attribute(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attribute, const T& value, const char* what) {
  SF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attribute, &value, sizeof value), what);
}

}  // namespace

Fp8Gemm::Fp8Gemm(void* lt_handle, void* workspace, size_t workspace_bytes, cudaStream_t stream)
    : lt_handle_(lt_handle), workspace_(workspace), workspace_bytes_(workspace_bytes), stream_(stream) {}

Fp8Gemm::~Fp8Gemm() {
  if (scratch_ != nullptr) cudaFree(scratch_);
  for (void* old : retired_) cudaFree(old);
}

void Fp8Gemm::add_matrix(const Tensor& host, const void* device_rows) {
  if (host.dtype != DType::F8_CHANNEL || host.shape.size() != 2) return;
  const int64_t n = host.dim(0), k = host.dim(1);
  const auto row_bytes = static_cast<int64_t>(dtype_row_bytes(DType::F8_CHANNEL, k));
  std::vector<float> scales(static_cast<size_t>(n));
  for (int64_t row = 0; row < n; ++row)
    std::memcpy(&scales[static_cast<size_t>(row)], static_cast<const uint8_t*>(host.data) + row * row_bytes, sizeof(float));
  void* device = nullptr;
  SF_CUDA_CALL(cudaMalloc(&device, scales.size() * sizeof(float)), "allocate an f8_channel matrix's scale vector");
  std::shared_ptr<void> owner(device, [](void* p) { cudaFree(p); });
  SF_CUDA_CALL(cudaMemcpyAsync(device, scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice, stream_),
               "copy an f8_channel matrix's scales");
  SF_CUDA_CALL(cudaStreamSynchronize(stream_), "copy an f8_channel matrix's scales");
  // Keyed by the rows' address: a matrix freed and another uploaded there replaces the entry.
  weight_scales_[device_rows] = std::move(owner);
}

const Fp8Gemm::Plan* Fp8Gemm::plan(const PlanKey& key) {
  if (auto found = plans_.find(key); found != plans_.end()) return found->second.get();
  const auto [m, n, k, ldw, f32_out] = key;
  // gemm_plan.h's layout, as the bf16 GEMMs: A's outer-vector scale is then w's n row scales, B's
  // x's m row scales.
  auto plan = std::make_unique<Plan>();
  plan->create(CUDA_R_8F_E4M3, f32_out ? CUDA_R_32F : CUDA_R_16BF, m, n, k, ldw, n);
  const int32_t outer_vector = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  set_attribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, outer_vector, "fp8 matmul A scale mode");
  set_attribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, outer_vector, "fp8 matmul B scale mode");
  cublasLtMatmulHeuristicResult_t result{};
  int found_count = 0;
  const cublasStatus_t status =
      plan->find_algorithms(static_cast<cublasLtHandle_t>(lt_handle_), workspace_bytes_, 16, 1, &result, &found_count);
  if (status != CUBLAS_STATUS_SUCCESS || found_count == 0) {
    spdlog::warn("fp8 matmul: cuBLASLt has no FP8 kernel with row scales for m {} n {} k {} ({}); this shape runs "
                 "weight-only",
                 m, n, k, status != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(status) : "no algorithm");
    plan.reset();
  } else {
    plan->algo = result.algo;
  }
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

bool Fp8Gemm::run(const QuantRun& w, int64_t n, int64_t k, const bf16_bits* x, int64_t m, void* y, bool f32_out,
                  bool accumulate) {
  if (w.dtype != DType::F8_CHANNEL || w.first_row != 0 || w.end_row != n || m == 0) return false;
  const auto scales = weight_scales_.find(w.data);
  if (scales == weight_scales_.end()) return false;
  if (k % 16 != 0 || w.row_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(y) % 16 != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
    return false;
  const int64_t codes_bytes = round_up(m * k, 256), need = codes_bytes + m * static_cast<int64_t>(sizeof(float));
  if (need > scratch_bytes_) {
    if (capturing(stream_)) return false;  // a graph cannot allocate: the warm-up's eager step grows it
    // The old scratch stays allocated: graphs recorded before (decode buckets) still write there.
    const int64_t bytes = std::max(need, 2 * scratch_bytes_);
    void* grown = nullptr;
    SF_CUDA_CALL(cudaMalloc(&grown, static_cast<size_t>(bytes)), fmt::format("allocate the {}-byte fp8 x scratch", bytes));
    if (scratch_ != nullptr) retired_.push_back(scratch_);
    scratch_ = grown;
    scratch_bytes_ = bytes;
  }
  const Plan* chosen = plan({m, n, k, w.row_bytes, f32_out});
  if (chosen == nullptr) return false;
  auto* codes = static_cast<uint8_t*>(scratch_);
  auto* x_scales = reinterpret_cast<float*>(codes + codes_bytes);
  SF_CUDA_CALL(launch_quantize_rows_e4m3(x, m, k, codes, x_scales, stream_), "fp8 matmul (quantize x rows)");
  const void* w_scales = scales->second.get();
  set_attribute(chosen->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scales, "fp8 matmul w scales");
  set_attribute(chosen->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, x_scales, "fp8 matmul x scales");
  // beta = 1 reads y as C: the residual add in cuBLASLt's epilogue, in fp32.
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  SF_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_handle_), chosen->op, &alpha,
                                 w.data + kRowScaleBytes, chosen->w, codes, chosen->x, &beta, y, chosen->y, y, chosen->y,
                                 &chosen->algo, workspace_, workspace_bytes_, stream_),
                  "fp8 matmul");
  return true;
}

}  // namespace splitflow::cuda
