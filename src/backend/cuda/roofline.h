// backend/cuda/roofline.h — the two ceilings of a GPU, measured in place (METHOD.md): the
// device-to-device copy bandwidth and the bf16 GEMM rate. No CUDA types here, so the benchmark
// code outside backend/cuda can call them (only when SPLITFLOW_HAS_CUDA).
#pragma once

namespace splitflow::cuda {

// Median of timed cudaMemcpyAsync device-to-device copies of 2 GiB (CUDA events), counting bytes
// read plus bytes written, in GB/s (1e9 bytes), as DESIGN.md §3 does.
double measure_copy_bandwidth_gbps(int device);

// Median rate of a cuBLASLt 8192 x 8192 x 8192 GEMM, bf16 inputs and output, fp32 compute, on
// random inputs, in TFLOP/s (2 m n k / time).
double measure_bf16_gemm_tflops(int device);

}  // namespace splitflow::cuda
