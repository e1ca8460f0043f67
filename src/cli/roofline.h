// cli/roofline.h — the device a benchmark runs on and its ceilings, measured in the same process
// before the run, so every result names the roofline it is a fraction of.
#pragma once

#include "cli/options.h"

#include <string>

namespace splitflow::cli {

struct Roofline {
  std::string device;
  double bandwidth_gbps = 0;  // streaming read (CPU) or device-to-device copy (GPU)
  double gemm_tflops = 0;     // bf16 GEMM on a GPU; 0 on the CPU (bench latency adds its FMA peak)
};

// --backend cuda: GPU 0 (fails naming the flag when none is visible); cpu: `threads` threads.
Roofline measure_roofline(const ModelFlags& flags, int threads);

}  // namespace splitflow::cli
