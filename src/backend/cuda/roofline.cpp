// backend/cuda/roofline.cpp — copy bandwidth and bf16 GEMM rate (see roofline.h).
#include "backend/cuda/roofline.h"

#include "core/error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace splitflow::cuda {

namespace {

#define SF_ROOFLINE_CUDA(expr, what)                                                                  \
  do {                                                                                                \
    const cudaError_t sf_err_ = (expr);                                                               \
    SF_CHECK(sf_err_ == cudaSuccess, "cuda roofline {}: {}", what, cudaGetErrorString(sf_err_));      \
  } while (0)

#define SF_ROOFLINE_CUBLAS(expr, what)                                                                          \
  do {                                                                                                          \
    const cublasStatus_t sf_status_ = (expr);                                                                   \
    SF_CHECK(sf_status_ == CUBLAS_STATUS_SUCCESS, "cuda roofline {}: cuBLASLt {}", what,                        \
             cublasLtGetStatusString(sf_status_));                                                              \
  } while (0)

// Device memory freed on scope exit, so a failed check leaks nothing.
struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t bytes) { SF_ROOFLINE_CUDA(cudaMalloc(&ptr, bytes), "allocate"); }
  ~DeviceMemory() { cudaFree(ptr); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

struct Stream {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  Stream() {
    SF_ROOFLINE_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "create stream");
    SF_ROOFLINE_CUDA(cudaEventCreate(&start), "create event");
    SF_ROOFLINE_CUDA(cudaEventCreate(&stop), "create event");
  }
  ~Stream() {
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
    cudaStreamDestroy(stream);
  }
  // Median milliseconds of `launch` over `repeats` event-timed runs, after `warmup` untimed ones.
  double median_ms(const std::function<void()>& launch, int warmup, int repeats) {
    for (int i = 0; i < warmup; ++i) launch();
    SF_ROOFLINE_CUDA(cudaStreamSynchronize(stream), "warm-up");
    std::vector<float> times(static_cast<size_t>(repeats));
    for (float& ms : times) {
      SF_ROOFLINE_CUDA(cudaEventRecord(start, stream), "record event");
      launch();
      SF_ROOFLINE_CUDA(cudaEventRecord(stop, stream), "record event");
      SF_ROOFLINE_CUDA(cudaEventSynchronize(stop), "timed run");
      SF_ROOFLINE_CUDA(cudaEventElapsedTime(&ms, start, stop), "elapsed time");
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }
};

// Random bf16 values in [-1, 1) (never zeros: METHOD.md), from a 64-bit LCG.
std::vector<uint16_t> random_bf16(size_t count, uint64_t seed) {
  std::vector<uint16_t> values(count);
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (uint16_t& v : values) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const float x = static_cast<float>(static_cast<int32_t>(state >> 32)) / 2147483648.0f;
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    v = static_cast<uint16_t>(bits >> 16);
  }
  return values;
}

}  // namespace

double measure_copy_bandwidth_gbps(int device) {
  SF_ROOFLINE_CUDA(cudaSetDevice(device), "set device");
  const size_t bytes = size_t{2} << 30;
  DeviceMemory src(bytes), dst(bytes);
  SF_ROOFLINE_CUDA(cudaMemset(src.ptr, 0x5a, bytes), "fill source");
  Stream stream;
  const double ms = stream.median_ms(
      [&] { SF_ROOFLINE_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, stream.stream), "copy"); },
      2, 10);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

double measure_bf16_gemm_tflops(int device) {
  SF_ROOFLINE_CUDA(cudaSetDevice(device), "set device");
  constexpr int64_t n = 8192;
  const size_t elements = static_cast<size_t>(n * n);
  const size_t bytes = elements * sizeof(uint16_t);
  DeviceMemory a(bytes), b(bytes), c(bytes);
  const std::vector<uint16_t> a_host = random_bf16(elements, 1), b_host = random_bf16(elements, 2);
  SF_ROOFLINE_CUDA(cudaMemcpy(a.ptr, a_host.data(), bytes, cudaMemcpyHostToDevice), "upload A");
  SF_ROOFLINE_CUDA(cudaMemcpy(b.ptr, b_host.data(), bytes, cudaMemcpyHostToDevice), "upload B");
  const size_t workspace_bytes = size_t{32} << 20;
  DeviceMemory workspace(workspace_bytes);

  cublasLtHandle_t handle = nullptr;
  SF_ROOFLINE_CUBLAS(cublasLtCreate(&handle), "create handle");
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  // Releases the descriptors whether the measurement succeeds or throws.
  struct Cleanup {
    std::function<void()> release;
    ~Cleanup() { release(); }
  } cleanup{[&] {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (c_layout) cublasLtMatrixLayoutDestroy(c_layout);
    if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
    if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
    if (op) cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }};

  // Column-major C [n, n] = A^T B with A and B stored [k, n]: the "TN" layout of the usual GEMM benchmarks.
  SF_ROOFLINE_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t transpose = CUBLAS_OP_T;
  SF_ROOFLINE_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
                     "set transa");
  SF_ROOFLINE_CUBLAS(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_16BF, n, n, n), "layout A");
  SF_ROOFLINE_CUBLAS(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_16BF, n, n, n), "layout B");
  SF_ROOFLINE_CUBLAS(cublasLtMatrixLayoutCreate(&c_layout, CUDA_R_16BF, n, n, n), "layout C");
  SF_ROOFLINE_CUBLAS(cublasLtMatmulPreferenceCreate(&preference), "preference");
  SF_ROOFLINE_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace_bytes, sizeof workspace_bytes),
                     "set workspace");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  SF_ROOFLINE_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle, op, a_layout, b_layout, c_layout, c_layout, preference, 1,
                                                    &heuristic, &found),
                     "algorithm heuristic");
  SF_CHECK(found > 0, "cuda roofline: cuBLASLt has no algorithm for the {}^3 bf16 GEMM", n);

  const float alpha = 1.0f, beta = 0.0f;
  Stream stream;
  const double ms = stream.median_ms(
      [&] {
        SF_ROOFLINE_CUBLAS(cublasLtMatmul(handle, op, &alpha, a.ptr, a_layout, b.ptr, b_layout, &beta, c.ptr, c_layout,
                                          c.ptr, c_layout, &heuristic.algo, workspace.ptr, workspace_bytes, stream.stream),
                           "matmul");
      },
      5, 30);
  return 2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace splitflow::cuda
