#include "model/template.h"

#include "core/error.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>

namespace splitflow {
namespace {

using nlohmann::json;

// Expression tree. Branches of `?:` and the alternatives of `|` are evaluated only when chosen,
// so `$n ? $a / $n : 0` never divides by an absent or zero $n.
struct Node {
  enum class Kind { Literal, Reference, Unary, Binary, Alternative, Conditional, Length, Sqrt } kind;
  json literal;                   // Literal
  std::string text;               // Reference key, or the operator of Unary/Binary
  std::vector<std::unique_ptr<Node>> children;
};
using NodePtr = std::unique_ptr<Node>;

NodePtr make_node(Node::Kind kind) {
  auto node = std::make_unique<Node>();
  node->kind = kind;
  return node;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  NodePtr parse() {
    NodePtr root = parse_conditional();
    skip_space();
    if (pos_ != text_.size()) error(fmt::format("unexpected '{}'", text_.substr(pos_)));
    return root;
  }

 private:
  [[noreturn]] void error(const std::string& problem) const {
    fail("expression \"{}\": {} (at character {})", text_, problem, pos_ + 1);
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool accept(std::string_view token) {
    skip_space();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  void expect(std::string_view token) {
    if (!accept(token)) error(fmt::format("expected '{}'", token));
  }

  NodePtr parse_conditional() {
    NodePtr condition = parse_comparison();
    if (!accept("?")) return condition;
    auto node = make_node(Node::Kind::Conditional);
    node->children.push_back(std::move(condition));
    node->children.push_back(parse_conditional());
    expect(":");
    node->children.push_back(parse_conditional());
    return node;
  }

  NodePtr parse_comparison() {
    NodePtr left = parse_alternative();
    for (std::string_view op : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (!accept(op)) continue;
      auto node = make_node(Node::Kind::Binary);
      node->text = op;
      node->children.push_back(std::move(left));
      node->children.push_back(parse_alternative());
      return node;
    }
    return left;
  }

  NodePtr parse_alternative() {
    NodePtr first = parse_sum();
    if (!accept("|")) return first;
    auto node = make_node(Node::Kind::Alternative);
    node->children.push_back(std::move(first));
    do {
      node->children.push_back(parse_sum());
    } while (accept("|"));
    return node;
  }

  NodePtr parse_sum() {
    NodePtr left = parse_product();
    while (true) {
      std::string op;
      if (accept("+")) op = "+";
      else if (accept("-")) op = "-";
      else return left;
      auto node = make_node(Node::Kind::Binary);
      node->text = op;
      node->children.push_back(std::move(left));
      node->children.push_back(parse_product());
      left = std::move(node);
    }
  }

  NodePtr parse_product() {
    NodePtr left = parse_unary();
    while (true) {
      std::string op;
      if (accept("*")) op = "*";
      else if (accept("/")) op = "/";
      else return left;
      auto node = make_node(Node::Kind::Binary);
      node->text = op;
      node->children.push_back(std::move(left));
      node->children.push_back(parse_unary());
      left = std::move(node);
    }
  }

  NodePtr parse_unary() {
    if (accept("-")) {
      auto node = make_node(Node::Kind::Unary);
      node->text = "-";
      node->children.push_back(parse_unary());
      return node;
    }
    return parse_primary();
  }

  static bool is_key_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }
  static bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

  NodePtr literal(json value) {
    auto node = make_node(Node::Kind::Literal);
    node->literal = std::move(value);
    return node;
  }

  // A JSON literal starting at pos_ ('"', '[' or '{'): scans to its end, honouring strings.
  NodePtr parse_json_literal() {
    const size_t start = pos_;
    int depth = 0;
    bool in_string = false;
    for (; pos_ < text_.size(); ++pos_) {
      const char c = text_[pos_];
      if (in_string) {
        if (c == '\\') ++pos_;
        else if (c == '"') in_string = false;
        if (!in_string && depth == 0) break;
        continue;
      }
      if (c == '"') in_string = true;
      else if (c == '[' || c == '{') ++depth;
      else if (c == ']' || c == '}') {
        if (--depth == 0) break;
      }
    }
    if (pos_ >= text_.size()) {
      pos_ = start;
      error("unterminated literal");
    }
    ++pos_;
    const std::string_view piece = text_.substr(start, pos_ - start);
    json value = json::parse(piece, nullptr, false);
    if (value.is_discarded()) {
      pos_ = start;
      error(fmt::format("invalid JSON literal {}", piece));
    }
    return literal(std::move(value));
  }

  NodePtr parse_primary() {
    skip_space();
    if (pos_ >= text_.size()) error("unexpected end");
    const char c = text_[pos_];
    if (c == '(') {
      ++pos_;
      NodePtr inner = parse_conditional();
      expect(")");
      return inner;
    }
    if (c == '$') {
      const size_t start = ++pos_;
      while (pos_ < text_.size() && is_key_char(text_[pos_])) ++pos_;
      // A trailing '.' belongs to no key ("$a." is a typo, not key "a.").
      if (pos_ == start || text_[pos_ - 1] == '.') error("expected a config key after '$'");
      auto node = make_node(Node::Kind::Reference);
      node->text = std::string(text_.substr(start, pos_ - start));
      return node;
    }
    if (c == '"' || c == '[' || c == '{') return parse_json_literal();
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      const size_t start = pos_;
      while (pos_ < text_.size() && (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.')) ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
        ++pos_;
        if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
        while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      }
      const std::string_view piece = text_.substr(start, pos_ - start);
      json value = json::parse(piece, nullptr, false);
      if (value.is_discarded() || !value.is_number()) {
        pos_ = start;
        error(fmt::format("invalid number '{}'", piece));
      }
      return literal(std::move(value));
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      while (pos_ < text_.size() && is_word_char(text_[pos_])) ++pos_;
      const std::string word(text_.substr(start, pos_ - start));
      if (word == "true") return literal(true);
      if (word == "false") return literal(false);
      if (word == "null") return literal(nullptr);
      if (word == "len" || word == "sqrt") {
        expect("(");
        auto node = make_node(word == "len" ? Node::Kind::Length : Node::Kind::Sqrt);
        node->children.push_back(parse_conditional());
        expect(")");
        return node;
      }
      return literal(word);
    }
    error(fmt::format("unexpected '{}'", c));
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// Looks `key` up: the exact key first (GGUF keys contain dots), then a walk through nested
// objects and arrays ("rope_scaling.factor", "architectures.0"). Null counts as absent.
const json* lookup(const json& config, const std::string& key) {
  if (!config.is_object()) return nullptr;
  if (auto it = config.find(key); it != config.end()) return it->is_null() ? nullptr : &*it;
  const json* current = &config;
  size_t start = 0;
  while (start <= key.size()) {
    const size_t dot = std::min(key.find('.', start), key.size());
    const std::string segment = key.substr(start, dot - start);
    if (current->is_object()) {
      auto it = current->find(segment);
      if (it == current->end()) return nullptr;
      current = &*it;
    } else if (current->is_array() && !segment.empty() &&
               std::all_of(segment.begin(), segment.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      const size_t index = std::stoul(segment);
      if (index >= current->size()) return nullptr;
      current = &(*current)[index];
    } else {
      return nullptr;
    }
    start = dot + 1;
  }
  return current->is_null() ? nullptr : current;
}

class Evaluator {
 public:
  Evaluator(std::string_view text, const json& config) : text_(text), config_(config) {}

  ExpressionValue evaluate(const Node& node) {
    switch (node.kind) {
      case Node::Kind::Literal: return {node.literal, {}};
      case Node::Kind::Reference: {
        if (const json* value = lookup(config_, node.text)) return {*value, {}};
        return {std::nullopt, {node.text}};
      }
      case Node::Kind::Alternative: {
        ExpressionValue missing;
        for (const auto& child : node.children) {
          ExpressionValue value = evaluate(*child);
          if (value.value) return value;
          missing.missing_keys.insert(missing.missing_keys.end(), value.missing_keys.begin(), value.missing_keys.end());
        }
        return missing;
      }
      case Node::Kind::Conditional: {
        ExpressionValue condition = evaluate(*node.children[0]);
        if (!condition.value) return condition;
        return evaluate(*node.children[truthy(*condition.value) ? 1 : 2]);
      }
      case Node::Kind::Length: {
        ExpressionValue value = evaluate(*node.children[0]);
        if (!value.value) return value;
        const json& container = *value.value;
        if (!container.is_array() && !container.is_string() && !container.is_object())
          error(fmt::format("len() needs an array, string or object, got {}", brief(container)));
        return {json(container.is_string() ? container.get_ref<const std::string&>().size() : container.size()), {}};
      }
      case Node::Kind::Sqrt: {
        ExpressionValue value = evaluate(*node.children[0]);
        if (!value.value) return value;
        if (!value.value->is_number() || value.value->get<double>() < 0)
          error(fmt::format("sqrt() needs a number >= 0, got {}", brief(*value.value)));
        return {json(std::sqrt(value.value->get<double>())), {}};
      }
      case Node::Kind::Unary: {
        ExpressionValue value = evaluate(*node.children[0]);
        if (!value.value) return value;
        if (!value.value->is_number()) error(fmt::format("'-' needs a number, got {}", brief(*value.value)));
        if (value.value->is_number_float()) return {json(-value.value->get<double>()), {}};
        return {json(-value.value->get<int64_t>()), {}};
      }
      case Node::Kind::Binary: {
        ExpressionValue left = evaluate(*node.children[0]);
        ExpressionValue right = evaluate(*node.children[1]);
        if (!left.value || !right.value) {
          left.value.reset();
          left.missing_keys.insert(left.missing_keys.end(), right.missing_keys.begin(), right.missing_keys.end());
          return left;
        }
        return {binary(node.text, *left.value, *right.value), {}};
      }
    }
    return {};
  }

 private:
  [[noreturn]] void error(const std::string& problem) const { fail("expression \"{}\": {}", text_, problem); }

  static std::string brief(const json& value) {
    std::string text = value.dump();
    return text.size() > 60 ? text.substr(0, 57) + "..." : text;
  }

  bool truthy(const json& value) const {
    if (value.is_boolean()) return value.get<bool>();
    if (value.is_number()) return value.get<double>() != 0.0;
    error(fmt::format("a condition must be a boolean or a number, got {}", brief(value)));
  }

  // Booleans compare as 0/1 against numbers, so `$flag == 1` works for bool and int configs.
  static bool comparable_number(const json& value) { return value.is_number() || value.is_boolean(); }
  static double as_double(const json& value) {
    return value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>();
  }

  json binary(const std::string& op, const json& left, const json& right) const {
    if (op == "==" || op == "!=") {
      bool equal;
      if (comparable_number(left) && comparable_number(right)) equal = as_double(left) == as_double(right);
      else equal = left == right;
      return op == "==" ? equal : !equal;
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      if (!comparable_number(left) || !comparable_number(right))
        error(fmt::format("'{}' needs numbers, got {} and {}", op, brief(left), brief(right)));
      const double a = as_double(left), b = as_double(right);
      if (op == "<") return a < b;
      if (op == "<=") return a <= b;
      if (op == ">") return a > b;
      return a >= b;
    }
    if (!left.is_number() || !right.is_number())
      error(fmt::format("'{}' needs numbers, got {} and {}", op, brief(left), brief(right)));
    const bool integers = !left.is_number_float() && !right.is_number_float();
    if (integers) {
      const int64_t a = left.get<int64_t>(), b = right.get<int64_t>();
      if (op == "+") return a + b;
      if (op == "-") return a - b;
      if (op == "*") return a * b;
      if (b == 0) error("division by zero");
      if (a % b == 0) return a / b;
      return static_cast<double>(a) / static_cast<double>(b);
    }
    const double a = left.get<double>(), b = right.get<double>();
    if (op == "+") return a + b;
    if (op == "-") return a - b;
    if (op == "*") return a * b;
    if (b == 0.0) error("division by zero");
    return a / b;
  }

  std::string_view text_;
  const json& config_;
};

bool is_expression(const json& value) {
  return value.is_string() && value.get_ref<const std::string&>().find('$') != std::string::npos;
}

void evaluate_into(const json& node, const json& config, const std::string& config_name, const std::string& path,
                   json& out) {
  if (node.is_object()) {
    out = json::object();
    for (auto it = node.begin(); it != node.end(); ++it)
      evaluate_into(it.value(), config, config_name, path.empty() ? it.key() : path + "." + it.key(), out[it.key()]);
    return;
  }
  if (node.is_array()) {
    out = json::array();
    for (size_t i = 0; i < node.size(); ++i) {
      out.push_back(nullptr);
      evaluate_into(node[i], config, config_name, fmt::format("{}[{}]", path, i), out.back());
    }
    return;
  }
  if (!is_expression(node)) {
    out = node;
    return;
  }
  const std::string& text = node.get_ref<const std::string&>();
  ExpressionValue result;
  try {
    result = evaluate_expression(text, config);
  } catch (const Error& error) {
    fail("{}: {}", path, error.what());
  }
  if (!result.value) {
    std::vector<std::string> keys = result.missing_keys;
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    fail("{}: {} {} not in {} (needed by \"{}\"); give the field in a spec file with --spec", path,
         fmt::format("'{}'", fmt::join(keys, "' or '")), keys.size() == 1 ? "is" : "are", config_name, text);
  }
  out = std::move(*result.value);
}

}  // namespace

ExpressionValue evaluate_expression(std::string_view expression, const json& config) {
  NodePtr root = Parser(expression).parse();
  return Evaluator(expression, config).evaluate(*root);
}

json evaluate_template(const json& spec_template, const json& config, const std::string& config_name) {
  json out;
  evaluate_into(spec_template, config, config_name, "", out);
  return out;
}

}  // namespace splitflow
