// backend/cpu/fma_peak.h — the FLOP roofline of this machine: fp32 fused multiply-adds on the
// widest vectors the kernels use (AVX-512 or AVX2), independent chains in registers, no memory
// traffic, on the kernels' own team of num_threads (thread_team.h); the prefill GEMM is reported
// as a fraction of it.
#pragma once

namespace splitflow::cpu {

// Best of a few ~0.1 s runs, in GFLOP/s (2 FLOPs per lane per FMA).
double measure_fma_peak_gflops(int num_threads);

}  // namespace splitflow::cpu
