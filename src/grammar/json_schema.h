// grammar/json_schema.h — JSON schemas (OpenAI's strict subset and more) and "any JSON object"
// as GBNF text, compiled by grammar/gbnf.h.
//
// Supported keywords: type (a name or a list), properties, required, additionalProperties
// (false; true or a schema only without properties: a map), enum, const, items, minItems,
// maxItems, anyOf, allOf of one schema, $ref to "#", "#/$defs/..." or "#/definitions/...", and
// for strings minLength, maxLength, pattern (grammar/regex.h) and format (date, time, date-time,
// uuid, email). Annotations (title, description, default, examples, $schema, $id, $comment,
// deprecated, readOnly, writeOnly, strict) are ignored. Any other keyword is a GrammarError naming
// it and where it is (a JSON pointer), as is a number bound (minimum, multipleOf...), which a
// grammar cannot enforce exactly.
//
// Objects list their properties in the schema's order; optional properties may be left out.
// Whitespace between tokens is bounded (a newline and at most 20 spaces or tabs), and so are
// integer and fraction digits (16 each), so a model cannot wander off in padding.
#pragma once

#include "grammar/grammar.h"

#include <nlohmann/json.hpp>

#include <string>

namespace splitflow::grammar {

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// response_format {"type": "json_object"}: any JSON object.
std::string json_object_gbnf();

// The GBNF rules of one schema as a named rule, for grammars that embed a JSON value (tool
// calls): appends its rules (and the JSON primitives once) to `rules` under names prefixed by
// `prefix`, and returns the rule name of the value.
class JsonSchemaGbnf {
 public:
  std::string add(const nlohmann::ordered_json& schema, const std::string& prefix);
  // Every rule so far, primitives included.
  std::string rules() const;

 private:
  friend class SchemaVisitor;
  std::string body_;
  std::vector<std::string> primitives_;
};

}  // namespace splitflow::grammar
