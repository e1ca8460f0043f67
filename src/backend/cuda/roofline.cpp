// backend/cuda/roofline.cpp — copy bandwidth and bf16 GEMM rate (see roofline.h).
#include "backend/cuda/roofline.h"

#include "backend/cuda/cuda_check.h"
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

// Device memory freed on scope exit, so a failed check leaks nothing.
struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t bytes) { SF_CUDA_CALL(cudaMalloc(&ptr, bytes), "roofline allocate"); }
  ~DeviceMemory() { cudaFree(ptr); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

struct Stream {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  Stream() {
    SF_CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "roofline create stream");
    SF_CUDA_CALL(cudaEventCreate(&start), "roofline create event");
    SF_CUDA_CALL(cudaEventCreate(&stop), "roofline create event");
  }
  ~Stream() {
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
    cudaStreamDestroy(stream);
  }
  // Median milliseconds of `launch` over `repeats` event-timed runs, after `warmup` untimed ones.
  double median_ms(const std::function<void()>& launch, int warmup, int repeats) {
    for (int i = 0; i < warmup; ++i) launch();
    SF_CUDA_CALL(cudaStreamSynchronize(stream), "roofline warm-up");
    std::vector<float> times(static_cast<size_t>(repeats));
    for (float& ms : times) {
      SF_CUDA_CALL(cudaEventRecord(start, stream), "roofline record event");
      launch();
      SF_CUDA_CALL(cudaEventRecord(stop, stream), "roofline record event");
      SF_CUDA_CALL(cudaEventSynchronize(stop), "roofline timed run");
      SF_CUDA_CALL(cudaEventElapsedTime(&ms, start, stop), "roofline elapsed time");
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
  SF_CUDA_CALL(cudaSetDevice(device), "roofline set device");
  const size_t bytes = size_t{2} << 30;
  DeviceMemory src(bytes), dst(bytes);
  SF_CUDA_CALL(cudaMemset(src.ptr, 0x5a, bytes), "roofline fill source");
  Stream stream;
  const double ms = stream.median_ms(
      [&] { SF_CUDA_CALL(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice, stream.stream), "roofline copy"); },
      2, 10);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

double measure_bf16_gemm_tflops(int device) {
  SF_CUDA_CALL(cudaSetDevice(device), "roofline set device");
  constexpr int64_t n = 8192;
  const size_t elements = static_cast<size_t>(n * n);
  const size_t bytes = elements * sizeof(uint16_t);
  DeviceMemory a(bytes), b(bytes), c(bytes);
  const std::vector<uint16_t> a_host = random_bf16(elements, 1), b_host = random_bf16(elements, 2);
  SF_CUDA_CALL(cudaMemcpy(a.ptr, a_host.data(), bytes, cudaMemcpyHostToDevice), "roofline upload A");
  SF_CUDA_CALL(cudaMemcpy(b.ptr, b_host.data(), bytes, cudaMemcpyHostToDevice), "roofline upload B");
  const size_t workspace_bytes = size_t{32} << 20;
  DeviceMemory workspace(workspace_bytes);

  cublasLtHandle_t handle = nullptr;
  SF_CUBLAS_CHECK(cublasLtCreate(&handle), "roofline create handle");
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
  SF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "roofline matmul descriptor");
  const cublasOperation_t transpose = CUBLAS_OP_T;
  SF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
                  "roofline set transa");
  SF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_16BF, n, n, n), "roofline layout A");
  SF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_16BF, n, n, n), "roofline layout B");
  SF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_layout, CUDA_R_16BF, n, n, n), "roofline layout C");
  SF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference), "roofline preference");
  SF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes, sizeof workspace_bytes),
                  "roofline set workspace");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  SF_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, a_layout, b_layout, c_layout, c_layout, preference, 1,
                                                 &heuristic, &found),
                  "roofline algorithm heuristic");
  SF_CHECK(found > 0, "cuda roofline: cuBLASLt has no algorithm for the {}^3 bf16 GEMM", n);

  const float alpha = 1.0f, beta = 0.0f;
  Stream stream;
  const double ms = stream.median_ms(
      [&] {
        SF_CUBLAS_CHECK(cublasLtMatmul(handle, op, &alpha, a.ptr, a_layout, b.ptr, b_layout, &beta, c.ptr, c_layout,
                                       c.ptr, c_layout, &heuristic.algo, workspace.ptr, workspace_bytes, stream.stream),
                        "roofline matmul");
      },
      5, 30);
  return 2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace splitflow::cuda
