#include "cli/commands.h"
#include "core/error.h"

namespace splitflow::cli {

// Placeholder until the command lands (issue 2 in progress).
void register_generate(CLI::App& app) {
  auto* command = app.add_subcommand("generate", "(not built yet)");
  command->callback([] { fail("splitflow generate is not built yet"); });
}

}  // namespace splitflow::cli
