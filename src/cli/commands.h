// cli/commands.h — each subcommand lives in its own cli/<name>_command.cpp and registers itself
// on the app; main.cpp only wires them up and turns splitflow::Error into a clean exit.
#pragma once

#include <CLI/CLI.hpp>

namespace splitflow::cli {

void register_tokenize(CLI::App& app);
void register_generate(CLI::App& app);
void register_inspect(CLI::App& app);
void register_bench(CLI::App& app);
// `splitflow bench allreduce` (cli/bench_allreduce_command.cpp), added under the bench command.
void register_bench_allreduce(CLI::App& bench);
// `splitflow bench serve` and `bench throughput` (cli/bench_serve_command.cpp), under the bench command.
void register_bench_serving(CLI::App& bench);
// `splitflow bench grammar` (cli/bench_grammar_command.cpp): structured outputs' per-token cost.
void register_bench_grammar(CLI::App& bench);
// `splitflow bench embed` (cli/bench_embed_command.cpp): offline embedding throughput.
void register_bench_embed(CLI::App& bench);
#ifdef SPLITFLOW_HAS_HTTP_SERVER
void register_serve(CLI::App& app);
// `splitflow route` (cli/route_command.cpp): the Splitwise router over serve instances.
void register_route(CLI::App& app);
#endif
void register_sim(CLI::App& app);
// `splitflow profile` (cli/profile_command.cpp): the simulator's perf-model CSV from this device.
void register_profile(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_quantize(CLI::App& app);
void register_chat(CLI::App& app);
void register_embed(CLI::App& app);

}  // namespace splitflow::cli
