// Simulator behaviour beyond the reference example: decode blocks cut by arrivals, mixed batches,
// mixed-pool borrowing, KV-transfer modes, JSQ spreading and bad input. Expected times are
// computed here from the perf curves in double precision, following docs/simulator.md.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "sim/config.h"
#include "sim/simulator.h"
#include "test_paths.h"

namespace splitflow::sim {
namespace {

const PerfModel& reference_model() {
  static const PerfModel model =
      PerfModel::load_csv(test::shared_path("sim-reference/splitwise-sim/perf_model.csv"));
  return model;
}
const PerfCurves& h100() { return reference_model().curves(PerfKey{"bloom-176b", "h100-80gb", 8}); }
const PerfCurves& a100() { return reference_model().curves(PerfKey{"bloom-176b", "a100-80gb", 8}); }

nlohmann::json shipped(const std::string& name) {
  std::ifstream in(test::fixture_path("../../sim/configs/" + name));
  EXPECT_TRUE(in) << name;
  return nlohmann::json::parse(in);
}

ClusterConfig config_from(const nlohmann::json& json) { return parse_cluster_config(json.dump(), "test config"); }

SimulationResult simulate(const nlohmann::json& config, std::vector<Request> requests) {
  return Simulation(config_from(config), reference_model(), std::move(requests)).run();
}

TEST(SimBehaviour, ArrivalCutsDecodeBlockAndJoinsAsMixedBatch) {
  const double t1 = h100().token_time_s(1);
  const double arrival_b = h100().prompt_time_s(512) + 2.5 * t1;
  const SimulationResult result = simulate(shipped("baseline_h100_1server.json"),
                                           {{0, 0.0, 512, 11}, {1, arrival_b, 256, 3}});
  const RequestResult& a = result.requests[0];
  const RequestResult& b = result.requests[1];
  // A's 10-iteration decode block is cut after its 3rd iteration; B's prompt joins A's decode
  // (257 tokens, mixed: 1.1 P); then both decode (T(2)) until B is done; A finishes alone.
  const double cut_s = h100().prompt_time_s(512) + 3 * t1;
  const double mixed_end_s = cut_s + 1.1 * h100().prompt_time_s(257);
  const double b_done_s = mixed_end_s + 2 * h100().token_time_s(2);
  EXPECT_NEAR(a.ttft_s(), h100().prompt_time_s(512), 1e-12);
  EXPECT_NEAR(b.prompt_start_s, cut_s, 1e-12);
  EXPECT_NEAR(b.prompt_end_s, mixed_end_s, 1e-12);
  EXPECT_NEAR(b.completion_s, b_done_s, 1e-12);
  EXPECT_NEAR(a.completion_s, b_done_s + 4 * t1, 1e-12);
}

TEST(SimBehaviour, LongPromptPreemptsDecodeThatResumesFirst) {
  // B's 4096-token prompt cuts A's decode block and takes the batch alone (A's decode would pass
  // 2048 tokens), so A is preempted; afterwards A (preempted list) and B's decode run together.
  const double t1 = h100().token_time_s(1);
  const double arrival_b = h100().prompt_time_s(512) + 2.5 * t1;
  Simulation simulation(config_from(shipped("baseline_h100_1server.json")), reference_model(),
                        {{0, 0.0, 512, 20}, {1, arrival_b, 4096, 5}}, SimulationOptions{.record_iterations = true});
  const SimulationResult result = simulation.run();
  const double cut_s = h100().prompt_time_s(512) + 3 * t1;
  const double b_prompt_end_s = cut_s + h100().prompt_time_s(4096);
  const double b_done_s = b_prompt_end_s + 4 * h100().token_time_s(2);
  EXPECT_NEAR(result.requests[1].prompt_start_s, cut_s, 1e-12);
  EXPECT_NEAR(result.requests[1].prompt_end_s, b_prompt_end_s, 1e-12);
  EXPECT_NEAR(result.requests[1].completion_s, b_done_s, 1e-12);
  EXPECT_NEAR(result.requests[0].completion_s, b_done_s + 12 * t1, 1e-12);
  ASSERT_EQ(result.iterations.size(), 5u);
  EXPECT_EQ(result.iterations[2].batch_size, 1);  // the prompt alone
  EXPECT_EQ(result.iterations[2].batch_tokens, 4096);
  EXPECT_EQ(result.iterations[3].batch_size, 2);
  EXPECT_EQ(result.iterations[3].iterations, 4);
}

TEST(SimBehaviour, DecodeThatCannotJoinDoesNotCutTheBlock) {
  // Batches of one: B's decode reaches the A100 while A's 50-iteration block runs, cannot join,
  // so A's block runs to its end and B's decode starts then.
  nlohmann::json config = shipped("splitwise_ha_1h100p_1a100t.json");
  config["instance"]["max_batch_size"] = 1;
  const double serial_s = 512.0 * 4014080.0 / (200.0 * 1024 * 1024 * 1024);
  const SimulationResult result = simulate(config, {{0, 0.0, 512, 51}, {1, 0.1, 512, 3}});
  const RequestResult& a = result.requests[0];
  const RequestResult& b = result.requests[1];
  const double a_decode_start_s = h100().prompt_time_s(512) + serial_s;
  EXPECT_NEAR(a.decode_start_s, a_decode_start_s, 1e-12);
  EXPECT_NEAR(a.completion_s, a_decode_start_s + 50 * a100().token_time_s(1), 1e-12);
  EXPECT_LT(b.prompt_end_s + serial_s, a.completion_s);
  EXPECT_NEAR(b.decode_start_s, a.completion_s, 1e-12);
  EXPECT_NEAR(b.completion_s, a.completion_s + 2 * a100().token_time_s(1), 1e-12);
}

TEST(SimBehaviour, TokenJsqSpreadsRequests) {
  nlohmann::json config = shipped("baseline_h100_1server.json");
  config["pools"][0]["count"] = 2;
  const SimulationResult result = simulate(config, {{0, 0.0, 1000, 5}, {1, 0.0, 1000, 5}, {2, 0.0, 10, 5}});
  EXPECT_EQ(result.requests[0].prompt_instance, 0);
  EXPECT_EQ(result.requests[1].prompt_instance, 1);
  // Instance 0 and 1 both hold 1001 pending tokens; the tie goes to the lowest id.
  EXPECT_EQ(result.requests[2].prompt_instance, 0);
  EXPECT_EQ(result.requests[2].token_instance, 0);
}

TEST(SimBehaviour, MixedPoolBorrowsPromptMachineWhenTokenMachineIsFull) {
  nlohmann::json config = shipped("splitwise_ha_1h100p_1a100t.json");
  // Token machine (A100) with room for the weights and 6,000 tokens of KV only.
  const int64_t kv = config["model"]["kv_bytes_per_token"];
  const int64_t weights = config["model"]["weights_bytes"];
  config["machine_types"][1]["gpu_memory_bytes"] = (weights + 6000 * kv) / 8 + 1;
  const SimulationResult result = simulate(config, {{0, 0.0, 4096, 20}, {1, 0.1, 2048, 10}});
  EXPECT_EQ(result.requests[0].prompt_instance, 0);
  EXPECT_EQ(result.requests[0].token_instance, 1);
  // 4116 + 2058 tokens would exceed 6000: request 1 runs both phases on the borrowed H100.
  EXPECT_EQ(result.requests[1].prompt_instance, 0);
  EXPECT_EQ(result.requests[1].token_instance, 0);
  EXPECT_DOUBLE_EQ(result.requests[1].nth_token_overhead_s(), 0);
}

TEST(SimBehaviour, BorrowedMachineReturnsHomeWhenIdle) {
  nlohmann::json config = shipped("splitwise_ha_1h100p_1a100t.json");
  const int64_t kv = config["model"]["kv_bytes_per_token"];
  const int64_t weights = config["model"]["weights_bytes"];
  config["machine_types"][1]["gpu_memory_bytes"] = (weights + 6000 * kv) / 8 + 1;
  Simulation simulation(config_from(config), reference_model(), {{0, 0.0, 4096, 20}, {1, 0.1, 2048, 10}});
  simulation.run();
  EXPECT_EQ(simulation.instances()[0].pool, InstanceRole::Prompt);
  EXPECT_EQ(simulation.instances()[1].pool, InstanceRole::Token);
}

TEST(SimBehaviour, KvTransferModes) {
  const double serial_s = 4096.0 * 4014080.0 / (200.0 * 1024 * 1024 * 1024);
  nlohmann::json config = shipped("splitwise_ha_1h100p_1a100t.json");
  EXPECT_NEAR(simulate(config, {{0, 0.0, 4096, 5}}).requests[0].nth_token_overhead_s(), serial_s, 1e-12);

  // Layer-wise: the 70-layer prefill (0.65 s) hides all but the last layer's share.
  config["kv_transfer"]["mode"] = "layerwise_overlapped";
  const RequestResult layerwise = simulate(config, {{0, 0.0, 4096, 5}}).requests[0];
  EXPECT_NEAR(layerwise.nth_token_overhead_s(), serial_s / 70, 1e-12);
  EXPECT_NEAR(layerwise.completion_s, h100().prompt_time_s(4096) + serial_s / 70 + 4 * a100().token_time_s(1), 1e-12);

  // A slow link outlasts the prefill: the visible part is what the prefill could not hide.
  config["kv_transfer"]["bandwidth_gib_per_s"] = 1.0;
  const double slow_s = serial_s * 200;
  EXPECT_NEAR(simulate(config, {{0, 0.0, 4096, 5}}).requests[0].nth_token_overhead_s(),
              slow_s - h100().prompt_time_s(4096) * 69 / 70, 1e-9);
}

TEST(SimBehaviour, LongPromptQueueRunsInArrivalOrder) {
  // 20,000 prompts of 1500 tokens at t = 0 on one H100: two never share a 2048-token batch, so
  // prompt k ends at (k + 1) P(1500), through every aging state (all waiting tasks pass the
  // preemption cap near the end). Forming a batch must not cost the queue's length (it once did:
  // quadratic in the queue).
  std::vector<Request> requests;
  for (int k = 0; k < 20000; ++k) requests.push_back({k, 0.0, 1500, 1});
  const SimulationResult result = simulate(shipped("baseline_h100_1server.json"), requests);
  for (int k : {0, 1, 2, 9999, 19998, 19999})
    EXPECT_NEAR(result.requests[k].completion_s, (k + 1) * h100().prompt_time_s(1500), 1e-6 * (k + 1)) << k;
}

TEST(SimBehaviour, OneTokenRequestFinishesWithItsPrompt) {
  Simulation simulation(config_from(shipped("splitwise_ha_1h100p_1a100t.json")), reference_model(),
                        {{0, 0.5, 1000, 1}});
  const SimulationResult result = simulation.run();
  EXPECT_NEAR(result.requests[0].completion_s, 0.5 + h100().prompt_time_s(1000), 1e-12);
  for (const Instance& instance : simulation.instances()) {
    EXPECT_EQ(instance.memory_bytes, 329000000000) << instance.name;
    EXPECT_EQ(instance.sched_memory_bytes, 329000000000) << instance.name;
    EXPECT_EQ(instance.sched_pending_tokens, 0) << instance.name;
  }
}

TEST(SimBehaviour, RejectsBadInput) {
  const nlohmann::json config = shipped("baseline_h100_1server.json");
  EXPECT_THROW(simulate(config, {{0, 0.0, 0, 5}}), Error);
  EXPECT_THROW(simulate(config, {{0, 0.0, 10, 0}}), Error);
  EXPECT_THROW(simulate(config, {{0, -1.0, 10, 5}}), Error);

  nlohmann::json unprofiled = config;
  unprofiled["machine_types"][0]["hardware"] = "b200";
  EXPECT_THROW(simulate(unprofiled, {{0, 0.0, 10, 5}}), Error);

  nlohmann::json too_small = config;
  too_small["machine_types"][0]["gpu_memory_bytes"] = 1000000000;
  EXPECT_THROW(simulate(too_small, {{0, 0.0, 10, 5}}), Error);

  nlohmann::json empty = config;
  empty["pools"][0]["count"] = 0;
  EXPECT_THROW(simulate(empty, {{0, 0.0, 10, 5}}), Error);

  // A request whose KV can never fit on its machine is reported, not silently dropped.
  nlohmann::json tight = config;
  tight["machine_types"][0]["gpu_memory_bytes"] = (329000000000 + 100 * 4014080) / 8 + 1;
  EXPECT_THROW(simulate(tight, {{0, 0.0, 500, 5}}), Error);
}

}  // namespace
}  // namespace splitflow::sim
