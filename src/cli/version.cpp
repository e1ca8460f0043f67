#include "cli/version.h"

#include "build_commit.h"  // generated at build time by cmake/BuildInfo.cmake

#include <fmt/format.h>

#ifndef SPLITFLOW_VERSION
#define SPLITFLOW_VERSION "unknown"
#endif
#ifndef SPLITFLOW_BUILD_TYPE
#define SPLITFLOW_BUILD_TYPE "unknown"
#endif

namespace splitflow::cli {

std::string version_text() {
#ifdef SPLITFLOW_HAS_CUDA
  constexpr const char* kCuda = "CUDA on";
#else
  constexpr const char* kCuda = "CUDA off";
#endif
  return fmt::format("splitflow {} (commit {}, {} build, {})", SPLITFLOW_VERSION, SPLITFLOW_BUILD_COMMIT,
                     SPLITFLOW_BUILD_TYPE, kCuda);
}

}  // namespace splitflow::cli
