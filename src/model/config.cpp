#include "model/config.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/weight_source.h"
#include "model/embedded_specs.h"
#include "model/template.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace splitflow {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Keys only templates (and user specs) carry; they are consumed here, never seen by spec_from_json.
constexpr const char* kServesKey = "serves";
constexpr const char* kUnsupportedKey = "unsupported";
constexpr const char* kTemplateKey = "template";

struct Template {
  std::string name;
  json body;
};

json parse_json_text(std::string_view text, const std::string& name) {
  try {
    return json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& error) {
    fail("{}: invalid JSON: {}", name, error.what());
  }
}

const std::vector<Template>& templates() {
  static const std::vector<Template> parsed = [] {
    std::vector<Template> out;
    for (const EmbeddedSpec& spec : embedded_specs())
      out.push_back({std::string(spec.name), parse_json_text(spec.json, fmt::format("models/{}.json", spec.name))});
    return out;
  }();
  return parsed;
}

std::vector<std::string> served(const Template& entry, const char* key) {
  std::vector<std::string> names;
  auto serves = entry.body.find(kServesKey);
  if (serves == entry.body.end() || !serves->is_object()) return names;
  auto list = serves->find(key);
  if (list == serves->end() || !list->is_array()) return names;
  for (const json& name : *list)
    if (name.is_string()) names.push_back(name.get<std::string>());
  return names;
}

const Template* find_template(const char* key, const std::string& name) {
  for (const Template& entry : templates()) {
    const std::vector<std::string> names = served(entry, key);
    if (std::find(names.begin(), names.end(), name) != names.end()) return &entry;
  }
  return nullptr;
}

std::vector<std::string> all_served(const char* key) {
  std::vector<std::string> names;
  for (const Template& entry : templates())
    for (std::string& name : served(entry, key)) names.push_back(std::move(name));
  std::sort(names.begin(), names.end());
  return names;
}

// config.json's model_type, for a head no template lists by name (BertForSequenceClassification
// is still a BERT encoder): templates may serve "model_types".
const Template* template_for_model_type(const SpecRequest& request) {
  if (!request.config.is_object()) return nullptr;
  const auto model_type = request.config.find("model_type");
  if (model_type == request.config.end() || !model_type->is_string()) return nullptr;
  return find_template("model_types", model_type->get<std::string>());
}

const char* kSpecHint =
    "write a spec file with the fields hidden_size, num_layers, vocab_size, max_position, norm, attention, mlp, "
    "position, rope and tensors (docs/model-spec.md), or one that starts from a built-in template with "
    "\"template\": \"<name>\" and overrides what differs, and pass it with --spec";

// Picks the template for a request; null when the user specs alone are the spec.
const Template* choose_template(const SpecRequest& request) {
  for (const UserSpec& user_spec : request.user_specs) {
    auto name = user_spec.body.find(kTemplateKey);
    if (name == user_spec.body.end()) continue;
    SF_CHECK(name->is_string(), "{}: template: expected a template name, got {}", user_spec.name, name->dump());
    for (const Template& entry : templates())
      if (entry.name == name->get<std::string>()) return &entry;
    fail("{}: template: no built-in template '{}' (known: {})", user_spec.name, name->get<std::string>(),
         fmt::join(template_names(), ", "));
  }
  const bool has_user_spec = !request.user_specs.empty();
  if (!request.hf_architectures.empty()) {
    for (const std::string& architecture : request.hf_architectures)
      if (const Template* entry = find_template("architectures", architecture)) return entry;
    if (const Template* entry = template_for_model_type(request)) return entry;
    if (has_user_spec) return nullptr;
    fail("{}: no built-in template serves architectures [{}] (known: {}); {}", request.config_name,
         fmt::join(request.hf_architectures, ", "), fmt::join(known_hf_architectures(), ", "), kSpecHint);
  }
  if (!request.gguf_architecture.empty()) {
    if (const Template* entry = find_template("gguf_architectures", request.gguf_architecture)) return entry;
    if (has_user_spec) return nullptr;
    fail("{}: no built-in template serves general.architecture '{}' (known: {}); {}", request.config_name,
         request.gguf_architecture, fmt::join(known_gguf_architectures(), ", "), kSpecHint);
  }
  if (!request.format.empty()) {
    if (const Template* entry = find_template("formats", request.format)) return entry;
    if (has_user_spec) return nullptr;
    fail("{}: no built-in template serves the {} format; {}", request.config_name, request.format, kSpecHint);
  }
  if (has_user_spec) return nullptr;
  fail("{}: nothing says which model this is (no \"architectures\" list); {}", request.config_name, kSpecHint);
}

// Evaluates a template's "unsupported" entries: each {"if": expr, "message": text} whose
// condition holds (absent keys count as false) rejects the model.
void check_unsupported(const Template& entry, const SpecRequest& request) {
  auto list = entry.body.find(kUnsupportedKey);
  if (list == entry.body.end()) return;
  for (const json& rule : *list) {
    const std::string condition = rule.at("if").get<std::string>();
    ExpressionValue value = evaluate_expression(condition, request.config);
    if (value.value && value.value->is_boolean() && value.value->get<bool>())
      fail("{}: {} (template models/{}.json)", request.config_name, rule.at("message").get<std::string>(), entry.name);
  }
}

std::string config_label(const SpecRequest& request) {
  return request.config.is_null() ? std::string("the model's config (there is none)") : request.config_name;
}

}  // namespace

json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), fmt::format("'{}'", path)); }

std::vector<std::string> known_hf_architectures() { return all_served("architectures"); }
std::vector<std::string> known_gguf_architectures() { return all_served("gguf_architectures"); }
std::vector<std::string> template_names() {
  std::vector<std::string> names;
  for (const Template& entry : templates()) names.push_back(entry.name);
  return names;
}

json resolve_spec_json(const SpecRequest& request) {
  const Template* base = choose_template(request);
  json resolved = json::object();
  if (base) {
    check_unsupported(*base, request);
    json body = base->body;
    body.erase(kServesKey);
    body.erase(kUnsupportedKey);
    try {
      resolved = evaluate_template(body, request.config, config_label(request));
    } catch (const Error& error) {
      fail("template models/{}.json: {}", base->name, error.what());
    }
  }
  for (const UserSpec& user_spec : request.user_specs) {
    SF_CHECK(user_spec.body.is_object(), "{}: a spec file must hold a JSON object", user_spec.name);
    json patch = user_spec.body;
    patch.erase(kTemplateKey);
    try {
      patch = evaluate_template(patch, request.config, config_label(request));
    } catch (const Error& error) {
      fail("{}: {}", user_spec.name, error.what());
    }
    resolved.merge_patch(patch);
  }
  return resolved;
}

ModelSpec resolve_spec(const SpecRequest& request) {
  const json resolved = resolve_spec_json(request);
  try {
    return spec_from_json(resolved);
  } catch (const Error& error) {
    std::vector<std::string> origin;
    if (const Template* base = choose_template(request)) origin.push_back(fmt::format("template models/{}.json", base->name));
    for (const UserSpec& user_spec : request.user_specs) origin.push_back(user_spec.name);
    if (!request.config.is_null()) origin.push_back(request.config_name);
    fail("model spec ({}): {}", fmt::join(origin, " + "), error.what());
  }
}

namespace {

void add_user_spec(SpecRequest& request, const std::string& user_spec_path) {
  if (user_spec_path.empty()) return;
  request.user_specs.push_back({read_json_file(user_spec_path), fmt::format("spec file '{}'", user_spec_path)});
}

// config.json's "architectures" (absent or malformed -> empty, which the caller reports).
void add_hf_config(SpecRequest& request, const json& config, const std::string& name) {
  SF_CHECK(config.is_object(), "{}: expected a JSON object", name);
  request.config = config;
  request.config_name = name;
  if (auto list = config.find("architectures"); list != config.end() && list->is_array())
    for (const json& architecture : *list)
      if (architecture.is_string()) request.hf_architectures.push_back(architecture.get<std::string>());
}

// llama.cpp's converter stores the llama3 RoPE scaling of Llama 3.1+ as a `rope_freqs.weight`
// tensor of per-pair frequency divisors, not as metadata: it becomes the spec's freq_factors.
void apply_gguf_rope_freqs(const WeightSource& source, const std::string& model_path, ModelSpec& spec) {
  const TensorInfo* found = nullptr;
  for (const TensorInfo& info : source.tensors())
    if (info.name == kGgufRopeFreqs) found = &info;
  if (found == nullptr) return;
  const std::string where = fmt::format("'{}' tensor {}", model_path, kGgufRopeFreqs);
  SF_CHECK(spec.position == PositionType::Rope, "{}: the model has no RoPE (position {})", where,
           spec_to_json(spec)["position"].get<std::string>());
  SF_CHECK(spec.rope.scaling.type == RopeScalingType::None,
           "{}: the spec also has rope.scaling ({}); give one or the other", where,
           spec_to_json(spec)["rope"]["scaling"]["type"].get<std::string>());
  const Tensor values = materialize(found->tensor);
  const size_t pairs = static_cast<size_t>(spec.rotary_dim() / 2);
  SF_CHECK(values.dtype == DType::F32 && values.shape == Shape{static_cast<int64_t>(pairs)},
           "{}: expected f32 [{}] (rotary_dim / 2), got {} {}", where, pairs, dtype_name(values.dtype),
           shape_str(values.shape));
  RopeScaling& scaling = spec.rope.scaling;
  scaling.type = RopeScalingType::FreqFactors;
  scaling.freq_factors.assign(values.as<float>(), values.as<float>() + pairs);
  for (size_t i = 0; i < pairs; ++i)
    SF_CHECK(std::isfinite(scaling.freq_factors[i]) && scaling.freq_factors[i] > 0, "{}: entry {} is {}, expected > 0",
             where, i, scaling.freq_factors[i]);
}

// What sentence-transformers' files in a model directory declare, as config keys for templates:
//   sentence_transformers.pooling_mode   "cls" / "mean" / "last" (other modes by their own name,
//                                        which the spec then refuses), from the Pooling module's
//                                        config.json (modules.json says where it is)
//   sentence_transformers.normalize      true when modules.json has a Normalize module
//   sentence_transformers.max_seq_length sentence_bert_config.json's truncation length
// and tokenizer_max_length: tokenizer.json's truncation.max_length, else tokenizer_config.json's
// model_max_length (when it is a real length, not transformers' "unset" 1e30).
// Null (absent) when the directory has none of these files.
json sentence_transformers_config(const fs::path& model_dir) {
  json out = json::object();
  const fs::path modules_path = model_dir / "modules.json";
  if (fs::exists(modules_path)) {
    const json modules = read_json_file(modules_path.string());
    SF_CHECK(modules.is_array(), "'{}': expected a list of modules", modules_path.string());
    bool normalize = false;
    for (const json& module : modules) {
      if (!module.is_object()) continue;
      const std::string type = module.value("type", "");
      if (type.ends_with(".Normalize")) normalize = true;
      if (!type.ends_with(".Pooling")) continue;
      const fs::path pooling_path = model_dir / module.value("path", "") / "config.json";
      if (!fs::exists(pooling_path)) continue;
      const json pooling = read_json_file(pooling_path.string());
      std::string mode;
      if (pooling.contains("pooling_mode") && pooling["pooling_mode"].is_string()) {
        mode = pooling["pooling_mode"].get<std::string>();
      } else {
        const std::pair<const char*, const char*> flags[] = {
            {"pooling_mode_cls_token", "cls"},        {"pooling_mode_mean_tokens", "mean"},
            {"pooling_mode_lasttoken", "last"},       {"pooling_mode_max_tokens", "max"},
            {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"}, {"pooling_mode_weightedmean_tokens", "weightedmean"}};
        for (const auto& [flag, name] : flags) {
          if (!pooling.value(flag, false)) continue;
          SF_CHECK(mode.empty(), "'{}': several pooling modes at once ({} and {}) are not supported",
                   pooling_path.string(), mode, name);
          mode = name;
        }
      }
      if (!mode.empty()) out["pooling_mode"] = mode;
    }
    out["normalize"] = normalize;
  }
  const fs::path bert_config_path = model_dir / "sentence_bert_config.json";
  if (fs::exists(bert_config_path)) {
    const json bert_config = read_json_file(bert_config_path.string());
    if (bert_config.contains("max_seq_length") && bert_config["max_seq_length"].is_number_integer())
      out["max_seq_length"] = bert_config["max_seq_length"];
  }
  return out.empty() ? json(nullptr) : out;
}

json tokenizer_max_length(const fs::path& model_dir) {
  const fs::path tokenizer_path = model_dir / "tokenizer.json";
  if (fs::exists(tokenizer_path)) {
    const json tokenizer = read_json_file(tokenizer_path.string());
    const json* truncation = tokenizer.contains("truncation") ? &tokenizer["truncation"] : nullptr;
    if (truncation && truncation->is_object() && (*truncation)["max_length"].is_number_integer())
      return (*truncation)["max_length"];
  }
  const fs::path tokenizer_config_path = model_dir / "tokenizer_config.json";
  if (fs::exists(tokenizer_config_path)) {
    const json config = read_json_file(tokenizer_config_path.string());
    if (config.contains("model_max_length") && config["model_max_length"].is_number_integer() &&
        config["model_max_length"].get<int64_t>() <= (int64_t{1} << 20))
      return config["model_max_length"];
  }
  return nullptr;
}

}  // namespace

ModelSpec resolve_hf_spec(const std::string& model_dir, const std::string& user_spec_path) {
  SpecRequest request;
  add_user_spec(request, user_spec_path);
  const fs::path config_path = fs::path(model_dir) / "config.json";
  if (fs::exists(config_path)) {
    add_hf_config(request, read_json_file(config_path.string()), fmt::format("config.json '{}'", config_path.string()));
    const fs::path generation_path = fs::path(model_dir) / "generation_config.json";
    if (fs::exists(generation_path)) request.config["generation_config"] = read_json_file(generation_path.string());
    // Encoder templates read how the model pools and truncates (sentence-transformers' files).
    if (request.config.is_object()) {
      if (json st = sentence_transformers_config(model_dir); !st.is_null()) request.config["sentence_transformers"] = st;
      if (json length = tokenizer_max_length(model_dir); !length.is_null()) request.config["tokenizer_max_length"] = length;
    }
  } else {
    SF_CHECK(!request.user_specs.empty(), "'{}': no config.json, so nothing says what model this is; {}", model_dir,
             kSpecHint);
    request.config_name = fmt::format("'{}' (no config.json)", model_dir);
  }
  if (request.hf_architectures.empty() && request.user_specs.empty())
    fail("{}: no \"architectures\" list, so no template can be chosen; {}", request.config_name, kSpecHint);
  return resolve_spec(request);
}

ModelSpec resolve_source_spec(const WeightSource& source, const std::string& model_path,
                              const std::string& user_spec_path) {
  const std::string format = source.format();
  if (format == "safetensors" || format == "pytorch") {  // HF checkpoints: the config is config.json beside them
    const fs::path path(model_path);
    return resolve_hf_spec(fs::is_directory(path) ? path.string() : path.parent_path().string(), user_spec_path);
  }
  SpecRequest request;
  add_user_spec(request, user_spec_path);
  request.config = source.metadata();
  if (format == "gguf") {
    request.config_name = fmt::format("GGUF metadata of '{}'", model_path);
    auto architecture = request.config.find("general.architecture");
    if (architecture != request.config.end() && architecture->is_string())
      request.gguf_architecture = architecture->get<std::string>();
    else if (request.user_specs.empty())
      fail("{}: no general.architecture key; {}", request.config_name, kSpecHint);
  } else {
    request.config_name = fmt::format("{} header of '{}'", format, model_path);
    request.format = format;
  }
  ModelSpec spec = resolve_spec(request);
  if (format == "gguf") apply_gguf_rope_freqs(source, model_path, spec);
  return spec;
}

ModelSpec resolve_config_spec(const std::string& path, const std::string& user_spec_path) {
  const json file = read_json_file(path);
  SF_CHECK(file.is_object(), "'{}': expected a JSON object", path);
  SpecRequest request;
  if (file.contains("architectures")) {
    add_hf_config(request, file, fmt::format("config.json '{}'", path));
  } else {
    request.user_specs.push_back({file, fmt::format("spec file '{}'", path)});
    request.config_name = request.user_specs.back().name;
  }
  add_user_spec(request, user_spec_path);
  return resolve_spec(request);
}

}  // namespace splitflow
