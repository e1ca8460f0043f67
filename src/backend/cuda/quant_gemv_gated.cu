// backend/cuda/quant_gemv_gated.cu — the gated-MLP decode GEMV (gate and up rows of one warp, the activation in the epilogue), on quantized weights
// (quant_gemv.cuh).
#include "backend/cuda/quant_gemv.cuh"
#include "backend/cuda/quant_mma.cuh"

namespace splitflow::cuda {
using namespace quant_gemv_detail;

cudaError_t launch_quant_gemv_gated(const QuantMatrix& w, const bf16_bits* x, const float* bias, int act,
                                    bf16_bits* y, int64_t m, const QuantNorm& norm, cudaStream_t stream) {
  if (w.n == 0 || m == 0) return cudaSuccess;
  if (w.count != 1) return cudaErrorInvalidValue;
  const XOperand xo{x, static_cast<int>(m), w.k, norm};
  const QuantRun& run = w.runs[0];
  cudaError_t err = cudaErrorInvalidValue;
  if (quant_mma_enabled() && quant_mma_detail::with_fragment_decoder(run.dtype, [&](auto frag) {
        using Frag = decltype(frag);
        if ((err = quant_mma_detail::allow_shared_memory<quant_mma_detail::quant_mma_gated_kernel<Frag>>(quant_mma_detail::kSharedBytes<Frag>)) != cudaSuccess)
          return;
        quant_mma_detail::quant_mma_gated_kernel<Frag>
            <<<quant_mma_detail::tiles_for(w.n / 2, quant_mma_detail::kTileRows / 2), quant_mma_detail::kWarps<Frag> * 32,
               quant_mma_detail::kSharedBytes<Frag>, stream>>>(run, xo, bias, act, y);
        err = cudaGetLastError();
      }))
    return err;
  return with_dot<2>(run.dtype, m, w.k, [&](auto tag) {
    using Dot = typename decltype(tag)::type;
    const int64_t shared = Dot::shared_bytes(w.k);
    if (const cudaError_t e = allow_shared_bytes<quant_gemv_gated_kernel<Dot>>(shared); e != cudaSuccess) return e;
    quant_gemv_gated_kernel<Dot><<<grid_for<Dot>(reinterpret_cast<const void*>(&quant_gemv_gated_kernel<Dot>), w.n / 2, shared), Dot::kWarps * 32, shared, stream>>>(
        run, xo, bias, act, y);
    return cudaGetLastError();
  });
}

}  // namespace splitflow::cuda
