// chat/jinja_builtins.h — what templates can do to values, with the semantics of Python and of
// jinja2's ImmutableSandboxedEnvironment: attribute and item access, slicing, iteration, operators,
// the builtin filters and tests, str/dict/list methods, the globals transformers provides
// (raise_exception, strftime_now, namespace, dict, range) and transformers' tojson.
// All functions throw RuntimeError for what Python or jinja2 would refuse; the interpreter adds the
// template location. None of them see scopes or the AST.
#pragma once

#include "chat/jinja_value.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace splitflow::jinja {

// jinja2's sandboxed getattr: a method of str/dict/list, else a dict item, else undefined.
Value get_attribute(const Value& object, std::string_view name);
// jinja2's getitem: obj[key] (negative indexes count from the end), else the attribute of that name.
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] on a str, list or tuple; undefined bounds are None.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);
// The items a for loop sees: list/tuple items, str characters, dict keys; undefined is empty.
std::vector<Value> iterate(const Value& value);
// Python len().
int64_t length(const Value& value);

// + - * / // % ** on numbers, str (+, *, % formatting), lists/tuples (+, *); ~ concatenates str().
Value binary_operation(std::string_view op, const Value& left, const Value& right);
Value unary_minus(const Value& operand);
// Python `item in container`.
bool contains(const Value& container, const Value& item);

// str.method(...), dict.method(...), list.method(...); nullopt when the object has no such method.
std::optional<Value> call_method(const Value& object, std::string_view name, const CallArgs& args);

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value apply_filter(std::string_view name, const Value& input, const CallArgs& args);
bool apply_test(std::string_view name, const Value& input, const CallArgs& args);

// The global functions: range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> global_functions();

struct JsonOptions {
  std::optional<std::string> indent;  // json.dumps indent as a string; nullopt: single line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python json.dumps (transformers' tojson filter).
std::string to_json(const Value& value, const JsonOptions& options);

// Thrown by raise_exception(): the template's own message, passed to the caller unchanged.
class TemplateException : public std::runtime_error {
 public:
  explicit TemplateException(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace splitflow::jinja
