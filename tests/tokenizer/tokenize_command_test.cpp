// `splitflow tokenize` as a user runs it: ids on one line, BOS only with --add-special.
#include "test_paths.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>

namespace splitflow {
namespace {

// Runs a shell command; returns stdout and sets `status` to the exit status.
std::string run(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) out.append(buffer.data(), n);
  status = WEXITSTATUS(pclose(pipe));
  return out;
}

TEST(TokenizeCommand, PrintsIdsOnOneLine) {
  const std::string base = test::splitflow_binary() + " tokenize --model " + test::shared_path("models/stories260K/stories260K.bin");
  int status = -1;
  EXPECT_EQ(run(base + " --text 'Once upon a time' --add-special", status), "1 403 407 261 378\n");
  EXPECT_EQ(status, 0);
  EXPECT_EQ(run(base + " --text 'Once upon a time'", status), "403 407 261 378\n");
  EXPECT_EQ(status, 0);
}

TEST(TokenizeCommand, InputFileGivesOneLinePerString) {
  const std::string input = testing::TempDir() + "/tokenize_input.jsonl";
  std::ofstream(input) << "\"Once upon a time\"\n\"\"\n\"Once\"\n";
  int status = -1;
  const std::string out = run(test::splitflow_binary() + " tokenize --model " +
                                  test::shared_path("models/stories260K/stories260K.bin") + " --input-file " + input,
                              status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(out, "403 407 261 378\n\n403\n");
}

TEST(TokenizeCommand, ErrorsNameTheProblem) {
  int status = -1;
  const std::string out = run(test::splitflow_binary() + " tokenize --model /nonexistent/model --text hi", status);
  EXPECT_EQ(status, 1);
  EXPECT_NE(out.find("error: model path '/nonexistent/model' does not exist"), std::string::npos) << out;
  const std::string input = testing::TempDir() + "/tokenize_bad.jsonl";
  std::ofstream(input) << "\"ok\"\nnot json\n";
  const std::string bad = run(test::splitflow_binary() + " tokenize --model " +
                                  test::shared_path("models/stories260K/stories260K.bin") + " --input-file " + input,
                              status);
  EXPECT_EQ(status, 1);
  EXPECT_NE(bad.find("line 2: not a JSON value"), std::string::npos) << bad;
}

}  // namespace
}  // namespace splitflow
