#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "grammar/gbnf.h"
#include "grammar/regex.h"

namespace splitflow::grammar {

using json = nlohmann::ordered_json;  // properties keep the schema's order

namespace {

// JSON's primitives in GBNF, each with the rules it needs.
const std::map<std::string, std::string>& primitive_rules() {
  static const std::map<std::string, std::string> rules = {
      {"ws", R"(ws ::= ( " " | "\n" [ \t]{0,20} )?)"},
      {"json-char", R"(json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))"},
      {"json-string", R"(json-string ::= "\"" json-char* "\"")"},
      {"json-int", R"(json-int ::= "-"? ( "0" | [1-9] [0-9]{0,15} ))"},
      {"json-number", R"(json-number ::= json-int ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?)"},
      {"json-boolean", R"(json-boolean ::= "true" | "false")"},
      {"json-null", R"(json-null ::= "null")"},
      {"json-value", R"(json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null)"},
      {"json-object",
       R"(json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}")"},
      {"json-array", R"(json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]")"},
      {"json-date", R"(json-date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] ))"},
      {"json-time",
       R"(json-time ::= ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
      {"json-uuid",
       R"(json-uuid ::= [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})"},
      {"json-email", R"(json-email ::= [a-zA-Z0-9._%+-]{1,64} "@" [a-zA-Z0-9-]{1,63} ( "." [a-zA-Z0-9-]{1,63} ){1,4})"},
  };
  return rules;
}

const std::map<std::string, std::vector<std::string>>& primitive_dependencies() {
  static const std::map<std::string, std::vector<std::string>> deps = {
      {"json-string", {"json-char"}},
      {"json-number", {"json-int"}},
      {"json-value", {"json-object", "json-array", "json-string", "json-number", "json-boolean", "json-null"}},
      {"json-object", {"ws", "json-string", "json-value"}},
      {"json-array", {"ws", "json-value"}},
  };
  return deps;
}

// A JSON value written as a GBNF literal.
std::string gbnf_literal(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string rule_safe(const std::string& text) {
  std::string out;
  for (const char c : text) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return out;
}

std::string pointer_escape(const std::string& key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string pointer_unescape(const std::string& token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size()) {
      out += token[i + 1] == '1' ? '/' : '~';
      ++i;
    } else {
      out += token[i];
    }
  }
  return out;
}

}  // namespace

class SchemaVisitor {
 public:
  SchemaVisitor(JsonSchemaGbnf& out, const json& root, std::string prefix)
      : out_(out), root_(root), prefix_(std::move(prefix)) {}

  // The rule name of `schema` at JSON pointer `path`.
  std::string visit(const json& schema, const std::string& path) {
    // Nested schemas and chains of $ref recurse here: a cap keeps a hostile schema off the end of
    // the stack (no real schema comes near it).
    struct Depth {
      int& depth;
      explicit Depth(int& d) : depth(d) { ++depth; }
      ~Depth() { --depth; }
    } depth(depth_);
    if (depth_ > kMaxDepth) fail(path, fmt::format("schemas nest deeper than {} levels (nested schemas and $ref chains)", kMaxDepth));
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) unsupported(path, "the schema 'false' (nothing is valid)");
      return primitive("json-value");
    }
    if (!schema.is_object()) fail(path, fmt::format("a schema must be an object or a boolean, not {}", schema.type_name()));
    static const std::set<std::string> kIgnored = {"title", "description", "default", "examples", "$schema", "$id",
                                                    "$comment", "deprecated", "readOnly", "writeOnly", "strict",
                                                    "$defs", "definitions"};
    static const std::set<std::string> kKnown = {"type", "properties", "required", "additionalProperties", "enum",
                                                  "const", "items", "minItems", "maxItems", "anyOf", "allOf", "$ref",
                                                  "minLength", "maxLength", "pattern", "format", "nullable"};
    for (const auto& [key, value] : schema.items()) {
      if (!kIgnored.contains(key) && !kKnown.contains(key)) unsupported(path, fmt::format("'{}'", key));
    }
    if (const auto ref = schema.find("$ref"); ref != schema.end()) {
      if (schema.size() > 1 && std::any_of(schema.items().begin(), schema.items().end(), [](const auto& item) {
            return !kIgnored.contains(item.key()) && item.key() != "$ref";
          })) {
        unsupported(path, "'$ref' beside other keywords");
      }
      return reference(ref->is_string() ? ref->get<std::string>() : "", path);
    }
    if (const auto it = schema.find("const"); it != schema.end()) return define(path, gbnf_literal(it->dump()));
    if (const auto it = schema.find("enum"); it != schema.end()) {
      if (!it->is_array() || it->empty()) fail(path + "/enum", "'enum' must be a non-empty array");
      std::string alternatives;
      for (const json& value : *it) alternatives += (alternatives.empty() ? "" : " | ") + gbnf_literal(value.dump());
      return define(path, alternatives);
    }
    if (const auto it = schema.find("anyOf"); it != schema.end()) {
      if (!it->is_array() || it->empty()) fail(path + "/anyOf", "'anyOf' must be a non-empty array");
      std::string alternatives;
      for (size_t i = 0; i < it->size(); ++i) {
        alternatives += (alternatives.empty() ? "" : " | ") + visit((*it)[i], fmt::format("{}/anyOf/{}", path, i));
      }
      return define(path, alternatives);
    }
    if (const auto it = schema.find("allOf"); it != schema.end()) {
      if (!it->is_array() || it->size() != 1) unsupported(path, "'allOf' with other than one schema");
      return visit((*it)[0], path + "/allOf/0");
    }
    const auto type = schema.find("type");
    if (type == schema.end()) {
      if (schema.contains("properties")) return object(schema, path);
      if (schema.contains("items")) return array(schema, path);
      return primitive("json-value");
    }
    if (type->is_array()) {
      std::string alternatives;
      for (size_t i = 0; i < type->size(); ++i) {
        if (!(*type)[i].is_string()) fail(path + "/type", "'type' must be a string or an array of strings");
        alternatives += (alternatives.empty() ? "" : " | ") + typed(schema, (*type)[i].get<std::string>(), path);
      }
      if (alternatives.empty()) fail(path + "/type", "'type' is an empty array");
      return define(path, alternatives);
    }
    if (!type->is_string()) fail(path + "/type", "'type' must be a string or an array of strings");
    std::string rule = typed(schema, type->get<std::string>(), path);
    if (schema.value("nullable", false)) return define(path + "/nullable", rule + " | " + primitive("json-null"));
    return rule;
  }

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    throw GrammarError(fmt::format("json_schema at '#{}': {}", path, message));
  }
  [[noreturn]] void unsupported(const std::string& path, const std::string& feature) const {
    throw GrammarError(fmt::format("json_schema at '#{}': {} is not supported", path, feature));
  }

  std::string primitive(const std::string& name) {
    if (std::find(out_.primitives_.begin(), out_.primitives_.end(), name) == out_.primitives_.end()) {
      out_.primitives_.push_back(name);
      const auto deps = primitive_dependencies().find(name);
      if (deps != primitive_dependencies().end()) {
        for (const std::string& dep : deps->second) primitive(dep);
      }
    }
    return name;
  }

  std::string define(const std::string& path, const std::string& body) {
    const std::string name = fmt::format("{}{}", prefix_, rule_safe(path.empty() ? "root" : path));
    std::string unique = name;
    for (int i = 2; used_.contains(unique); ++i) unique = fmt::format("{}-{}", name, i);
    used_.insert(unique);
    out_.body_ += fmt::format("{} ::= {}\n", unique, body);
    return unique;
  }

  std::string reference(const std::string& ref, const std::string& path) {
    if (ref != "#" && !ref.starts_with("#/")) unsupported(path, fmt::format("'$ref' to '{}' (only local references)", ref));
    if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const json* target = &root_;
    std::string target_path;
    size_t start = 2;
    while (ref.size() > 1 && start <= ref.size()) {
      const size_t end = std::min(ref.find('/', start), ref.size());
      const std::string token = pointer_unescape(ref.substr(start, end - start));
      if (!target->is_object() || !target->contains(token)) fail(path, fmt::format("'$ref' '{}' points to nothing", ref));
      target = &(*target)[token];
      target_path += "/" + pointer_escape(token);
      start = end + 1;
    }
    // Named before it is visited, so recursive references end in a rule reference.
    const std::string name = fmt::format("{}ref{}", prefix_, rule_safe(target_path));
    refs_.emplace(ref, name);
    used_.insert(name);
    const std::string body = visit(*target, target_path);
    out_.body_ += fmt::format("{} ::= {}\n", name, body);
    return name;
  }

  static void forbid(const json& schema, const std::string& path, std::initializer_list<const char*> keys,
                     const std::string& type, const SchemaVisitor& self) {
    for (const char* key : keys) {
      if (schema.contains(key)) self.unsupported(path, fmt::format("'{}' on a schema of type '{}'", key, type));
    }
  }

  std::string typed(const json& schema, const std::string& type, const std::string& path) {
    if (type == "string") return string(schema, path);
    if (type == "number" || type == "integer") {
      static const char* kBounds[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
      for (const char* key : kBounds) {
        if (schema.contains(key)) unsupported(path, fmt::format("'{}'", key));
      }
      return primitive(type == "number" ? "json-number" : "json-int");
    }
    if (type == "boolean") return primitive("json-boolean");
    if (type == "null") return primitive("json-null");
    if (type == "object") return object(schema, path);
    if (type == "array") return array(schema, path);
    fail(path + "/type", fmt::format("unknown type '{}'", type));
  }

  static int64_t count(const json& schema, const char* key, const std::string& path, const SchemaVisitor& self) {
    const auto it = schema.find(key);
    if (it == schema.end()) return -1;
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
      self.fail(path + "/" + key, fmt::format("'{}' must be a non-negative integer", key));
    }
    const int64_t value = it->get<int64_t>();
    if (value > 1000) self.unsupported(path, fmt::format("'{}' above 1000", key));
    return value;
  }

  static std::string repeat(const std::string& element, int64_t min_count, int64_t max_count) {
    if (min_count <= 0 && max_count < 0) return element + "*";
    if (max_count < 0) return fmt::format("{}{{{},}}", element, min_count);
    return fmt::format("{}{{{},{}}}", element, std::max<int64_t>(min_count, 0), max_count);
  }

  std::string string(const json& schema, const std::string& path) {
    const int64_t min_length = count(schema, "minLength", path, *this);
    const int64_t max_length = count(schema, "maxLength", path, *this);
    const auto pattern = schema.find("pattern");
    const auto format = schema.find("format");
    if (pattern != schema.end()) {
      if (!pattern->is_string()) fail(path + "/pattern", "'pattern' must be a string");
      if (min_length >= 0 || max_length >= 0 || format != schema.end()) unsupported(path, "'pattern' with a length or format");
      std::string regex = pattern->get<std::string>();
      // JSON Schema patterns search; only anchored ones say what the whole string is.
      if (!regex.starts_with("^") || !regex.ends_with("$")) {
        unsupported(path, "a 'pattern' that is not anchored with ^...$");
      }
      try {
        return define(path, "\"\\\"\" " + regex_to_json_string(regex) + " \"\\\"\"");
      } catch (const GrammarError& e) {
        fail(path + "/pattern", e.what());
      }
    }
    if (format != schema.end()) {
      if (!format->is_string()) fail(path + "/format", "'format' must be a string");
      const std::string name = format->get<std::string>();
      std::string body;
      if (name == "date") body = primitive("json-date");
      if (name == "time") body = primitive("json-time");
      if (name == "date-time") body = primitive("json-date") + " \"T\" " + primitive("json-time");
      if (name == "uuid") body = primitive("json-uuid");
      if (name == "email") body = primitive("json-email");
      if (body.empty()) unsupported(path, fmt::format("string format '{}'", name));
      if (min_length >= 0 || max_length >= 0) unsupported(path, "'format' with a length");
      return define(path, "\"\\\"\" " + body + " \"\\\"\"");
    }
    if (min_length < 0 && max_length < 0) return primitive("json-string");
    if (max_length >= 0 && min_length > max_length) fail(path, "'minLength' is above 'maxLength'");
    return define(path, "\"\\\"\" " + repeat(primitive("json-char"), min_length, max_length) + " \"\\\"\"");
  }

  // A pattern's characters must still be valid inside a JSON string: the regex's own text runs
  // between the quotes, so a pattern that would produce '"' or a control character is refused.
  static std::string regex_to_json_string(const std::string& regex);

  std::string object(const json& schema, const std::string& path) {
    const json properties = schema.value("properties", json::object());
    if (!properties.is_object()) fail(path + "/properties", "'properties' must be an object");
    std::set<std::string> required;
    if (const auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) fail(path + "/required", "'required' must be an array of strings");
      for (const json& name : *it) {
        if (!name.is_string()) fail(path + "/required", "'required' must be an array of strings");
        if (!properties.contains(name.get<std::string>())) {
          unsupported(path, fmt::format("'required' naming '{}', which is not in 'properties'", name.get<std::string>()));
        }
        required.insert(name.get<std::string>());
      }
    }
    const auto additional = schema.find("additionalProperties");
    if (properties.empty()) {
      if (additional == schema.end() || additional->is_boolean()) {
        if (additional != schema.end() && !additional->get<bool>()) return define(path, "\"{\" ws \"}\"");
        return primitive("json-object");
      }
      // A map: any keys, each value of the schema.
      const std::string value = visit(*additional, path + "/additionalProperties");
      primitive("ws");
      const std::string member = fmt::format("{} ws \":\" ws {} ws", primitive("json-string"), value);
      return define(path, fmt::format("\"{{\" ws ( {} ( \",\" ws {} )* )? \"}}\"", member, member));
    }
    if (additional != schema.end() && !additional->is_boolean()) {
      unsupported(path, "'additionalProperties' as a schema beside 'properties'");
    }
    primitive("ws");
    // Properties in the schema's order; optional ones may be left out. tail_i: properties i..
    // after one was written (each then starts with a comma); head_i: the same before any was.
    std::vector<std::pair<std::string, std::string>> members;  // (name, "key": value rule)
    for (const auto& [name, property] : properties.items()) {
      const std::string value = visit(property, path + "/properties/" + pointer_escape(name));
      const std::string key = gbnf_literal(json(name).dump());
      members.emplace_back(name, define(path + "/properties/" + pointer_escape(name) + "/member",
                                        fmt::format("{} ws \":\" ws {} ws", key, value)));
    }
    std::string tail_next, head_next;  // empty: nothing follows
    for (size_t i = members.size(); i-- > 0;) {
      const auto& [name, member] = members[i];
      const bool is_required = required.contains(name);
      const std::string comma_member = fmt::format("\",\" ws {}", member);
      const std::string tail_body =
          is_required ? fmt::format("{} {}", comma_member, tail_next) : fmt::format("( {} )? {}", comma_member, tail_next);
      const std::string tail = define(fmt::format("{}/tail{}", path, i), tail_body);
      std::string head_body = fmt::format("{} {}", member, tail_next);
      if (!is_required) head_body = fmt::format("{} | {}", head_body, head_next.empty() ? "\"\"" : head_next);
      head_next = define(fmt::format("{}/head{}", path, i), head_body);
      tail_next = tail;
    }
    return define(path, fmt::format("\"{{\" ws {} \"}}\"", head_next));
  }

  std::string array(const json& schema, const std::string& path) {
    if (schema.contains("prefixItems")) unsupported(path, "'prefixItems'");
    const std::string item = schema.contains("items") ? visit(schema["items"], path + "/items") : primitive("json-value");
    const int64_t min_items = count(schema, "minItems", path, *this);
    const int64_t max_items = count(schema, "maxItems", path, *this);
    if (max_items >= 0 && min_items > max_items) fail(path, "'minItems' is above 'maxItems'");
    primitive("ws");
    const std::string element = define(path + "/item", fmt::format("{} ws", item));
    const std::string more = fmt::format("( \",\" ws {} )", element);
    if (max_items == 0) return define(path, "\"[\" ws \"]\"");
    const std::string rest = repeat(more, min_items - 1, max_items < 0 ? -1 : max_items - 1);
    if (min_items >= 1) return define(path, fmt::format("\"[\" ws {} {} \"]\"", element, rest));
    return define(path, fmt::format("\"[\" ws ( {} {} )? \"]\"", element, rest));
  }

  JsonSchemaGbnf& out_;
  const json& root_;
  std::string prefix_;
  std::set<std::string> used_;
  std::map<std::string, std::string> refs_;
  static constexpr int kMaxDepth = 128;
  int depth_ = 0;  // visit() calls in progress
};

std::string SchemaVisitor::regex_to_json_string(const std::string& regex) {
  const std::string inner = regex_to_gbnf(regex);
  // The regex's characters are emitted raw between the quotes; a '"', a backslash or a control
  // character there would end or break the JSON string, so such patterns are excluded by
  // intersecting: every class of the regex must exclude them. Checked on the compiled grammar.
  const Grammar g = parse_gbnf("root ::= " + inner + "\n");
  for (const ByteSet& set : g.byte_classes) {
    for (int b = 0; b < 0x20; ++b) {
      if (set.test(static_cast<uint8_t>(b))) throw GrammarError("the pattern allows control characters, which a JSON string must escape");
    }
    if (set.test('"') || set.test('\\')) throw GrammarError("the pattern allows '\"' or '\\', which a JSON string must escape");
  }
  return inner;
}

std::string JsonSchemaGbnf::add(const json& schema, const std::string& prefix) {
  SchemaVisitor visitor(*this, schema, prefix);
  return visitor.visit(schema, "");
}

std::string JsonSchemaGbnf::rules() const {
  std::string text = body_;
  for (const std::string& name : primitives_) text += primitive_rules().at(name) + "\n";
  return text;
}

std::string json_schema_to_gbnf(const json& schema) {
  JsonSchemaGbnf gbnf;
  const std::string value = gbnf.add(schema, "s");
  return fmt::format("root ::= {}\n{}", value, gbnf.rules());
}

std::string json_object_gbnf() {
  JsonSchemaGbnf gbnf;
  const std::string value = gbnf.add(json{{"type", "object"}}, "s");
  return fmt::format("root ::= {}\n{}", value, gbnf.rules());
}

}  // namespace splitflow::grammar
