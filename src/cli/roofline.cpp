#include "cli/roofline.h"

#include "bench/report.h"
#include "core/error.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "backend/cuda/device_info.h"
#include "backend/cuda/roofline.h"
#endif

#include <fmt/format.h>

#include <vector>

namespace splitflow::cli {

Roofline measure_roofline(const ModelFlags& flags, int threads) {
  if (flags.backend == "cuda") {
#ifdef SPLITFLOW_HAS_CUDA
    const std::vector<cuda::DeviceInfo> devices = cuda::list_devices();
    SF_CHECK(!devices.empty(), "--backend cuda: no GPU visible");
    fmt::print(stderr, "measuring copy bandwidth and bf16 GEMM rate on {}...\n", devices[0].name);
    return {devices[0].name, cuda::measure_copy_bandwidth_gbps(0), cuda::measure_bf16_gemm_tflops(0)};
#endif
  }
  fmt::print(stderr, "measuring memory bandwidth...\n");
  return {bench::cpu_description(threads), bench::measure_cpu_read_bandwidth_gbps(threads), 0.0};
}

}  // namespace splitflow::cli
