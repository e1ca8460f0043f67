// comm/local_launcher: workers get their rank variables and a shared store, exit codes come back
// per rank, a failing worker gets the others stopped, and the whole-run timeout holds.
#include "comm/local_launcher.h"

#include "comm/launch_env.h"
#include "core/error.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace splitflow;
using namespace splitflow::comm;
using namespace std::chrono_literals;

TEST(LocalLauncher, WorkersSeeTheirRankAndExitCodesComeBackInOrder) {
  WorkerLaunch launch;
  launch.argv = {"/bin/sh", "-c", "exit $((SPLITFLOW_RANK + 3 * SPLITFLOW_WORLD_SIZE))"};
  launch.world_size = 3;
  const std::vector<WorkerExit> exits = run_local_workers(launch);
  ASSERT_EQ(exits.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(exits[r].rank, r);
    EXPECT_EQ(exits[r].exit_code, r + 9);
  }
}

TEST(LocalLauncher, WorkersShareAStoreAndParseAsSplitflowLaunch) {
  const std::string out = ::testing::TempDir() + "/sf-launch-" + std::to_string(::getpid());
  std::filesystem::create_directories(out);
  WorkerLaunch launch;
  // Each worker records what parse_launch_env would read; the store must exist while they run.
  launch.argv = {"/bin/sh", "-c",
                 "test -d \"$SPLITFLOW_COMM_STORE\" && echo \"$SPLITFLOW_RANK $SPLITFLOW_LOCAL_RANK "
                 "$SPLITFLOW_LOCAL_WORLD_SIZE $SPLITFLOW_COMM_STORE $EXTRA\" > \"$OUT_DIR/$SPLITFLOW_RANK\""};
  launch.world_size = 2;
  launch.extra_env = {{"OUT_DIR", out}, {"EXTRA", "x"}};
  const std::vector<WorkerExit> exits = run_local_workers(launch);
  ASSERT_TRUE(exits[0].ok() && exits[1].ok());
  std::string store_dirs[2];
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(out + "/" + std::to_string(r));
    int rank = -1, local_rank = -1, local_world = -1;
    std::string extra;
    in >> rank >> local_rank >> local_world >> store_dirs[r] >> extra;
    EXPECT_EQ(rank, r);
    EXPECT_EQ(local_rank, r);
    EXPECT_EQ(local_world, 2);
    EXPECT_EQ(extra, "x");
  }
  EXPECT_EQ(store_dirs[0], store_dirs[1]);
  EXPECT_FALSE(std::filesystem::exists(store_dirs[0]));  // removed after the run
  std::filesystem::remove_all(out);
}

TEST(LocalLauncher, AFailingWorkerStopsTheOthers) {
  WorkerLaunch launch;
  // Rank 0 would wait a minute for a peer that died; rank 1 fails at once.
  launch.argv = {"/bin/sh", "-c", "if [ $SPLITFLOW_RANK = 1 ]; then exit 7; fi; exec sleep 60"};
  launch.world_size = 2;
  launch.grace = 100ms;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<WorkerExit> exits = run_local_workers(launch);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  EXPECT_EQ(exits[1].exit_code, 7);
  EXPECT_EQ(exits[0].exit_code, 128 + SIGTERM);
}

TEST(LocalLauncher, TimeoutStopsEveryWorker) {
  WorkerLaunch launch;
  launch.argv = {"/bin/sh", "-c", "exec sleep 60"};
  launch.world_size = 2;
  launch.grace = 100ms;
  launch.timeout = 200ms;
  const std::vector<WorkerExit> exits = run_local_workers(launch);
  EXPECT_FALSE(exits[0].ok());
  EXPECT_FALSE(exits[1].ok());
}

TEST(LocalLauncher, MissingExecutableIsAnError) {
  WorkerLaunch launch;
  launch.argv = {"/nonexistent/splitflow-worker"};
  launch.world_size = 2;
  try {
    run_local_workers(launch);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/splitflow-worker"), std::string::npos);
  }
}

TEST(LocalLauncher, BadArgumentsAreErrors) {
  WorkerLaunch launch;
  EXPECT_THROW(run_local_workers(launch), Error);  // empty command
  launch.argv = {"/bin/true"};
  launch.world_size = 0;
  EXPECT_THROW(run_local_workers(launch), Error);
}

TEST(LocalLauncher, SelfCommandLineIsThisTestBinary) {
  const std::vector<std::string> argv = self_command_line();
  ASSERT_FALSE(argv.empty());
  EXPECT_TRUE(std::filesystem::exists(argv[0]));
  EXPECT_NE(argv[0].find("test_comm"), std::string::npos);
}
