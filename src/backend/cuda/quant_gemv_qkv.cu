// backend/cuda/quant_gemv_qkv.cu — the QKV decode GEMV with RoPE and the KV-cache write in the epilogue, on quantized weights
// (quant_gemv.cuh).
#include "backend/cuda/quant_gemv.cuh"
#include "backend/cuda/quant_mma.cuh"

namespace splitflow::cuda {
using namespace quant_gemv_detail;

cudaError_t launch_quant_gemv_qkv_rope(const QuantMatrix& w, const QkvRopeLaunch& a, const QuantNorm& norm,
                                       cudaStream_t stream) {
  if (w.count != 1) return cudaErrorInvalidValue;
  const XOperand xo{a.x, a.m, w.k, norm};
  const int64_t rotated_heads = a.heads + a.kv_heads, half = a.rotary_dim / 2;
  const int64_t plain_rows = rotated_heads * (a.head_dim - 2 * half) + static_cast<int64_t>(a.kv_heads) * a.head_dim;
  const int64_t tasks = rotated_heads * half + (plain_rows + 1) / 2;
  const QuantRun& run = w.runs[0];
  cudaError_t err = cudaErrorInvalidValue;
  if (quant_mma_enabled() && quant_mma_detail::with_fragment_decoder(run.dtype, [&](auto frag) {
        using Frag = decltype(frag);
        if ((err = quant_mma_detail::allow_shared_memory<quant_mma_detail::quant_mma_qkv_rope_kernel<Frag>>(quant_mma_detail::kSharedBytes<Frag>)) != cudaSuccess)
          return;
        quant_mma_detail::quant_mma_qkv_rope_kernel<Frag>
            <<<quant_mma_detail::tiles_for(tasks, quant_mma_detail::kTileRows / 2), quant_mma_detail::kWarps<Frag> * 32,
               quant_mma_detail::kSharedBytes<Frag>, stream>>>(run, xo, a);
        err = cudaGetLastError();
      }))
    return err;
  return with_dot<2>(run.dtype, a.m, w.k, [&](auto tag) {
    using Dot = typename decltype(tag)::type;
    const int64_t shared = Dot::shared_bytes(w.k);
    if (const cudaError_t e = allow_shared_bytes<quant_gemv_qkv_rope_kernel<Dot>>(shared); e != cudaSuccess) return e;
    quant_gemv_qkv_rope_kernel<Dot><<<grid_for<Dot>(reinterpret_cast<const void*>(&quant_gemv_qkv_rope_kernel<Dot>), tasks, shared), Dot::kWarps * 32, shared, stream>>>(run, xo, a);
    return cudaGetLastError();
  });
}

}  // namespace splitflow::cuda
