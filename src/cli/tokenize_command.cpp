#include "cli/commands.h"
#include "core/error.h"

namespace splitflow::cli {

// Placeholder until the command lands (issue 2 in progress).
void register_tokenize(CLI::App& app) {
  auto* command = app.add_subcommand("tokenize", "(not built yet)");
  command->callback([] { fail("splitflow tokenize is not built yet"); });
}

}  // namespace splitflow::cli
