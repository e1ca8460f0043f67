#include "cli/llama_cpp_spellings.h"

#include <array>
#include <string_view>
#include <utility>

namespace splitflow::cli {

std::vector<std::string> rewrite_llama_cpp_spellings(int argc, const char* const* argv) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 2> kLongForms = {{
      {"-ngl", "--n-gpu-layers"},
      {"-sys", "--system-prompt"},
  }};
  std::vector<std::string> args;
  args.reserve(static_cast<size_t>(argc));
  bool options_ended = false;  // after "--" every argument is a value, spelled as given
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    options_ended = options_ended || arg == "--";
    for (const auto& [short_form, long_form] : kLongForms) {
      if (options_ended) break;
      if (arg == short_form || (arg.starts_with(short_form) && arg.size() > short_form.size() &&
                                arg[short_form.size()] == '=')) {
        arg = std::string(long_form) + arg.substr(short_form.size());
        break;
      }
    }
    args.push_back(std::move(arg));
  }
  return args;
}

}  // namespace splitflow::cli
