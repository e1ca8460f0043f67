// cli/main.cpp — the splitflow command: one subcommand per cli/<name>_command.cpp.
// Every splitflow::Error ends the command with "error: <message>" and exit status 1.
#include "cli/commands.h"
#include "core/error.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

int main(int argc, char** argv) {
  CLI::App app{"splitflow: LLM inference and serving engine"};
  app.require_subcommand(1);
  splitflow::cli::register_generate(app);
  splitflow::cli::register_tokenize(app);
  splitflow::cli::register_inspect(app);
  splitflow::cli::register_bench(app);
#ifdef SPLITFLOW_HAS_HTTPLIB
  splitflow::cli::register_serve(app);
#endif
  splitflow::cli::register_sim(app);
  splitflow::cli::register_perplexity(app);
  splitflow::cli::register_quantize(app);
  splitflow::cli::register_chat(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const splitflow::Error& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return 1;
  }
  return 0;
}
