// core/error.h — the one exception type splitflow throws for bad input and failed invariants.
// Messages name the thing at fault (file, tensor, field, parameter) and the problem, so a user
// can act on them without reading code.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace splitflow {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace splitflow

// SF_CHECK(cond, "fmt", args...) throws splitflow::Error with the formatted message when cond is false.
#define SF_CHECK(cond, ...)                 \
  do {                                      \
    if (!(cond)) ::splitflow::fail(__VA_ARGS__); \
  } while (0)
