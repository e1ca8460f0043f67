#include "comm/local_launcher.h"

#include "comm/launch_env.h"
#include "core/error.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

namespace splitflow::comm {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string make_store_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/splitflow-comm-XXXXXX";
  SF_CHECK(::mkdtemp(pattern.data()) != nullptr, "local launcher: cannot create a rendezvous directory from '{}': {}",
           pattern, std::strerror(errno));
  return pattern;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

pid_t spawn(const std::vector<std::string>& argv, const EnvMap& env) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, argv[0].c_str(), nullptr, nullptr, args.data(), envp.data());
  SF_CHECK(error == 0, "local launcher: cannot start '{}': {}", argv[0], std::strerror(error));
  return pid;
}

}  // namespace

std::vector<WorkerExit> run_local_workers(const WorkerLaunch& launch) {
  SF_CHECK(!launch.argv.empty(), "local launcher: empty command");
  SF_CHECK(launch.world_size >= 1, "local launcher: world size {} (at least 1)", launch.world_size);
  const std::string store_dir = make_store_dir();

  std::vector<pid_t> pids(launch.world_size, 0);
  std::vector<std::optional<int>> codes(launch.world_size);
  auto signal_running = [&](int signal_number) {
    for (int r = 0; r < launch.world_size; ++r) {
      if (pids[r] > 0 && !codes[r]) ::kill(pids[r], signal_number);
    }
  };
  try {
    for (int r = 0; r < launch.world_size; ++r) {
      EnvMap env = current_environment();
      for (const auto& [name, value] : launch.extra_env) env[name] = value;
      env["SPLITFLOW_RANK"] = std::to_string(r);
      env["SPLITFLOW_WORLD_SIZE"] = std::to_string(launch.world_size);
      env["SPLITFLOW_LOCAL_RANK"] = std::to_string(r);
      env["SPLITFLOW_LOCAL_WORLD_SIZE"] = std::to_string(launch.world_size);
      env["SPLITFLOW_COMM_STORE"] = store_dir;
      pids[r] = spawn(launch.argv, env);
    }
  } catch (const Error&) {
    signal_running(SIGKILL);
    for (int r = 0; r < launch.world_size; ++r) {
      if (pids[r] > 0) ::waitpid(pids[r], nullptr, 0);
    }
    std::error_code ignored;
    fs::remove_all(store_dir, ignored);
    throw;
  }

  const auto start = Clock::now();
  std::optional<Clock::time_point> stop_since;  // first failure or timeout
  bool terminated = false;
  int running = launch.world_size;
  while (running > 0) {
    bool reaped = false;
    for (int r = 0; r < launch.world_size; ++r) {
      if (codes[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      codes[r] = exit_code_of(status);
      --running;
      reaped = true;
      if (*codes[r] != 0 && !stop_since) stop_since = Clock::now();
    }
    const auto now = Clock::now();
    if (launch.timeout.count() > 0 && now - start > launch.timeout && !stop_since) {
      stop_since = now - launch.grace;  // stop at once
    }
    if (stop_since && running > 0) {
      if (!terminated && now - *stop_since >= launch.grace) {
        signal_running(SIGTERM);
        terminated = true;
      } else if (terminated && now - *stop_since >= launch.grace + std::chrono::seconds(3)) {
        signal_running(SIGKILL);
      }
    }
    if (!reaped && running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  std::error_code ignored;
  fs::remove_all(store_dir, ignored);
  std::vector<WorkerExit> exits(launch.world_size);
  for (int r = 0; r < launch.world_size; ++r) exits[r] = {r, *codes[r]};
  return exits;
}

std::vector<std::string> self_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string text = bytes.str();
  std::vector<std::string> argv;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\0', begin);
    if (end == std::string::npos) end = text.size();
    argv.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  SF_CHECK(!argv.empty(), "local launcher: cannot read /proc/self/cmdline");
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  SF_CHECK(!error, "local launcher: cannot resolve /proc/self/exe: {}", error.message());
  argv[0] = exe.string();
  return argv;
}

}  // namespace splitflow::comm
