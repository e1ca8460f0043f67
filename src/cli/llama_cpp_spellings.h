// cli/llama_cpp_spellings.h — llama.cpp's multi-letter single-dash flags (-ngl, -sys), which CLI11
// cannot declare (its short names are one character), rewritten to the long spellings the
// commands declare (--n-gpu-layers, --system-prompt) before parsing. The one-letter and long
// llama.cpp spellings (-m, -c/--ctx-size, -n/--n-predict, --temp, -p, -s, -t, --top-k, --top-p)
// are declared as aliases where the flags live (cli/options.cpp and the commands).
#pragma once

#include <string>
#include <vector>

namespace splitflow::cli {

// argv with "-ngl" and "-sys" (alone, or as "-ngl=99") spelled long; every other argument as given.
std::vector<std::string> rewrite_llama_cpp_spellings(int argc, const char* const* argv);

}  // namespace splitflow::cli
