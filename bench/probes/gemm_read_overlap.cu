// bench/probes/gemm_read_overlap.cu — can a decode step hide its memory-bound attention behind
// the compute-bound GEMMs (NanoFlow-style)? Times a cuBLASLt bf16 GEMM (Llama-3-8B gate/up,
// 2048 tokens) limited to S SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET) next to a streaming read
// of 3 GiB (the stand-in for KV reads) on the other SMs, on two streams, against both run one
// after the other on every SM. A design probe for issue 4, not part of the build:
//   nvcc -O2 -arch=sm_90 -o gemm_read_overlap bench/probes/gemm_read_overlap.cu -lcublasLt && ./gemm_read_overlap
// Results: docs/perf-notes/cuda-decode.md (session 13).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#define CK(x) do { auto e = (x); if (e != 0) { printf("err %d at line %d\n", (int)e, __LINE__); return 1; } } while (0)

__global__ void __launch_bounds__(1024) stream_read(const uint4* p, size_t n, uint4* out) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) { acc.x ^= v[u].x; acc.y ^= v[u].y; acc.z ^= v[u].z; acc.w ^= v[u].w; }
  }
  for (; i < n; i += stride) { uint4 v = __ldcs(p + i); acc.x ^= v.x; }
  if (acc.x == 0x12345678) out[0] = acc;
}

int main() {
  const int M = 2048, N = 28672, K = 4096;
  __nv_bfloat16 *A, *B, *C;
  CK(cudaMalloc(&A, (size_t)M * K * 2)); CK(cudaMalloc(&B, (size_t)N * K * 2)); CK(cudaMalloc(&C, (size_t)M * N * 2));
  // Random-ish bits so the GEMM draws real power.
  cudaMemset(A, 0x3c, (size_t)M * K * 2); cudaMemset(B, 0x3b, (size_t)N * K * 2);
  const size_t bytes = size_t(3) << 30;
  uint4 *buf, *out; CK(cudaMalloc(&buf, bytes)); CK(cudaMalloc(&out, 64)); cudaMemset(buf, 1, bytes);
  void* workspace; const size_t ws = 64 << 20; CK(cudaMalloc(&workspace, ws));
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt));
  cudaStream_t s1, s2; cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float alpha = 1, beta = 0;
  cublasLtMatrixLayout_t la, lb, lc;
  // C[N x M] (col-major) = B^T[N x K] * A[K x M]: B stored [N][K] row-major = col-major K x N, transposed.
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
  auto make = [&](int sm_target, cublasLtMatmulDesc_t* d, cublasLtMatmulAlgo_t* algo) -> int {
    CK(cublasLtMatmulDescCreate(d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(*d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CK(cublasLtMatmulDescSetAttribute(*d, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
    if (sm_target > 0) CK(cublasLtMatmulDescSetAttribute(*d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof sm_target));
    cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t r; int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, *d, lb, la, lc, lc, pref, 1, &r, &found));
    if (!found) { printf("no algo\n"); return 1; }
    *algo = r.algo;
    return 0;
  };
  cudaEvent_t e0, e1, f1, f2; cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&f1); cudaEventCreate(&f2);
  auto time = [&](auto body) {
    for (int w = 0; w < 3; ++w) body();
    cudaDeviceSynchronize();
    cudaEventRecord(e0, s1);
    const int reps = 10;
    for (int r = 0; r < reps; ++r) body();
    cudaEventRecord(e1, s1);
    cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    return ms / reps;
  };
  const int gemms = 4;
  cublasLtMatmulDesc_t full_d; cublasLtMatmulAlgo_t full_a;
  if (make(0, &full_d, &full_a)) return 1;
  auto gemm_with = [&](cublasLtMatmulDesc_t d, cublasLtMatmulAlgo_t* a, cudaStream_t s) {
    cublasLtMatmul(lt, d, &alpha, B, lb, A, la, &beta, C, lc, C, lc, a, workspace, ws, s);
  };
  const float t_full = time([&] { for (int g = 0; g < gemms; ++g) gemm_with(full_d, &full_a, s1); });
  const float t_mem_full = time([&] { stream_read<<<sms, 1024, 0, s1>>>(buf, bytes / 16, out); });
  printf("%d SMs. gemm x%d on all SMs: %.2f ms (%.0f TFLOP/s); read on all SMs: %.2f ms (%.2f TB/s); serial %.2f ms\n", sms,
         gemms, t_full, gemms * 2.0 * M * N * K / t_full / 1e9, t_mem_full, bytes / t_mem_full / 1e9, t_full + t_mem_full);
  // Unpartitioned: the GEMM and a read over every SM, left to the hardware scheduler.
  const float t_naive = time([&] {
    cudaEventRecord(f1, s1); cudaStreamWaitEvent(s2, f1);
    stream_read<<<sms, 1024, 0, s2>>>(buf, bytes / 16, out);
    for (int g = 0; g < gemms; ++g) gemm_with(full_d, &full_a, s1);
    cudaEventRecord(f2, s2); cudaStreamWaitEvent(s1, f2);
  });
  printf("both on every SM, concurrent: %.2f ms -> %.2fx\n", t_naive, (t_full + t_mem_full) / t_naive);
  for (int mem_sms : {16, 24, 32, 40, 48}) {
    cublasLtMatmulDesc_t d; cublasLtMatmulAlgo_t a;
    if (make(sms - mem_sms, &d, &a)) return 1;
    const float tg = time([&] { for (int g = 0; g < gemms; ++g) gemm_with(d, &a, s1); });
    const float tm = time([&] { stream_read<<<mem_sms, 1024, 0, s1>>>(buf, bytes / 16, out); });
    const float tc = time([&] {
      cudaEventRecord(f1, s1); cudaStreamWaitEvent(s2, f1);
      stream_read<<<mem_sms, 1024, 0, s2>>>(buf, bytes / 16, out);
      for (int g = 0; g < gemms; ++g) gemm_with(d, &a, s1);
      cudaEventRecord(f2, s2); cudaStreamWaitEvent(s1, f2);
    });
    printf("read on %2d SMs: %.2f ms (%.2f TB/s) | gemm on %3d SMs: %.2f ms | concurrent %.2f ms vs serial-on-all %.2f -> %.2fx\n",
           mem_sms, tm, bytes / tm / 1e9, sms - mem_sms, tg, tc, t_full + t_mem_full, (t_full + t_mem_full) / tc);
  }
  return 0;
}
