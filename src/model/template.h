// model/template.h — spec templates: spec JSON whose string values may be expressions over a
// model's config (HF config.json, GGUF metadata, llama2.c header fields). A string that contains
// '$' is an expression; every other value is taken as written. docs/model-spec.md ("Templates")
// is the reference; in short:
//   $key              the config's value (dotted keys: exact key first, then nested objects)
//   a | b | 42        the first alternative whose config keys are present (null counts as absent)
//   + - * /           arithmetic; int / int stays an int when it divides exactly
//   == != < <= > >=   comparisons;  c ? a : b  picks a branch;  len(x)  array/string/object size
//   literals          numbers, true, false, null, "strings", [json], {json}, bare words (strings)
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow {

struct ExpressionValue {
  std::optional<nlohmann::json> value;    // empty: the expression needs config keys that are absent
  std::vector<std::string> missing_keys;  // the absent keys it needed
};

// Evaluates one expression (with or without '$' references). Syntax and type errors throw
// splitflow::Error quoting the expression.
ExpressionValue evaluate_expression(std::string_view expression, const nlohmann::json& config);

// Replaces every expression string in `spec_template` (recursively) by its value. An expression
// whose config keys are all absent throws, naming the JSON path, the expression and the keys;
// `config_name` says where the config came from ("config.json '/m/config.json'").
nlohmann::json evaluate_template(const nlohmann::json& spec_template, const nlohmann::json& config,
                                 const std::string& config_name);

}  // namespace splitflow
