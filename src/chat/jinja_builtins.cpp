#include "chat/jinja_builtins.h"

#include "tokenizer/unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <unordered_map>

namespace splitflow::jinja {
namespace {

// ---------------------------------------------------------------- strings, per code point

std::u32string code_points(std::string_view text) { return unicode::to_code_points(text); }
std::string utf8(std::u32string_view cps) { return unicode::to_utf8(cps); }

// For strings built piece by piece: the size is checked before each piece makes it grow.
void append_checked(std::string& out, std::string_view piece) {
  check_string_size(out.size() + piece.size());
  out += piece;
}

// Uppercase as the inverse of the simple lowercase mapping (the tokenizer tables hold lowercase
// only): right for every cased pair, misses Python's special expansions (ß -> SS).
char32_t to_upper(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  static const std::unordered_map<char32_t, char32_t> table = [] {
    std::unordered_map<char32_t, char32_t> upper;
    for (char32_t c = 0x80; c < 0x20000; ++c) {
      char32_t lower = unicode::simple_lowercase(c);
      if (lower != c) upper.emplace(lower, c);  // first (smallest) upper case wins
    }
    return upper;
  }();
  auto it = table.find(cp);
  return it == table.end() ? cp : it->second;
}

void append_lower(std::u32string& out, char32_t cp) {
  if (cp < 0x80) {
    out += (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  } else {
    unicode::append_lowercase(out, cp);
  }
}

bool is_cased(char32_t cp) {
  using unicode::Category;
  Category c = unicode::category(cp);
  return c == Category::Lu || c == Category::Ll || c == Category::Lt;
}

std::string str_lower(std::string_view text) {
  if (is_ascii(text)) {
    std::string out(text);
    for (char& c : out) c = (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return out;
  }
  std::u32string out;
  for (char32_t cp : code_points(text)) append_lower(out, cp);
  return utf8(out);
}

std::string str_upper(std::string_view text) {
  std::u32string cps = code_points(text);
  for (char32_t& cp : cps) cp = to_upper(cp);
  return utf8(cps);
}

// Python str.title(): a cased character after an uncased one starts a word.
std::string str_title(std::string_view text) {
  std::u32string out;
  bool previous_cased = false;
  for (char32_t cp : code_points(text)) {
    if (previous_cased) {
      append_lower(out, cp);
    } else {
      out += to_upper(cp);
    }
    previous_cased = is_cased(cp);
  }
  return utf8(out);
}

std::string str_capitalize(std::string_view text) {
  std::u32string cps = code_points(text);
  std::u32string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      out += to_upper(cps[0]);
    } else {
      append_lower(out, cps[i]);
    }
  }
  return utf8(out);
}

// strip/lstrip/rstrip; chars null or None: whitespace.
std::string str_strip(std::string_view text, const Value* chars, bool left, bool right) {
  std::u32string set;
  bool whitespace = !chars || chars->is_none();
  if (!whitespace) {
    if (!chars->is_string()) {
      throw RuntimeError(fmt::format("strip arg must be None or str, not {}", chars->type_name()));
    }
    set = code_points(chars->as_string());
  }
  auto strip = [&](char32_t cp) {
    return whitespace ? is_python_space(cp) : set.find(cp) != std::u32string::npos;
  };
  std::u32string cps = code_points(text);
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return utf8(std::u32string_view(cps).substr(begin, end - begin));
}

std::vector<Value> str_split(const std::string& text, const Value* separator, int64_t maxsplit, bool from_right) {
  std::vector<Value> parts;
  auto check_one_more = [](size_t count) { check_container_size("list", count + 1, sizeof(Value)); };
  if (!separator || separator->is_none()) {
    // Runs of whitespace separate; leading/trailing whitespace yields no empty parts.
    std::u32string cps = code_points(text);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < cps.size() && is_python_space(cps[i])) ++i;
        if (i >= cps.size()) break;
        check_one_more(words.size());
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(cps.substr(i));  // the remainder keeps its trailing whitespace
          break;
        }
        size_t start = i;
        while (i < cps.size() && !is_python_space(cps[i])) ++i;
        words.push_back(cps.substr(start, i - start));
      }
    } else {
      size_t i = cps.size();
      while (true) {
        while (i > 0 && is_python_space(cps[i - 1])) --i;
        if (i == 0) break;
        check_one_more(words.size());
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(cps.substr(0, i));  // the remainder keeps its leading whitespace
          break;
        }
        size_t end = i;
        while (i > 0 && !is_python_space(cps[i - 1])) --i;
        words.push_back(cps.substr(i, end - i));
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto& word : words) parts.emplace_back(utf8(word));
    return parts;
  }
  if (!separator->is_string()) {
    throw RuntimeError(fmt::format("must be str or None, not {}", separator->type_name()));
  }
  const std::string& sep = separator->as_string();
  if (sep.empty()) throw RuntimeError("empty separator");
  charge_search(text.size(), sep.size());
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t found = text.find(sep, start);
      if (found == std::string::npos) break;
      check_one_more(parts.size());
      parts.emplace_back(text.substr(start, found - start));
      start = found + sep.size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  size_t end = text.size();
  std::vector<Value> reversed;
  while (maxsplit < 0 || static_cast<int64_t>(reversed.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t found = text.rfind(sep, end - sep.size());
    if (found == std::string::npos) break;
    check_one_more(reversed.size());
    reversed.emplace_back(text.substr(found + sep.size(), end - found - sep.size()));
    end = found;
  }
  reversed.emplace_back(text.substr(0, end));
  return std::vector<Value>(reversed.rbegin(), reversed.rend());
}

// Python str.splitlines(): \n \r \r\n \v \f \x1c \x1d \x1e \x85 \u2028 \u2029 end lines.
std::vector<std::string> str_splitlines(std::string_view text, bool keep_ends) {
  std::u32string cps = code_points(text);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    char32_t c = cps[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 ||
                    c == 0x2028 || c == 0x2029;
    if (!is_break) continue;
    size_t end = i;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    check_container_size("list", lines.size() + 1, sizeof(Value));
    lines.push_back(utf8(std::u32string_view(cps).substr(start, (keep_ends ? i + 1 : end) - start)));
    start = i + 1;
  }
  if (start < cps.size()) lines.push_back(utf8(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string str_replace(const std::string& text, const std::string& old, const std::string& replacement,
                        int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts the replacement before every character and at the end.
    std::u32string cps = code_points(text);
    for (char32_t cp : cps) {
      if (count < 0 || done < count) {
        append_checked(out, replacement);
        ++done;
      }
      unicode::append_utf8(out, cp);
    }
    if (count < 0 || done < count) append_checked(out, replacement);
    return out;
  }
  charge_search(text.size(), old.size());
  std::string_view text_view(text);
  size_t start = 0;
  while (count < 0 || done < count) {
    size_t found = text.find(old, start);
    if (found == std::string::npos) break;
    append_checked(out, text_view.substr(start, found - start));
    append_checked(out, replacement);
    start = found + old.size();
    ++done;
  }
  append_checked(out, text_view.substr(start));
  return out;
}

// ---------------------------------------------------------------- argument helpers

Value arg_or(const CallArgs& args, size_t index, std::string_view name, std::string_view function,
             const Value& fallback) {
  const Value* found = args.find(index, name, function);
  return found ? *found : fallback;
}

const std::string& require_string(const Value& value, std::string_view what) {
  if (!value.is_string()) throw RuntimeError(fmt::format("{} must be a string, not {}", what, value.type_name()));
  return value.as_string();
}

int64_t require_int(const Value& value, std::string_view what) {
  if (value.is_int() || value.is_bool()) return value.to_int();
  throw RuntimeError(fmt::format("{} must be an integer, not {}", what, value.type_name()));
}

std::string object_description(const Value& object) {
  if (object.is_none()) return "None";
  return object.type_name() + " object";
}

Value missing_attribute(const Value& object, const Value& name) {
  if (name.is_string()) {
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_description(object), name.as_string()));
  }
  return Value::undefined(fmt::format("{} has no element {}", object_description(object), name.repr()));
}

// Python's index normalization for obj[i]; -1 when out of range.
int64_t normalize_index(int64_t index, int64_t size) {
  if (index < 0) index += size;
  return index >= 0 && index < size ? index : -1;
}

const std::vector<std::string_view> kStringMethods = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "upper",
    "lower", "title", "capitalize", "replace", "find", "rfind", "index", "rindex", "count", "join",
    "format", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "removeprefix",
    "removesuffix", "zfill", "center", "ljust", "rjust", "casefold", "swapcase", "partition", "rpartition"};
const std::vector<std::string_view> kDictMethods = {"items", "keys", "values", "get", "copy"};
const std::vector<std::string_view> kListMethods = {"index", "count", "copy"};
// Methods the immutable sandbox refuses (they would change a value).
const std::vector<std::string_view> kMutatingMethods = {"append", "extend", "insert", "pop", "remove", "clear",
                                                        "sort", "reverse", "update", "setdefault", "popitem"};

bool contains_name(const std::vector<std::string_view>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool has_method(const Value& object, std::string_view name) {
  if (object.is_string()) return contains_name(kStringMethods, name);
  if (object.is_dict()) return contains_name(kDictMethods, name);
  if (object.is_sequence()) return contains_name(kListMethods, name);
  return false;
}

// ---------------------------------------------------------------- formatting

std::string pad(const std::string& text, int64_t width, bool left_align, char fill = ' ') {
  int64_t length = static_cast<int64_t>(code_point_count(text));
  if (width <= length) return text;
  check_string_size(text.size() + static_cast<size_t>(width - length));
  std::string padding(width - length, fill);
  return left_align ? text + padding : padding + text;
}

// Python's printf-style `format % values`.
std::string percent_format(const std::string& format, const Value& values) {
  std::vector<Value> positional;
  const Dict* mapping = nullptr;
  if (values.is_sequence() && values.as_sequence().is_tuple) {
    positional = values.items();
  } else if (values.is_dict()) {
    mapping = &values.as_dict();
    positional.push_back(values);
  } else {
    positional.push_back(values);
  }
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> const Value& {
    if (next >= positional.size()) throw RuntimeError("not enough arguments for format string");
    return positional[next++];
  };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) throw RuntimeError("incomplete format");
    const Value* value = nullptr;
    if (format[i] == '(') {
      size_t close = format.find(')', i);
      if (close == std::string::npos || !mapping) throw RuntimeError("format requires a mapping");
      std::string key = format.substr(i + 1, close - i - 1);
      value = mapping->find_key(key);
      if (!value) throw RuntimeError(fmt::format("KeyError: '{}'", key));
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::string_view("-+ #0").find(format[i]) != std::string_view::npos) flags += format[i++];
    int64_t width = -1, precision = -1;
    // Digits saturate rather than overflow: a field that wide is then refused by the value-size
    // limit (pad, or the check before a numeric field's buffer), naming it.
    constexpr int64_t kSaturatedWidth = int64_t{1} << 50;
    auto read_number = [&](int64_t& target) {
      if (i < format.size() && format[i] == '*') {
        target = require_int(take(), "* width");
        ++i;
        return;
      }
      if (i < format.size() && isdigit(static_cast<unsigned char>(format[i]))) {
        target = 0;
        while (i < format.size() && isdigit(static_cast<unsigned char>(format[i])))
          target = std::min(target * 10 + (format[i++] - '0'), kSaturatedWidth);
      }
    };
    read_number(width);
    if (i < format.size() && format[i] == '.') {
      ++i;
      precision = 0;
      read_number(precision);
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) throw RuntimeError("incomplete format");
    char type = format[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    const Value& v = value ? *value : take();
    bool left = flags.find('-') != std::string::npos;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        std::string text = type == 's' ? v.str() : v.repr();
        if (precision >= 0) text = utf8(code_points(text).substr(0, precision));
        append_checked(out, pad(text, width, left));
        break;
      }
      case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': case 'c':
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
        if (!v.is_number()) {
          throw RuntimeError(fmt::format("%{} format: a real number is required, not {}", type, v.type_name()));
        }
        std::string spec = "%" + flags + (width >= 0 ? std::to_string(width) : "") +
                           (precision >= 0 ? "." + std::to_string(precision) : "");
        // Sized for the field plus any double's digits, within the value-size limit.
        const size_t field = static_cast<size_t>(std::max<int64_t>(width, 0) + std::max<int64_t>(precision, 0)) + 512;
        check_string_size(field);
        std::vector<char> buffer(field);
        if (type == 'c') {
          std::string ch;
          unicode::append_utf8(ch, static_cast<char32_t>(v.to_int()));
          out += pad(ch, width, left);
        } else if (std::string_view("diuxXo").find(type) != std::string_view::npos) {
          if (v.is_float() && !(std::fabs(v.as_float()) < 9.2e18))  // NaN too: no int64 holds it
            throw RuntimeError(fmt::format("%{} format: {} does not fit a 64-bit integer", type, v.as_float()));
          int64_t n = v.is_float() ? static_cast<int64_t>(v.as_float()) : v.to_int();
          spec += "ll";
          spec += type == 'i' || type == 'u' ? 'd' : type;
          std::snprintf(buffer.data(), buffer.size(), spec.c_str(), static_cast<long long>(n));
          append_checked(out, buffer.data());
        } else {
          spec += type;
          std::snprintf(buffer.data(), buffer.size(), spec.c_str(), v.to_double());
          append_checked(out, buffer.data());
        }
        break;
      }
      default:
        throw RuntimeError(fmt::format("unsupported format character '{}'", type));
    }
  }
  if (next < positional.size() && !used_mapping && !mapping) {
    throw RuntimeError("not all arguments converted during string formatting");
  }
  return out;
}

// Python str.format with {}, {0}, {name}, {x!r}; format specs beyond none are not supported.
std::string brace_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if (c == '}' ) {
      if (i + 1 < format.size() && format[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = format.find('}', i);
    if (close == std::string::npos) throw RuntimeError("Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 's';
      field = field.substr(0, bang);
    }
    if (field.find(':') != std::string::npos) throw RuntimeError("format specs in str.format are not supported");
    const Value* value = nullptr;
    if (field.empty()) {
      if (auto_index >= args.positional.size()) throw RuntimeError("Replacement index out of range");
      value = &args.positional[auto_index++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return isdigit(static_cast<unsigned char>(d)); })) {
      size_t index = std::stoul(field);
      if (index >= args.positional.size()) throw RuntimeError("Replacement index out of range");
      value = &args.positional[index];
    } else {
      for (const auto& [name, v] : args.keyword) {
        if (name == field) value = &v;
      }
      if (!value) throw RuntimeError(fmt::format("KeyError: '{}'", field));
    }
    append_checked(out, conversion == 'r' ? value->repr() : value->str());
  }
  return out;
}

// ---------------------------------------------------------------- numbers

int64_t checked(bool overflow, int64_t result) {
  if (overflow) throw RuntimeError("integer overflow in the chat template");
  return result;
}

std::optional<int64_t> parse_int(std::string_view text, int base) {
  size_t begin = 0, end = text.size();
  while (begin < end && isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  text = text.substr(begin, end - begin);
  bool negative = false;
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
    negative = text[0] == '-';
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  bool digit_before = false;
  for (char c : text) {
    if (c == '_' && digit_before) {
      digit_before = false;
      continue;
    }
    int d = isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : (isalpha(static_cast<unsigned char>(c)) ? (tolower(static_cast<unsigned char>(c)) - 'a' + 10) : 99);
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(value, base, &value) || __builtin_add_overflow(value, d, &value)) return std::nullopt;
    digit_before = true;
  }
  if (!digit_before) return std::nullopt;
  return negative ? -value : value;
}

std::optional<double> parse_float(std::string_view text) {
  std::string cleaned;
  for (char c : text) {
    if (c != '_') cleaned += c;
  }
  size_t begin = cleaned.find_first_not_of(" \t\n\r\f\v");
  if (begin == std::string::npos) return std::nullopt;
  size_t end = cleaned.find_last_not_of(" \t\n\r\f\v");
  cleaned = cleaned.substr(begin, end - begin + 1);
  char* stop = nullptr;
  double value = std::strtod(cleaned.c_str(), &stop);
  if (stop != cleaned.c_str() + cleaned.size()) return std::nullopt;
  return value;
}

// Python round(x, ndigits) for floats: correctly rounded decimal, ties to even (printf does the same).
double round_decimal(double value, int64_t digits) {
  if (!std::isfinite(value)) return value;
  if (digits < 0) {
    double scale = std::pow(10.0, static_cast<double>(-digits));
    return std::nearbyint(value / scale) * scale;
  }
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(std::min<int64_t>(digits, 300)), value);
  return std::strtod(buffer, nullptr);
}

// ---------------------------------------------------------------- sorting and attribute paths

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (getitem first); with a
// fallback, an undefined step is replaced by it before the next step.
Value lookup_path(const Value& item, const Value& attribute, const Value* fallback = nullptr) {
  if (!attribute.is_string()) {
    Value found = get_item(item, attribute);
    return found.is_undefined() && fallback ? *fallback : found;
  }
  Value current = item;
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    auto index = parse_int(part, 10);
    bool all_digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return isdigit(static_cast<unsigned char>(c)); });
    current = all_digits && index ? get_item(current, Value(*index)) : get_item(current, Value(part));
    if (current.is_undefined() && fallback) current = *fallback;
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

Value sort_key(const Value& value, bool case_sensitive) {
  if (!case_sensitive && value.is_string()) return Value(str_lower(value.as_string()));
  return value;
}

void stable_sort(std::vector<Value>& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) keyed.emplace_back(key(items[i]), i);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? compare(b.first, a.first, "<") < 0 : compare(a.first, b.first, "<") < 0;
  });
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (const auto& [k, index] : keyed) sorted.push_back(items[index]);
  items = std::move(sorted);
}

// ---------------------------------------------------------------- JSON

void append_json_string(std::string& out, std::string_view text, bool ensure_ascii) {
  check_string_size(out.size() + text.size() + 2);  // escapes can make it longer: checked again at the end
  out += '"';
  size_t offset = 0;
  while (offset < text.size()) {
    char32_t cp = unicode::decode_next(text, offset);
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7e)) {
          if (cp >= 0x10000) {
            char32_t v = cp - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
          }
        } else {
          unicode::append_utf8(out, cp);
        }
    }
  }
  out += '"';
  check_string_size(out.size());
}

std::string json_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  return python_float_repr(value);
}

void append_json(std::string& out, const Value& value, const JsonOptions& options, int level) {
  auto newline = [&](int depth) {
    if (!options.indent) return;
    check_string_size(out.size() + 1 + depth * options.indent->size());
    out += '\n';
    for (int i = 0; i < depth; ++i) out += *options.indent;
  };
  if (value.is_none()) {
    out += "null";
  } else if (value.is_bool()) {
    out += value.as_bool() ? "true" : "false";
  } else if (value.is_int()) {
    out += std::to_string(value.as_int());
  } else if (value.is_float()) {
    out += json_float(value.as_float());
  } else if (value.is_string()) {
    append_json_string(out, value.as_string(), options.ensure_ascii);
  } else if (value.is_sequence()) {
    const auto& items = value.items();
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += options.item_separator;
      newline(level + 1);
      append_json(out, items[i], options, level + 1);
    }
    newline(level);
    out += ']';
  } else if (value.is_dict()) {
    const auto& entries = value.as_dict().entries;
    if (entries.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> items;
    for (const auto& [key, item] : entries) {
      std::string name;
      if (key.is_string()) {
        name = key.as_string();
      } else if (key.is_bool()) {
        name = key.as_bool() ? "true" : "false";
      } else if (key.is_none()) {
        name = "null";
      } else if (key.is_int()) {
        name = std::to_string(key.as_int());
      } else if (key.is_float()) {
        name = json_float(key.as_float());
      } else {
        throw RuntimeError(fmt::format("keys must be str, int, float, bool or None, not {}", key.type_name()));
      }
      items.emplace_back(std::move(name), &item);
    }
    if (options.sort_keys) {
      std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += options.item_separator;
      newline(level + 1);
      append_json_string(out, items[i].first, options.ensure_ascii);
      out += options.key_separator;
      append_json(out, *items[i].second, options, level + 1);
    }
    newline(level);
    out += '}';
  } else {
    throw RuntimeError(fmt::format("Object of type {} is not JSON serializable", value.type_name()));
  }
}

// ---------------------------------------------------------------- filters

using FilterFunction = Value (*)(const Value& input, const CallArgs& args);
using TestFunction = bool (*)(const Value& input, const CallArgs& args);

Value filter_abs(const Value& input, const CallArgs& args) {
  args.check("abs", 0, {});
  if (input.is_float()) return Value(std::fabs(input.as_float()));
  if (input.is_int() || input.is_bool()) {
    int64_t v = input.to_int();
    return Value(v == INT64_MIN ? checked(true, 0) : (v < 0 ? -v : v));
  }
  if (input.is_undefined()) input.fail_undefined();
  throw RuntimeError(fmt::format("bad operand type for abs(): '{}'", input.type_name()));
}

Value filter_attr(const Value& input, const CallArgs& args) {
  args.check("attr", 1, {"name"});
  Value name = arg_or(args, 0, "name", "attr", Value());
  if (input.is_undefined()) input.fail_undefined();
  if (input.is_namespace()) {
    const Value* found = input.as_namespace().attributes.find_key(require_string(name, "attr name"));
    if (found) return *found;
  } else if (name.is_string() && has_method(input, name.as_string())) {
    return get_attribute(input, name.as_string());
  }
  return missing_attribute(input, name);
}

Value filter_batch(const Value& input, const CallArgs& args) {
  args.check("batch", 2, {"linecount", "fill_with"});
  int64_t count = require_int(arg_or(args, 0, "linecount", "batch", Value()), "batch linecount");
  if (count <= 0) throw RuntimeError("batch linecount must be positive");
  const Value* fill = args.find(1, "fill_with", "batch");
  if (fill && !fill->is_none()) check_container_size("list", static_cast<uint64_t>(count), sizeof(Value));
  std::vector<Value> batches, current;
  for (auto& item : iterate(input)) {
    current.push_back(item);
    if (static_cast<int64_t>(current.size()) == count) {
      batches.push_back(Value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (fill && !fill->is_none()) {
      while (static_cast<int64_t>(current.size()) < count) current.push_back(*fill);
    }
    batches.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(batches));
}

Value filter_capitalize(const Value& input, const CallArgs& args) {
  args.check("capitalize", 0, {});
  return Value(str_capitalize(input.str()));
}

std::string center(const std::string& text, int64_t width) {
  int64_t length = static_cast<int64_t>(code_point_count(text));
  if (width <= length) return text;
  int64_t margin = width - length;
  check_string_size(text.size() + static_cast<size_t>(margin));
  int64_t left = margin / 2 + (margin & width & 1);  // CPython's rounding
  return std::string(left, ' ') + text + std::string(margin - left, ' ');
}

Value filter_center(const Value& input, const CallArgs& args) {
  args.check("center", 1, {"width"});
  return Value(center(input.str(), require_int(arg_or(args, 0, "width", "center", Value(80)), "center width")));
}

Value filter_default(const Value& input, const CallArgs& args) {
  args.check("default", 2, {"default_value", "boolean"});
  Value fallback = arg_or(args, 0, "default_value", "default", Value(""));
  bool boolean = arg_or(args, 1, "boolean", "default", Value(false)).truthy();
  if (input.is_undefined() || (boolean && !input.truthy())) return fallback;
  return input;
}

Value filter_dictsort(const Value& input, const CallArgs& args) {
  args.check("dictsort", 3, {"case_sensitive", "by", "reverse"});
  bool case_sensitive = arg_or(args, 0, "case_sensitive", "dictsort", Value(false)).truthy();
  std::string by = require_string(arg_or(args, 1, "by", "dictsort", Value("key")), "dictsort by");
  bool reverse = arg_or(args, 2, "reverse", "dictsort", Value(false)).truthy();
  if (!input.is_dict()) throw RuntimeError("dictsort: the value must be a dict");
  if (by != "key" && by != "value") throw RuntimeError("You can only sort by either \"key\" or \"value\"");
  size_t position = by == "key" ? 0 : 1;
  std::vector<Value> pairs;
  for (const auto& [key, value] : input.as_dict().entries) pairs.push_back(Value::tuple({key, value}));
  stable_sort(pairs, [&](const Value& pair) { return sort_key(pair.items()[position], case_sensitive); }, reverse);
  return Value::list(std::move(pairs));
}

Value filter_escape(const Value& input, const CallArgs& args) {
  args.check("escape", 0, {});
  auto entity = [](char c) -> std::string_view {
    switch (c) {
      case '&': return "&amp;";
      case '<': return "&lt;";
      case '>': return "&gt;";
      case '"': return "&#34;";
      case '\'': return "&#39;";
      default: return {};
    }
  };
  std::string text = input.str();
  size_t escaped_size = 0;
  for (char c : text) escaped_size += entity(c).empty() ? 1 : entity(c).size();
  check_string_size(escaped_size);
  std::string out;
  out.reserve(escaped_size);
  for (char c : text) {
    std::string_view replacement = entity(c);
    if (replacement.empty()) {
      out += c;
    } else {
      out += replacement;
    }
  }
  return Value(std::move(out));
}

Value filter_first(const Value& input, const CallArgs& args) {
  args.check("first", 0, {});
  std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value filter_last(const Value& input, const CallArgs& args) {
  args.check("last", 0, {});
  std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value to_float_or(const Value& input, const Value& fallback) {
  if (input.is_number()) return Value(input.to_double());
  if (input.is_string()) {
    if (auto parsed = parse_float(input.as_string())) return Value(*parsed);
  }
  return fallback;
}

Value filter_float(const Value& input, const CallArgs& args) {
  args.check("float", 1, {"default"});
  return to_float_or(input, arg_or(args, 0, "default", "float", Value(0.0)));
}

Value filter_format(const Value& input, const CallArgs& args) {
  if (!args.keyword.empty() && !args.positional.empty()) {
    throw RuntimeError("can't handle positional and keyword arguments at the same time");
  }
  if (!args.keyword.empty()) {
    Dict mapping;
    for (const auto& [key, value] : args.keyword) mapping.set(Value(key), value);
    return Value(percent_format(input.str(), Value::dict(std::move(mapping))));
  }
  return Value(percent_format(input.str(), Value::tuple(args.positional)));
}

Value filter_indent(const Value& input, const CallArgs& args) {
  args.check("indent", 3, {"width", "first", "blank"});
  Value width = arg_or(args, 0, "width", "indent", Value(4));
  bool first = arg_or(args, 1, "first", "indent", Value(false)).truthy();
  bool blank = arg_or(args, 2, "blank", "indent", Value(false)).truthy();
  std::string indentation;
  if (width.is_string()) {
    indentation = width.as_string();
  } else {
    int64_t spaces = require_int(width, "indent width");
    check_repeated_string_size(spaces, 1);
    indentation.assign(std::max<int64_t>(0, spaces), ' ');
  }
  // jinja2 appends a newline before splitlines() so a trailing newline keeps its (empty) line.
  std::vector<std::string> lines = str_splitlines(input.str() + "\n", false);
  std::string out;
  if (first) out = indentation;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) {
      append_checked(out, "\n");
      if (blank || !lines[i].empty()) append_checked(out, indentation);
    }
    append_checked(out, lines[i]);
  }
  return Value(std::move(out));
}

Value filter_int(const Value& input, const CallArgs& args) {
  args.check("int", 2, {"default", "base"});
  Value fallback = arg_or(args, 0, "default", "int", Value(0));
  int64_t base = require_int(arg_or(args, 1, "base", "int", Value(10)), "int base");
  if (input.is_bool() || input.is_int()) return Value(input.to_int());
  if (input.is_float()) {
    double v = input.as_float();
    if (!std::isfinite(v) || std::fabs(v) >= 9.2e18) return fallback;
    return Value(static_cast<int64_t>(v));
  }
  if (input.is_string()) {
    if (auto parsed = parse_int(input.as_string(), static_cast<int>(base))) return Value(*parsed);
    if (auto parsed = parse_float(input.as_string())) {
      if (std::isfinite(*parsed) && std::fabs(*parsed) < 9.2e18) return Value(static_cast<int64_t>(*parsed));
    }
  }
  return fallback;
}

Value filter_items(const Value& input, const CallArgs& args) {
  args.check("items", 0, {});
  if (input.is_undefined()) return Value::list({});
  if (!input.is_dict()) throw RuntimeError("Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : input.as_dict().entries) pairs.push_back(Value::tuple({key, value}));
  return Value::list(std::move(pairs));
}

Value filter_join(const Value& input, const CallArgs& args) {
  args.check("join", 2, {"d", "attribute"});
  std::string separator = arg_or(args, 0, "d", "join", Value("")).str();
  const Value* attribute = args.find(1, "attribute", "join");
  std::string out;
  bool first = true;
  for (const auto& item : iterate(input)) {
    if (!first) append_checked(out, separator);
    first = false;
    append_checked(out, attribute && !attribute->is_none() ? lookup_path(item, *attribute).str() : item.str());
  }
  return Value(std::move(out));
}

Value filter_length(const Value& input, const CallArgs& args) {
  args.check("length", 0, {});
  return Value(length(input));
}

Value filter_list(const Value& input, const CallArgs& args) {
  args.check("list", 0, {});
  return Value::list(iterate(input));
}

Value filter_lower(const Value& input, const CallArgs& args) {
  args.check("lower", 0, {});
  return Value(str_lower(input.str()));
}

Value filter_upper(const Value& input, const CallArgs& args) {
  args.check("upper", 0, {});
  return Value(str_upper(input.str()));
}

Value filter_map(const Value& input, const CallArgs& args) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [key, value] : args.keyword) {
    if (key == "attribute") attribute = &value;
    if (key == "default" && !value.is_none()) fallback = &value;
  }
  if (attribute) {
    for (const auto& item : iterate(input)) out.push_back(lookup_path(item, *attribute, fallback));
    return Value::list(std::move(out));
  }
  if (args.positional.empty()) throw RuntimeError("map requires a filter argument");
  std::string name = require_string(args.positional[0], "map filter name");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const auto& item : iterate(input)) out.push_back(apply_filter(name, item, rest));
  return Value::list(std::move(out));
}

Value min_max(const Value& input, const CallArgs& args, const char* name, bool want_max) {
  args.check(name, 2, {"case_sensitive", "attribute"});
  bool case_sensitive = arg_or(args, 0, "case_sensitive", name, Value(false)).truthy();
  const Value* attribute = args.find(1, "attribute", name);
  std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
  auto key = [&](const Value& item) {
    return sort_key(attribute && !attribute->is_none() ? lookup_path(item, *attribute) : item, case_sensitive);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare(key(items[i]), key(items[best]), "<");
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value filter_max(const Value& input, const CallArgs& args) { return min_max(input, args, "max", true); }
Value filter_min(const Value& input, const CallArgs& args) { return min_max(input, args, "min", false); }

// select/reject/selectattr/rejectattr share jinja2's select_or_reject.
Value select_or_reject(const Value& input, const CallArgs& args, bool with_attribute, bool keep_matches) {
  size_t next = 0;
  const Value* attribute = nullptr;
  if (with_attribute) {
    if (args.positional.empty()) throw RuntimeError("Missing parameter for attribute name");
    attribute = &args.positional[next++];
  }
  std::string test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    test = require_string(args.positional[next++], "test name");
    test_args.positional.assign(args.positional.begin() + next, args.positional.end());
    test_args.keyword = args.keyword;
    if (!has_test(test)) throw RuntimeError(fmt::format("No test named '{}'.", test));
  }
  std::vector<Value> out;
  for (const auto& item : iterate(input)) {
    Value subject = attribute ? lookup_path(item, *attribute) : item;
    bool matches = test.empty() ? subject.truthy() : apply_test(test, subject, test_args);
    if (matches == keep_matches) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_select(const Value& input, const CallArgs& args) { return select_or_reject(input, args, false, true); }
Value filter_reject(const Value& input, const CallArgs& args) { return select_or_reject(input, args, false, false); }
Value filter_selectattr(const Value& input, const CallArgs& args) { return select_or_reject(input, args, true, true); }
Value filter_rejectattr(const Value& input, const CallArgs& args) { return select_or_reject(input, args, true, false); }

Value filter_replace(const Value& input, const CallArgs& args) {
  args.check("replace", 3, {"old", "new", "count"});
  std::string old = arg_or(args, 0, "old", "replace", Value()).str();
  std::string replacement = arg_or(args, 1, "new", "replace", Value()).str();
  Value count = arg_or(args, 2, "count", "replace", Value(nullptr));
  return Value(str_replace(input.str(), old, replacement, count.is_none() ? -1 : require_int(count, "replace count")));
}

Value filter_reverse(const Value& input, const CallArgs& args) {
  args.check("reverse", 0, {});
  if (input.is_string()) {
    std::u32string cps = code_points(input.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(utf8(cps));
  }
  std::vector<Value> items = iterate(input);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_round(const Value& input, const CallArgs& args) {
  args.check("round", 2, {"precision", "method"});
  int64_t precision = require_int(arg_or(args, 0, "precision", "round", Value(0)), "round precision");
  std::string method = require_string(arg_or(args, 1, "method", "round", Value("common")), "round method");
  if (method != "common" && method != "ceil" && method != "floor") {
    throw RuntimeError("method must be common, ceil or floor");
  }
  if (!input.is_number()) throw RuntimeError(fmt::format("type {} doesn't define __round__ method", input.type_name()));
  if (method == "common") {
    if (!input.is_float()) return Value(input.to_int());  // round(int, n) stays an int
    return Value(round_decimal(input.as_float(), precision));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double scaled = input.to_double() * scale;
  return Value((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

Value filter_safe(const Value& input, const CallArgs& args) {
  args.check("safe", 0, {});
  return Value(input.str());
}

Value filter_sort(const Value& input, const CallArgs& args) {
  args.check("sort", 3, {"reverse", "case_sensitive", "attribute"});
  bool reverse = arg_or(args, 0, "reverse", "sort", Value(false)).truthy();
  bool case_sensitive = arg_or(args, 1, "case_sensitive", "sort", Value(false)).truthy();
  const Value* attribute = args.find(2, "attribute", "sort");
  std::vector<Value> items = iterate(input);
  stable_sort(items, [&](const Value& item) {
    return sort_key(attribute && !attribute->is_none() ? lookup_path(item, *attribute) : item, case_sensitive);
  }, reverse);
  return Value::list(std::move(items));
}

Value filter_string(const Value& input, const CallArgs& args) {
  args.check("string", 0, {});
  return Value(input.str());
}

Value filter_sum(const Value& input, const CallArgs& args) {
  args.check("sum", 2, {"attribute", "start"});
  const Value* attribute = args.find(0, "attribute", "sum");
  Value total = arg_or(args, 1, "start", "sum", Value(0));
  for (const auto& item : iterate(input)) {
    total = binary_operation("+", total, attribute && !attribute->is_none() ? lookup_path(item, *attribute) : item);
  }
  return total;
}

// jinja2's title filter: words start after whitespace, '-', '(', '{', '[' or '<'.
Value filter_title(const Value& input, const CallArgs& args) {
  args.check("title", 0, {});
  std::u32string out;
  bool word_start = true;
  for (char32_t cp : code_points(input.str())) {
    bool separator = is_python_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (separator) {
      out += cp;
      word_start = true;
    } else if (word_start) {
      out += to_upper(cp);
      word_start = false;
    } else {
      append_lower(out, cp);
    }
  }
  return Value(utf8(out));
}

Value filter_tojson(const Value& input, const CallArgs& args) {
  args.check("tojson", 5, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions options;
  options.ensure_ascii = arg_or(args, 0, "ensure_ascii", "tojson", Value(false)).truthy();
  Value indent = arg_or(args, 1, "indent", "tojson", Value(nullptr));
  if (indent.is_string()) {
    options.indent = indent.as_string();
  } else if (!indent.is_none()) {
    int64_t spaces = require_int(indent, "tojson indent");
    check_repeated_string_size(spaces, 1);
    options.indent = std::string(std::max<int64_t>(0, spaces), ' ');
  }
  if (options.indent) options.item_separator = ",";
  Value separators = arg_or(args, 2, "separators", "tojson", Value(nullptr));
  if (!separators.is_none()) {
    std::vector<Value> pair = iterate(separators);
    if (pair.size() != 2) throw RuntimeError("tojson separators must be an (item, key) pair");
    options.item_separator = require_string(pair[0], "tojson item separator");
    options.key_separator = require_string(pair[1], "tojson key separator");
  }
  options.sort_keys = arg_or(args, 3, "sort_keys", "tojson", Value(false)).truthy();
  return Value(to_json(input, options));
}

Value filter_trim(const Value& input, const CallArgs& args) {
  args.check("trim", 1, {"chars"});
  return Value(str_strip(input.str(), args.find(0, "chars", "trim"), true, true));
}

Value filter_unique(const Value& input, const CallArgs& args) {
  args.check("unique", 2, {"case_sensitive", "attribute"});
  bool case_sensitive = arg_or(args, 0, "case_sensitive", "unique", Value(false)).truthy();
  const Value* attribute = args.find(1, "attribute", "unique");
  std::vector<Value> out, seen;
  for (const auto& item : iterate(input)) {
    Value key = sort_key(attribute && !attribute->is_none() ? lookup_path(item, *attribute) : item, case_sensitive);
    bool duplicate = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); });
    if (duplicate) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_wordcount(const Value& input, const CallArgs& args) {
  args.check("wordcount", 0, {});
  int64_t count = 0;
  bool in_word = false;
  for (char32_t cp : code_points(input.str())) {
    bool word_char = cp == '_' || unicode::is_letter(cp) || unicode::is_number(cp);
    if (word_char && !in_word) ++count;
    in_word = word_char;
  }
  return Value(count);
}

const std::map<std::string_view, FilterFunction>& filters() {
  static const std::map<std::string_view, FilterFunction> table = {
      {"abs", filter_abs}, {"attr", filter_attr}, {"batch", filter_batch}, {"capitalize", filter_capitalize},
      {"center", filter_center}, {"count", filter_length}, {"d", filter_default}, {"default", filter_default},
      {"dictsort", filter_dictsort}, {"e", filter_escape}, {"escape", filter_escape},
      {"first", filter_first}, {"float", filter_float}, {"forceescape", filter_escape},
      {"format", filter_format}, {"indent", filter_indent}, {"int", filter_int}, {"items", filter_items},
      {"join", filter_join}, {"last", filter_last}, {"length", filter_length}, {"list", filter_list},
      {"lower", filter_lower}, {"map", filter_map}, {"max", filter_max}, {"min", filter_min},
      {"reject", filter_reject}, {"rejectattr", filter_rejectattr}, {"replace", filter_replace},
      {"reverse", filter_reverse}, {"round", filter_round}, {"safe", filter_safe}, {"select", filter_select},
      {"selectattr", filter_selectattr}, {"sort", filter_sort}, {"string", filter_string}, {"sum", filter_sum},
      {"title", filter_title}, {"tojson", filter_tojson}, {"trim", filter_trim}, {"unique", filter_unique},
      {"upper", filter_upper}, {"wordcount", filter_wordcount},
  };
  return table;
}

// ---------------------------------------------------------------- tests

const Value& test_arg(const CallArgs& args, const char* name) {
  if (args.positional.size() != 1 || !args.keyword.empty()) {
    throw RuntimeError(fmt::format("the '{}' test takes one argument", name));
  }
  return args.positional[0];
}

bool test_defined(const Value& v, const CallArgs&) { return !v.is_undefined(); }
bool test_undefined(const Value& v, const CallArgs&) { return v.is_undefined(); }
bool test_none(const Value& v, const CallArgs&) { return v.is_none(); }
bool test_boolean(const Value& v, const CallArgs&) { return v.is_bool(); }
bool test_true(const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }
bool test_false(const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool test_integer(const Value& v, const CallArgs&) { return v.is_int(); }
bool test_float(const Value& v, const CallArgs&) { return v.is_float(); }
bool test_number(const Value& v, const CallArgs&) { return v.is_number(); }
bool test_string(const Value& v, const CallArgs&) { return v.is_string(); }
bool test_mapping(const Value& v, const CallArgs&) { return v.is_dict(); }
bool test_callable(const Value& v, const CallArgs&) { return v.is_callable(); }
bool test_escaped(const Value&, const CallArgs&) { return false; }
// Python iter() works on Undefined too (it iterates as empty).
bool test_iterable(const Value& v, const CallArgs&) {
  return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
}
bool test_sequence(const Value& v, const CallArgs&) { return v.is_string() || v.is_sequence() || v.is_dict(); }
bool test_lower(const Value& v, const CallArgs&) {
  std::string s = v.str();
  return str_lower(s) == s && str_upper(s) != s;
}
bool test_upper(const Value& v, const CallArgs&) {
  std::string s = v.str();
  return str_upper(s) == s && str_lower(s) != s;
}
int64_t integer_operand(const Value& v, const char* test) {
  if (v.is_int() || v.is_bool()) return v.to_int();
  throw RuntimeError(fmt::format("the '{}' test needs an integer, not {}", test, v.type_name()));
}
bool test_even(const Value& v, const CallArgs&) { return integer_operand(v, "even") % 2 == 0; }
bool test_odd(const Value& v, const CallArgs&) { return integer_operand(v, "odd") % 2 != 0; }
bool test_divisibleby(const Value& v, const CallArgs& args) {
  int64_t divisor = integer_operand(test_arg(args, "divisibleby"), "divisibleby");
  if (divisor == 0) throw RuntimeError("integer division or modulo by zero");
  return integer_operand(v, "divisibleby") % divisor == 0;
}
bool test_eq(const Value& v, const CallArgs& args) { return equals(v, test_arg(args, "eq")); }
bool test_ne(const Value& v, const CallArgs& args) { return !equals(v, test_arg(args, "ne")); }
bool test_lt(const Value& v, const CallArgs& args) { return compare(v, test_arg(args, "lt"), "<") < 0; }
bool test_le(const Value& v, const CallArgs& args) { return compare(v, test_arg(args, "le"), "<=") <= 0; }
bool test_gt(const Value& v, const CallArgs& args) { return compare(v, test_arg(args, "gt"), ">") > 0; }
bool test_ge(const Value& v, const CallArgs& args) { return compare(v, test_arg(args, "ge"), ">=") >= 0; }
bool test_in(const Value& v, const CallArgs& args) { return contains(test_arg(args, "in"), v); }
bool test_sameas(const Value& v, const CallArgs& args) { return same_object(v, test_arg(args, "sameas")); }
bool test_filter(const Value& v, const CallArgs&) { return v.is_string() && has_filter(v.as_string()); }
bool test_test(const Value& v, const CallArgs&) { return v.is_string() && has_test(v.as_string()); }

const std::map<std::string_view, TestFunction>& tests() {
  static const std::map<std::string_view, TestFunction> table = {
      {"!=", test_ne}, {"<", test_lt}, {"<=", test_le}, {"==", test_eq}, {">", test_gt}, {">=", test_ge},
      {"boolean", test_boolean}, {"callable", test_callable}, {"defined", test_defined},
      {"divisibleby", test_divisibleby}, {"eq", test_eq}, {"equalto", test_eq}, {"escaped", test_escaped},
      {"even", test_even}, {"false", test_false}, {"filter", test_filter}, {"float", test_float},
      {"ge", test_ge}, {"greaterthan", test_gt}, {"gt", test_gt}, {"in", test_in}, {"integer", test_integer},
      {"iterable", test_iterable}, {"le", test_le}, {"lessthan", test_lt}, {"lower", test_lower},
      {"lt", test_lt}, {"mapping", test_mapping}, {"ne", test_ne}, {"none", test_none},
      {"number", test_number}, {"odd", test_odd}, {"sameas", test_sameas}, {"sequence", test_sequence},
      {"string", test_string}, {"test", test_test}, {"true", test_true}, {"undefined", test_undefined},
      {"upper", test_upper},
  };
  return table;
}

// ---------------------------------------------------------------- methods

bool matches_affix(const std::string& text, const Value& affix, bool prefix, const char* method) {
  auto check = [&](const Value& candidate) {
    const std::string& a = require_string(candidate, std::string(method) + " argument");
    if (a.size() > text.size()) return false;
    return prefix ? text.compare(0, a.size(), a) == 0 : text.compare(text.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_sequence() && affix.as_sequence().is_tuple) {
    return std::any_of(affix.items().begin(), affix.items().end(), check);
  }
  return check(affix);
}

// Python str.find in code points.
int64_t find_code_points(const std::string& text, const std::string& needle, bool from_right) {
  size_t found = from_right ? text.rfind(needle) : text.find(needle);
  if (found == std::string::npos) return -1;
  return static_cast<int64_t>(code_point_count(std::string_view(text).substr(0, found)));
}

Value string_method(const std::string& s, std::string_view name, const CallArgs& args) {
  std::string fn = "str." + std::string(name);
  if (name == "startswith" || name == "endswith") {
    args.check(fn, 1, {});
    if (args.positional.empty()) throw RuntimeError(fn + "() takes at least 1 argument (0 given)");
    return Value(matches_affix(s, args.positional[0], name == "startswith", fn.c_str()));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    args.check(fn, 1, {});
    return Value(str_strip(s, args.find(0, "chars", fn), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    args.check(fn, 2, {"sep", "maxsplit"});
    int64_t maxsplit = require_int(arg_or(args, 1, "maxsplit", fn, Value(-1)), "maxsplit");
    return Value::list(str_split(s, args.find(0, "sep", fn), maxsplit, name == "rsplit"));
  }
  if (name == "splitlines") {
    args.check(fn, 1, {"keepends"});
    std::vector<Value> lines;
    for (auto& line : str_splitlines(s, arg_or(args, 0, "keepends", fn, Value(false)).truthy())) lines.emplace_back(line);
    return Value::list(std::move(lines));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "casefold" ||
      name == "swapcase") {
    args.check(fn, 0, {});
    if (name == "upper") return Value(str_upper(s));
    if (name == "lower" || name == "casefold") return Value(str_lower(s));
    if (name == "title") return Value(str_title(s));
    if (name == "capitalize") return Value(str_capitalize(s));
    std::u32string out;
    for (char32_t cp : code_points(s)) {
      char32_t upper = to_upper(cp);
      if (upper != cp) {
        out += upper;
      } else {
        append_lower(out, cp);
      }
    }
    return Value(utf8(out));
  }
  if (name == "replace") {
    args.check(fn, 3, {});
    if (args.positional.size() < 2) throw RuntimeError(fn + "() takes at least 2 arguments");
    int64_t count = args.positional.size() > 2 ? require_int(args.positional[2], "replace count") : -1;
    return Value(str_replace(s, require_string(args.positional[0], fn + " old"),
                             require_string(args.positional[1], fn + " new"), count));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    args.check(fn, 1, {});
    if (args.positional.empty()) throw RuntimeError(fn + "() takes at least 1 argument (0 given)");
    const std::string& needle = require_string(args.positional[0], fn + " argument");
    charge_search(s.size(), needle.size());
    if (name == "count") {
      if (needle.empty()) return Value(static_cast<int64_t>(code_point_count(s) + 1));
      int64_t count = 0;
      for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + needle.size())) ++count;
      return Value(count);
    }
    int64_t found = find_code_points(s, needle, name[0] == 'r');
    if (found < 0 && (name == "index" || name == "rindex")) throw RuntimeError("substring not found");
    return Value(found);
  }
  if (name == "join") {
    args.check(fn, 1, {});
    if (args.positional.empty()) throw RuntimeError(fn + "() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(args.positional[0])) {
      if (!item.is_string()) throw RuntimeError(fmt::format("sequence item: expected str instance, {} found", item.type_name()));
      if (!first) append_checked(out, s);
      first = false;
      append_checked(out, item.as_string());
    }
    return Value(std::move(out));
  }
  if (name == "format") return Value(brace_format(s, args));
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper") {
    args.check(fn, 0, {});
    if (name == "islower") return Value(str_lower(s) == s && str_upper(s) != s);
    if (name == "isupper") return Value(str_upper(s) == s && str_lower(s) != s);
    std::u32string cps = code_points(s);
    if (cps.empty()) return Value(false);
    return Value(std::all_of(cps.begin(), cps.end(), [&](char32_t cp) {
      if (name == "isdigit") return unicode::category(cp) == unicode::Category::Nd;
      if (name == "isalpha") return unicode::is_letter(cp);
      if (name == "isalnum") return unicode::is_letter(cp) || unicode::is_number(cp);
      return is_python_space(cp);
    }));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    args.check(fn, 1, {});
    if (args.positional.empty()) throw RuntimeError(fn + "() takes exactly one argument (0 given)");
    const std::string& affix = require_string(args.positional[0], fn + " argument");
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) return Value(s.substr(affix.size()));
    if (name == "removesuffix" && !affix.empty() && s.size() >= affix.size() &&
        s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value(s.substr(0, s.size() - affix.size()));
    }
    return Value(s);
  }
  if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
    args.check(fn, 1, {});
    if (args.positional.empty()) throw RuntimeError(fn + "() takes at least 1 argument (0 given)");
    int64_t width = require_int(args.positional[0], fn + " width");
    if (name == "center") return Value(center(s, width));
    if (name == "ljust") return Value(pad(s, width, true));
    if (name == "rjust") return Value(pad(s, width, false));
    bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
    std::string padded = pad(s.substr(sign ? 1 : 0), width - (sign ? 1 : 0), false, '0');
    return Value(sign ? s.substr(0, 1) + padded : padded);
  }
  if (name == "partition" || name == "rpartition") {
    args.check(fn, 1, {});
    if (args.positional.empty()) throw RuntimeError(fn + "() takes exactly one argument (0 given)");
    const std::string& sep = require_string(args.positional[0], fn + " argument");
    if (sep.empty()) throw RuntimeError("empty separator");
    charge_search(s.size(), sep.size());
    size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (at == std::string::npos) {
      return name == "partition" ? Value::tuple({Value(s), Value(""), Value("")})
                                 : Value::tuple({Value(""), Value(""), Value(s)});
    }
    return Value::tuple({Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))});
  }
  throw RuntimeError(fmt::format("'str' object has no attribute '{}'", name));
}

Value dict_method(const Value& object, std::string_view name, const CallArgs& args) {
  const Dict& dict = object.as_dict();
  std::string fn = "dict." + std::string(name);
  if (name == "items" || name == "keys" || name == "values") {
    args.check(fn, 0, {});
    std::vector<Value> out;
    for (const auto& [key, value] : dict.entries) {
      out.push_back(name == "items" ? Value::tuple({key, value}) : (name == "keys" ? key : value));
    }
    return Value::list(std::move(out));
  }
  if (name == "get") {
    args.check(fn, 2, {});
    if (args.positional.empty()) throw RuntimeError("get expected at least 1 argument, got 0");
    const Value* found = dict.find(args.positional[0]);
    if (found) return *found;
    return args.positional.size() > 1 ? args.positional[1] : Value(nullptr);
  }
  if (name == "copy") return object;  // values are immutable, a copy is the same value
  throw RuntimeError(fmt::format("'dict' object has no attribute '{}'", name));
}

Value list_method(const Value& object, std::string_view name, const CallArgs& args) {
  const auto& items = object.items();
  std::string fn = object.type_name() + "." + std::string(name);
  if (name == "index" || name == "count") {
    args.check(fn, 1, {});
    if (args.positional.empty()) throw RuntimeError(fn + "() takes exactly one argument (0 given)");
    int64_t count = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!equals(items[i], args.positional[0])) continue;
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++count;
    }
    if (name == "index") throw RuntimeError(fmt::format("{} is not in list", args.positional[0].repr()));
    return Value(count);
  }
  if (name == "copy") return object;
  throw RuntimeError(fmt::format("'{}' object has no attribute '{}'", object.type_name(), name));
}

// ---------------------------------------------------------------- globals

Dict dict_from_arguments(const CallArgs& args, const char* function) {
  if (args.positional.size() > 1) {
    throw RuntimeError(fmt::format("{} expected at most 1 argument, got {}", function, args.positional.size()));
  }
  Dict dict;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      dict = source.as_dict();
    } else if (source.is_namespace()) {
      dict = source.as_namespace().attributes;
    } else {
      for (const auto& pair : iterate(source)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) throw RuntimeError("dictionary update sequence element has length != 2");
        dict.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keyword) dict.set(Value(key), value);
  return dict;
}

Value global_range(const CallArgs& args) {
  args.check("range", 3, {});
  if (args.positional.empty()) throw RuntimeError("range expected at least 1 argument, got 0");
  int64_t start = 0, stop, step = 1;
  if (args.positional.size() == 1) {
    stop = require_int(args.positional[0], "range stop");
  } else {
    start = require_int(args.positional[0], "range start");
    stop = require_int(args.positional[1], "range stop");
    if (args.positional.size() == 3) step = require_int(args.positional[2], "range step");
  }
  if (step == 0) throw RuntimeError("range() arg 3 must not be zero");
  // Computed in unsigned arithmetic: stop - start overflows int64 for extreme bounds.
  uint64_t count = 0;
  if (step > 0 && stop > start) {
    count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
  } else if (step < 0 && start > stop) {
    count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / (0 - static_cast<uint64_t>(step)) + 1;
  }
  // jinja2's sandbox caps ranges at MAX_RANGE (100000) items; so does max_range_items by default.
  int64_t max_items = current_limits().max_range_items;
  if (count > static_cast<uint64_t>(max_items)) {
    throw LimitExceeded(fmt::format("Range too big: range() of {} items would exceed {} items (limit max_range_items)",
                                    count, max_items));
  }
  std::vector<Value> items;
  items.reserve(count);
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) items.emplace_back(start + i * step);
  return Value::list(std::move(items));
}

Value global_strftime_now(const CallArgs& args) {
  args.check("strftime_now", 1, {});
  if (args.positional.empty()) throw RuntimeError("strftime_now() takes exactly one argument (0 given)");
  const std::string& format = require_string(args.positional[0], "strftime_now format");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  check_repeated_string_size(static_cast<int64_t>(format.size()) + 32, 8);
  std::string buffer(256 + format.size() * 8, '\0');
  size_t written = std::strftime(buffer.data(), buffer.size(), format.c_str(), &local);
  if (written == 0 && !format.empty()) throw RuntimeError("strftime_now: format produced no output or is too long");
  buffer.resize(written);
  return Value(buffer);
}

}  // namespace

// ---------------------------------------------------------------- public functions

Value get_attribute(const Value& object, std::string_view name) {
  if (object.is_undefined()) object.fail_undefined();
  if (has_method(object, name)) {
    Value bound_object = object;
    std::string method(name);
    return Value::callable(std::string(object.type_name()) + "." + method,
                           [bound_object, method](const CallArgs& args) {
                             return *call_method(bound_object, method, args);
                           });
  }
  if ((object.is_sequence() || object.is_dict() || object.is_string()) && contains_name(kMutatingMethods, name)) {
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, object.type_name()));
  }
  if (object.is_dict()) {
    if (const Value* found = object.as_dict().find_key(name)) return *found;
  } else if (object.is_namespace()) {
    if (const Value* found = object.as_namespace().attributes.find_key(name)) return *found;
  }
  return missing_attribute(object, Value(name));
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) object.fail_undefined();
  if ((object.is_sequence() || object.is_string()) && (key.is_int() || key.is_bool())) {
    if (object.is_sequence()) {
      const auto& items = object.items();
      int64_t index = normalize_index(key.to_int(), static_cast<int64_t>(items.size()));
      if (index >= 0) return items[index];
    } else if (is_ascii(object.as_string())) {
      const std::string& s = object.as_string();
      int64_t index = normalize_index(key.to_int(), static_cast<int64_t>(s.size()));
      if (index >= 0) return Value(s.substr(index, 1));
    } else {
      std::u32string cps = code_points(object.as_string());
      int64_t index = normalize_index(key.to_int(), static_cast<int64_t>(cps.size()));
      if (index >= 0) return Value(utf8(cps.substr(index, 1)));
    }
    return missing_attribute(object, key);
  }
  if (object.is_dict()) {
    if (const Value* found = object.as_dict().find(key)) return *found;
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return missing_attribute(object, key);
}

Value get_slice(const Value& object, const Value& start_value, const Value& stop_value, const Value& step_value) {
  if (object.is_undefined()) object.fail_undefined();
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.is_int() || v.is_bool()) return v.to_int();
    throw RuntimeError(fmt::format("slice indices must be integers or None, not {} ({})", v.type_name(), what));
  };
  std::optional<int64_t> start = bound(start_value, "start"), stop = bound(stop_value, "stop"),
                         step_opt = bound(step_value, "step");
  int64_t step = step_opt.value_or(1);
  if (step == 0) throw RuntimeError("slice step cannot be zero");
  auto indices = [&](int64_t size) {
    // CPython's PySlice_AdjustIndices.
    auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
      if (!v) return fallback;
      int64_t i = *v;
      if (i < 0) {
        i += size;
        if (i < 0) i = step < 0 ? -1 : 0;
      } else if (i >= size) {
        i = step < 0 ? size - 1 : size;
      }
      return i;
    };
    int64_t begin = adjust(start, step < 0 ? size - 1 : 0);
    int64_t end = adjust(stop, step < 0 ? -1 : size);
    std::vector<int64_t> picked;
    for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) picked.push_back(i);
    return picked;
  };
  if (object.is_string()) {
    std::u32string cps = code_points(object.as_string());
    std::u32string out;
    for (int64_t i : indices(static_cast<int64_t>(cps.size()))) out += cps[i];
    return Value(utf8(out));
  }
  if (object.is_sequence()) {
    const auto& items = object.items();
    std::vector<Value> out;
    for (int64_t i : indices(static_cast<int64_t>(items.size()))) out.push_back(items[i]);
    return object.as_sequence().is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  throw RuntimeError(fmt::format("'{}' object is not subscriptable", object.type_name()));
}

std::vector<Value> iterate(const Value& value) {
  if (value.is_undefined()) return {};
  if (value.is_sequence()) {
    charge_steps(static_cast<int64_t>(value.items().size()));
    return value.items();
  }
  if (value.is_dict()) {
    charge_steps(static_cast<int64_t>(value.as_dict().entries.size()));
    std::vector<Value> keys;
    keys.reserve(value.as_dict().entries.size());
    for (const auto& [key, item] : value.as_dict().entries) keys.push_back(key);
    return keys;
  }
  if (value.is_string()) {
    const std::string& s = value.as_string();
    size_t count = code_point_count(s);
    check_container_size("list", count, sizeof(Value));
    charge_steps(static_cast<int64_t>(count));
    std::vector<Value> chars;
    chars.reserve(count);
    for (size_t offset = 0; offset < s.size();) {
      size_t start = offset;
      unicode::decode_next(s, offset);
      chars.emplace_back(s.substr(start, offset - start));
    }
    return chars;
  }
  throw RuntimeError(fmt::format("'{}' object is not iterable", value.type_name()));
}

int64_t length(const Value& value) {
  if (value.is_undefined()) return 0;
  if (value.is_string()) return static_cast<int64_t>(code_point_count(value.as_string()));
  if (value.is_sequence()) return static_cast<int64_t>(value.items().size());
  if (value.is_dict()) return static_cast<int64_t>(value.as_dict().entries.size());
  throw RuntimeError(fmt::format("object of type '{}' has no len()", value.type_name()));
}

Value unary_minus(const Value& operand) {
  if (operand.is_undefined()) operand.fail_undefined();
  if (operand.is_float()) return Value(-operand.as_float());
  if (operand.is_int() || operand.is_bool()) {
    int64_t v = operand.to_int();
    if (v == INT64_MIN) checked(true, 0);
    return Value(-v);
  }
  throw RuntimeError(fmt::format("bad operand type for unary -: '{}'", operand.type_name()));
}

namespace {

// The concatenation of two strings, or of two lists' items, checked before it is built.
std::string concatenate(const std::string& a, const std::string& b) {
  check_string_size(a.size() + b.size());
  return a + b;
}

std::vector<Value> concatenate(const Sequence& a, const Sequence& b) {
  check_container_size(a.is_tuple ? "tuple" : "list", a.items.size() + b.items.size(), sizeof(Value));
  std::vector<Value> items;
  items.reserve(a.items.size() + b.items.size());
  items.insert(items.end(), a.items.begin(), a.items.end());
  items.insert(items.end(), b.items.begin(), b.items.end());
  return items;
}

}  // namespace

Value binary_operation(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") return Value(concatenate(a.str(), b.str()));
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  auto unsupported = [&]() -> RuntimeError {
    return RuntimeError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
  };
  if (a.is_number() && b.is_number()) {
    if (op == "/") {
      if (b.to_double() == 0.0) throw RuntimeError("division by zero");
      return Value(a.to_double() / b.to_double());
    }
    if (a.is_float() || b.is_float() || (op == "**" && b.to_int() < 0)) {
      double x = a.to_double(), y = b.to_double();
      if (op == "+") return Value(x + y);
      if (op == "-") return Value(x - y);
      if (op == "*") return Value(x * y);
      if (op == "**") {
        if (x == 0.0 && y < 0) throw RuntimeError("0.0 cannot be raised to a negative power");
        return Value(std::pow(x, y));
      }
      if (y == 0.0) throw RuntimeError(op == "//" ? "float floor division by zero" : "float modulo");
      // CPython's float_divmod.
      double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0.0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      if (op == "%") return Value(mod);
      double floor_div = std::copysign(0.0, x / y);
      if (div != 0.0) {
        floor_div = std::floor(div);
        if (div - floor_div > 0.5) floor_div += 1.0;
      }
      return Value(floor_div);
    }
    int64_t x = a.to_int(), y = b.to_int(), r = 0;
    if (op == "+" || op == "-" || op == "*") {
      bool overflow = op == "+" ? __builtin_add_overflow(x, y, &r)
                                : (op == "-" ? __builtin_sub_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r));
      return Value(checked(overflow, r));
    }
    if (op == "**") {
      int64_t result = 1;
      for (int64_t i = 0; i < y; ++i) {
        if (__builtin_mul_overflow(result, x, &result)) checked(true, 0);
        if (result == 0 || result == 1) break;
      }
      if (result == 1 && x == -1) result = (y % 2 == 0) ? 1 : -1;
      return Value(result);
    }
    if (y == 0) throw RuntimeError("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) checked(true, 0);
    int64_t quotient = x / y, remainder = x % y;
    if (remainder != 0 && ((remainder < 0) != (y < 0))) {
      --quotient;
      remainder += y;
    }
    return Value(op == "//" ? quotient : remainder);
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(concatenate(a.as_string(), b.as_string()));
    if (a.is_sequence() && b.is_sequence() && a.as_sequence().is_tuple == b.as_sequence().is_tuple) {
      std::vector<Value> items = concatenate(a.as_sequence(), b.as_sequence());
      return a.as_sequence().is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (a.is_string() || a.is_sequence()) {
      throw RuntimeError(fmt::format("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(), a.type_name()));
    }
    throw unsupported();
  }
  if (op == "*") {
    const Value* repeated = (a.is_string() || a.is_sequence()) ? &a : ((b.is_string() || b.is_sequence()) ? &b : nullptr);
    const Value* times = repeated == &a ? &b : &a;
    if (repeated && (times->is_int() || times->is_bool())) {
      int64_t n = std::max<int64_t>(0, times->to_int());
      if (repeated->is_string()) {
        const std::string& unit = repeated->as_string();
        if (unit.empty() || n == 0) return Value("");
        check_repeated_string_size(n, unit.size());
        size_t size = n * unit.size();
        std::string out;
        out.reserve(size);
        out = unit;
        while (out.size() * 2 <= size) out.append(out);  // doubling: a few big copies, not n small ones
        out.append(out, 0, size - out.size());
        return Value(std::move(out));
      }
      const Sequence& unit = repeated->as_sequence();
      uint64_t count = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(unit.items.empty() ? 0 : n), uint64_t{unit.items.size()}, &count)) {
        count = UINT64_MAX;
      }
      check_container_size(unit.is_tuple ? "tuple" : "list", count, sizeof(Value));
      std::vector<Value> items;
      items.reserve(count);
      for (int64_t i = 0; i < n && !unit.items.empty(); ++i) items.insert(items.end(), unit.items.begin(), unit.items.end());
      return unit.is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (repeated) throw RuntimeError(fmt::format("can't multiply sequence by non-int of type '{}'", times->type_name()));
    throw unsupported();
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  throw unsupported();
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      throw RuntimeError(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
    }
    charge_search(container.as_string().size(), item.as_string().size());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_sequence()) {
    for (const auto& element : container.items()) {
      if (equals(element, item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return container.as_dict().find(item) != nullptr;
  if (container.is_undefined()) return false;
  throw RuntimeError(fmt::format("argument of type '{}' is not iterable", container.type_name()));
}

std::optional<Value> call_method(const Value& object, std::string_view name, const CallArgs& args) {
  if (!has_method(object, name)) return std::nullopt;
  if (object.is_string()) return string_method(object.as_string(), name, args);
  if (object.is_dict()) return dict_method(object, name, args);
  return list_method(object, name, args);
}

bool has_filter(std::string_view name) { return filters().count(name) != 0; }
bool has_test(std::string_view name) { return tests().count(name) != 0; }

Value apply_filter(std::string_view name, const Value& input, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw RuntimeError(fmt::format("No filter named '{}'.", name));
  return it->second(input, args);
}

bool apply_test(std::string_view name, const Value& input, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw RuntimeError(fmt::format("No test named '{}'.", name));
  return it->second(input, args);
}

std::vector<std::pair<std::string, Value>> global_functions() {
  std::vector<std::pair<std::string, Value>> globals;
  globals.emplace_back("range", Value::callable("range", global_range));
  globals.emplace_back("dict", Value::callable("dict", [](const CallArgs& args) {
                         return Value::dict(dict_from_arguments(args, "dict"));
                       }));
  globals.emplace_back("namespace", Value::callable("namespace", [](const CallArgs& args) {
                         Dict attributes = dict_from_arguments(args, "namespace");
                         for (const auto& [key, value] : attributes.entries) {
                           if (key.is_string() && !key.as_string().empty() && key.as_string()[0] == '_') {
                             throw RuntimeError(fmt::format(
                                 "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'.",
                                 key.as_string()));
                           }
                         }
                         charge_container("namespace", attributes.entries.size() + 1, sizeof(attributes.entries[0]));
                         return Value(std::make_shared<Namespace>(Namespace{std::move(attributes)}));
                       }));
  globals.emplace_back("raise_exception", Value::callable("raise_exception", [](const CallArgs& args) -> Value {
                         args.check("raise_exception", 1, {"message"});
                         const Value* message = args.find(0, "message", "raise_exception");
                         throw TemplateException(message ? message->str() : "");
                       }));
  globals.emplace_back("strftime_now", Value::callable("strftime_now", global_strftime_now));
  return globals;
}

std::string to_json(const Value& value, const JsonOptions& options) {
  std::string out;
  append_json(out, value, options, 0);
  return out;
}

}  // namespace splitflow::jinja
