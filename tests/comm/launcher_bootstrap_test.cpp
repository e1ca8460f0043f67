// The bootstrap under real launchers: OpenMPI's mpirun (Debian's openmpi-bin) and torchrun (from
// the torch wheel) each start two copies of this binary. Every copy reads who it is from the
// variables the launcher set (parse_launch_env), derives the rendezvous directory from the job's
// id, and meets the other copy there through a FileStore. Each test skips when its launcher is
// not on PATH; scripts/setup.sh installs both for CI.
#include "comm/file_store.h"
#include "comm/launch_env.h"
#include "comm/local_launcher.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace splitflow;
using namespace splitflow::comm;

namespace {

constexpr const char* kWorkerVariable = "SPLITFLOW_BOOTSTRAP_WORKER";  // the launcher name the worker expects
constexpr int kWorld = 2;

bool on_path(const std::string& program) {
  return std::system(fmt::format("command -v {} > /dev/null 2>&1", program).c_str()) == 0;
}

struct LaunchRun {
  int exit_code = -1;
  std::string output;
};

LaunchRun run_launcher(const std::string& command) {
  LaunchRun result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) result.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// This test binary, run by the launcher as the worker test.
std::string worker_command() {
  return fmt::format("{} --gtest_filter=LauncherBootstrap.Worker", self_command_line().front());
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void expect_both_workers_met(const LaunchRun& run, const std::string& launcher) {
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(count(run.output, fmt::format("[bootstrap] {} rank {} of {} met every rank", launcher, rank, kWorld)), 1u)
        << run.output;
  }
}

}  // namespace

// The worker: only runs under a launcher (the variable names the launcher it expects).
TEST(LauncherBootstrap, Worker) {
  const char* expected = std::getenv(kWorkerVariable);
  if (expected == nullptr) GTEST_SKIP() << "runs only when a launcher test starts it";
  const LaunchInfo info = parse_launch_env(current_environment());
  ASSERT_EQ(info.launcher, expected);
  ASSERT_EQ(info.world_size, kWorld);
  EXPECT_EQ(info.local_world_size, kWorld);
  EXPECT_EQ(info.local_rank, info.rank);  // one node
  ASSERT_FALSE(info.store_dir.empty());
  // Every rank must have derived the same directory: each publishes its own, and reads the others'.
  FileStore store(info.store_dir, info.rank, info.world_size, std::chrono::seconds(60));
  const std::vector<std::string> seen = store.allgather("identity", fmt::format("{} {}", info.rank, info.store_dir));
  ASSERT_EQ(seen.size(), static_cast<size_t>(kWorld));
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(seen[rank], fmt::format("{} {}", rank, info.store_dir));
  store.barrier("done");
  store.finish();
  if (!::testing::Test::HasFailure())
    std::printf("[bootstrap] %s rank %d of %d met every rank\n", expected, info.rank, info.world_size);
}

TEST(LauncherBootstrap, OpenMpiMpirun) {
  if (!on_path("mpirun")) GTEST_SKIP() << "no mpirun on PATH (Debian: openmpi-bin)";
  // --allow-run-as-root: CI containers run as root; -x passes the variable to the ranks.
  const LaunchRun result = run_launcher(fmt::format("{}=openmpi mpirun --allow-run-as-root --oversubscribe -np {} -x {} {}",
                                     kWorkerVariable, kWorld, kWorkerVariable, worker_command()));
  expect_both_workers_met(result, "openmpi");
}

TEST(LauncherBootstrap, Torchrun) {
  if (!on_path("torchrun")) GTEST_SKIP() << "no torchrun on PATH (PyPI: torch)";
  // --no-python runs the binary itself; the port is free-picked by the rendezvous backend.
  const LaunchRun result = run_launcher(fmt::format("{}=torchrun torchrun --no-python --standalone --nproc-per-node {} {}",
                                     kWorkerVariable, kWorld, worker_command()));
  expect_both_workers_met(result, "torchrun");
}
