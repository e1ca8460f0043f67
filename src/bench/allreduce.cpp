#include "bench/allreduce.h"

#include "bench/report.h"
#include "core/dtype.h"
#include "core/error.h"

#ifdef SPLITFLOW_HAS_CUDA
#include "comm/comm_group.h"
#include "comm/elementwise.h"
#include "comm/launch_env.h"
#include "comm/local_launcher.h"

#include <cuda_runtime.h>
#endif

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>

namespace splitflow::bench {

#ifndef SPLITFLOW_HAS_CUDA

void run_allreduce_bench(const AllreduceBenchOptions&) {
  fail("bench allreduce: this splitflow was built without CUDA (configure with -DSPLITFLOW_CUDA=ON)");
}

#else

namespace {

using comm::AllreduceAlgorithm;
using nlohmann::json;

#define SF_BENCH_CUDA(call)                                                                             \
  do {                                                                                                  \
    const cudaError_t sf_status = (call);                                                               \
    if (sf_status != cudaSuccess) fail("bench allreduce: {} failed: {}", #call, cudaGetErrorString(sf_status)); \
  } while (0)

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string size_label(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return fmt::format("{} MB", bytes >> 20);
  if (bytes >= (size_t{1} << 10)) return fmt::format("{} KB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

class Worker {
 public:
  Worker(comm::CommGroup& group, const AllreduceBenchOptions& options) : group_(group), options_(options) {
    SF_BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SF_BENCH_CUDA(cudaEventCreate(&start_));
    SF_BENCH_CUDA(cudaEventCreate(&stop_));
    SF_BENCH_CUDA(cudaMalloc(&flag_, sizeof(float)));
  }
  ~Worker() {
    cudaFree(flag_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  cudaStream_t stream() const { return stream_; }

  // Every rank leaves together (as far as a host can tell), with an empty stream.
  void sync_ranks() {
    group_.nccl().allreduce(flag_, flag_, 1, DType::F32, stream_);
    SF_BENCH_CUDA(cudaStreamSynchronize(stream_));
  }

  // Microseconds per call of `call`, issued back to back: the median over the trials.
  double time_eager(const std::function<void()>& call, int calls) {
    for (int i = 0; i < 3; ++i) call();
    std::vector<double> trials;
    for (int t = 0; t < options_.trials; ++t) {
      sync_ranks();
      SF_BENCH_CUDA(cudaEventRecord(start_, stream_));
      for (int i = 0; i < calls; ++i) call();
      SF_BENCH_CUDA(cudaEventRecord(stop_, stream_));
      trials.push_back(elapsed_us() / calls);
    }
    return median(trials);
  }

  // The same with `graph_calls` calls captured in one graph, replayed so that about `calls` run.
  double time_graph(const std::function<void()>& call, int calls) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    SF_BENCH_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < options_.graph_calls; ++i) call();
    SF_BENCH_CUDA(cudaStreamEndCapture(stream_, &graph));
    SF_BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    group_.register_graph_buffers();
    SF_BENCH_CUDA(cudaGraphLaunch(exec, stream_));
    const int replays = std::max(1, calls / options_.graph_calls);
    std::vector<double> trials;
    for (int t = 0; t < options_.trials; ++t) {
      sync_ranks();
      SF_BENCH_CUDA(cudaEventRecord(start_, stream_));
      for (int r = 0; r < replays; ++r) SF_BENCH_CUDA(cudaGraphLaunch(exec, stream_));
      SF_BENCH_CUDA(cudaEventRecord(stop_, stream_));
      trials.push_back(elapsed_us() / (replays * options_.graph_calls));
    }
    SF_BENCH_CUDA(cudaGraphExecDestroy(exec));
    SF_BENCH_CUDA(cudaGraphDestroy(graph));
    return median(trials);
  }

 private:
  double elapsed_us() {
    SF_BENCH_CUDA(cudaEventSynchronize(stop_));
    float ms = 0;
    SF_BENCH_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1000.0;
  }

  comm::CommGroup& group_;
  const AllreduceBenchOptions& options_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  float* flag_ = nullptr;
};

int calls_for(size_t bytes) { return bytes <= (size_t{1} << 20) ? 200 : bytes <= (size_t{16} << 20) ? 60 : 20; }

std::vector<AllreduceAlgorithm> algorithms(const comm::CommGroup& group) {
  std::vector<AllreduceAlgorithm> list = {AllreduceAlgorithm::Nccl};
  for (AllreduceAlgorithm a : {AllreduceAlgorithm::OneShot, AllreduceAlgorithm::TwoShot, AllreduceAlgorithm::HalfButterfly}) {
    if (comm::custom_supports(a, group.custom_capability(), 1)) list.push_back(a);
  }
  return list;
}

// Random finite values (a fixed pattern is as good as any for timing, but not zeros).
void fill(void* device, size_t bytes) {
  std::vector<uint16_t> host(bytes / 2);
  uint32_t state = 12345;
  for (uint16_t& v : host) {
    state = state * 1664525u + 1013904223u;
    v = 0x3c00 | (state >> 22);  // values in [1, 2) for f16, small positive for bf16/f32 halves
  }
  SF_BENCH_CUDA(cudaMemcpy(device, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  SF_BENCH_CUDA(cudaDeviceSynchronize());  // a pageable copy may still be in flight on return
}

json run_worker(comm::CommGroup& group, const AllreduceBenchOptions& options) {
  const DType dtype = parse_dtype(options.dtype);
  SF_CHECK(dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16, "bench allreduce: --dtype {} (f32, f16, bf16)",
           options.dtype);
  const size_t element = dtype_size(dtype);
  const int n = group.world_size();
  Worker worker(group, options);
  cudaStream_t stream = worker.stream();
  void *in = nullptr, *out = nullptr;
  SF_BENCH_CUDA(cudaMalloc(&in, options.max_bytes));
  SF_BENCH_CUDA(cudaMalloc(&out, options.max_bytes));
  fill(in, options.max_bytes);

  json rows = json::array();
  const std::vector<AllreduceAlgorithm> list = algorithms(group);
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    const size_t count = bytes / element;
    for (AllreduceAlgorithm algorithm : list) {
      auto call = [&] {
        if (algorithm == AllreduceAlgorithm::Nccl) {
          group.nccl().allreduce(in, out, count, dtype, stream);
        } else {
          group.custom()->allreduce(algorithm, in, out, count, dtype, stream);
        }
      };
      for (const char* mode : {"eager", "graph"}) {
        const double us = std::string(mode) == "eager" ? worker.time_eager(call, calls_for(bytes))
                                                        : worker.time_graph(call, calls_for(bytes));
        const double busbw = bytes / (us * 1e-6) / 1e9 * 2.0 * (n - 1) / n;
        rows.push_back({{"bytes", bytes},
                        {"algorithm", comm::algorithm_name(algorithm)},
                        {"mode", mode},
                        {"latency_us", us},
                        {"busbw_gbps", busbw}});
      }
    }
  }

  // Grid limit sweep (graph mode), restored afterwards.
  json sweep = json::array();
  if (comm::CustomAllreduce* custom = group.custom()) {
    const int default_blocks = custom->max_blocks();
    for (size_t bytes : {size_t{32} << 10, size_t{512} << 10, size_t{4} << 20, size_t{64} << 20}) {
      if (bytes > options.max_bytes || bytes < options.min_bytes) continue;
      for (AllreduceAlgorithm algorithm : {AllreduceAlgorithm::OneShot, AllreduceAlgorithm::TwoShot}) {
        for (int blocks : options.sweep_blocks) {
          custom->set_max_blocks(blocks);
          const size_t count = bytes / element;
          const double us =
              worker.time_graph([&] { custom->allreduce(algorithm, in, out, count, dtype, stream); }, calls_for(bytes));
          sweep.push_back({{"bytes", bytes}, {"algorithm", comm::algorithm_name(algorithm)}, {"max_blocks", blocks}, {"latency_us", us}});
        }
      }
    }
    custom->set_max_blocks(default_blocks);
  }

  // The protocols at the sizes LL or LL128 may take (graph), one-shot: pushed packs with flags (LL),
  // pushed 128-byte lines with flags (LL128, NVLink only; timed at every world size, also where
  // its default limit is 0) and reading the peers' buffers between barriers; the LL and LL128
  // limits come from this table. Two-shot: LL128 lines or reads with barriers.
  json protocols = json::array();
  if (comm::CustomAllreduce* custom = group.custom()) {
    const size_t ll_default = custom->ll_max_bytes(), ll_capacity = custom->ll_capacity_bytes();
    const size_t ll128_default = custom->ll128_max_bytes();
    const size_t ll128_capacity =
        group.topology().link == comm::LinkType::NVLink ? custom->ll128_capacity_bytes() : 0;
    const size_t largest = std::min(std::max(ll_capacity, ll128_capacity), options.max_bytes);
    for (size_t bytes = options.min_bytes; bytes <= largest; bytes *= 2) {
      const size_t count = bytes / element;
      json row = {{"bytes", bytes}};
      const auto time = [&](const char* protocol, AllreduceAlgorithm algorithm, size_t ll_max, size_t ll128_max) {
        custom->set_ll_max_bytes(ll_max);
        custom->set_ll128_max_bytes(ll128_max);
        row[protocol] = worker.time_graph([&] { custom->allreduce(algorithm, in, out, count, dtype, stream); },
                                          calls_for(bytes));
      };
      if (bytes <= ll_capacity) time("ll_us", AllreduceAlgorithm::OneShot, ll_capacity, 0);
      if (bytes <= ll128_capacity) time("ll128_us", AllreduceAlgorithm::OneShot, 0, ll128_capacity);
      time("read_us", AllreduceAlgorithm::OneShot, 0, 0);
      if (bytes <= ll128_capacity) time("two_shot_ll128_us", AllreduceAlgorithm::TwoShot, 0, ll128_capacity);
      time("two_shot_read_us", AllreduceAlgorithm::TwoShot, 0, 0);
      protocols.push_back(row);
    }
    custom->set_ll_max_bytes(ll_default);
    custom->set_ll128_max_bytes(ll128_default);
  }

  // allreduce + residual + RMSNorm: each fused kernel and the group's choice vs three launches
  // (the selected custom allreduce or NCCL, add, norm), for each row count.
  json fused = json::array();
  const size_t hidden = options.fused_hidden;
  comm::CustomAllreduce* custom = group.custom();
  for (size_t rows_n : options.fused_rows) {
    const size_t fused_count = rows_n * hidden, fused_bytes = fused_count * element;
    if (!custom || fused_bytes > options.max_bytes || !comm::CustomAllreduce::fused_rmsnorm_supported(hidden, dtype)) continue;
    void *residual = nullptr, *residual_out = nullptr, *norm_out = nullptr;
    float* weight = nullptr;
    SF_BENCH_CUDA(cudaMalloc(&residual, fused_bytes));
    SF_BENCH_CUDA(cudaMalloc(&residual_out, fused_bytes));
    SF_BENCH_CUDA(cudaMalloc(&norm_out, fused_bytes));
    SF_BENCH_CUDA(cudaMalloc(&weight, hidden * sizeof(float)));
    fill(residual, fused_bytes);
    std::vector<float> ones(hidden, 1.0f);
    SF_BENCH_CUDA(cudaMemcpy(weight, ones.data(), hidden * sizeof(float), cudaMemcpyHostToDevice));
    const float eps = 1e-5f;
    // The baselines use the custom algorithm the group selects for this size (its best protocol).
    AllreduceAlgorithm selected = group.choose_allreduce(fused_bytes);
    if (selected == AllreduceAlgorithm::Nccl) selected = AllreduceAlgorithm::OneShot;
    const std::string name = std::string(comm::algorithm_name(selected));
    const auto fused_kernel = [&](AllreduceAlgorithm algorithm) {
      return [&, algorithm] {
        custom->allreduce_add_rmsnorm(algorithm, in, residual, residual_out, norm_out, weight, eps, rows_n, hidden, dtype,
                                      stream);
      };
    };
    std::vector<std::pair<std::string, std::function<void()>>> variants;
    // The one-shot LL128 kernel wherever it takes the rows: enabled for the call also where it is
    // not by default (more than two GPUs).
    const bool ll128_norm_default = custom->one_shot_rmsnorm_ll128_enabled();
    if (custom->one_shot_rmsnorm_ll128(rows_n, hidden, dtype))
      variants.push_back({"fused one-shot LL128 (1 kernel)", [&, ll128_norm_default] {
                            custom->set_one_shot_rmsnorm_ll128(true);
                            fused_kernel(AllreduceAlgorithm::OneShot)();
                            custom->set_one_shot_rmsnorm_ll128(ll128_norm_default);
                          }});
    // The one-shot kernel that reads the peers' staged inputs: LL128 off for the call (it is chosen
    // on the host, so a captured graph keeps it).
    variants.push_back({"fused one-shot read (1 kernel)", [&, ll128 = custom->ll128_max_bytes()] {
                          custom->set_ll128_max_bytes(0);
                          fused_kernel(AllreduceAlgorithm::OneShot)();
                          custom->set_ll128_max_bytes(ll128);
                        }});
    if (custom->two_shot_rmsnorm_supported(rows_n, hidden, dtype))
      variants.push_back({"fused two-shot LL128 (1 kernel)", fused_kernel(AllreduceAlgorithm::TwoShot)});
    variants.push_back({"CommGroup::allreduce_add_rmsnorm (the group's choice)", [&] {
                          group.allreduce_add_rmsnorm(in, residual, residual_out, norm_out, weight, eps, rows_n, hidden,
                                                      dtype, stream);
                        }});
    variants.push_back({name + " allreduce + add + rmsnorm (3 launches)", [&] {
                          custom->allreduce(selected, in, out, fused_count, dtype, stream);
                          comm::add(out, residual, residual_out, fused_count, dtype, stream);
                          comm::rms_norm(residual_out, weight, norm_out, rows_n, hidden, eps, dtype, stream);
                        }});
    variants.push_back({"nccl allreduce + add + rmsnorm (3 launches)", [&] {
                          group.nccl().allreduce(in, out, fused_count, dtype, stream);
                          comm::add(out, residual, residual_out, fused_count, dtype, stream);
                          comm::rms_norm(residual_out, weight, norm_out, rows_n, hidden, eps, dtype, stream);
                        }});
    variants.push_back({name + " allreduce+residual (1 kernel) + rmsnorm", [&] {
                          custom->allreduce(selected, in, residual_out, fused_count, dtype, stream, residual);
                          comm::rms_norm(residual_out, weight, norm_out, rows_n, hidden, eps, dtype, stream);
                        }});
    for (const auto& [variant, call] : variants) {
      fused.push_back({{"rows", rows_n},
                       {"hidden", hidden},
                       {"variant", variant},
                       {"eager_us", worker.time_eager(call, 200)},
                       {"graph_us", worker.time_graph(call, 200)}});
    }
    SF_BENCH_CUDA(cudaStreamSynchronize(stream));
    cudaFree(weight);
    cudaFree(norm_out);
    cudaFree(residual_out);
    cudaFree(residual);
  }
  SF_BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaFree(out);
  cudaFree(in);

  cudaDeviceProp properties{};
  SF_BENCH_CUDA(cudaGetDeviceProperties(&properties, group.device()));
  json result = {{"benchmark", "allreduce"},
                 {"device", fmt::format("{} x{}", properties.name, n)},
                 {"world_size", n},
                 {"link", comm::link_name(group.topology().link)},
                 {"topology", group.topology().description},
                 {"nccl_version", comm::NcclCommunicator::library_version()},
                 {"dtype", dtype_name(dtype)},
                 {"custom_max_blocks", group.custom() ? group.custom()->max_blocks() : 0},
                 {"rows", rows},
                 {"sweep", sweep},
                 {"protocols", protocols},
                 {"one_shot_ll_max_bytes", group.custom() ? group.custom()->ll_max_bytes() : 0},
                 {"one_shot_ll128_max_bytes", group.custom() ? group.custom()->ll128_max_bytes() : 0},
                 {"fused", fused}};
  return result;
}

double find(const json& rows, size_t bytes, const std::string& algorithm, const std::string& mode) {
  for (const json& row : rows) {
    if (row["bytes"] == bytes && row["algorithm"] == algorithm && row["mode"] == mode) return row["latency_us"];
  }
  return 0;
}

void print_tables(const json& result, const AllreduceBenchOptions& options) {
  const json& rows = result["rows"];
  std::vector<std::string> algorithms;
  for (const json& row : rows) {
    const std::string name = row["algorithm"];
    if (std::find(algorithms.begin(), algorithms.end(), name) == algorithms.end()) algorithms.push_back(name);
  }
  const int n = result["world_size"];
  comm::CustomCapability capability{algorithms.size() > 1, comm::LinkType::NVLink, n, options.max_bytes};
  capability.link = result["link"] == "nvlink" ? comm::LinkType::NVLink
                    : result["link"] == "pcie" ? comm::LinkType::PCIe
                                               : comm::LinkType::None;
  fmt::print("\nallreduce latency (us), {} GPUs ({}), {}, {}\n", n, result["link"].get<std::string>(),
             result["dtype"].get<std::string>(), result["device"].get<std::string>());
  std::string header = "| size |", rule = "|---|";
  for (const char* mode : {"eager", "graph"}) {
    for (const std::string& a : algorithms) {
      header += fmt::format(" {} {} |", a, mode);
      rule += "---|";
    }
  }
  header += " best custom / nccl (graph) | selected |";
  rule += "---|---|";
  fmt::print("{}\n{}\n", header, rule);
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    std::string line = fmt::format("| {} |", size_label(bytes));
    for (const char* mode : {"eager", "graph"}) {
      for (const std::string& a : algorithms) line += fmt::format(" {:.1f} |", find(rows, bytes, a, mode));
    }
    double best = 1e30;
    for (const std::string& a : algorithms) {
      if (a != "nccl") best = std::min(best, find(rows, bytes, a, "graph"));
    }
    const double nccl = find(rows, bytes, "nccl", "graph");
    line += algorithms.size() > 1 ? fmt::format(" {:.2f} |", best / nccl) : " - |";
    line += fmt::format(" {} |", comm::algorithm_name(comm::select_allreduce(bytes, capability)));
    fmt::print("{}\n", line);
  }

  fmt::print("\nbus bandwidth (GB/s, graph), 2(N-1)/N x bytes / time\n| size |");
  std::string bandwidth_rule = "|---|";
  for (const std::string& a : algorithms) {
    fmt::print(" {} |", a);
    bandwidth_rule += "---|";
  }
  fmt::print("\n{}\n", bandwidth_rule);
  for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 2) {
    fmt::print("| {} |", size_label(bytes));
    for (const std::string& a : algorithms) {
      const double us = find(rows, bytes, a, "graph");
      fmt::print(" {:.1f} |", us > 0 ? bytes / (us * 1e-6) / 1e9 * 2.0 * (n - 1) / n : 0.0);
    }
    fmt::print("\n");
  }

  if (!result["sweep"].empty()) {
    fmt::print("\ncustom kernels' grid limit (graph, us)\n| size | algorithm |");
    for (int blocks : options.sweep_blocks) fmt::print(" {} blocks |", blocks);
    fmt::print("\n|---|---|");
    for (size_t i = 0; i < options.sweep_blocks.size(); ++i) fmt::print("---|");
    fmt::print("\n");
    std::map<std::pair<size_t, std::string>, std::vector<double>> table;
    std::vector<std::pair<size_t, std::string>> order;
    for (const json& row : result["sweep"]) {
      const std::pair<size_t, std::string> key{row["bytes"].get<size_t>(), row["algorithm"].get<std::string>()};
      if (!table.count(key)) order.push_back(key);
      table[key].push_back(row["latency_us"]);
    }
    for (const auto& key : order) {
      fmt::print("| {} | {} |", size_label(key.first), key.second);
      for (double us : table[key]) fmt::print(" {:.1f} |", us);
      fmt::print("\n");
    }
  }

  if (!result["protocols"].empty()) {
    fmt::print("\nprotocols (graph, us; one-shot: LL by default up to {}, LL128 above it up to {};"
               " two-shot: LL128 up to the same limit)\n"
               "| size | one-shot LL | one-shot LL128 | one-shot read | two-shot LL128 | two-shot read |\n"
               "|---|---|---|---|---|---|\n",
               size_label(result["one_shot_ll_max_bytes"].get<size_t>()),
               size_label(result.value("one_shot_ll128_max_bytes", size_t{0})));
    const auto cell = [](const json& row, const char* key) {
      return row.contains(key) ? fmt::format("{:.1f}", row[key].get<double>()) : std::string("-");
    };
    for (const json& row : result["protocols"]) {
      fmt::print("| {} | {} | {} | {} | {} | {} |\n", size_label(row["bytes"].get<size_t>()), cell(row, "ll_us"),
                 cell(row, "ll128_us"), cell(row, "read_us"), cell(row, "two_shot_ll128_us"),
                 cell(row, "two_shot_read_us"));
    }
  }

  if (!result["fused"].empty()) {
    fmt::print("\nallreduce + residual + RMSNorm, rows x {} {}; ratio: the 3 launches of the selected algorithm / this (graph)\n"
               "| rows (KB) | variant | eager us | graph us | ratio |\n|---|---|---|---|---|\n",
               options.fused_hidden, result["dtype"].get<std::string>());
    const size_t element = dtype_size(parse_dtype(result["dtype"].get<std::string>()));
    for (const json& row : result["fused"]) {
      double baseline = 0;
      for (const json& other : result["fused"]) {
        const std::string variant = other["variant"];
        if (other["rows"] == row["rows"] && variant.find("(3 launches)") != std::string::npos && variant.rfind("nccl", 0) != 0)
          baseline = other["graph_us"];
      }
      const size_t rows_n = row["rows"];
      fmt::print("| {} ({}) | {} | {:.1f} | {:.1f} | {:.2f} |\n", rows_n, rows_n * options.fused_hidden * element / 1024,
                 row["variant"].get<std::string>(), row["eager_us"].get<double>(), row["graph_us"].get<double>(),
                 baseline / row["graph_us"].get<double>());
    }
  }
}

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

}  // namespace

void run_allreduce_bench(const AllreduceBenchOptions& options) {
  SF_CHECK(options.min_bytes >= 16 && options.min_bytes <= options.max_bytes,
           "bench allreduce: --min-bytes {} must be at least 16 and at most --max-bytes {}", options.min_bytes,
           options.max_bytes);
  SF_CHECK(options.graph_calls >= 1 && options.trials >= 1, "bench allreduce: --graph-calls and --trials must be positive");
  const comm::LaunchInfo launch = comm::parse_launch_env(comm::current_environment());
  if (launch.launcher == "none") {
    const int gpus = visible_gpus();
    const int nproc = options.nproc > 0 ? options.nproc : gpus;
    SF_CHECK(gpus >= 1, "bench allreduce: no GPU visible");
    SF_CHECK(nproc <= gpus, "bench allreduce: --nproc {} but {} GPU(s) visible", nproc, gpus);
    if (nproc > 1) {
      comm::WorkerLaunch workers;
      workers.argv = comm::self_command_line();
      workers.world_size = nproc;
      for (const comm::WorkerExit& exit : comm::run_local_workers(workers)) {
        SF_CHECK(exit.ok(), "bench allreduce: rank {} exited with {}", exit.rank, exit.exit_code);
      }
      return;
    }
  }

  comm::CommOptions comm_options;
  comm_options.custom_max_bytes = options.max_bytes;
  std::unique_ptr<comm::CommGroup> group = comm::CommGroup::create(launch, comm_options);
  json result = run_worker(*group, options);
  if (group->rank() == 0) {
    result["date"] = utc_timestamp();
    result["commit"] = source_commit();
    print_tables(result, options);
    fmt::print("\nresult: {}\n", write_result(result, options.results_dir, "allreduce"));
  }
}

#endif  // SPLITFLOW_HAS_CUDA

}  // namespace splitflow::bench
