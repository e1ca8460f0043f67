// backend/cuda/quant_gemv_plain.cu — the plain decode GEMV (y = x w^T + bias, accumulate), one launch per run of w, on quantized weights
// (quant_gemv.cuh).
#include "backend/cuda/quant_gemv.cuh"
#include "backend/cuda/quant_mma.cuh"

namespace splitflow::cuda {
using namespace quant_gemv_detail;

cudaError_t launch_quant_gemv(const QuantMatrix& w, const bf16_bits* x, const float* bias, bf16_bits* y_bf16,
                              float* y_f32, int64_t m, bool accumulate, cudaStream_t stream) {
  if (w.n == 0 || m == 0) return cudaSuccess;
  const XOperand xo{x, static_cast<int>(m), w.k, QuantNorm{}};
  for (int i = 0; i < w.count; ++i) {
    const QuantRun& run = w.runs[i];
    cudaError_t err = cudaErrorInvalidValue;
    if (quant_mma_enabled() && quant_mma_detail::with_fragment_decoder(run.dtype, [&](auto frag) {
          using Frag = decltype(frag);
          if ((err = quant_mma_detail::allow_shared_memory<quant_mma_detail::quant_mma_gemv_kernel<Frag>>(quant_mma_detail::kSharedBytes<Frag>)) != cudaSuccess)
            return;
          quant_mma_detail::quant_mma_gemv_kernel<Frag>
              <<<quant_mma_detail::tiles_for(run.end_row - run.first_row, quant_mma_detail::kTileRows),
                 quant_mma_detail::kWarps<Frag> * 32,
                 quant_mma_detail::kSharedBytes<Frag>, stream>>>(run, w.n, xo, bias, y_bf16, y_f32, accumulate);
          err = cudaGetLastError();
        })) {
      if (err != cudaSuccess) return err;
      continue;
    }
    err = with_dot<1>(run.dtype, m, w.k, [&](auto tag) {
      using Dot = typename decltype(tag)::type;
      const int64_t shared = Dot::shared_bytes(w.k);
      if (const cudaError_t e = allow_shared_bytes<quant_gemv_kernel<Dot>>(shared); e != cudaSuccess) return e;
      quant_gemv_kernel<Dot><<<grid_for<Dot>(reinterpret_cast<const void*>(&quant_gemv_kernel<Dot>), run.end_row - run.first_row, shared),
                               Dot::kWarps * 32, shared, stream>>>(run, w.n, xo, bias, y_bf16, y_f32, accumulate);
      return cudaGetLastError();
    });
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace splitflow::cuda
