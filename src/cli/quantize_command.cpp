// `splitflow quantize`: a GGUF rewritten with its weights in another type (convert/quantize_checkpoint.h).
#include "cli/commands.h"
#include "convert/quantize_checkpoint.h"
#include "core/error.h"

#include <fmt/format.h>

#include <memory>

namespace splitflow::cli {

namespace {

struct QuantizeFlags {
  std::string model;
  std::string type;
  std::string out;
  bool verbose = false;
};

void run_quantize(const QuantizeFlags& flags) {
  const DType target = parse_dtype(flags.type);
  SF_CHECK(flags.model != flags.out, "quantize: --out must differ from --model");
  const QuantizeReport report =
      quantize_checkpoint(flags.model, target, flags.out, [&](const std::string& name, DType type) {
        if (flags.verbose) fmt::print(stderr, "  {:<40} {}\n", name, dtype_name(type));
      });
  fmt::print("{}: {} tensors in {}, {} in a fallback type, {} kept; {:.1f} MiB -> {:.1f} MiB\n", flags.out,
             report.quantized, dtype_name(target), report.fallback, report.kept, report.input_bytes / 1048576.0,
             report.output_bytes / 1048576.0);
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto flags = std::make_shared<QuantizeFlags>();
  auto* command = app.add_subcommand("quantize", "rewrite a GGUF with its weights in another type");
  command->add_option("--model", flags->model, "input GGUF file")->required();
  command->add_option("--type,-t", flags->type,
                      "q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k (llama.cpp reads these), "
                      "q{2,3,4,5,6,8}_b{32,64} q3h_b64 f8_channel f8_g128 i8_g{32,64,128} (splitflow's), f32 f16 bf16")
      ->required();
  command->add_option("--out,-o", flags->out, "output GGUF file")->required();
  command->add_flag("--verbose,-v", flags->verbose, "print each tensor's output type");
  command->callback([flags] { run_quantize(*flags); });
}

}  // namespace splitflow::cli
