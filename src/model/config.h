// model/config.h — resolving a model's ModelSpec from what it ships with. The built-in templates
// (models/*.json, compiled in) say which HF `architectures`, GGUF `general.architecture` or
// checkpoint format they serve; the chosen template is evaluated against the config (HF
// config.json plus generation_config.json under the key "generation_config", GGUF metadata, or
// the llama2.c header). A user spec file then overrides any field (JSON merge patch, RFC 7396,
// whose string values may be template expressions too) and the result is validated.
//
// A user spec may name its base with "template": "<name>" (a models/*.json file name). Without
// a template that serves the model, the user spec alone is the spec: a complete hand-written spec
// (no '$' references) needs no config at all. This module never names an architecture in code.
#pragma once

#include "model/spec.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace splitflow {

class WeightSource;

struct UserSpec {
  nlohmann::json body;  // a JSON object: spec fields, plus an optional "template" name
  std::string name;     // for messages: "spec file 'my.json'"
};

// Where a spec comes from. The template is picked by the first user spec with a "template" key,
// else by `hf_architectures`, `gguf_architecture` or `format`; user specs patch it in order.
struct SpecRequest {
  nlohmann::json config;                     // null when the model has none
  std::string config_name;                   // for messages: "config.json '/m/config.json'"
  std::vector<std::string> hf_architectures; // config.json "architectures"
  std::string gguf_architecture;             // GGUF general.architecture
  std::string format;                        // "llama2c"
  std::vector<UserSpec> user_specs;
};

// The resolved spec as JSON (before parsing), for `splitflow inspect` and tests.
nlohmann::json resolve_spec_json(const SpecRequest& request);
ModelSpec resolve_spec(const SpecRequest& request);

// HF directory: config.json (optional when a user spec is given) + generation_config.json.
// llama.cpp's tensor of per-pair RoPE frequency divisors (Llama 3.1+ GGUFs: the llama3 scaling).
inline constexpr const char* kGgufRopeFreqs = "rope_freqs.weight";
ModelSpec resolve_hf_spec(const std::string& model_dir, const std::string& user_spec_path = "");
// An opened checkpoint: GGUF -> its metadata, llama2c -> its header, safetensors -> the
// config.json next to `model_path` (the directory, or the file's directory). A GGUF's
// kGgufRopeFreqs tensor becomes rope.scaling freq_factors.
ModelSpec resolve_source_spec(const WeightSource& source, const std::string& model_path,
                              const std::string& user_spec_path = "");
// --dummy-weights: `path` is a HF config.json (it has "architectures") or a spec file (then the
// user spec, if any, patches it).
ModelSpec resolve_config_spec(const std::string& path, const std::string& user_spec_path = "");

// Reads a JSON file that may contain // and /* */ comments; errors name the file and position.
nlohmann::json read_json_file(const std::string& path);

// The names of the built-in templates and what they serve, for messages and `splitflow inspect`.
std::vector<std::string> known_hf_architectures();
std::vector<std::string> known_gguf_architectures();
std::vector<std::string> template_names();

}  // namespace splitflow
