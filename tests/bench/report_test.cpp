// bench/report.h: every result written names the kernel-path switches set in the environment (so
// the two sides of an A/B run are told apart by their JSON), and only those: never another
// variable (the API key lives in the environment too).
#include "bench/report.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace splitflow::bench {
namespace {

nlohmann::json read_back(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(BenchReport, ResultsNameTheKernelSwitchesSetAndNoOtherVariable) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "splitflow-report-test";
  std::filesystem::remove_all(dir);
  setenv("SPLITFLOW_CUDA_Q8_ACTIVATIONS", "0", 1);
  setenv("SPLITFLOW_CPU_PIN", "0", 1);
  setenv("SPLITFLOW_API_KEY", "not-for-results", 1);
  const std::string path = write_result({{"benchmark", "test"}}, dir.string(), "a");
  const nlohmann::json switched = read_back(path);
  EXPECT_EQ(switched.at("benchmark"), "test");
  EXPECT_EQ(switched.at("kernel_switches"),
            nlohmann::json({{"SPLITFLOW_CPU_PIN", "0"}, {"SPLITFLOW_CUDA_Q8_ACTIVATIONS", "0"}}));
  EXPECT_EQ(switched.dump().find("not-for-results"), std::string::npos);
  unsetenv("SPLITFLOW_CUDA_Q8_ACTIVATIONS");
  unsetenv("SPLITFLOW_CPU_PIN");
  unsetenv("SPLITFLOW_API_KEY");
  EXPECT_EQ(kernel_switches(), nlohmann::json::object());  // defaults: nothing set
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace splitflow::bench
