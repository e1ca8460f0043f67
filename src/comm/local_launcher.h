// comm/local_launcher.h — one process per GPU on this node: starts `world_size` copies of a
// command with the splitflow launch variables (comm/launch_env.h) and a fresh rendezvous
// directory, waits for them, and stops the others when one fails so a crashed rank never leaves
// its peers waiting in a collective. Owns process management only.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace splitflow::comm {

struct WorkerLaunch {
  std::vector<std::string> argv;  // argv[0] is the executable's path
  int world_size = 1;
  std::map<std::string, std::string> extra_env;  // added to (or replacing) this process's environment
  // After the first failure the others get this long to finish before SIGTERM, then SIGKILL.
  std::chrono::milliseconds grace = std::chrono::seconds(10);
  // Whole-run limit (0: none); past it every worker is stopped and reported as killed.
  std::chrono::milliseconds timeout{0};
};

struct WorkerExit {
  int rank = 0;
  int exit_code = 0;  // the process's exit status, or 128 + signal number when a signal ended it
  bool ok() const { return exit_code == 0; }
};

// Starts the workers with SPLITFLOW_RANK, SPLITFLOW_WORLD_SIZE, SPLITFLOW_LOCAL_RANK,
// SPLITFLOW_LOCAL_WORLD_SIZE and SPLITFLOW_COMM_STORE (a new directory under $TMPDIR, removed
// afterwards) set, and returns one WorkerExit per rank, in rank order. Throws splitflow::Error when
// a process cannot be started.
std::vector<WorkerExit> run_local_workers(const WorkerLaunch& launch);

// This process's command line (/proc/self/cmdline) with argv[0] replaced by /proc/self/exe's
// target, so the copy runs the same binary wherever it was started from.
std::vector<std::string> self_command_line();

}  // namespace splitflow::comm
