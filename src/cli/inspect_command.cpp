// `splitflow inspect`: the resolved spec, the layer plan and the checkpoint's tensor table.
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "formats/weight_source.h"
#include "model/config.h"
#include "runtime/layer_plan.h"

#include <fmt/format.h>

#include <memory>

namespace splitflow::cli {

namespace {

struct InspectFlags {
  ModelFlags model;
  bool metadata = false;
};

// Long arrays (GGUF vocabularies) are summarised, not dumped.
nlohmann::json summarise(const nlohmann::json& value) {
  if (value.is_array() && value.size() > 16) return fmt::format("[{} items]", value.size());
  if (!value.is_object()) return value;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, item] : value.items()) out[key] = summarise(item);
  return out;
}

void run_inspect(const InspectFlags& flags) {
  const ModelLoadOptions& load = flags.model.load;
  std::unique_ptr<WeightSource> source;
  ModelSpec spec;
  if (load.dummy_weights || load.model_path.empty()) {
    SF_CHECK(!load.config_path.empty() || !load.spec_path.empty(), "give --model PATH, or --config/--spec");
    spec = resolve_config_spec(load.config_path.empty() ? load.spec_path : load.config_path,
                               load.config_path.empty() ? "" : load.spec_path);
  } else {
    source = open_weights(load.model_path);
    spec = resolve_source_spec(*source, load.model_path, load.spec_path);
  }
  fmt::print("spec:\n{}\n\nlayer plan (every layer):\n{}\n", spec_to_json(spec).dump(2), build_layer_plan(spec).describe());
  if (!source) return;
  if (flags.metadata) fmt::print("\nmetadata ({}):\n{}\n", source->format(), summarise(source->metadata()).dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  fmt::print("\ntensors ({}, {}):\n", source->format(), source->tensors().size());
  int64_t total = 0;
  for (const TensorInfo& info : source->tensors()) {
    fmt::print("  {:<56} {:<5} {}\n", info.name, dtype_name(info.tensor.dtype), shape_str(info.tensor.shape));
    total += info.tensor.numel();
  }
  fmt::print("parameters: {}\n", total);
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto flags = std::make_shared<InspectFlags>();
  auto* command = app.add_subcommand("inspect", "print the resolved model spec, layer plan and tensor table");
  add_model_flags(*command, flags->model);
  command->add_flag("--metadata", flags->metadata, "also print the checkpoint's metadata");
  command->callback([flags] { run_inspect(*flags); });
}

}  // namespace splitflow::cli
