// Multi-GPU tests of comm: one process per GPU, started by comm's own local launcher. Each
// CommMultiGpu test re-runs this binary once per rank with --gtest_filter=CommWorker.Run and a
// scenario name; the workers check their results with gtest (a failure makes the worker exit
// non-zero) and rank 0 writes a JSON report that the parent prints. Every world size in
// {2, 4, 6, 8} that the visible GPUs allow runs. Skips with fewer than two GPUs.
//
// Ground truth: fp64 sums of the values each rank's device holds, computed on the host
// (comm_test_util.h gives the per-element bounds).
#include <gtest/gtest.h>

#ifndef SPLITFLOW_HAS_CUDA

TEST(CommMultiGpu, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#else

#include "comm_cuda/comm_test_util.h"

#include "comm/comm_group.h"
#include "comm/launch_env.h"
#include "comm/local_launcher.h"
#include "core/error.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <map>

using namespace splitflow;
using namespace splitflow::comm;
using namespace splitflow::test;
using nlohmann::json;

namespace {

constexpr size_t kMaxBytes = size_t{64} << 20;
constexpr DType kDtypes[] = {DType::F32, DType::F16, DType::BF16};

std::vector<AllreduceAlgorithm> algorithms_for(CommGroup& group) {
  std::vector<AllreduceAlgorithm> algorithms = {AllreduceAlgorithm::Nccl};
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::OneShot, AllreduceAlgorithm::TwoShot, AllreduceAlgorithm::HalfButterfly}) {
    if (custom_supports(a, group.custom_capability(), 1)) algorithms.push_back(a);
  }
  return algorithms;
}

// A fused allreduce + residual + RMSNorm kernel to force: the algorithm, and whether LL128 stays on
// for the call (the one-shot kernel pushes over LL128 where it takes the rows, else reads).
struct FusedKernel {
  AllreduceAlgorithm algorithm;
  bool ll128;
  std::string name, report_key;
};

// The fused kernels that take [rows, hidden] of `dtype`; the one-shot LL128 kernel also on more
// than two GPUs, where it is not enabled by default (call_fused enables it for its call).
std::vector<FusedKernel> fused_kernels(const CustomAllreduce& custom, size_t rows, size_t hidden, DType dtype) {
  if (!CustomAllreduce::fused_rmsnorm_supported(hidden, dtype)) return {};
  std::vector<FusedKernel> kernels = {
      {AllreduceAlgorithm::OneShot, false, "one-shot read", "fused_one_shot_read_checks"}};
  if (custom.one_shot_rmsnorm_ll128(rows, hidden, dtype))
    kernels.push_back({AllreduceAlgorithm::OneShot, true, "one-shot LL128", "fused_one_shot_ll128_checks"});
  if (custom.two_shot_rmsnorm_supported(rows, hidden, dtype))
    kernels.push_back({AllreduceAlgorithm::TwoShot, true, "two-shot LL128", "fused_two_shot_checks"});
  return kernels;
}

// residual_out, norm_out = allreduce_add_rmsnorm through `kernel`: LL128 (and the one-shot LL128
// kernel) on, or LL128 off, for this call.
void call_fused(CustomAllreduce& custom, const FusedKernel& kernel, const void* in, const void* residual_in,
                void* residual_out, void* norm_out, const float* weight, float eps, size_t rows, size_t hidden,
                DType dtype, cudaStream_t stream) {
  const size_t ll128 = custom.ll128_max_bytes();
  const bool ll128_norm = custom.one_shot_rmsnorm_ll128_enabled();
  custom.set_ll128_max_bytes(kernel.ll128 ? ll128 : 0);
  custom.set_one_shot_rmsnorm_ll128(kernel.ll128);
  custom.allreduce_add_rmsnorm(kernel.algorithm, in, residual_in, residual_out, norm_out, weight, eps, rows, hidden,
                               dtype, stream);
  custom.set_ll128_max_bytes(ll128);
  custom.set_one_shot_rmsnorm_ll128(ll128_norm);
}

std::vector<size_t> counts_for(DType dtype) {
  const size_t max_count = kMaxBytes / dtype_size(dtype);
  return {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 127, 1000, 1023, 4097, 65535, 131073, (size_t{512} << 10) / dtype_size(dtype),
          1048577, 4194301, max_count};
}

// Host copies of every rank's input and the fp64 reference.
struct Case {
  std::vector<uint8_t> my_bytes;
  std::vector<double> sum, abs_sum;
};

Case make_case(uint64_t seed, int rank, int world_size, size_t count, DType dtype) {
  Case c;
  c.sum.assign(count, 0.0);
  c.abs_sum.assign(count, 0.0);
  for (int r = 0; r < world_size; ++r) {
    std::vector<uint8_t> bytes;
    const std::vector<double> values = rank_input(seed, r, count, dtype, r == rank ? &bytes : nullptr);
    for (size_t i = 0; i < count; ++i) {
      c.sum[i] += values[i];
      c.abs_sum[i] += std::abs(values[i]);
    }
    if (r == rank) c.my_bytes = std::move(bytes);
  }
  return c;
}

std::vector<uint8_t> download(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

struct ErrorStats {
  double mean_abs = 0, max_abs = 0;
  size_t violations = 0, first_bad = 0;
  double first_bad_value = 0, first_bad_ref = 0;
};

ErrorStats compare(const std::vector<double>& out, const std::vector<double>& ref, const std::vector<double>& abs_sum,
                   bool custom, int world_size, DType dtype) {
  ErrorStats stats;
  for (size_t i = 0; i < out.size(); ++i) {
    const double error = std::abs(out[i] - ref[i]);
    const double bound = custom ? custom_bound(ref[i], abs_sum[i], world_size, dtype) : nccl_bound(abs_sum[i], world_size, dtype);
    if (!(error <= bound)) {  // NaN (an unwritten element) fails too
      if (stats.violations++ == 0) {
        stats.first_bad = i;
        stats.first_bad_value = out[i];
        stats.first_bad_ref = ref[i];
      }
    }
    stats.mean_abs += std::isfinite(error) ? error : 1e30;
    stats.max_abs = std::max(stats.max_abs, std::isfinite(error) ? error : 1e30);
  }
  stats.mean_abs /= std::max<size_t>(out.size(), 1);
  return stats;
}

// ---- scenarios (run inside each worker) -----------------------------------------------------------

void allreduce_scenario(CommGroup& group, cudaStream_t stream, json& report) {
  const int rank = group.rank(), n = group.world_size();
  // Inputs and outputs one element past a 16-byte boundary exercise the unaligned paths.
  DeviceBuffer in(kMaxBytes + 16), out(kMaxBytes + 16);
  ASSERT_TRUE(in.ptr && out.ptr);
  for (DType dtype : kDtypes) {
    const size_t size = dtype_size(dtype);
    for (size_t count : counts_for(dtype)) {
      const Case c = make_case(1000 + count, rank, n, count, dtype);
      for (size_t shift : {size_t{0}, size}) {
        if (shift != 0 && (count > 4097 || count * size + shift > kMaxBytes)) continue;
        SF_COMM_CUDA_OK(upload(in.bytes() + shift, c.my_bytes.data(), count * size));
        for (AllreduceAlgorithm algorithm : algorithms_for(group)) {
          if (!custom_supports(algorithm, group.custom_capability(), count * size)) continue;
          SF_COMM_CUDA_OK(cudaMemsetAsync(out.ptr, 0xff, kMaxBytes + 16, stream));  // NaN in every float type
          group.allreduce(algorithm, in.bytes() + shift, out.bytes() + shift, count, dtype, stream);
          SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
          const std::vector<double> got = decode(download(out.bytes() + shift, count * size), dtype);
          const bool custom = algorithm != AllreduceAlgorithm::Nccl;
          const ErrorStats stats = compare(got, c.sum, c.abs_sum, custom, n, dtype);
          EXPECT_EQ(stats.violations, 0u) << algorithm_name(algorithm) << " " << dtype_name(dtype) << " count " << count
                                          << " shift " << shift << ": element " << stats.first_bad << " = "
                                          << stats.first_bad_value << ", fp64 " << stats.first_bad_ref;
          if (shift == 0) {
            report["accuracy"].push_back({{"dtype", dtype_name(dtype)},
                                          {"algorithm", algorithm_name(algorithm)},
                                          {"count", count},
                                          {"mean_abs_error", stats.mean_abs},
                                          {"max_abs_error", stats.max_abs}});
          }
        }
      }
    }
  }
  // In place (out == in) through the automatic choice, every size class.
  for (size_t count : {size_t{4097}, size_t{262144}, size_t{4} << 20}) {
    const Case c = make_case(7, rank, n, count, DType::BF16);
    SF_COMM_CUDA_OK(upload(in.ptr, c.my_bytes.data(), count * 2));
    group.allreduce(in.ptr, in.ptr, count, DType::BF16, stream);
    SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<double> got = decode(download(in.ptr, count * 2), DType::BF16);
    const bool custom = group.choose_allreduce(count * 2) != AllreduceAlgorithm::Nccl;
    EXPECT_EQ(compare(got, c.sum, c.abs_sum, custom, n, DType::BF16).violations, 0u) << "in place, count " << count;
  }
}

// Graph capture: a captured allreduce reads whatever its registered input holds at replay, and
// gives bit-identical results to the eager call on the same data.
void graph_scenario(CommGroup& group, cudaStream_t stream, json& report) {
  const int rank = group.rank(), n = group.world_size();
  for (DType dtype : {DType::F32, DType::BF16}) {
    const size_t size = dtype_size(dtype);
    for (size_t count : {size_t{4097}, size_t{262144}, size_t{1} << 20}) {
      const size_t bytes = count * size;
      DeviceBuffer in(bytes), in_place(bytes), eager(bytes), graphed(bytes);
      for (AllreduceAlgorithm algorithm : algorithms_for(group)) {
        if (!custom_supports(algorithm, group.custom_capability(), bytes)) continue;
        const std::string what = fmt::format("{} {} count {}", algorithm_name(algorithm), dtype_name(dtype), count);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        SF_COMM_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        group.allreduce(algorithm, in.ptr, graphed.ptr, count, dtype, stream);
        group.allreduce(algorithm, in_place.ptr, in_place.ptr, count, dtype, stream);  // captured staging copy
        SF_COMM_CUDA_OK(cudaStreamEndCapture(stream, &graph));
        SF_COMM_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        group.register_graph_buffers();
        for (uint64_t seed : {11u, 12u}) {
          const Case c = make_case(seed + count, rank, n, count, dtype);
          // Eager reference on this data.
          SF_COMM_CUDA_OK(upload(in.ptr, c.my_bytes.data(), bytes));
          group.allreduce(algorithm, in.ptr, eager.ptr, count, dtype, stream);
          SF_COMM_CUDA_OK(cudaMemcpyAsync(in_place.ptr, in.ptr, bytes, cudaMemcpyDeviceToDevice, stream));
          SF_COMM_CUDA_OK(cudaMemsetAsync(graphed.ptr, 0xff, bytes, stream));
          SF_COMM_CUDA_OK(cudaGraphLaunch(exec, stream));
          SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
          const std::vector<uint8_t> want = download(eager.ptr, bytes);
          EXPECT_TRUE(download(graphed.ptr, bytes) == want) << what << " seed " << seed << ": graph != eager";
          EXPECT_TRUE(download(in_place.ptr, bytes) == want) << what << " seed " << seed << ": in-place graph != eager";
          const bool custom = algorithm != AllreduceAlgorithm::Nccl;
          EXPECT_EQ(compare(decode(want, dtype), c.sum, c.abs_sum, custom, n, dtype).violations, 0u) << what;
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        report["graph_checks"] = report.value("graph_checks", 0) + 1;
      }
    }
  }

  // The fused allreduce + residual + RMSNorm, captured vs eager (bf16, 32 x 8192): each fused
  // kernel that takes the rows.
  const size_t rows = 32, hidden = 8192, count = rows * hidden, bytes = count * 2;
  DeviceBuffer in(bytes), res(bytes), res_eager(bytes), norm_eager(bytes), res_graph(bytes), norm_graph(bytes), w(hidden * 4);
  std::vector<float> weight(hidden, 1.25f);
  SF_COMM_CUDA_OK(upload(w.ptr, weight.data(), hidden * 4));
  std::vector<uint8_t> residual_bytes;
  rank_input(4242, -1, count, DType::BF16, &residual_bytes);
  SF_COMM_CUDA_OK(upload(res.ptr, residual_bytes.data(), bytes));
  const float* weight_device = static_cast<const float*>(w.ptr);
  CustomAllreduce& custom = *group.custom();
  for (const FusedKernel& kernel : fused_kernels(custom, rows, hidden, DType::BF16)) {
    const auto call = [&](void* res_out, void* norm_out) {
      call_fused(custom, kernel, in.ptr, res.ptr, res_out, norm_out, weight_device, 1e-6f, rows, hidden, DType::BF16,
                 stream);
    };
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    SF_COMM_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    call(res_graph.ptr, norm_graph.ptr);
    SF_COMM_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    SF_COMM_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    group.register_graph_buffers();
    const Case c = make_case(31, rank, n, count, DType::BF16);
    SF_COMM_CUDA_OK(upload(in.ptr, c.my_bytes.data(), bytes));
    call(res_eager.ptr, norm_eager.ptr);
    SF_COMM_CUDA_OK(cudaGraphLaunch(exec, stream));
    SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
    const std::string what = fmt::format("fused {}", kernel.name);
    EXPECT_TRUE(download(res_graph.ptr, bytes) == download(res_eager.ptr, bytes)) << what << " residual: graph != eager";
    EXPECT_TRUE(download(norm_graph.ptr, bytes) == download(norm_eager.ptr, bytes)) << what << " norm: graph != eager";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

// Fused allreduce + residual (every algorithm) and allreduce + residual + RMSNorm (each fused
// kernel and the unfused fallback), against fp64.
void fused_scenario(CommGroup& group, cudaStream_t stream, json& report) {
  const int rank = group.rank(), n = group.world_size();
  for (DType dtype : kDtypes) {
    const size_t size = dtype_size(dtype);
    for (size_t count : {size_t{1000}, size_t{262149}, size_t{1} << 20}) {
      const Case c = make_case(300 + count, rank, n, count, dtype);
      std::vector<uint8_t> residual_bytes;
      const std::vector<double> residual = rank_input(999, -1, count, dtype, &residual_bytes);  // same on every rank
      DeviceBuffer in(count * size), res(count * size), out(count * size);
      SF_COMM_CUDA_OK(upload(in.ptr, c.my_bytes.data(), count * size));
      SF_COMM_CUDA_OK(upload(res.ptr, residual_bytes.data(), count * size));
      std::vector<double> ref(count), abs_sum(count);
      for (size_t i = 0; i < count; ++i) {
        ref[i] = c.sum[i] + residual[i];
        abs_sum[i] = c.abs_sum[i] + std::abs(residual[i]);
      }
      for (AllreduceAlgorithm algorithm : algorithms_for(group)) {
        if (algorithm == AllreduceAlgorithm::Nccl || !custom_supports(algorithm, group.custom_capability(), count * size)) continue;
        SF_COMM_CUDA_OK(cudaMemsetAsync(out.ptr, 0xff, count * size, stream));
        group.custom()->allreduce(algorithm, in.ptr, out.ptr, count, dtype, stream, res.ptr);
        SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
        const ErrorStats stats = compare(decode(download(out.ptr, count * size), dtype), ref, abs_sum, true, n, dtype);
        EXPECT_EQ(stats.violations, 0u) << "allreduce + residual, " << algorithm_name(algorithm) << " " << dtype_name(dtype)
                                        << " count " << count << ": element " << stats.first_bad;
      }
      // The automatic path, NCCL + add where the table picks NCCL.
      SF_COMM_CUDA_OK(cudaMemsetAsync(out.ptr, 0xff, count * size, stream));
      group.allreduce_add(in.ptr, res.ptr, out.ptr, count, dtype, stream);
      SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
      const bool custom = group.choose_allreduce(count * size) != AllreduceAlgorithm::Nccl;
      // NCCL + add rounds twice: allow one more ulp.
      const std::vector<double> got = decode(download(out.ptr, count * size), dtype);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        const double bound = custom ? custom_bound(ref[i], abs_sum[i], n, dtype)
                                    : nccl_bound(c.abs_sum[i], n, dtype) + ulp(std::abs(ref[i]) + 1, dtype);
        if (!(std::abs(got[i] - ref[i]) <= bound)) ++bad;
      }
      EXPECT_EQ(bad, 0u) << "allreduce_add auto, " << dtype_name(dtype) << " count " << count;
    }

    // RMSNorm: [rows, hidden]; hidden 8192 is 512 KB at 32 rows of bf16; 1001 is no whole number of
    // packs; 2056 and 24 end rows inside a line group; 2 rows leave a GPU without a row at N = 4;
    // 47 x 4096 and 100 x 1000: more rows than the one-shot LL128 kernel's clusters, so the
    // one-shot call reads, and two-shot rows end inside a line group.
    for (auto [rows, hidden] : {std::pair<size_t, size_t>{32, 8192}, {64, 8192}, {7, 4096}, {3, 1001}, {9, 2056},
                                {5, 24}, {2, 4096}, {47, 4096}, {100, 1000}}) {
      const size_t count = rows * hidden, bytes = count * size;
      const Case c = make_case(500 + hidden, rank, n, count, dtype);
      std::vector<uint8_t> residual_bytes;
      const std::vector<double> residual = rank_input(777, -1, count, dtype, &residual_bytes);
      std::vector<float> weight(hidden);
      for (size_t i = 0; i < hidden; ++i) weight[i] = 0.5f + 0.25f * input_value(5, 0, i);
      DeviceBuffer in(bytes), res_in(bytes), res_out(bytes), norm_out(bytes), w(hidden * 4);
      SF_COMM_CUDA_OK(upload(in.ptr, c.my_bytes.data(), bytes));
      SF_COMM_CUDA_OK(upload(w.ptr, weight.data(), hidden * 4));
      const float* weight_device = static_cast<const float*>(w.ptr);
      // The group's choice (no kernel named), then each fused kernel forced where it takes the rows,
      // the LL128 ones in place (residual_out = residual_in).
      std::vector<std::optional<FusedKernel>> kernels = {std::nullopt};
      if (custom_supports(AllreduceAlgorithm::OneShot, group.custom_capability(), bytes)) {
        for (const FusedKernel& kernel : fused_kernels(*group.custom(), rows, hidden, dtype)) kernels.push_back(kernel);
      }
      for (const std::optional<FusedKernel>& kernel : kernels) {
        const bool in_place = kernel && kernel->ll128;
        const std::string path = kernel ? fmt::format("{} kernel{}", kernel->name, in_place ? ", in place" : "") : "auto";
        SF_COMM_CUDA_OK(upload(res_in.ptr, residual_bytes.data(), bytes));
        if (in_place) {
          SF_COMM_CUDA_OK(upload(res_out.ptr, residual_bytes.data(), bytes));
        } else {
          SF_COMM_CUDA_OK(cudaMemsetAsync(res_out.ptr, 0xff, bytes, stream));
        }
        SF_COMM_CUDA_OK(cudaMemsetAsync(norm_out.ptr, 0xff, bytes, stream));
        if (kernel) {
          call_fused(*group.custom(), *kernel, in.ptr, in_place ? res_out.ptr : res_in.ptr, res_out.ptr, norm_out.ptr,
                     weight_device, 1e-5f, rows, hidden, dtype, stream);
        } else {
          group.allreduce_add_rmsnorm(in.ptr, res_in.ptr, res_out.ptr, norm_out.ptr, weight_device, 1e-5f, rows, hidden,
                                      dtype, stream);
        }
        SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
        const std::vector<double> got_res = decode(download(res_out.ptr, bytes), dtype);
        const std::vector<double> got_norm = decode(download(norm_out.ptr, bytes), dtype);
        const bool custom = kernel || group.choose_allreduce(bytes) != AllreduceAlgorithm::Nccl;
        // Custom paths (a fused kernel, or the allreduce with the residual folded in) round the
        // residual once; NCCL, then add, twice.
        const bool one_rounding = custom;
        size_t bad_res = 0, bad_norm = 0;
        for (size_t row = 0; row < rows; ++row) {
          // Reference: the residual rounded to dtype (as stored), then the norm of those values.
          std::vector<double> rounded(hidden), res_bound(hidden);
          double squares = 0;
          for (size_t j = 0; j < hidden; ++j) {
            const size_t i = row * hidden + j;
            const double exact = c.sum[i] + residual[i];
            const double abs_sum = c.abs_sum[i] + std::abs(residual[i]);
            if (one_rounding) {
              res_bound[j] = custom_bound(exact, abs_sum, n, dtype);
            } else {
              const double first = nccl_bound(c.abs_sum[i], n, dtype);
              res_bound[j] = first + ulp(std::abs(exact) + first, dtype);
            }
            if (!(std::abs(got_res[i] - exact) <= res_bound[j])) ++bad_res;
            std::vector<double> one = {exact};
            encode(one, dtype);
            rounded[j] = one[0];
            squares += rounded[j] * rounded[j];
          }
          const double scale = 1.0 / std::sqrt(squares / hidden + 1e-5);
          for (size_t j = 0; j < hidden; ++j) {
            const size_t i = row * hidden + j;
            const double want = rounded[j] * scale * weight[j];
            // One rounding of the output, plus the error of the residual it was computed from.
            const double bound = ulp(std::abs(want), dtype) +
                                 std::abs(scale * weight[j]) * (res_bound[j] + ulp(std::abs(rounded[j]), dtype)) +
                                 1e-5 * std::abs(want);
            if (!(std::abs(got_norm[i] - want) <= bound)) ++bad_norm;
          }
        }
        const std::string what = fmt::format("allreduce_add_rmsnorm ({}) {} {}x{}", path, dtype_name(dtype), rows, hidden);
        EXPECT_EQ(bad_res, 0u) << what << ": residual";
        EXPECT_EQ(bad_norm, 0u) << what << ": norm";
        report["fused_checks"] = report.value("fused_checks", 0) + 1;
        if (kernel) report[kernel->report_key] = report.value(kernel->report_key, 0) + 1;
      }
    }
  }
  report["ll128"] = group.custom() != nullptr && group.custom()->ll128_max_bytes() > 0;
  report["one_shot_norm_ll128_default"] = group.custom() != nullptr && group.custom()->one_shot_rmsnorm_ll128_enabled();
}

// The protocols of one-shot (LL, LL128, read) and two-shot (LL128, read), each forced over every
// size its buffers take (LL128 only where the group allows it: NVLink), against fp64: unaligned,
// in place, with and without a residual.
enum class Protocol { LL, LL128, Read };

void force_protocol(CustomAllreduce& custom, Protocol protocol) {
  custom.set_ll_max_bytes(protocol == Protocol::LL ? custom.ll_capacity_bytes() : 0);
  custom.set_ll128_max_bytes(protocol == Protocol::LL128 ? custom.ll128_capacity_bytes() : 0);
}

void protocols_scenario(CommGroup& group, cudaStream_t stream, json& report) {
  const int rank = group.rank(), n = group.world_size();
  CustomAllreduce* custom = group.custom();
  if (custom == nullptr) return;
  report["protocol_checks"] = json::object();
  const size_t ll_default = custom->ll_max_bytes(), ll128_default = custom->ll128_max_bytes();
  const size_t capacity = std::max(custom->ll_capacity_bytes(), custom->ll128_capacity_bytes());
  struct Variant {
    const char* name;
    AllreduceAlgorithm algorithm;
    Protocol protocol;
    size_t largest;
  };
  std::vector<Variant> variants = {{"LL", AllreduceAlgorithm::OneShot, Protocol::LL, custom->ll_capacity_bytes()},
                                   {"read", AllreduceAlgorithm::OneShot, Protocol::Read, capacity},
                                   {"two-shot read", AllreduceAlgorithm::TwoShot, Protocol::Read, capacity}};
  // LL128 needs NVLink: the group switched it off elsewhere (where forcing it would be unsafe).
  if (group.topology().link == LinkType::NVLink) {
    variants.push_back({"LL128", AllreduceAlgorithm::OneShot, Protocol::LL128, custom->ll128_capacity_bytes()});
    variants.push_back({"two-shot LL128", AllreduceAlgorithm::TwoShot, Protocol::LL128, custom->ll128_capacity_bytes()});
  }
  DeviceBuffer in(capacity + 16), out(capacity + 16), res(capacity + 16);
  for (const auto& [name, algorithm, protocol, largest] : variants) {
    force_protocol(*custom, protocol);
    for (DType dtype : kDtypes) {
      const size_t size = dtype_size(dtype);
      for (size_t count : counts_for(dtype)) {
        if (count * size > largest) continue;
        const Case c = make_case(2000 + count, rank, n, count, dtype);
        std::vector<uint8_t> residual_bytes;
        const std::vector<double> residual = rank_input(555, -1, count, dtype, &residual_bytes);
        std::vector<double> with_residual(count), abs_with_residual(count);
        for (size_t i = 0; i < count; ++i) {
          with_residual[i] = c.sum[i] + residual[i];
          abs_with_residual[i] = c.abs_sum[i] + std::abs(residual[i]);
        }
        for (size_t shift : {size_t{0}, size}) {
          if (shift != 0 && count > 4097) continue;
          for (const bool add : {false, true}) {
            for (const bool in_place : {false, true}) {
              SF_COMM_CUDA_OK(upload(in.bytes() + shift, c.my_bytes.data(), count * size));
              SF_COMM_CUDA_OK(upload(res.bytes() + shift, residual_bytes.data(), count * size));
              void* target = in_place ? in.bytes() + shift : out.bytes() + shift;
              if (!in_place) SF_COMM_CUDA_OK(cudaMemsetAsync(out.ptr, 0xff, capacity + 16, stream));  // NaN
              custom->allreduce(algorithm, in.bytes() + shift, target, count, dtype, stream,
                                add ? res.bytes() + shift : nullptr);
              SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
              const std::vector<double> got = decode(download(target, count * size), dtype);
              const ErrorStats stats = compare(got, add ? with_residual : c.sum, add ? abs_with_residual : c.abs_sum,
                                               true, n, dtype);
              EXPECT_EQ(stats.violations, 0u) << name << " " << dtype_name(dtype) << " count " << count << " shift "
                                              << shift << (add ? " + residual" : "") << (in_place ? " in place" : "")
                                              << ": element " << stats.first_bad << " = " << stats.first_bad_value
                                              << ", fp64 " << stats.first_bad_ref;
            }
          }
        }
        report["protocol_checks"][name] = report["protocol_checks"].value(name, 0) + 1;
      }
    }
  }
  custom->set_ll_max_bytes(ll_default);
  custom->set_ll128_max_bytes(ll128_default);
}

// NCCL's other collectives with integer-valued f32 (exact).
void collectives_scenario(CommGroup& group, cudaStream_t stream, json& report) {
  const int rank = group.rank(), n = group.world_size();
  constexpr size_t kCount = 1000;
  std::vector<float> mine(kCount * n);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(rank * 100000 + i);
  DeviceBuffer in(mine.size() * 4), out(mine.size() * 4);
  SF_COMM_CUDA_OK(upload(in.ptr, mine.data(), mine.size() * 4));
  auto fetch = [&](size_t count) {
    std::vector<float> host(count);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), out.ptr, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };

  group.allgather(in.ptr, out.ptr, kCount, DType::F32, stream);
  std::vector<float> got = fetch(kCount * n);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[r * kCount + i], r * 100000.0f + i) << "allgather";
  }

  group.reduce_scatter(in.ptr, out.ptr, kCount, DType::F32, stream);
  got = fetch(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += r * 100000.0 + rank * kCount + i;
    ASSERT_EQ(got[i], want) << "reduce_scatter element " << i;
  }

  const int root = n - 1;
  group.broadcast(in.ptr, out.ptr, kCount, DType::F32, root, stream);
  got = fetch(kCount);
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], root * 100000.0f + i) << "broadcast";

  // Ring: every rank sends to rank + 1 and receives from rank - 1 in one group-free pair of calls
  // ordered so that no rank waits on itself (even ranks send first).
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  if (rank % 2 == 0) {
    group.send(in.ptr, kCount, DType::F32, next, stream);
    group.recv(out.ptr, kCount, DType::F32, prev, stream);
  } else {
    group.recv(out.ptr, kCount, DType::F32, prev, stream);
    group.send(in.ptr, kCount, DType::F32, next, stream);
  }
  got = fetch(kCount);
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], prev * 100000.0f + i) << "send/recv";

  EXPECT_THROW(group.send(in.ptr, kCount, DType::F32, n, stream), Error);
  if (group.choose_allreduce(kCount * 4) != AllreduceAlgorithm::Nccl) {
    EXPECT_THROW(group.allreduce(in.ptr, out.ptr, kCount, DType::I32, stream), Error);  // custom kernels sum floats only
  }
  report["nccl_version"] = NcclCommunicator::library_version();
}

// ---- parent side -------------------------------------------------------------------------------

std::vector<int> world_sizes() {
  std::vector<int> sizes;
  for (int n : {2, 4, 6, 8}) {
    if (n <= visible_gpus()) sizes.push_back(n);
  }
  return sizes;
}

json run_scenario(const std::string& scenario, int world_size) {
  const std::string report_path =
      ::testing::TempDir() + fmt::format("/sf-comm-{}-{}-{}.json", scenario, world_size, ::getpid());
  std::filesystem::remove(report_path);
  WorkerLaunch launch;
  launch.argv = {self_command_line()[0], "--gtest_filter=CommWorker.Run"};
  launch.world_size = world_size;
  launch.extra_env = {{"SPLITFLOW_COMM_TEST_SCENARIO", scenario}, {"SPLITFLOW_COMM_TEST_REPORT", report_path}};
  launch.timeout = std::chrono::seconds(150);
  const std::vector<WorkerExit> exits = run_local_workers(launch);
  for (const WorkerExit& exit : exits) {
    EXPECT_TRUE(exit.ok()) << scenario << ": rank " << exit.rank << " of " << world_size << " exited with "
                           << exit.exit_code;
  }
  std::ifstream in(report_path);
  if (!in) {
    ADD_FAILURE() << scenario << ": rank 0 wrote no report";
    return json::object();
  }
  json report = json::parse(in);
  std::filesystem::remove(report_path);
  return report;
}

}  // namespace

// The worker body: runs only when the launcher set the scenario.
TEST(CommWorker, Run) {
  const char* scenario = std::getenv("SPLITFLOW_COMM_TEST_SCENARIO");
  if (!scenario) GTEST_SKIP() << "runs only as a worker of a CommMultiGpu test";
  CommOptions options;
  options.custom_max_bytes = kMaxBytes;
  std::unique_ptr<CommGroup> group = CommGroup::create(parse_launch_env(current_environment()), options);
  cudaStream_t stream = nullptr;
  SF_COMM_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  json report = {{"world_size", group->world_size()},
                 {"link", link_name(group->topology().link)},
                 {"topology", group->topology().description}};
  const std::string name = scenario;
  if (name == "allreduce") allreduce_scenario(*group, stream, report);
  else if (name == "graph") graph_scenario(*group, stream, report);
  else if (name == "fused") fused_scenario(*group, stream, report);
  else if (name == "protocols") protocols_scenario(*group, stream, report);
  else if (name == "collectives") collectives_scenario(*group, stream, report);
  else FAIL() << "unknown scenario " << name;
  SF_COMM_CUDA_OK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  if (group->rank() == 0) std::ofstream(std::getenv("SPLITFLOW_COMM_TEST_REPORT")) << report.dump(1);
  group.reset();
}

TEST(CommMultiGpu, AllreduceMatchesFp64ForEverySizeDtypeAndAlgorithm) {
  if (world_sizes().empty()) GTEST_SKIP() << "needs at least 2 GPUs";
  for (int n : world_sizes()) {
    const json report = run_scenario("allreduce", n);
    if (!report.contains("accuracy")) continue;
    fmt::print("[comm accuracy] N={} link={} ({})\n", n, report.value("link", "?"), report.value("topology", ""));
    fmt::print("[comm accuracy] | dtype | algorithm | elements | mean abs error | max abs error |\n");
    // The largest size per dtype and algorithm: the table the design note reports.
    std::map<std::string, double> nccl_mae;  // by dtype
    for (const json& row : report["accuracy"]) {
      const size_t count = row["count"];
      if (count * dtype_size(parse_dtype(row["dtype"].get<std::string>())) != kMaxBytes) continue;
      fmt::print("[comm accuracy] | {} | {} | {} | {:.4g} | {:.4g} |\n", row["dtype"].get<std::string>(),
                 row["algorithm"].get<std::string>(), count, row["mean_abs_error"].get<double>(),
                 row["max_abs_error"].get<double>());
      if (row["algorithm"] == "nccl") nccl_mae[row["dtype"].get<std::string>()] = row["mean_abs_error"].get<double>();
    }
    // fp32 accumulation: never less accurate than NCCL (equal at two ranks, where NCCL adds once).
    for (const json& row : report["accuracy"]) {
      const size_t count = row["count"];
      const std::string dtype = row["dtype"];
      if (count * dtype_size(parse_dtype(dtype)) != kMaxBytes || row["algorithm"] == "nccl") continue;
      EXPECT_LE(row["mean_abs_error"].get<double>(), nccl_mae[dtype] * 1.02 + 1e-12)
          << row["algorithm"].get<std::string>() << " " << dtype << " N=" << n;
    }
  }
}

TEST(CommMultiGpu, GraphCapturedAllreduceEqualsEager) {
  if (world_sizes().empty()) GTEST_SKIP() << "needs at least 2 GPUs";
  for (int n : world_sizes()) {
    const json report = run_scenario("graph", n);
    EXPECT_GT(report.value("graph_checks", 0), 0) << "N=" << n;
  }
}

TEST(CommMultiGpu, FusedResidualAndRmsNorm) {
  if (world_sizes().empty()) GTEST_SKIP() << "needs at least 2 GPUs";
  for (int n : world_sizes()) {
    const json report = run_scenario("fused", n);
    // Every dtype and shape through the group's choice, most through the one-shot kernel too.
    EXPECT_GE(report.value("fused_checks", 0), 21) << "N=" << n;
    EXPECT_GT(report.value("fused_one_shot_read_checks", 0), 0) << "N=" << n;
    // The one-shot LL128 kernel runs by default where it was measured (two GPUs); forced elsewhere.
    EXPECT_EQ(report.value("one_shot_norm_ll128_default", false), n == 2) << "N=" << n;
    if (report.value("ll128", false)) {
      EXPECT_GT(report.value("fused_one_shot_ll128_checks", 0), 0) << "N=" << n;
      EXPECT_GT(report.value("fused_two_shot_checks", 0), 0) << "N=" << n;
    }
  }
}

TEST(CommMultiGpu, ProtocolsMatchFp64) {
  if (world_sizes().empty()) GTEST_SKIP() << "needs at least 2 GPUs";
  for (int n : world_sizes()) {
    const json report = run_scenario("protocols", n);
    const json checks = report.value("protocol_checks", json::object());
    EXPECT_GT(checks.value("LL", 0), 0) << "N=" << n;
    EXPECT_GT(checks.value("read", 0), 0) << "N=" << n;
    EXPECT_GT(checks.value("two-shot read", 0), 0) << "N=" << n;
    if (report.value("link", "") == "nvlink") {
      EXPECT_GT(checks.value("LL128", 0), 0) << "N=" << n;
      EXPECT_GT(checks.value("two-shot LL128", 0), 0) << "N=" << n;
    }
    fmt::print("[comm] N={} protocol checks: {}\n", n, checks.dump());
  }
}

TEST(CommMultiGpu, NcclCollectives) {
  if (world_sizes().empty()) GTEST_SKIP() << "needs at least 2 GPUs";
  for (int n : world_sizes()) {
    const json report = run_scenario("collectives", n);
    fmt::print("[comm] N={} NCCL {}\n", n, report.value("nccl_version", "?"));
  }
}

TEST(CommSingleGpu, WorldOfOneUsesNccl) {
  if (visible_gpus() < 1) GTEST_SKIP() << "no GPU";
  std::unique_ptr<CommGroup> group = CommGroup::create(parse_launch_env({}));
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->custom(), nullptr);
  EXPECT_EQ(group->choose_allreduce(4096), AllreduceAlgorithm::Nccl);
  std::vector<float> host = {1.5f, -2.0f, 3.25f};
  DeviceBuffer in(12), out(12);
  ASSERT_EQ(upload(in.ptr, host.data(), 12), cudaSuccess);
  group->allreduce(in.ptr, out.ptr, 3, DType::F32, nullptr);
  std::vector<float> got(3);
  ASSERT_EQ(cudaMemcpy(got.data(), out.ptr, 12, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, host);
}

#endif  // SPLITFLOW_HAS_CUDA
