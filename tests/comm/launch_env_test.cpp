// comm/launch_env: rank, world size, local rank and rendezvous directory from each launcher's
// variables, and every malformed combination rejected with the variable named.
#include "comm/launch_env.h"

#include "core/error.h"

#include <gtest/gtest.h>

using namespace splitflow;
using namespace splitflow::comm;

namespace {

std::string error_of(const EnvMap& env) {
  try {
    parse_launch_env(env);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST(LaunchEnv, NoLauncherIsASingleRank) {
  const LaunchInfo info = parse_launch_env({});
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.launcher, "none");
  EXPECT_EQ(info.store_dir, "");
}

TEST(LaunchEnv, SplitflowLauncher) {
  const LaunchInfo info = parse_launch_env({{"SPLITFLOW_RANK", "1"},
                                            {"SPLITFLOW_WORLD_SIZE", "2"},
                                            {"SPLITFLOW_LOCAL_RANK", "1"},
                                            {"SPLITFLOW_LOCAL_WORLD_SIZE", "2"},
                                            {"SPLITFLOW_COMM_STORE", "/tmp/store-x"}});
  EXPECT_EQ(info.launcher, "splitflow");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.store_dir, "/tmp/store-x");
}

TEST(LaunchEnv, SplitflowVariablesWinOverTorchrunOnes) {
  const LaunchInfo info = parse_launch_env({{"SPLITFLOW_RANK", "0"},
                                            {"SPLITFLOW_WORLD_SIZE", "2"},
                                            {"RANK", "3"},
                                            {"WORLD_SIZE", "4"},
                                            {"SPLITFLOW_COMM_STORE", "/tmp/s"}});
  EXPECT_EQ(info.launcher, "splitflow");
  EXPECT_EQ(info.world_size, 2);
}

TEST(LaunchEnv, TorchrunWithRunIdAndPort) {
  const LaunchInfo info = parse_launch_env({{"RANK", "5"},
                                            {"WORLD_SIZE", "8"},
                                            {"LOCAL_RANK", "1"},
                                            {"LOCAL_WORLD_SIZE", "4"},
                                            {"TORCHELASTIC_RUN_ID", "job/7"},
                                            {"MASTER_PORT", "29500"},
                                            {"TMPDIR", "/scratch"}});
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  // '/' is not safe in a directory name.
  EXPECT_EQ(info.store_dir, "/scratch/splitflow-comm-torchrun-job_7-29500");
}

TEST(LaunchEnv, OpenMpiUsesTheJobNamespace) {
  const LaunchInfo info = parse_launch_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                            {"OMPI_COMM_WORLD_SIZE", "4"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                            {"PMIX_NAMESPACE", "prterun-host-1234@1"}});
  EXPECT_EQ(info.launcher, "openmpi");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.store_dir, "/tmp/splitflow-comm-ompi-prterun-host-1234_1");
}

TEST(LaunchEnv, OpenMpi4JobId) {
  const LaunchInfo info = parse_launch_env(
      {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_MCA_orte_ess_jobid", "123456"}});
  EXPECT_EQ(info.store_dir, "/tmp/splitflow-comm-ompi-123456");
  EXPECT_EQ(info.local_rank, 0);  // no local rank: one node, local rank = rank
  EXPECT_EQ(info.local_world_size, 2);
}

TEST(LaunchEnv, MpichNeedsAnExplicitStore) {
  EXPECT_NE(error_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}).find("SPLITFLOW_COMM_STORE"), std::string::npos);
  const LaunchInfo info =
      parse_launch_env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "1"}, {"SPLITFLOW_JOB_ID", "abc"}});
  EXPECT_EQ(info.launcher, "mpich");
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.store_dir, "/tmp/splitflow-comm-abc");
}

TEST(LaunchEnv, Slurm) {
  const LaunchInfo info = parse_launch_env({{"SLURM_PROCID", "2"},
                                            {"SLURM_NTASKS", "4"},
                                            {"SLURM_LOCALID", "0"},
                                            {"SLURM_JOB_ID", "991"},
                                            {"SLURM_STEP_ID", "3"},
                                            {"SLURM_NTASKS_PER_NODE", "2(x2)"}});
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.store_dir, "/tmp/splitflow-comm-slurm-991.3");
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  EXPECT_NE(error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}).find("RANK='x1'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}).find("RANK='-1'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", ""}, {"WORLD_SIZE", "2"}}).find("RANK=''"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2 "}}).find("WORLD_SIZE='2 '"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"SPLITFLOW_COMM_STORE", "/s"}}).find("RANK=2 is not below"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}}).find("WORLD_SIZE is set but RANK is not"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"},
                      {"SPLITFLOW_COMM_STORE", "/s"}})
                .find("LOCAL_RANK=3"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SPLITFLOW_COMM_STORE", ""}}).find("SPLITFLOW_COMM_STORE is empty"),
            std::string::npos);
}

TEST(LaunchEnv, TorchrunWithoutRunIdOrPortHasNoStore) {
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("no rendezvous directory"), std::string::npos);
}

TEST(LaunchEnv, CurrentEnvironmentSeesSetVariables) {
  ::setenv("SPLITFLOW_LAUNCH_ENV_TEST", "a=b", 1);
  const EnvMap env = current_environment();
  ASSERT_TRUE(env.count("SPLITFLOW_LAUNCH_ENV_TEST"));
  EXPECT_EQ(env.at("SPLITFLOW_LAUNCH_ENV_TEST"), "a=b");  // only the first '=' separates
  ::unsetenv("SPLITFLOW_LAUNCH_ENV_TEST");
}
