#include "chat/jinja_value.h"

#include "tokenizer/unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace splitflow::jinja {

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : entries) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* Dict::find_key(std::string_view key) const {
  int64_t compared = 0;
  for (const auto& [k, v] : entries) {
    ++compared;
    if (k.is_string() && k.as_string() == key) {
      charge_steps(compared);
      return &v;
    }
  }
  charge_steps(compared);
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::find(size_t index, std::string_view name, std::string_view function) const {
  const Value* found = index < positional.size() ? &positional[index] : nullptr;
  for (const auto& [key, value] : keyword) {
    if (key != name) continue;
    if (found) throw RuntimeError(fmt::format("{}() got multiple values for argument '{}'", function, name));
    found = &value;
  }
  return found;
}

void CallArgs::check(std::string_view function, size_t max_positional,
                     std::initializer_list<std::string_view> names) const {
  if (positional.size() > max_positional) {
    throw RuntimeError(fmt::format("{}() takes at most {} positional argument(s) ({} given)", function,
                                   max_positional, positional.size()));
  }
  for (const auto& [key, value] : keyword) {
    bool known = false;
    for (auto name : names) known = known || name == key;
    if (!known) throw RuntimeError(fmt::format("{}() got an unexpected keyword argument '{}'", function, key));
  }
}

namespace {

template <typename Json>
Value value_from_json(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null: return Value(nullptr);
    case nlohmann::json::value_t::boolean: return Value(json.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      auto u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(json.template get<double>());
    case nlohmann::json::value_t::string: return Value(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(value_from_json(item));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      dict.entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        dict.entries.emplace_back(Value(it.key()), value_from_json(it.value()));
      }
      return Value::dict(std::move(dict));
    }
    default: throw RuntimeError("chat template input: binary or discarded JSON values are not supported");
  }
}

}  // namespace

int nesting_depth(const Value& value) {
  if (value.is_sequence()) return value.as_sequence().depth;
  if (value.is_dict()) return value.as_dict().depth;
  return value.is_namespace() ? 1 : 0;
}

Value Value::sequence(std::vector<Value> items, bool is_tuple) {
  charge_container(is_tuple ? "tuple" : "list", items.size(), sizeof(Value));
  int depth = 1;
  for (const auto& item : items) depth = std::max(depth, 1 + nesting_depth(item));
  check_nesting_depth(depth);
  return Value(std::make_shared<const Sequence>(Sequence{std::move(items), is_tuple, depth}));
}

Value Value::dict(Dict d) {
  charge_container("dict", d.entries.size(), sizeof(d.entries[0]));
  d.depth = 1;
  for (const auto& [key, value] : d.entries) d.depth = std::max({d.depth, 1 + nesting_depth(key), 1 + nesting_depth(value)});
  check_nesting_depth(d.depth);
  return Value(std::make_shared<const Dict>(std::move(d)));
}

Value Value::from_json(const nlohmann::json& json) { return value_from_json(json); }
Value Value::from_json(const nlohmann::ordered_json& json) { return value_from_json(json); }

double Value::to_double() const {
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  if (is_int()) return static_cast<double>(as_int());
  return as_float();
}

int64_t Value::to_int() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }

bool Value::truthy() const {
  struct Visitor {
    bool operator()(const Undefined&) const { return false; }
    bool operator()(std::nullptr_t) const { return false; }
    bool operator()(bool b) const { return b; }
    bool operator()(int64_t i) const { return i != 0; }
    bool operator()(double d) const { return d != 0.0; }
    bool operator()(const std::string& s) const { return !s.empty(); }
    bool operator()(const List& l) const { return !l->items.empty(); }
    bool operator()(const DictRef& d) const { return !d->entries.empty(); }
    bool operator()(const NamespaceRef&) const { return true; }
    bool operator()(const CallableRef&) const { return true; }
  };
  return std::visit(Visitor{}, storage_);
}

std::string Value::type_name() const {
  struct Visitor {
    const char* operator()(const Undefined&) const { return "Undefined"; }
    const char* operator()(std::nullptr_t) const { return "NoneType"; }
    const char* operator()(bool) const { return "bool"; }
    const char* operator()(int64_t) const { return "int"; }
    const char* operator()(double) const { return "float"; }
    const char* operator()(const std::string&) const { return "str"; }
    const char* operator()(const List& l) const { return l->is_tuple ? "tuple" : "list"; }
    const char* operator()(const DictRef&) const { return "dict"; }
    const char* operator()(const NamespaceRef&) const { return "Namespace"; }
    const char* operator()(const CallableRef&) const { return "function"; }
  };
  return std::visit(Visitor{}, storage_);
}

void Value::fail_undefined() const { throw RuntimeError(as_undefined().message); }

namespace {

// Printing follows lists, dicts and namespaces; a namespace can hold itself or a long chain of
// others, so the depth is checked on the way down and the size as the text grows.
void append_repr(std::string& out, const Value& value, int depth);

void append_sequence_repr(std::string& out, const Sequence& seq, int depth) {
  check_nesting_depth(depth);
  out += seq.is_tuple ? '(' : '[';
  for (size_t i = 0; i < seq.items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, seq.items[i], depth);
  }
  if (seq.is_tuple && seq.items.size() == 1) out += ',';
  out += seq.is_tuple ? ')' : ']';
}

void append_dict_repr(std::string& out, const Dict& dict, int depth) {
  check_nesting_depth(depth);
  out += '{';
  for (size_t i = 0; i < dict.entries.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, dict.entries[i].first, depth);
    out += ": ";
    append_repr(out, dict.entries[i].second, depth);
  }
  out += '}';
}

void append_namespace_repr(std::string& out, const Namespace& ns, int depth) {
  out += "<Namespace ";
  append_dict_repr(out, ns.attributes, depth);
  out += '>';
}

// `depth`: the containers already open around `value`.
void append_repr(std::string& out, const Value& value, int depth) {
  if (value.is_string()) {
    check_string_size(out.size() + value.as_string().size());
    out += python_string_repr(value.as_string());
  } else if (value.is_sequence()) {
    append_sequence_repr(out, value.as_sequence(), depth + 1);
  } else if (value.is_dict()) {
    append_dict_repr(out, value.as_dict(), depth + 1);
  } else if (value.is_namespace()) {
    append_namespace_repr(out, value.as_namespace(), depth + 1);
  } else if (value.is_undefined()) {
    out += "Undefined";
  } else {
    out += value.str();
  }
  check_string_size(out.size());
}

// A repr built by `append`, charged like a string Value: printing a list reads all of it.
template <typename AppendRepr>
std::string charged_repr(AppendRepr append) {
  std::string out;
  append(out);
  charge_string(out.size());
  return out;
}

}  // namespace

std::string Value::str() const {
  struct Visitor {
    std::string operator()(const Undefined&) const { return ""; }
    std::string operator()(std::nullptr_t) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return python_float_repr(d); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const List& l) const {
      return charged_repr([&](std::string& out) { append_sequence_repr(out, *l, 1); });
    }
    std::string operator()(const DictRef& d) const {
      return charged_repr([&](std::string& out) { append_dict_repr(out, *d, 1); });
    }
    std::string operator()(const NamespaceRef& n) const {
      return charged_repr([&](std::string& out) { append_namespace_repr(out, *n, 1); });
    }
    std::string operator()(const CallableRef& c) const { return "<function " + c->name + ">"; }
  };
  return std::visit(Visitor{}, storage_);
}

std::string Value::repr() const {
  if (is_string()) return python_string_repr(as_string());
  return charged_repr([&](std::string& out) { append_repr(out, *this, 0); });
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  charge_steps(1);
  if (a.storage().index() != b.storage().index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) {
    if (a.as_string().size() != b.as_string().size()) return false;
    charge_bytes_read(a.as_string().size());
    return a.as_string() == b.as_string();
  }
  if (a.is_sequence()) {
    const auto& x = a.as_sequence();
    const auto& y = b.as_sequence();
    if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i) {
      if (!equals(x.items[i], y.items[i])) return false;
    }
    return true;
  }
  if (a.is_dict()) {
    const auto& x = a.as_dict();
    const auto& y = b.as_dict();
    if (x.entries.size() != y.entries.size()) return false;
    for (const auto& [key, value] : x.entries) {
      const Value* other = y.find(key);
      if (!other || !equals(value, *other)) return false;
    }
    return true;
  }
  return same_object(a, b);
}

bool same_object(const Value& a, const Value& b) {
  if (a.storage().index() != b.storage().index()) return false;
  if (a.is_sequence()) return &a.as_sequence() == &b.as_sequence();
  if (a.is_dict()) return &a.as_dict() == &b.as_dict();
  if (a.is_namespace()) return &a.as_namespace() == &b.as_namespace();
  if (a.is_callable()) return &a.as_callable() == &b.as_callable();
  if (a.is_undefined()) return false;
  return equals(a, b);
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.to_double(), y = b.to_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.to_int(), y = b.to_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  charge_steps(1);
  if (a.is_string() && b.is_string()) {
    charge_bytes_read(std::min(a.as_string().size(), b.as_string().size()));
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence() && b.is_sequence() && a.as_sequence().is_tuple == b.as_sequence().is_tuple) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw RuntimeError(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(),
                                 b.type_name()));
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  if (value == 0.0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits from to_chars in scientific form "d.ddde±XX", then laid out the
  // way CPython's repr does: decpt is the position of the decimal point after the first digit.
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string_view sci(buffer, result.ptr - buffer);
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exponent);
  int decpt = exponent + 1;
  int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (decpt < n) {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  } else {
    out += digits + std::string(decpt - n, '0') + ".0";
  }
  return out;
}

namespace {

// CPython's Py_UNICODE_ISPRINTABLE: not in categories Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs (space is).
bool is_printable(char32_t cp) {
  if (cp == ' ') return true;
  using unicode::Category;
  switch (unicode::category(cp)) {
    case Category::Cc: case Category::Cf: case Category::Cs: case Category::Co: case Category::Cn:
    case Category::Zl: case Category::Zp: case Category::Zs:
      return false;
    default:
      return true;
  }
}

}  // namespace

std::string python_string_repr(std::string_view text) {
  bool has_single = text.find('\'') != std::string_view::npos;
  bool has_double = text.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t offset = 0;
  while (offset < text.size()) {
    char32_t cp = unicode::decode_next(text, offset);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(cp));
    } else if (cp < 0x7f || is_printable(cp)) {
      unicode::append_utf8(out, cp);
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(cp));
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(cp));
    }
  }
  out += quote;
  return out;
}

bool is_ascii(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0x80) return false;
  }
  return true;
}

size_t code_point_count(std::string_view text) {
  size_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
}

bool is_python_space(char32_t cp) {
  return (cp >= 0x1c && cp <= 0x1f) || unicode::is_white_space(cp);
}

}  // namespace splitflow::jinja
