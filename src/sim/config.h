// sim/config.h — a simulated cluster's description, loaded from a JSON cluster config file
// (sim/configs/*.json; schema in docs/simulator.md): model, machine types, instance pools,
// machine-level batching limits, cluster-level scheduler, KV-transfer link and SLOs. Unknown fields
// are errors, so a misspelt parameter never falls back to its default silently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace splitflow::sim {

struct ModelConfig {
  std::string name;               // key into the perf model ("bloom-176b")
  int64_t weights_bytes = 0;      // reserved on every instance
  int64_t kv_bytes_per_token = 0; // all layers, K and V
  int num_layers = 0;             // for layer-wise overlapped KV transfer
};

struct MachineType {
  std::string name;               // "dgx-h100"
  std::string hardware;           // perf-model hardware key ("h100-80gb")
  int num_gpus = 8;
  int64_t gpu_memory_bytes = 0;   // per GPU
  double cost = 0;                // relative cost per machine
  double power = 0;               // relative power per machine
};

enum class InstanceRole { Prompt, Token, Mixed };

struct PoolConfig {
  std::string machine_type;
  InstanceRole role = InstanceRole::Mixed;  // home pool (Mixed for baseline clusters)
  int count = 0;                            // machines; one instance per machine
  int tensor_parallel = 8;
};

// Machine-level batching (SplitwiseSim's "Splitwise" instance).
struct InstanceConfig {
  int max_batch_size = 512;
  int64_t max_batch_tokens = 2048;
  int max_preemptions = 4;
  double mixed_batch_factor = 1.1;  // mixed prompt+decode iteration = factor × P(tokens)
};

enum class SchedulerKind { TokenJsq, MixedPool };

struct SchedulerConfig {
  SchedulerKind kind = SchedulerKind::TokenJsq;
  int64_t prompt_max_pending_batch_tokens = 8192;  // mixed_pool: prompt instance admission limit
};

enum class KvTransferMode {
  Serialized,           // whole KV cache sent after the prefill ends
  LayerwiseOverlapped,  // layer i sent while layer i+1 computes; only the tail is visible
};

// p50, p90 and p99 of a distribution (measured values or SLO limits).
struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0;
};

// How requests are judged: slowdowns against an unloaded reference instance (SplitwiseSim: a
// DGX-A100 at TP8 running the same model) and the nine strict upper bounds on slowdown
// percentiles; defaults are the paper's SLO table.
struct SloConfig {
  std::string reference_hardware = "a100-80gb";
  int reference_tensor_parallel = 8;
  Percentiles ttft{2, 3, 6};
  Percentiles tbt{1.25, 1.5, 5};
  Percentiles e2e{1.25, 1.5, 5};
};

// Where a whole cache's transfer time comes from: bytes over the configured bandwidth, or the perf
// model's profiled kv_transfer times for the prompt's length (the link `splitflow profile` measured).
enum class KvTransferTiming { Bandwidth, Profile };

struct KvTransferConfig {
  double bandwidth_gib_per_s = 200;  // per flow; flows do not contend (as SplitwiseSim)
  KvTransferTiming timing = KvTransferTiming::Bandwidth;
  KvTransferMode mode = KvTransferMode::Serialized;
  double retry_interval_s = 1.0;     // when the destination lacks free memory
};

struct ClusterConfig {
  std::string name;
  ModelConfig model;
  std::vector<MachineType> machine_types;
  std::vector<PoolConfig> pools;
  InstanceConfig instance;
  SchedulerConfig scheduler;
  KvTransferConfig kv_transfer;
  SloConfig slo;

  const MachineType& machine_type(const std::string& name) const;
  double total_cost() const;
  double total_power() const;
  int total_machines() const;
};

ClusterConfig load_cluster_config(const std::string& path);
ClusterConfig parse_cluster_config(const std::string& json_text, const std::string& source_name);

}  // namespace splitflow::sim
