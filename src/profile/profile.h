// profile/profile.h — `splitflow profile`: times the engine's own steps over a grid and writes the
// cluster simulator's perf-model CSV (docs/simulator.md, extended schema). Owns the grid (prompt
// sizes, decode batch sizes, context lengths, KV-transfer sizes, repetitions), the timing loops
// over a ModelRunner, the KV-transfer timing over Splitwise's transport (splitwise/, TCP), and the
// CSV and provenance it writes. It must never: schedule requests or build an Engine (it times the
// runner's forward passes, as bench latency does), fit or interpolate a model (that is sim/),
// or write outside the paths it is given.
//
// A decode row is `decode_steps` steps of `batch_size` sequences each with `context_tokens` tokens
// already in its cache (every step writes the same next position, so the context stays exact);
// the cache holds whatever earlier steps left there, which costs the same to read as real KV.
#pragma once

#include "backend/backend.h"
#include "runtime/model_runner.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace splitflow::profile {

struct ProfileGrid {
  std::vector<int32_t> prompt_tokens;       // prefill sizes (one sequence, one forward each)
  std::vector<int32_t> batch_sizes;         // decode sequences per step
  std::vector<int32_t> context_tokens;      // tokens already cached per decode sequence
  std::vector<int32_t> kv_transfer_tokens;  // prompt lengths whose whole cache is transferred
  int32_t repetitions = 3;                  // rows per grid point (the simulator takes the median)
  int32_t decode_steps = 8;                 // steps averaged into one decode row
};

// What a production profile covers (prompts to 4K, batches to 64, contexts to 4K), clipped to the
// model's context; quick: a small grid for tests and CPU runs.
ProfileGrid default_grid(int64_t max_position);
ProfileGrid quick_grid(int64_t max_position);

// Throws an Error naming the flag and the value when a grid value is impossible: not positive
// (context 0 is allowed), above the model's context (a prompt, or a context plus one step),
// fewer than two distinct values on an axis the simulator interpolates, no repetitions.
void check_grid(const ProfileGrid& grid, const ModelSpec& spec);

// The runner's cache and limits a grid needs: prefills of the largest prompt in one forward, the
// largest decode batch at the largest context, and two copies of the largest transfer.
struct RunnerShape {
  KvCacheConfig kv;
  RunnerLimits limits;
};
RunnerShape runner_shape(const ProfileGrid& grid, int32_t block_size, std::optional<DType> kv_cache_dtype);

// One CSV row (times in ms; an unmeasured field is left empty in the file).
struct ProfileRow {
  std::string phase;            // prompt | token | kv_transfer
  int32_t prompt_size = 0;      // prompt: tokens; kv_transfer: tokens whose cache moved
  int32_t batch_size = 0;
  int32_t context_tokens = 0;   // token: tokens cached per sequence
  int64_t kv_bytes = 0;         // kv_transfer: K and V bytes moved
  double time_ms = 0;           // prompt_time, token_time or transfer_time
  int32_t repetition = 0;
};

using Progress = std::function<void(const std::string& line)>;

// Times prefills and decode steps on `runner` (built with runner_shape(grid, ...)); a few untimed
// steps first, so one-time costs (plans, graph recording) stay out of the rows.
std::vector<ProfileRow> profile_steps(ModelRunner& runner, Backend& backend, const KvCacheConfig& kv,
                                      const ProfileGrid& grid, const Progress& progress);

// Whether this build has Splitwise's transport (it needs the HTTP server's Boost.Beast).
bool kv_transfer_available();
// Times whole-cache transfers of each size over Splitwise's TCP transport on the loopback, from
// one part of the runner's cache to another (serialized: every layer's rows after the prompt, the
// receiver writing them into its reservation), as a token instance's fetch sees it. `link` gets
// what was measured (transport, address, mode).
std::vector<ProfileRow> profile_kv_transfer(ModelRunner& runner, Backend& backend, const KvCacheConfig& kv,
                                            const ProfileGrid& grid, nlohmann::json& link, const Progress& progress);

// Who the rows belong to, as the simulator keys them.
struct PerfModelKey {
  std::string model;     // the cluster config's model.name
  std::string hardware;  // a machine type's hardware
  int tensor_parallel = 1;
};

// Checks that `path` can be written (its directory exists and a file can be created there),
// before hours of profiling; throws naming the path otherwise.
void check_writable(const std::string& path, const std::string& flag);
// The CSV (columns in docs/simulator.md: model, hardware, tensor_parallel, phase, prompt_size,
// batch_size, context_tokens, kv_bytes, prompt_time, token_time, transfer_time, repetition).
void write_perf_csv(const std::string& path, const PerfModelKey& key, const std::vector<ProfileRow>& rows);

}  // namespace splitflow::profile
