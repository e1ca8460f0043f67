#include "sim/config.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace splitflow::sim {

namespace {

using nlohmann::json;

// Every object's fields are checked against the names it may hold, so a misspelt parameter fails
// instead of silently keeping its default.
void check_fields(const json& object, std::initializer_list<const char*> known, const std::string& where) {
  SF_CHECK(object.is_object(), "{}: expected an object", where);
  for (auto it = object.begin(); it != object.end(); ++it) {
    const bool is_known = std::any_of(known.begin(), known.end(), [&](const char* k) { return it.key() == k; });
    if (is_known) continue;
    std::string names;
    for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    fail("{}: unknown field '{}' (known fields: {})", where, it.key(), names);
  }
}

Percentiles parse_limits(const json& object, const char* key, Percentiles fallback, const std::string& where) {
  if (!object.contains(key)) return fallback;
  const json& value = object[key];
  SF_CHECK(value.is_array() && value.size() == 3 && std::all_of(value.begin(), value.end(), [](const json& v) {
             return v.is_number() && v.get<double>() > 0;
           }),
           "{}: field '{}' must be three positive slowdown limits [p50, p90, p99]", where, key);
  return Percentiles{value[0].get<double>(), value[1].get<double>(), value[2].get<double>()};
}

const json& required(const json& object, const char* key, const std::string& where) {
  SF_CHECK(object.is_object(), "{}: expected an object", where);
  auto it = object.find(key);
  SF_CHECK(it != object.end(), "{}: missing field '{}'", where, key);
  return *it;
}

template <typename T>
T get(const json& object, const char* key, const std::string& where) {
  const json& value = required(object, key, where);
  try {
    return value.get<T>();
  } catch (const json::exception& e) {
    fail("{}: field '{}' has the wrong type: {}", where, key, e.what());
  }
}

template <typename T>
T get_or(const json& object, const char* key, T fallback, const std::string& where) {
  if (!object.contains(key)) return fallback;
  return get<T>(object, key, where);
}

InstanceRole parse_role(const std::string& text, const std::string& where) {
  if (text == "prompt") return InstanceRole::Prompt;
  if (text == "token") return InstanceRole::Token;
  if (text == "mixed") return InstanceRole::Mixed;
  fail("{}: role '{}' is not one of prompt, token, mixed", where, text);
}

}  // namespace

const MachineType& ClusterConfig::machine_type(const std::string& type_name) const {
  for (const MachineType& type : machine_types)
    if (type.name == type_name) return type;
  fail("cluster config '{}': unknown machine type '{}'", name, type_name);
}

double ClusterConfig::total_cost() const {
  double cost = 0;
  for (const PoolConfig& pool : pools) cost += pool.count * machine_type(pool.machine_type).cost;
  return cost;
}

double ClusterConfig::total_power() const {
  double power = 0;
  for (const PoolConfig& pool : pools) power += pool.count * machine_type(pool.machine_type).power;
  return power;
}

int ClusterConfig::total_machines() const {
  int machines = 0;
  for (const PoolConfig& pool : pools) machines += pool.count;
  return machines;
}

ClusterConfig parse_cluster_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
  check_fields(root, {"name", "model", "machine_types", "pools", "instance", "scheduler", "kv_transfer", "slo"}, source);
  ClusterConfig config;
  config.name = get<std::string>(root, "name", source);

  const std::string model_where = source + ": model";
  const json& model = required(root, "model", source);
  check_fields(model, {"name", "weights_bytes", "kv_bytes_per_token", "num_layers"}, model_where);
  config.model.name = get<std::string>(model, "name", model_where);
  config.model.weights_bytes = get<int64_t>(model, "weights_bytes", model_where);
  config.model.kv_bytes_per_token = get<int64_t>(model, "kv_bytes_per_token", model_where);
  config.model.num_layers = get<int>(model, "num_layers", model_where);
  SF_CHECK(config.model.weights_bytes > 0 && config.model.kv_bytes_per_token > 0 &&
               config.model.num_layers > 0,
           "{}: weights_bytes, kv_bytes_per_token and num_layers must be positive", model_where);

  const json& types = required(root, "machine_types", source);
  SF_CHECK(types.is_array() && !types.empty(), "{}: machine_types must be a non-empty array", source);
  for (size_t i = 0; i < types.size(); ++i) {
    const std::string where = fmt::format("{}: machine_types[{}]", source, i);
    check_fields(types[i], {"name", "hardware", "num_gpus", "gpu_memory_bytes", "cost", "power"}, where);
    MachineType type;
    type.name = get<std::string>(types[i], "name", where);
    type.hardware = get<std::string>(types[i], "hardware", where);
    type.num_gpus = get<int>(types[i], "num_gpus", where);
    type.gpu_memory_bytes = get<int64_t>(types[i], "gpu_memory_bytes", where);
    type.cost = get<double>(types[i], "cost", where);
    type.power = get<double>(types[i], "power", where);
    SF_CHECK(type.num_gpus > 0 && type.gpu_memory_bytes > 0, "{}: num_gpus and gpu_memory_bytes must be positive",
             where);
    SF_CHECK(type.cost >= 0 && type.power >= 0, "{}: cost and power must be non-negative", where);
    config.machine_types.push_back(type);
  }

  const json& pools = required(root, "pools", source);
  SF_CHECK(pools.is_array() && !pools.empty(), "{}: pools must be a non-empty array", source);
  for (size_t i = 0; i < pools.size(); ++i) {
    const std::string where = fmt::format("{}: pools[{}]", source, i);
    check_fields(pools[i], {"machine_type", "role", "count", "tensor_parallel"}, where);
    PoolConfig pool;
    pool.machine_type = get<std::string>(pools[i], "machine_type", where);
    pool.role = parse_role(get<std::string>(pools[i], "role", where), where);
    pool.count = get<int>(pools[i], "count", where);
    pool.tensor_parallel = get<int>(pools[i], "tensor_parallel", where);
    SF_CHECK(pool.count >= 0, "{}: count must be non-negative, got {}", where, pool.count);
    SF_CHECK(pool.tensor_parallel > 0, "{}: tensor_parallel must be positive", where);
    const MachineType& type = config.machine_type(pool.machine_type);
    SF_CHECK(pool.tensor_parallel <= type.num_gpus, "{}: tensor_parallel {} exceeds the {} GPUs of '{}'", where,
             pool.tensor_parallel, type.num_gpus, type.name);
    config.pools.push_back(pool);
  }

  if (root.contains("instance")) {
    const json& instance = root["instance"];
    const std::string where = source + ": instance";
    check_fields(instance, {"max_batch_size", "max_batch_tokens", "max_preemptions", "mixed_batch_factor"}, where);
    config.instance.max_batch_size = get_or(instance, "max_batch_size", config.instance.max_batch_size, where);
    config.instance.max_batch_tokens =
        get_or(instance, "max_batch_tokens", config.instance.max_batch_tokens, where);
    config.instance.max_preemptions = get_or(instance, "max_preemptions", config.instance.max_preemptions, where);
    config.instance.mixed_batch_factor =
        get_or(instance, "mixed_batch_factor", config.instance.mixed_batch_factor, where);
    SF_CHECK(config.instance.max_batch_size > 0 && config.instance.max_batch_tokens > 0,
             "{}: max_batch_size and max_batch_tokens must be positive", where);
  }

  const json& scheduler = required(root, "scheduler", source);
  const std::string scheduler_where = source + ": scheduler";
  check_fields(scheduler, {"kind", "prompt_max_pending_batch_tokens"}, scheduler_where);
  const std::string kind = get<std::string>(scheduler, "kind", scheduler_where);
  if (kind == "token_jsq") {
    config.scheduler.kind = SchedulerKind::TokenJsq;
  } else if (kind == "mixed_pool") {
    config.scheduler.kind = SchedulerKind::MixedPool;
  } else {
    fail("{}: kind '{}' is not one of token_jsq, mixed_pool", scheduler_where, kind);
  }
  config.scheduler.prompt_max_pending_batch_tokens = get_or(
      scheduler, "prompt_max_pending_batch_tokens", config.scheduler.prompt_max_pending_batch_tokens,
      scheduler_where);

  if (root.contains("kv_transfer")) {
    const json& link = root["kv_transfer"];
    const std::string where = source + ": kv_transfer";
    check_fields(link, {"bandwidth_gib_per_s", "mode", "retry_interval_s", "timing"}, where);
    config.kv_transfer.bandwidth_gib_per_s =
        get_or(link, "bandwidth_gib_per_s", config.kv_transfer.bandwidth_gib_per_s, where);
    config.kv_transfer.retry_interval_s =
        get_or(link, "retry_interval_s", config.kv_transfer.retry_interval_s, where);
    const std::string mode = get_or<std::string>(link, "mode", "serialized", where);
    if (mode == "serialized") {
      config.kv_transfer.mode = KvTransferMode::Serialized;
    } else if (mode == "layerwise_overlapped") {
      config.kv_transfer.mode = KvTransferMode::LayerwiseOverlapped;
    } else {
      fail("{}: mode '{}' is not one of serialized, layerwise_overlapped", where, mode);
    }
    const std::string timing = get_or<std::string>(link, "timing", "bandwidth", where);
    if (timing == "bandwidth") {
      config.kv_transfer.timing = KvTransferTiming::Bandwidth;
    } else if (timing == "profile") {
      config.kv_transfer.timing = KvTransferTiming::Profile;
    } else {
      fail("{}: timing '{}' is not one of bandwidth, profile", where, timing);
    }
    SF_CHECK(config.kv_transfer.bandwidth_gib_per_s > 0 && config.kv_transfer.retry_interval_s > 0,
             "{}: bandwidth_gib_per_s and retry_interval_s must be positive", where);
  }

  if (root.contains("slo")) {
    const json& slo = root["slo"];
    const std::string where = source + ": slo";
    check_fields(slo, {"reference_hardware", "reference_tensor_parallel", "ttft", "tbt", "e2e"}, where);
    config.slo.reference_hardware = get_or(slo, "reference_hardware", config.slo.reference_hardware, where);
    config.slo.reference_tensor_parallel =
        get_or(slo, "reference_tensor_parallel", config.slo.reference_tensor_parallel, where);
    SF_CHECK(config.slo.reference_tensor_parallel > 0, "{}: reference_tensor_parallel must be positive", where);
    config.slo.ttft = parse_limits(slo, "ttft", config.slo.ttft, where);
    config.slo.tbt = parse_limits(slo, "tbt", config.slo.tbt, where);
    config.slo.e2e = parse_limits(slo, "e2e", config.slo.e2e, where);
  }
  return config;
}

ClusterConfig load_cluster_config(const std::string& path) {
  std::ifstream in(path);
  SF_CHECK(in, "cannot open cluster config '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_cluster_config(text.str(), path);
}

}  // namespace splitflow::sim
