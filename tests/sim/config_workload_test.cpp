// Cluster config files and workloads: shipped configs load, bad input is named, traces parse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "sim/config.h"
#include "sim/workload.h"
#include "test_paths.h"

namespace splitflow::sim {
namespace {

std::string config_path(const std::string& name) { return test::fixture_path("../../sim/configs/" + name); }

std::string valid_config() {
  return R"({
    "name": "t",
    "model": {"name": "bloom-176b", "weights_bytes": 329000000000, "kv_bytes_per_token": 4014080, "num_layers": 70},
    "machine_types": [{"name": "dgx-h100", "hardware": "h100-80gb", "num_gpus": 8,
                       "gpu_memory_bytes": 85899345920, "cost": 4.76, "power": 44}],
    "pools": [{"machine_type": "dgx-h100", "role": "mixed", "count": 2, "tensor_parallel": 8}],
    "scheduler": {"kind": "token_jsq"}
  })";
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return text.replace(pos, from.size(), to);
}

TEST(SimConfig, ShippedConfigsLoad) {
  const ClusterConfig baseline = load_cluster_config(config_path("baseline_h100.json"));
  EXPECT_EQ(baseline.scheduler.kind, SchedulerKind::TokenJsq);
  ASSERT_EQ(baseline.pools.size(), 1u);
  EXPECT_EQ(baseline.pools[0].count, 40);
  EXPECT_DOUBLE_EQ(baseline.total_power(), 40 * 44.0);

  const ClusterConfig ha = load_cluster_config(config_path("splitwise_ha.json"));
  EXPECT_EQ(ha.scheduler.kind, SchedulerKind::MixedPool);
  EXPECT_EQ(ha.scheduler.prompt_max_pending_batch_tokens, 8192);
  ASSERT_EQ(ha.pools.size(), 2u);
  EXPECT_EQ(ha.pools[0].role, InstanceRole::Prompt);
  EXPECT_EQ(ha.pools[1].role, InstanceRole::Token);
  // Iso-power with 40 DGX-H100: 25 H100 + int(44 * 15 / 24.8) = 26 A100.
  EXPECT_EQ(ha.pools[1].count, static_cast<int>(44.0 * 15 / 24.8));
  EXPECT_LE(ha.total_power(), 40 * 44.0);
  EXPECT_DOUBLE_EQ(ha.kv_transfer.bandwidth_gib_per_s, 200);
  EXPECT_EQ(ha.instance.max_batch_tokens, 2048);

  for (const char* name : {"baseline_h100_1server.json", "splitwise_ha_1h100p_1a100t.json"})
    EXPECT_NO_THROW(load_cluster_config(config_path(name))) << name;
}

TEST(SimConfig, DefaultsAndOptionalSections) {
  const ClusterConfig config = parse_cluster_config(valid_config(), "inline");
  EXPECT_EQ(config.instance.max_batch_size, 512);
  EXPECT_EQ(config.instance.max_preemptions, 4);
  EXPECT_DOUBLE_EQ(config.instance.mixed_batch_factor, 1.1);
  EXPECT_EQ(config.kv_transfer.mode, KvTransferMode::Serialized);
}

TEST(SimConfig, RejectsBadConfigs) {
  const std::string good = valid_config();
  EXPECT_THROW(parse_cluster_config("{not json", "inline"), Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("name": "t",)", ""), "inline"), Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("role": "mixed")", R"("role": "decode")"), "inline"), Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("kind": "token_jsq")", R"("kind": "random")"), "inline"), Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("machine_type": "dgx-h100")", R"("machine_type": "dgx-b200")"),
                                    "inline"), Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("tensor_parallel": 8)", R"("tensor_parallel": 16)"), "inline"),
               Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("count": 2)", R"("count": -1)"), "inline"), Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("count": 2)", R"("count": "two")"), "inline"), Error);
  EXPECT_THROW(parse_cluster_config(replaced(good, R"("kv_bytes_per_token": 4014080)", R"("kv_bytes_per_token": 0)"),
                                    "inline"), Error);
  const std::string with_link = replaced(good, R"("scheduler")", R"("kv_transfer": {"mode": "teleport"}, "scheduler")");
  EXPECT_THROW(parse_cluster_config(with_link, "inline"), Error);
  const std::string zero_bw =
      replaced(good, R"("scheduler")", R"("kv_transfer": {"bandwidth_gib_per_s": 0}, "scheduler")");
  EXPECT_THROW(parse_cluster_config(zero_bw, "inline"), Error);
  EXPECT_THROW(load_cluster_config(config_path("no_such_config.json")), Error);
}

TEST(SimConfig, UnknownFieldsAreErrorsAtEveryLevel) {
  const std::string good = valid_config();
  auto message = [](const std::string& text) {
    try {
      parse_cluster_config(text, "inline");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(replaced(good, R"("name": "t",)", R"("name": "t", "nmae": "u",)")).find("unknown field 'nmae'"),
            std::string::npos);
  EXPECT_NE(message(replaced(good, R"("num_layers": 70)", R"("num_layers": 70, "layers": 70)")).find("model: unknown field 'layers'"),
            std::string::npos);
  EXPECT_NE(message(replaced(good, R"("power": 44)", R"("power": 44, "watts": 1)")).find("machine_types[0]: unknown field 'watts'"),
            std::string::npos);
  EXPECT_NE(message(replaced(good, R"("count": 2,)", R"("count": 2, "cnt": 2,)")).find("pools[0]: unknown field 'cnt'"),
            std::string::npos);
  EXPECT_NE(message(replaced(good, R"("kind": "token_jsq")", R"("kind": "token_jsq", "token_max_pending_batch_tokens": 1)"))
                .find("scheduler: unknown field 'token_max_pending_batch_tokens'"),
            std::string::npos);
  EXPECT_NE(message(replaced(good, R"("scheduler")", R"("instance": {"max_batch_sise": 64}, "scheduler")"))
                .find("instance: unknown field 'max_batch_sise'"),
            std::string::npos);
  EXPECT_NE(message(replaced(good, R"("scheduler")", R"("kv_transfer": {"bandwith_gib_per_s": 1}, "scheduler")"))
                .find("kv_transfer: unknown field 'bandwith_gib_per_s'"),
            std::string::npos);
  EXPECT_NE(message(replaced(good, R"("scheduler")", R"("slo": {"ttft_p50": 2}, "scheduler")")).find("slo: unknown field 'ttft_p50'"),
            std::string::npos);
}

TEST(SimConfig, SloSection) {
  const ClusterConfig defaults = parse_cluster_config(valid_config(), "inline");
  EXPECT_EQ(defaults.slo.reference_hardware, "a100-80gb");
  EXPECT_EQ(defaults.slo.reference_tensor_parallel, 8);
  EXPECT_DOUBLE_EQ(defaults.slo.tbt.p90, 1.5);
  const ClusterConfig custom = parse_cluster_config(
      replaced(valid_config(), R"("scheduler")",
               R"("slo": {"reference_hardware": "h100-80gb", "reference_tensor_parallel": 4, "e2e": [1.1, 1.2, 3]}, "scheduler")"),
      "inline");
  EXPECT_EQ(custom.slo.reference_hardware, "h100-80gb");
  EXPECT_EQ(custom.slo.reference_tensor_parallel, 4);
  EXPECT_DOUBLE_EQ(custom.slo.e2e.p50, 1.1);
  EXPECT_DOUBLE_EQ(custom.slo.e2e.p99, 3);
  EXPECT_DOUBLE_EQ(custom.slo.ttft.p99, 6);  // unchanged default
  for (const char* bad : {R"("slo": {"ttft": [2, 3]}, "scheduler")", R"("slo": {"tbt": [1, -1, 2]}, "scheduler")",
                          R"("slo": {"e2e": "tight"}, "scheduler")", R"("slo": {"reference_tensor_parallel": 0}, "scheduler")"})
    EXPECT_THROW(parse_cluster_config(replaced(valid_config(), R"("scheduler")", bad), "inline"), Error) << bad;
}

TEST(SimWorkload, SplitwiseTestTrace) {
  const std::vector<Request> requests =
      load_splitwise_trace(test::shared_path("sim-reference/splitwise-sim/traces/test_trace.csv"));
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_DOUBLE_EQ(requests[0].arrival_s, 1);
  EXPECT_EQ(requests[0].prompt_tokens, 4096);
  EXPECT_EQ(requests[0].output_tokens, 32);
  EXPECT_DOUBLE_EQ(requests[2].arrival_s, 4);
  EXPECT_EQ(requests[2].output_tokens, 16);
}

TEST(SimWorkload, AzureTimestamps) {
  EXPECT_DOUBLE_EQ(parse_azure_timestamp("1970-01-02 00:00:01"), 86401);
  EXPECT_NEAR(parse_azure_timestamp("2023-11-16 18:15:46.6805900") - parse_azure_timestamp("2023-11-16 18:15:44.0000000"),
              2.68059, 1e-6);
  // 2023-11-16 is 19,677 days after 1970-01-01.
  EXPECT_DOUBLE_EQ(parse_azure_timestamp("2023-11-16 00:00:00"), 19677.0 * 86400);
  EXPECT_THROW(parse_azure_timestamp("2023/11/16 18:15:46"), Error);
  EXPECT_THROW(parse_azure_timestamp("2023-11-16 18:15"), Error);
  EXPECT_THROW(parse_azure_timestamp("2023-13-16 18:15:46.1"), Error);
  EXPECT_THROW(parse_azure_timestamp("2023-11-16 18:15:46.x"), Error);
}

// Statistics from ../shared/traces/README.md.
TEST(SimWorkload, AzureTracesReplay) {
  struct Expected {
    const char* file;
    size_t rows;
    double span_s;
    int64_t prompt_total, output_total;
  };
  for (const Expected& e : {Expected{"AzureLLMInferenceTrace_code.csv", 8819, 3435.9, 18059974, 245896},
                            Expected{"AzureLLMInferenceTrace_conv.csv", 19366, 3501.7, 22361870, 4088665}}) {
    const std::vector<Request> requests = load_azure_trace(test::shared_path(std::string("traces/azure_llm_2023/") + e.file));
    ASSERT_EQ(requests.size(), e.rows) << e.file;
    EXPECT_DOUBLE_EQ(requests.front().arrival_s, 0);
    EXPECT_NEAR(requests.back().arrival_s, e.span_s, 0.05) << e.file;
    int64_t prompt_total = 0, output_total = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      prompt_total += requests[i].prompt_tokens;
      output_total += requests[i].output_tokens;
      if (i > 0) {
        EXPECT_GE(requests[i].arrival_s, requests[i - 1].arrival_s);
      }
    }
    EXPECT_EQ(prompt_total, e.prompt_total) << e.file;
    EXPECT_EQ(output_total, e.output_total) << e.file;
  }
}

TEST(SimWorkload, PoissonIsSeededAndHasTheRate) {
  const std::vector<Request> source = {{0, 0, 100, 10}, {1, 0, 200, 20}, {2, 0, 300, 30}};
  const std::vector<Request> a = poisson_workload(source, 50, 200, 7);
  const std::vector<Request> b = poisson_workload(source, 50, 200, 7);
  const std::vector<Request> c = poisson_workload(source, 50, 200, 8);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
  }
  EXPECT_NE(a.size() == c.size() && a.back().arrival_s == c.back().arrival_s, true);
  // 10,000 expected arrivals: the count is within 5 standard deviations (5 * 100).
  EXPECT_NEAR(static_cast<double>(a.size()), 10000, 500);
  EXPECT_LT(a.back().arrival_s, 200);
  // Prompt and output are drawn independently: some request pairs a 100 prompt with a non-10 output.
  EXPECT_TRUE(std::any_of(a.begin(), a.end(), [](const Request& r) { return r.prompt_tokens == 100 && r.output_tokens != 10; }));
  EXPECT_THROW(poisson_workload({}, 1, 1, 0), Error);
  EXPECT_THROW(poisson_workload(source, 0, 1, 0), Error);
  EXPECT_THROW(poisson_workload(source, 1, -1, 0), Error);
}

TEST(SimWorkload, RejectsBadTraces) {
  const std::string path = ::testing::TempDir() + "/sim_bad_trace.csv";
  std::ofstream(path) << "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size\n"
                         "0,2,0,1,1,0,32\n";
  EXPECT_THROW(load_splitwise_trace(path), Error);
  const std::string azure = ::testing::TempDir() + "/sim_bad_azure.csv";
  std::ofstream(azure) << "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,x\n";
  EXPECT_THROW(load_azure_trace(azure), Error);
}

}  // namespace
}  // namespace splitflow::sim
