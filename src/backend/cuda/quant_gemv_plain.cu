// backend/cuda/quant_gemv_plain.cu — the plain decode GEMV (y = x w^T + bias, accumulate), one launch per run of w, on quantized weights
// (quant_gemv.cuh).
#include "backend/cuda/quant_gemv.cuh"

namespace splitflow::cuda {
using namespace quant_gemv_detail;

cudaError_t launch_quant_gemv(const QuantMatrix& w, const bf16_bits* x, const float* bias, bf16_bits* y_bf16,
                              float* y_f32, int64_t m, bool accumulate, cudaStream_t stream) {
  if (w.n == 0 || m == 0) return cudaSuccess;
  const XOperand xo{x, static_cast<int>(m), w.k, QuantNorm{}};
  for (int i = 0; i < w.count; ++i) {
    const QuantRun& run = w.runs[i];
    cudaError_t err = cudaErrorInvalidValue;
    quant_decode::with_decoder(run.dtype, [&](auto dec) {
      err = with_row_bound(m, [&](auto bound) {
        constexpr int M = decltype(bound)::value;
        constexpr int warps = kWarps<decltype(dec), 1>;
        quant_gemv_kernel<decltype(dec), M><<<blocks_for(run.end_row - run.first_row, warps), warps * 32, 0,
                                              stream>>>(run, w.n, xo, bias, y_bf16, y_f32, accumulate);
        return cudaGetLastError();
      });
    });
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace splitflow::cuda
