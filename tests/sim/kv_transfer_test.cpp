// KV-cache transfer between a prompt and a token machine (Splitwise §IV-C, Fig. 11): serialized
// after the prefill, or layer-wise overlapped with it. Expected times are the link formula computed
// here in double precision: bytes = prompt_tokens × kv_bytes_per_token, serialized time =
// bytes / (bandwidth_GiB/s × 2^30), layer-wise visible time = max(serialized − prefill × (L−1)/L,
// serialized / L) (layer l leaves while layer l+1 computes; the last layer's share always remains).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

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

nlohmann::json one_prompt_one_token() {
  return nlohmann::json::parse(test::read_file(test::fixture_path("../../sim/configs/splitwise_ha_1h100p_1a100t.json")));
}

double serialized_s(double prompt_tokens, double kv_bytes_per_token, double bandwidth_gib_per_s) {
  return prompt_tokens * kv_bytes_per_token / (bandwidth_gib_per_s * 1024.0 * 1024.0 * 1024.0);
}

double layerwise_s(double serial_s, double prefill_s, double layers) {
  return std::max(serial_s - prefill_s * (layers - 1) / layers, serial_s / layers);
}

struct Case {
  const char* model;
  int64_t kv_bytes_per_token;
  int num_layers;
  int64_t weights_bytes;
};

TEST(SimKvTransfer, VisibleTimeMatchesTheLinkFormula) {
  // bloom-176b (70 layers, 14336 hidden) and llama2-70b (80 layers, 8192 hidden, GQA ignored as in
  // SplitwiseSim) on an H100 prompt and an A100 token machine; InfiniBand-class and Ethernet links.
  for (const Case& c : {Case{"bloom-176b", 4014080, 70, 329000000000}, Case{"llama2-70b", 2621440, 80, 135000000000}}) {
    const PerfCurves& h100 = reference_model().curves(PerfKey{c.model, "h100-80gb", 8});
    const PerfCurves& a100 = reference_model().curves(PerfKey{c.model, "a100-80gb", 8});
    for (double bandwidth : {200.0, 12.5}) {
      for (int64_t prompt : {128, 1024, 4096, 8192}) {
        for (const char* mode : {"serialized", "layerwise_overlapped"}) {
          nlohmann::json config = one_prompt_one_token();
          config["model"] = {{"name", c.model}, {"weights_bytes", c.weights_bytes},
                             {"kv_bytes_per_token", c.kv_bytes_per_token}, {"num_layers", c.num_layers}};
          config["kv_transfer"]["bandwidth_gib_per_s"] = bandwidth;
          config["kv_transfer"]["mode"] = mode;
          const RequestResult r = Simulation(parse_cluster_config(config.dump(), "kv test"), reference_model(),
                                             {{0, 0.0, prompt, 6}})
                                      .run()
                                      .requests[0];
          const double prefill_s = h100.prompt_time_s(static_cast<double>(prompt));
          const double serial = serialized_s(static_cast<double>(prompt), static_cast<double>(c.kv_bytes_per_token), bandwidth);
          const double expected = std::string(mode) == "serialized" ? serial : layerwise_s(serial, prefill_s, c.num_layers);
          const std::string where = fmt::format("{} {} GiB/s prompt {} {}", c.model, bandwidth, prompt, mode);
          EXPECT_NEAR(r.prompt_end_s, prefill_s, 1e-12) << where;  // the transfer never delays the first token
          EXPECT_NEAR(r.nth_token_overhead_s(), expected, 1e-12) << where;
          EXPECT_NEAR(r.completion_s, prefill_s + expected + 5 * a100.token_time_s(1), 1e-12) << where;
        }
      }
    }
  }
}

TEST(SimKvTransfer, LayerwiseHidesAllButTheLastLayerOnAFastLink) {
  // 4096-token bloom prompt at 200 GiB/s: 76.6 ms serialized; the 650 ms prefill hides all but
  // 1/70 of it (1.1 ms), the order of the paper's 5-8 ms (Fig. 14).
  nlohmann::json config = one_prompt_one_token();
  config["kv_transfer"]["mode"] = "layerwise_overlapped";
  const RequestResult r =
      Simulation(parse_cluster_config(config.dump(), "kv test"), reference_model(), {{0, 0.0, 4096, 2}}).run().requests[0];
  EXPECT_NEAR(r.nth_token_overhead_s(), serialized_s(4096, 4014080, 200) / 70, 1e-12);
  EXPECT_LT(r.nth_token_overhead_s(), 0.002);
}

TEST(SimKvTransfer, PromptMachineFreesTheCacheWhenTheTransferEnds) {
  // A's 4096-token cache leaves over a 12.5 GiB/s link: 1.225 s serialized, 0.585 s visible when
  // overlapped. B arrives 0.7 s after A's prefill: its prefill starts with A's cache still on the
  // prompt machine (serialized) or already gone (layer-wise).
  const PerfCurves& h100 = reference_model().curves(PerfKey{"bloom-176b", "h100-80gb", 8});
  const double prefill_a_s = h100.prompt_time_s(4096);
  const double serial = serialized_s(4096, 4014080, 12.5);
  ASSERT_GT(serial, 0.7);
  ASSERT_LT(layerwise_s(serial, prefill_a_s, 70), 0.7);
  for (const char* mode : {"serialized", "layerwise_overlapped"}) {
    nlohmann::json config = one_prompt_one_token();
    config["kv_transfer"]["bandwidth_gib_per_s"] = 12.5;
    config["kv_transfer"]["mode"] = mode;
    Simulation simulation(parse_cluster_config(config.dump(), "kv test"), reference_model(),
                          {{0, 0.0, 4096, 3}, {1, prefill_a_s + 0.7, 1000, 3}}, SimulationOptions{.record_iterations = true});
    const SimulationResult result = simulation.run();
    const auto b_prefill = std::find_if(result.iterations.begin(), result.iterations.end(), [](const IterationRecord& it) {
      return it.instance == 0 && it.batch_tokens == 1000;
    });
    ASSERT_NE(b_prefill, result.iterations.end()) << mode;
    const int64_t a_cache = 4097 * int64_t{4014080}, b_cache = 1001 * int64_t{4014080};
    const int64_t expected = 329000000000 + b_cache + (std::string(mode) == "serialized" ? a_cache : 0);
    EXPECT_EQ(b_prefill->memory_bytes, expected) << mode;
    EXPECT_NEAR(b_prefill->start_s, prefill_a_s + 0.7, 1e-12) << mode;
  }
}

}  // namespace
}  // namespace splitflow::sim
