// cli/version.h — what `splitflow --version` prints: the release, the commit the binary was built
// from, the build type and whether the CUDA backend is in it (what a bug report needs first).
#pragma once

#include <string>

namespace splitflow::cli {

// One line: "splitflow 0.1.0 (commit 1a2b3c4d5e6f, Release build, CUDA off)".
std::string version_text();

}  // namespace splitflow::cli
