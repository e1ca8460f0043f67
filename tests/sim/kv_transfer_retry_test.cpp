// The KV-transfer wait/retry path: a prompt finishes while its token instance has no room for the
// cache, so the transfer waits, retrying every retry_interval_s, and starts at the first try after
// the memory frees. mixed_pool promises memory conservatively, so the only way there is a token
// instance borrowed from the prompt pool without a memory check; the scenario below builds one.
//
// Toy cluster: three prompt-pool machines P0, P1, P2, each with room for 1000 tokens of KV after the
// weights (1 MiB per token), a 0.5 GiB/s link (512 tokens/s), retries every 30 ms. Toy profile:
// P(x) = x ms and T(x) = 10 ms + 0.01 ms × (x − 1), from two knots. Requests (prompt, output):
//   A (100, 80) at 0     P0 for both phases (first request: borrowed into the mixed pool).
//   B (400, 5)  at 0.2   prompt P1, token P0 (mixed pool, 180 + 405 < 1000).
//   C (600, 10) at 0.7   P0 cannot promise 585 + 610, so P2 is borrowed unchecked as C's token
//                        instance; C's prefill on P1 waits for B's cache to leave (401 + 601 > 1000).
//   D (400, 5)  at 0.85  P1 is overloaded (C queued, 600 + 400 > 512 pending tokens), so D's prefill
//                        runs on P2 (mixed, fewest pending); its token instance is P0 (585 + 405 < 1000).
// C's prefill ends while D's cache (401) still sits on P2: 401 + 601 > 1000, so C's transfer waits and
// starts at the first retry after D's transfer ends. Expected times are computed here from the knots,
// the link bandwidth and those memory sizes, with the ordering assumptions asserted.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/config.h"
#include "sim/simulator.h"

namespace splitflow::sim {
namespace {

constexpr int64_t kWeightsBytes = int64_t{1} << 30;
constexpr int64_t kKvBytesPerToken = int64_t{1} << 20;
constexpr int64_t kKvCapacityTokens = 1000;
constexpr double kBandwidthGiBPerS = 0.5;
constexpr double kRetryS = 0.03;
constexpr int kLayers = 2;

// Profile knots: (batch tokens, prompt ms, token ms).
constexpr double kKnotX[2] = {1, 1001};
constexpr double kPromptMs[2] = {1, 1001};
constexpr double kTokenMs[2] = {10, 20};

double interpolate(const double (&y_ms)[2], double x) {
  return (y_ms[0] + (x - kKnotX[0]) * (y_ms[1] - y_ms[0]) / (kKnotX[1] - kKnotX[0])) / 1000.0;
}
double prompt_s(double tokens) { return interpolate(kPromptMs, tokens); }
double token_s(double batch) { return interpolate(kTokenMs, batch); }
double serialized_s(double prompt_tokens) {
  return prompt_tokens * static_cast<double>(kKvBytesPerToken) / (kBandwidthGiBPerS * 1024.0 * 1024.0 * 1024.0);
}
// Visible time of a transfer started right at the end of its prefill.
double first_try_s(const std::string& mode, double prompt_tokens) {
  const double serial = serialized_s(prompt_tokens);
  if (mode == "serialized") return serial;
  return std::max(serial - prompt_s(prompt_tokens) * (kLayers - 1) / kLayers, serial / kLayers);
}

const PerfModel& toy_model() {
  static const PerfModel model = [] {
    const std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("sf_sim_retry_perf_" + std::to_string(::getpid()) + ".csv");
    {
      std::ofstream out(path);
      out << "model,hardware,tensor_parallel,prompt_size,batch_size,prompt_time,token_time\n";
      for (int k = 0; k < 2; ++k)
        out << "toy-model,toy,1," << kKnotX[k] << ",1," << kPromptMs[k] << "," << kTokenMs[k] << "\n";
    }
    PerfModel loaded = PerfModel::load_csv(path.string());
    std::filesystem::remove(path);
    return loaded;
  }();
  return model;
}

ClusterConfig toy_cluster(const std::string& mode) {
  const nlohmann::json config = {
      {"name", "retry test"},
      {"model", {{"name", "toy-model"}, {"weights_bytes", kWeightsBytes}, {"kv_bytes_per_token", kKvBytesPerToken},
                 {"num_layers", kLayers}}},
      {"machine_types", {{{"name", "toy-machine"}, {"hardware", "toy"}, {"num_gpus", 1},
                          {"gpu_memory_bytes", kWeightsBytes + kKvCapacityTokens * kKvBytesPerToken},
                          {"cost", 1}, {"power", 1}}}},
      {"pools", {{{"machine_type", "toy-machine"}, {"role", "prompt"}, {"count", 3}, {"tensor_parallel", 1}}}},
      {"scheduler", {{"kind", "mixed_pool"}, {"prompt_max_pending_batch_tokens", 512}}},
      {"kv_transfer", {{"bandwidth_gib_per_s", kBandwidthGiBPerS}, {"mode", mode}, {"retry_interval_s", kRetryS}}}};
  return parse_cluster_config(config.dump(), "retry test");
}

TEST(SimKvTransferRetry, TransferWaitsForRoomAndStartsAtTheFirstRetryAfterItFrees) {
  for (const std::string mode : {"serialized", "layerwise_overlapped"}) {
    SCOPED_TRACE(mode);
    const double t_a = 0, t_b = 0.2, t_c = 0.7, t_d = 0.85;
    Simulation simulation(toy_cluster(mode), toy_model(),
                          {{0, t_a, 100, 80}, {1, t_b, 400, 5}, {2, t_c, 600, 10}, {3, t_d, 400, 5}},
                          SimulationOptions{.record_iterations = true});
    const SimulationResult result = simulation.run();

    // A: prefill, then 79 decodes alone on P0.
    const double a_prompt_end = t_a + prompt_s(100);
    const double a_done = a_prompt_end + 79 * token_s(1);
    // B: prefill on P1, cache to P0 at once (P0 holds A's 180 tokens), decodes alone after A is done.
    const double b_prompt_end = t_b + prompt_s(400);
    const double b_transfer_end = b_prompt_end + first_try_s(mode, 400);
    const double b_done = b_transfer_end + 4 * token_s(1);
    // C: waits on P1 for B's cache to leave, then prefills.
    const double c_prompt_start = b_transfer_end;
    const double c_prompt_end = c_prompt_start + prompt_s(600);
    // D: prefill on P2 at once, cache to P0 at once, decodes alone.
    const double d_prompt_end = t_d + prompt_s(400);
    const double d_transfer_end = d_prompt_end + first_try_s(mode, 400);
    const double d_done = d_transfer_end + 4 * token_s(1);
    // C's transfer: first try at its prefill's end, then every kRetryS until D's cache has left P2.
    int retries = 0;
    while (c_prompt_end + retries * kRetryS < d_transfer_end) ++retries;
    const double c_transfer_start = c_prompt_end + retries * kRetryS;
    // A retried transfer cannot have streamed layers during the prefill: the whole cache moves now.
    const double c_transfer_end = c_transfer_start + serialized_s(600);
    const double c_done = c_transfer_end + 9 * token_s(1);

    // The scenario's ordering assumptions (placements above depend on them).
    ASSERT_GT(a_done, t_d);               // P0 stays borrowed until D is placed
    ASSERT_LT(a_done, b_transfer_end);    // B decodes alone
    ASSERT_LT(t_c, b_transfer_end);       // C's prefill is blocked by B's cache on P1 ...
    ASSERT_LT(t_d, b_transfer_end);       // ... and still queued when D arrives
    ASSERT_LT(b_done, d_transfer_end);    // D decodes alone (B's 405 tokens + D's 401 fit on P0)
    ASSERT_LT(c_prompt_end, d_transfer_end);  // P2 is full when C's first try comes
    ASSERT_EQ(retries, 2);
    ASSERT_GT(c_transfer_start - d_transfer_end, 1e-6);  // no tie between the retry and the free

    ASSERT_EQ(result.finished_requests, 4);
    EXPECT_EQ(result.stalled_requests, 0);
    const RequestResult& a = result.requests[0];
    const RequestResult& b = result.requests[1];
    const RequestResult& c = result.requests[2];
    const RequestResult& d = result.requests[3];
    for (const RequestResult& r : result.requests) EXPECT_TRUE(r.finished) << r.id;
    EXPECT_EQ(a.prompt_instance, 0);
    EXPECT_EQ(a.token_instance, 0);
    EXPECT_EQ(b.prompt_instance, 1);
    EXPECT_EQ(b.token_instance, 0);
    EXPECT_EQ(c.prompt_instance, 1);
    EXPECT_EQ(c.token_instance, 2);
    EXPECT_EQ(d.prompt_instance, 2);
    EXPECT_EQ(d.token_instance, 0);

    EXPECT_NEAR(a.ttft_s(), a_prompt_end - t_a, 1e-12);
    EXPECT_NEAR(a.e2e_s(), a_done - t_a, 1e-12);
    EXPECT_NEAR(b.ttft_s(), b_prompt_end - t_b, 1e-12);
    EXPECT_NEAR(b.decode_start_s, b_transfer_end, 1e-12);
    EXPECT_NEAR(b.e2e_s(), b_done - t_b, 1e-12);
    EXPECT_NEAR(c.prompt_start_s, c_prompt_start, 1e-12);
    EXPECT_NEAR(c.ttft_s(), c_prompt_end - t_c, 1e-12);
    EXPECT_NEAR(c.decode_start_s, c_transfer_end, 1e-12);
    EXPECT_NEAR(c.nth_token_overhead_s(), 2 * kRetryS + serialized_s(600), 1e-12);
    EXPECT_NEAR(c.e2e_s(), c_done - t_c, 1e-12);
    EXPECT_NEAR(d.ttft_s(), d_prompt_end - t_d, 1e-12);
    EXPECT_NEAR(d.decode_start_s, d_transfer_end, 1e-12);
    EXPECT_NEAR(d.e2e_s(), d_done - t_d, 1e-12);

    // No run ever used more than an instance's memory; C's decode on P2 holds exactly its own cache.
    const int64_t capacity = kWeightsBytes + kKvCapacityTokens * kKvBytesPerToken;
    for (const IterationRecord& run : result.iterations) EXPECT_LE(run.memory_bytes, capacity) << run.start_s;
    const auto c_decode = std::find_if(result.iterations.begin(), result.iterations.end(),
                                       [](const IterationRecord& run) { return run.instance == 2 && run.prompt_tasks == 0; });
    ASSERT_NE(c_decode, result.iterations.end());
    EXPECT_NEAR(c_decode->start_s, c_transfer_end, 1e-12);
    EXPECT_EQ(c_decode->iterations, 9);
    EXPECT_EQ(c_decode->memory_bytes, kWeightsBytes + (600 + 10) * kKvBytesPerToken);
    // Everything is released and every borrowed instance is back in the prompt pool.
    for (const Instance& instance : simulation.instances()) {
      EXPECT_EQ(instance.memory_bytes, kWeightsBytes) << instance.name;
      EXPECT_EQ(instance.sched_memory_bytes, kWeightsBytes) << instance.name;
      EXPECT_EQ(instance.sched_pending_tokens, 0) << instance.name;
      EXPECT_EQ(instance.pool, InstanceRole::Prompt) << instance.name;
    }
  }
}

}  // namespace
}  // namespace splitflow::sim
