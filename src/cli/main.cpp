// cli/main.cpp — the splitflow command: one subcommand per cli/<name>_command.cpp.
// Every splitflow::Error ends the command with "error: <message>" and exit status 1; any other
// exception that escapes a command does too, as a one-line "error: ..." rather than an abort.
// Every log line goes to stderr: stdout carries only what a command produces (generated text,
// JSON), so it can be piped.
#include "cli/commands.h"
#include "cli/llama_cpp_spellings.h"
#include "cli/version.h"
#include "core/error.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <new>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  // spdlog's default logger writes to stdout, where it would mix into generated text.
  spdlog::set_default_logger(spdlog::stderr_color_mt("splitflow"));
  CLI::App app{"splitflow: LLM inference and serving engine"};
  app.set_version_flag("--version", splitflow::cli::version_text(), "print the version, commit, build type and CUDA");
  app.require_subcommand(1);
  splitflow::cli::register_generate(app);
  splitflow::cli::register_tokenize(app);
  splitflow::cli::register_inspect(app);
  splitflow::cli::register_bench(app);
#ifdef SPLITFLOW_HAS_HTTP_SERVER
  splitflow::cli::register_serve(app);
  splitflow::cli::register_route(app);
#endif
  splitflow::cli::register_sim(app);
  splitflow::cli::register_profile(app);
  splitflow::cli::register_perplexity(app);
  splitflow::cli::register_quantize(app);
  splitflow::cli::register_chat(app);
  splitflow::cli::register_embed(app);
  const std::vector<std::string> args = splitflow::cli::rewrite_llama_cpp_spellings(argc, argv);
  std::vector<const char*> arg_pointers;
  for (const std::string& arg : args) arg_pointers.push_back(arg.c_str());
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const splitflow::Error& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // A size no check caught: report it instead of letting the runtime abort.
    fmt::print(stderr, "error: out of memory (std::bad_alloc); an input may claim a size it does not hold\n");
    return 1;
  } catch (const std::exception& error) {
    // std::length_error, std::out_of_range, nlohmann::json exceptions, ...: a bug to fix with a
    // splitflow::Error at its source, but never an abort.
    fmt::print(stderr, "error: internal error: {}\n", error.what());
    return 1;
  } catch (...) {
    fmt::print(stderr, "error: internal error: unknown exception\n");
    return 1;
  }
  return 0;
}
