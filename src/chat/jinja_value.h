// chat/jinja_value.h — the value type of the Jinja interpreter: Python's data model as far as chat
// templates see it (jinja2's Undefined, None, bool, int, float, str, list/tuple, dict, namespace,
// callable), with Python's truthiness, equality, ordering, str() and repr(), and conversion from
// JSON. Lists and dicts are immutable once built (the sandbox that transformers uses forbids
// append/update); only a namespace is mutated, by `set ns.attr = ...`.
// Inside a render, building or copying a string and building a list or dict are charged to the
// render's budget (jinja_budget.h), and lists and dicts record how deeply they nest.
// Strings are UTF-8; whatever Python does per character (len, indexing, slicing) is done per code
// point by the callers, with the helpers at the end of this file.
#pragma once

#include "chat/jinja_budget.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace splitflow::jinja {

class Value;

// A failure of template code at run time (a Python TypeError, jinja2's UndefinedError, ...). The
// interpreter adds the template line and column before it reaches the caller.
class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& message) : std::runtime_error(message) {}
};

// What jinja2 prints when an undefined value is used where it raises: "'x' is undefined",
// "'dict object' has no attribute 'y'".
struct Undefined {
  std::string message;
};

struct Sequence {
  std::vector<Value> items;
  bool is_tuple = false;  // prints as (a, b) and comes from tuple literals, items() and loops
  int depth = 1;          // 1 + the deepest item's depth (strings and numbers: 0, a namespace: 1)
};

// Insertion-ordered like a Python dict. Linear lookup: chat messages and tool schemas are small.
struct Dict {
  std::vector<std::pair<Value, Value>> entries;
  int depth = 1;  // as Sequence::depth; set by Value::dict (a namespace's attributes do not keep it)
  const Value* find(const Value& key) const;
  const Value* find_key(std::string_view key) const;
  void set(Value key, Value value);  // replaces in place or appends
};

struct Namespace {
  Dict attributes;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr; throws when given both ways.
  const Value* find(size_t index, std::string_view name, std::string_view function) const;
  // Throws when more than max_positional positional arguments or a keyword not in `names` came.
  void check(std::string_view function, size_t max_positional,
             std::initializer_list<std::string_view> names) const;
};

// Builtins, bound methods and macros. `name` is for messages.
struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

class Value {
 public:
  using List = std::shared_ptr<const Sequence>;
  using DictRef = std::shared_ptr<const Dict>;
  using NamespaceRef = std::shared_ptr<Namespace>;
  using CallableRef = std::shared_ptr<const Callable>;
  using Storage = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, List,
                               DictRef, NamespaceRef, CallableRef>;

  Value() : storage_(Undefined{}) {}
  Value(std::nullptr_t) : storage_(nullptr) {}
  Value(bool b) : storage_(b) {}
  Value(int i) : storage_(int64_t{i}) {}
  Value(int64_t i) : storage_(i) {}
  Value(double d) : storage_(d) {}
  Value(std::string s) : storage_(std::move(s)) { charge_string(as_string().size()); }
  Value(std::string_view s) : storage_(charged_string(s)) {}
  Value(const char* s) : Value(std::string_view(s)) {}
  Value(Undefined u) : storage_(std::move(u)) {}
  Value(List l) : storage_(std::move(l)) {}
  Value(DictRef d) : storage_(std::move(d)) {}
  Value(NamespaceRef n) : storage_(std::move(n)) {}
  Value(CallableRef c) : storage_(std::move(c)) {}
  // Strings are not shared between Values: a copy allocates the bytes again, and is charged for them.
  Value(const Value& other) : storage_(charged_copy(other)) {}
  Value(Value&&) noexcept = default;
  Value& operator=(const Value& other) {
    storage_ = charged_copy(other);
    return *this;
  }
  Value& operator=(Value&&) noexcept = default;

  static Value undefined(std::string message) { return Value(Undefined{std::move(message)}); }
  // Charged to the render's budget, and checked against max_nesting_depth.
  static Value list(std::vector<Value> items) { return sequence(std::move(items), false); }
  static Value tuple(std::vector<Value> items) { return sequence(std::move(items), true); }
  static Value dict(Dict d);
  static Value callable(std::string name, std::function<Value(const CallArgs&)> call) {
    return Value(std::make_shared<const Callable>(Callable{std::move(name), std::move(call)}));
  }
  static Value from_json(const nlohmann::json& json);
  static Value from_json(const nlohmann::ordered_json& json);

  bool is_undefined() const { return std::holds_alternative<Undefined>(storage_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(storage_); }
  bool is_bool() const { return std::holds_alternative<bool>(storage_); }
  bool is_int() const { return std::holds_alternative<int64_t>(storage_); }  // not bool
  bool is_float() const { return std::holds_alternative<double>(storage_); }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<std::string>(storage_); }
  bool is_sequence() const { return std::holds_alternative<List>(storage_); }
  bool is_dict() const { return std::holds_alternative<DictRef>(storage_); }
  bool is_namespace() const { return std::holds_alternative<NamespaceRef>(storage_); }
  bool is_callable() const { return std::holds_alternative<CallableRef>(storage_); }

  bool as_bool() const { return std::get<bool>(storage_); }
  int64_t as_int() const { return std::get<int64_t>(storage_); }
  double as_float() const { return std::get<double>(storage_); }
  const std::string& as_string() const { return std::get<std::string>(storage_); }
  const Sequence& as_sequence() const { return *std::get<List>(storage_); }
  const std::vector<Value>& items() const { return as_sequence().items; }
  const Dict& as_dict() const { return *std::get<DictRef>(storage_); }
  Namespace& as_namespace() const { return *std::get<NamespaceRef>(storage_); }
  const Callable& as_callable() const { return *std::get<CallableRef>(storage_); }
  const Undefined& as_undefined() const { return std::get<Undefined>(storage_); }
  const Storage& storage() const { return storage_; }

  // bool/int/float as a double, bool/int as an int64 (Python's numeric tower).
  double to_double() const;
  int64_t to_int() const;

  bool truthy() const;
  std::string str() const;   // Python str(); undefined prints as ""
  std::string repr() const;  // Python repr()
  // Python type name for messages: 'str', 'int', 'dict', 'NoneType', 'Undefined', ...
  std::string type_name() const;
  // Throws the undefined's message; for operations jinja2's Undefined refuses.
  [[noreturn]] void fail_undefined() const;

 private:
  static Value sequence(std::vector<Value> items, bool is_tuple);
  static std::string charged_string(std::string_view s) {
    charge_string(s.size());
    return std::string(s);
  }
  static const Storage& charged_copy(const Value& other) {
    if (other.is_string()) charge_string(other.as_string().size());
    return other.storage_;
  }

  Storage storage_;
};

// The depth a list or dict holding `value` has below itself: 0 for strings and numbers, a
// container's depth, 1 for a namespace (whose attributes can change later).
int nesting_depth(const Value& value);

// Python ==.
bool equals(const Value& a, const Value& b);
// Python <, as -1/0/1; throws RuntimeError for unorderable types ('<' not supported between ...).
int compare(const Value& a, const Value& b, std::string_view op);
// Python `a is b` for jinja's sameas: identity for containers, equality of type and value else.
bool same_object(const Value& a, const Value& b);

// Python float repr: shortest round-trip digits, exponent form when the exponent is < -4 or >= 16.
std::string python_float_repr(double value);
// Python repr of a str ('...' or "...", escapes as CPython).
std::string python_string_repr(std::string_view text);

// Per-code-point string helpers (UTF-8 in, UTF-8 out).
size_t code_point_count(std::string_view text);
bool is_ascii(std::string_view text);
bool is_python_space(char32_t cp);  // str.isspace()

}  // namespace splitflow::jinja
