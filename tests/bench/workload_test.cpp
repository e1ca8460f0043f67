// bench/workload.h: Poisson arrivals against the exponential distribution's formulas, seeds,
// trace replay of the Azure conversation trace (a fixture of its first rows, and the real file
// against the statistics in ../shared/traces/README.md), time scaling, limits, context fitting,
// prompt ids and every bad input.
#include "bench/workload.h"
#include "core/error.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace splitflow::bench {
namespace {

const std::string kConvFixture = "bench/azure_conv_first10.csv";  // the first 10 rows of the conv trace

TEST(PoissonArrivals, MeanAndSpreadOfGapsMatchTheExponential) {
  const double rate = 4.0;
  const int64_t n = 20000;
  const std::vector<double> arrivals = poisson_arrivals(rate, 0, n, 7);
  ASSERT_EQ(arrivals.size(), static_cast<size_t>(n));
  std::vector<double> gaps;
  double previous = 0;
  for (double t : arrivals) {
    gaps.push_back(t - previous);
    previous = t;
  }
  double sum = 0, sum_sq = 0;
  for (double g : gaps) {
    EXPECT_GT(g, 0);
    sum += g;
    sum_sq += g * g;
  }
  const double mean = sum / n;
  const double variance = sum_sq / n - mean * mean;
  // Exp(rate): mean 1/rate, sd 1/rate; the sample mean's sd is (1/rate)/sqrt(n). Four sigmas.
  EXPECT_NEAR(mean, 1 / rate, 4 * (1 / rate) / std::sqrt(double(n)));
  EXPECT_NEAR(std::sqrt(variance), 1 / rate, 0.02 * (1 / rate));
  // Kolmogorov-Smirnov against F(x) = 1 - exp(-rate x): D < 1.63 / sqrt(n) at the 1 % level.
  std::sort(gaps.begin(), gaps.end());
  double d = 0;
  for (size_t i = 0; i < gaps.size(); ++i) {
    const double f = 1 - std::exp(-rate * gaps[i]);
    d = std::max({d, std::abs(f - double(i) / n), std::abs(double(i + 1) / n - f)});
  }
  EXPECT_LT(d, 1.63 / std::sqrt(double(n)));
}

TEST(PoissonArrivals, CountOverADurationIsPoisson) {
  // N(T) ~ Poisson(rate T): mean 2000, sd sqrt(2000) = 44.7; all arrivals inside [0, T).
  const std::vector<double> arrivals = poisson_arrivals(20.0, 100.0, 0, 11);
  EXPECT_NEAR(double(arrivals.size()), 2000.0, 4 * std::sqrt(2000.0));
  EXPECT_LT(arrivals.back(), 100.0);
  EXPECT_TRUE(std::is_sorted(arrivals.begin(), arrivals.end()));
}

TEST(PoissonArrivals, SameSeedSameArrivalsOtherSeedOthers) {
  EXPECT_EQ(poisson_arrivals(3.0, 0, 50, 5), poisson_arrivals(3.0, 0, 50, 5));
  EXPECT_NE(poisson_arrivals(3.0, 0, 50, 5), poisson_arrivals(3.0, 0, 50, 6));
  // Whichever limit comes first: the count here.
  EXPECT_EQ(poisson_arrivals(3.0, 1000.0, 50, 5), poisson_arrivals(3.0, 0, 50, 5));
}

TEST(PoissonArrivals, RejectsBadRatesAndMissingLimits) {
  for (double rate : {0.0, -1.0, std::nan(""), double(INFINITY)}) {
    try {
      poisson_arrivals(rate, 10, 0, 0);
      ADD_FAILURE() << "rate " << rate << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--rate must be a positive number"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(poisson_arrivals(1.0, 0, 0, 0), Error);   // no limit at all
  EXPECT_THROW(poisson_arrivals(1.0, -5, 0, 0), Error);  // negative duration
  EXPECT_THROW(poisson_arrivals(1.0, 0, -3, 0), Error);  // negative count
}

TEST(Workload, FixedLengthsWithPoissonArrivals) {
  WorkloadSpec spec;
  spec.rate_per_s = 2;
  spec.num_requests = 30;
  spec.input_len = 2048;
  spec.output_len = 256;
  spec.seed = 9;
  const Workload workload = make_workload(spec);
  ASSERT_EQ(workload.requests.size(), 30u);
  const std::vector<double> arrivals = poisson_arrivals(2, 0, 30, 9);
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_EQ(workload.requests[i].index, int64_t(i));
    EXPECT_EQ(workload.requests[i].arrival_s, arrivals[i]);
    EXPECT_EQ(workload.requests[i].input_len, 2048);
    EXPECT_EQ(workload.requests[i].output_len, 256);
  }
  EXPECT_EQ(workload.last_arrival_s, arrivals.back());
  EXPECT_NE(workload.description.find("Poisson 2 req/s"), std::string::npos) << workload.description;
  EXPECT_NE(workload.description.find("2048 in / 256 out"), std::string::npos) << workload.description;
}

// Arrival seconds after the first row, by hand from the fixture's timestamps (all in minute 18:15).
const double kFixtureArrivals[10] = {0.0,       4.3145790, 4.5418770, 4.7104270, 5.8926550,
                                     6.3115290, 7.7454970, 8.2514310, 8.3370790, 8.4649850};
const int32_t kFixtureInput[10] = {374, 396, 879, 91, 91, 381, 1313, 388, 242, 209};
const int32_t kFixtureOutput[10] = {44, 109, 55, 16, 16, 84, 142, 84, 14, 152};

TEST(Workload, ReplaysTheAzureTraceWithItsLengthsAndTimes) {
  WorkloadSpec spec;
  spec.trace_path = test::fixture_path(kConvFixture);
  const Workload workload = make_workload(spec);
  ASSERT_EQ(workload.requests.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(workload.requests[i].arrival_s, kFixtureArrivals[i], 1e-6) << i;
    EXPECT_EQ(workload.requests[i].input_len, kFixtureInput[i]) << i;
    EXPECT_EQ(workload.requests[i].output_len, kFixtureOutput[i]) << i;
  }
  EXPECT_NE(workload.description.find("azure_conv_first10.csv replay"), std::string::npos) << workload.description;
}

TEST(Workload, TimeScaleDurationAndCountCutTheReplay) {
  WorkloadSpec spec;
  spec.trace_path = test::fixture_path(kConvFixture);
  spec.time_scale = 0.5;  // twice the rate
  Workload workload = make_workload(spec);
  ASSERT_EQ(workload.requests.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(workload.requests[i].arrival_s, 0.5 * kFixtureArrivals[i], 1e-6);

  spec.duration_s = 3.0;  // scaled arrivals below 3 s: rows 0-4 (the fifth is at 2.946)
  workload = make_workload(spec);
  EXPECT_EQ(workload.requests.size(), 5u);
  spec.num_requests = 3;
  workload = make_workload(spec);
  EXPECT_EQ(workload.requests.size(), 3u);

  // Fixed lengths replace the trace's; the arrivals stay.
  spec = WorkloadSpec{};
  spec.trace_path = test::fixture_path(kConvFixture);
  spec.output_len = 8;
  workload = make_workload(spec);
  EXPECT_EQ(workload.requests[2].input_len, 879);
  EXPECT_EQ(workload.requests[2].output_len, 8);
}

TEST(Workload, PoissonArrivalsWithTraceLengthsInRowOrder) {
  WorkloadSpec spec;
  spec.trace_path = test::fixture_path(kConvFixture);
  spec.rate_per_s = 50;
  spec.num_requests = 13;  // more than the rows: cycles
  const Workload workload = make_workload(spec);
  ASSERT_EQ(workload.requests.size(), 13u);
  const std::vector<double> arrivals = poisson_arrivals(50, 0, 13, 0);
  for (size_t i = 0; i < 13; ++i) {
    EXPECT_EQ(workload.requests[i].arrival_s, arrivals[i]);
    EXPECT_EQ(workload.requests[i].input_len, kFixtureInput[i % 10]);
    EXPECT_EQ(workload.requests[i].output_len, kFixtureOutput[i % 10]);
  }
}

TEST(Workload, RealConversationTraceMatchesItsPublishedStatistics) {
  // ../shared/traces/README.md: 19,366 rows over 3,501.7 s (18:15:46.68 -> 19:14:08.40).
  WorkloadSpec spec;
  spec.trace_path = test::shared_path("traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv");
  Workload workload = make_workload(spec);
  EXPECT_EQ(workload.requests.size(), 19366u);
  EXPECT_NEAR(workload.last_arrival_s, 3501.7, 0.05);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(workload.requests[i].arrival_s, kFixtureArrivals[i], 1e-6);
    EXPECT_EQ(workload.requests[i].input_len, kFixtureInput[i]);
  }
  // Its longest prompt (14050) exceeds an 8192-token context: fitting shortens some prompts.
  const int64_t clipped = fit_context(workload, 8192);
  EXPECT_GT(clipped, 0);
  EXPECT_EQ(workload.num_clipped, clipped);
  for (const TimedRequest& r : workload.requests) EXPECT_LE(r.input_len + r.output_len, 8192);
}

TEST(Workload, FitContextShortensThePromptThenTheOutput) {
  Workload workload;
  workload.requests = {{0, 0, 100, 20}, {1, 0, 500, 30}, {2, 0, 10, 600}, {3, 0, 412, 100}};
  EXPECT_EQ(fit_context(workload, 512), 2);
  EXPECT_EQ(workload.requests[0].input_len, 100);  // fits
  EXPECT_EQ(workload.requests[1].input_len, 482);  // 512 - 30
  EXPECT_EQ(workload.requests[1].output_len, 30);
  EXPECT_EQ(workload.requests[2].input_len, 1);    // the output alone overflows
  EXPECT_EQ(workload.requests[2].output_len, 511);
  EXPECT_EQ(workload.requests[3].input_len, 412);  // exactly 512
  EXPECT_THROW(fit_context(workload, 1), Error);
}

TEST(Workload, RejectsBadSpecs) {
  auto message = [](const WorkloadSpec& spec) {
    try {
      make_workload(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  WorkloadSpec spec;
  spec.input_len = 16;
  spec.output_len = 8;
  EXPECT_NE(message(spec).find("give --rate"), std::string::npos) << message(spec);
  spec.rate_per_s = -2;
  spec.num_requests = 4;
  EXPECT_NE(message(spec).find("--rate must be a positive number"), std::string::npos) << message(spec);
  spec.rate_per_s = 2;
  spec.input_len = 0;
  EXPECT_NE(message(spec).find("--input-len and --output-len"), std::string::npos) << message(spec);
  spec.input_len = -1;
  EXPECT_NE(message(spec).find("must not be negative"), std::string::npos) << message(spec);

  WorkloadSpec missing;
  missing.trace_path = "/nonexistent/trace.csv";
  EXPECT_NE(message(missing).find("--trace '/nonexistent/trace.csv': no such file"), std::string::npos)
      << message(missing);
  WorkloadSpec scaled;
  scaled.trace_path = test::fixture_path(kConvFixture);
  scaled.time_scale = 0;
  EXPECT_NE(message(scaled).find("--time-scale must be a positive number"), std::string::npos) << message(scaled);
  scaled.time_scale = 1;
  scaled.duration_s = 1e-9;  // only the first row (at 0) is before it
  EXPECT_EQ(make_workload(scaled).requests.size(), 1u);
  WorkloadSpec not_a_trace;
  not_a_trace.trace_path = test::fixture_path("bench/not_a_trace.csv");
  EXPECT_NE(message(not_a_trace).find("is neither the Azure format"), std::string::npos) << message(not_a_trace);
}

TEST(PromptTokenIds, DeterministicInRangeAndDistinctPerRequest) {
  const std::vector<int32_t> a = prompt_token_ids(1, 0, 2048, 256);
  ASSERT_EQ(a.size(), 2048u);
  EXPECT_EQ(a, prompt_token_ids(1, 0, 2048, 256));
  EXPECT_NE(a, prompt_token_ids(1, 1, 2048, 256));
  EXPECT_NE(a, prompt_token_ids(2, 0, 2048, 256));
  std::set<int32_t> seen(a.begin(), a.end());
  EXPECT_GE(*seen.begin(), 0);
  EXPECT_LT(*seen.rbegin(), 256);
  EXPECT_GT(seen.size(), 250u);  // values missed by 2048 draws: 256 (255/256)^2048 = 0.09 expected
  // No shared first block between two requests (a shared prefix would hit the prefix cache).
  const std::vector<int32_t> b = prompt_token_ids(1, 1, 16, 256);
  EXPECT_FALSE(std::equal(b.begin(), b.end(), a.begin()));
  EXPECT_THROW(prompt_token_ids(0, 0, 16, 0), Error);
  EXPECT_THROW(prompt_token_ids(0, 0, 0, 16), Error);
}

}  // namespace
}  // namespace splitflow::bench
