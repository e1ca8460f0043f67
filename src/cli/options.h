// cli/options.h — flags shared by the commands that load a model or sample tokens, so
// `generate`, `serve` and `bench` spell them the same way.
#pragma once

#include "backend/backend.h"
#include "engine/model_loader.h"
#include "engine/sampling_params.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

namespace splitflow::cli {

struct ModelFlags {
  ModelLoadOptions load;
  std::string weight_dtype = "auto";  // auto | f32 | f16 | bf16
  int threads = 0;                    // 0: OpenMP default
  std::string backend = "cpu";        // cpu | cuda

  // Resolves the flags into load options (parses --weight-dtype).
  ModelLoadOptions options() const;
  // The backend --backend names (cuda: GPU 0); fails when this build has no CUDA backend.
  std::unique_ptr<Backend> make_backend() const;
};

void add_model_flags(CLI::App& command, ModelFlags& flags);

struct SamplingFlags {
  SamplingParams params;
  std::string fsd = "off";
  uint64_t seed = 0;
  bool seed_given = false;

  SamplingParams resolve() const;  // applies fsd and seed; validate() is the caller's
};

void add_sampling_flags(CLI::App& command, SamplingFlags& flags);

}  // namespace splitflow::cli
