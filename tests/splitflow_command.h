// tests/splitflow_command.h — runs the splitflow binary as a user does (a shell command), for
// the command-line tests: exit status, stdout, stderr.
#pragma once

#include "test_paths.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace splitflow::test {

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out, err;
};

inline std::string shell_quote(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// `env_prefix` is prepended to the shell command (e.g. "PATH=/nonexistent").
inline CommandResult run_splitflow(const std::vector<std::string>& args, const std::string& env_prefix = "") {
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() / ("sf_cli_err_" + std::to_string(::getpid()));
  std::string command = env_prefix.empty() ? "" : env_prefix + " ";
  command += shell_quote(splitflow_binary());
  for (const std::string& arg : args) command += " " + shell_quote(arg);
  command += " 2>" + shell_quote(err_path.string());
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  char buffer[4096];
  size_t count;
  while ((count = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, count);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = read_file(err_path.string());
  std::filesystem::remove(err_path);
  return result;
}

// A clean failure: exit status 1 and "error: ..." naming `message_part` on stderr.
inline void expect_command_error(const CommandResult& result, const std::string& message_part) {
  EXPECT_EQ(result.exit_code, 1) << "stderr: " << result.err;
  EXPECT_NE(result.err.find("error: "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find(message_part), std::string::npos) << "expected '" << message_part << "' in: " << result.err;
}

}  // namespace splitflow::test
