#include "chat/jinja_interpreter.h"

#include "chat/jinja_builtins.h"
#include "core/error.h"

#include <fmt/format.h>

#include <memory>
#include <unordered_map>

namespace splitflow::jinja {
namespace {

struct Scope {
  explicit Scope(std::shared_ptr<Scope> parent) : parent(std::move(parent)) {}

  const Value* lookup(const std::string& name) const {
    for (const Scope* scope = this; scope; scope = scope->parent.get()) {
      auto it = scope->vars.find(name);
      if (it != scope->vars.end()) return &it->second;
    }
    return nullptr;
  }

  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;
};
using ScopePtr = std::shared_ptr<Scope>;

[[noreturn]] void fail_located(Location location, const std::string& message) {
  fail("chat template error at line {}, column {}: {}", location.line, location.column, message);
}

// Runs `fn`, giving the failures of template code the template location: a runtime error becomes
// an Error, a reached limit a TemplateLimitError. The innermost location wins: neither is caught again.
template <typename Fn>
auto located(Location location, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const LimitExceeded& limit) {
    throw TemplateLimitError(
        fmt::format("chat template error at line {}, column {}: {}", location.line, location.column, limit.what()));
  } catch (const RuntimeError& error) {
    fail_located(location, error.what());
  }
}

// Text a render produces: the prompt itself, bounded by max_output_bytes, or the body of a macro,
// call, set or filter block, which becomes a value and is bounded by max_value_bytes.
struct RenderedText {
  explicit RenderedText(bool is_prompt) : is_prompt(is_prompt) {}

  void append(std::string_view piece) {
    size_t size = text.size() + piece.size();
    if (is_prompt) {
      check_output_size(size);
    } else {
      check_string_size(size);
    }
    text += piece;
  }

  std::string text;
  bool is_prompt;
};

std::string namespace_attribute_error(const std::string& name) {
  return fmt::format(
      "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'. Please rename the "
      "attribute.",
      name);
}

class Interpreter {
 public:
  explicit Interpreter(const TemplateLimits& limits) : budget_(limits) {}

  // A namespace can hold itself (`set ns.self = [ns]`) or a chain of millions of others: a cycle
  // that reference counting never frees, or a chain whose release would recurse that deep. The
  // render keeps every namespace it makes and empties them one by one at its end.
  ~Interpreter() {
    for (const auto& ns : namespaces_) ns->attributes.entries.clear();
  }

  std::string run(const Program& program, const std::vector<std::pair<std::string, Value>>& variables) {
    auto globals = std::make_shared<Scope>(nullptr);
    for (auto& [name, value] : global_functions()) globals->vars[name] = std::move(value);
    globals->vars["namespace"] = Value::callable(
        "namespace", [this, make_namespace = globals->vars["namespace"]](const CallArgs& args) {
          Value ns = make_namespace.as_callable().call(args);
          namespaces_.push_back(std::get<Value::NamespaceRef>(ns.storage()));
          return ns;
        });
    auto context = std::make_shared<Scope>(globals);
    for (const auto& [name, value] : variables) context->vars[name] = value;
    auto root = std::make_shared<Scope>(context);
    root_ = root;
    RenderedText out(/*is_prompt=*/true);
    exec(program.body, root, out);
    return std::move(out.text);
  }

 private:
  enum class Flow { Normal, Break, Continue };

  // ---- statements ----

  Flow exec(const Body& body, const ScopePtr& scope, RenderedText& out) {
    for (const auto& node : body) {
      Flow flow = exec_node(*node, scope, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  Flow exec_node(const Node& node, const ScopePtr& scope, RenderedText& out) {
    return located(node.location, [&] {
      budget_.add_steps(1);
      return exec_unlocated(node, scope, out);
    });
  }

  Flow exec_unlocated(const Node& node, const ScopePtr& scope, RenderedText& out) {
    switch (node.kind) {
      case Node::Kind::Text:
        out.append(node.text);
        return Flow::Normal;
      case Node::Kind::Output: {
        Value value = eval(*node.expr, scope);
        if (!value.is_undefined()) out.append(value.str());
        return Flow::Normal;
      }
      case Node::Kind::If:
        for (size_t i = 0; i < node.conditions.size(); ++i) {
          if (eval(*node.conditions[i], scope).truthy()) return exec(node.bodies[i], scope, out);
        }
        if (node.bodies.size() > node.conditions.size()) return exec(node.bodies.back(), scope, out);
        return Flow::Normal;
      case Node::Kind::For:
        return exec_for(node, scope, out);
      case Node::Kind::Set:
        assign(node.target, eval(*node.expr, scope), *scope);
        return Flow::Normal;
      case Node::Kind::SetBlock:
        assign(node.target, render_block(node, scope), *scope);
        return Flow::Normal;
      case Node::Kind::FilterBlock:
        out.append(render_block(node, scope).str());
        return Flow::Normal;
      case Node::Kind::Macro:
        scope->vars[node.text] = make_callable(node.text, node, scope);
        return Flow::Normal;
      case Node::Kind::CallBlock: {
        const Expr& call = *node.expr;
        CallArgs args = eval_args(call, scope);
        args.keyword.emplace_back("caller", make_callable("caller", node, scope));
        Value result = call_value(eval(*call.children[0], scope), args);
        out.append(result.str());
        return Flow::Normal;
      }
      case Node::Kind::With: {
        auto inner = std::make_shared<Scope>(scope);
        for (const auto& [name, value] : node.assignments) inner->vars[name] = eval(*value, scope);
        return exec(node.body, inner, out);
      }
      case Node::Kind::Break:
        return Flow::Break;
      case Node::Kind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  Flow exec_for(const Node& node, const ScopePtr& scope, RenderedText& out) {
    Value iterable = eval(*node.expr, scope);
    std::vector<Value> items = located(node.expr->location, [&] { return iterate(iterable); });
    if (node.condition) {
      std::vector<Value> kept;
      for (auto& item : items) {
        budget_.add_steps(1);
        auto filter_scope = std::make_shared<Scope>(scope);
        assign(node.target, item, *filter_scope);
        if (eval(*node.condition, filter_scope).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      budget_.add_steps(1);
      auto iteration = std::make_shared<Scope>(scope);
      assign(node.target, items[i], *iteration);
      if (node.for_reads_loop) iteration->vars["loop"] = loop_object(items, i);
      if (exec(node.body, iteration, out) == Flow::Break) break;
    }
    if (items.empty() && !node.else_body.empty()) return exec(node.else_body, std::make_shared<Scope>(scope), out);
    return Flow::Normal;
  }

  // jinja2's LoopContext as a dict (index, index0, ..., previtem, nextitem, cycle).
  static Value loop_object(const std::vector<Value>& items, size_t i) {
    static const Value kKeys[] = {Value("index"),     Value("index0"), Value("revindex"), Value("revindex0"),
                                  Value("first"),     Value("last"),   Value("length"),   Value("depth"),
                                  Value("depth0"),    Value("previtem"), Value("nextitem"), Value("cycle")};
    auto n = static_cast<int64_t>(items.size());
    auto index = static_cast<int64_t>(i);
    Dict loop;
    loop.entries.reserve(std::size(kKeys));
    auto add = [&](size_t key, Value value) { loop.entries.emplace_back(kKeys[key], std::move(value)); };
    add(0, Value(index + 1));
    add(1, Value(index));
    add(2, Value(n - index));
    add(3, Value(n - index - 1));
    add(4, Value(index == 0));
    add(5, Value(index == n - 1));
    add(6, Value(n));
    add(7, Value(1));
    add(8, Value(0));
    add(9, index > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    add(10, index + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    add(11, Value::callable("loop.cycle", [index](const CallArgs& args) {
          if (args.positional.empty()) throw RuntimeError("no items for cycling given");
          return args.positional[static_cast<size_t>(index) % args.positional.size()];
        }));
    return Value::dict(std::move(loop));
  }

  // Takes the value by value: a `set` moves its result into place instead of copying its string.
  void assign(const AssignTarget& target, Value value, Scope& scope) {
    switch (target.kind) {
      case AssignTarget::Kind::Name:
        scope.vars[target.name] = std::move(value);
        return;
      case AssignTarget::Kind::Tuple: {
        std::vector<Value> items = iterate(value);
        if (items.size() < target.elements.size()) {
          throw RuntimeError(fmt::format("not enough values to unpack (expected {}, got {})", target.elements.size(),
                                         items.size()));
        }
        if (items.size() > target.elements.size()) {
          throw RuntimeError(fmt::format("too many values to unpack (expected {})", target.elements.size()));
        }
        for (size_t i = 0; i < items.size(); ++i) assign(target.elements[i], std::move(items[i]), scope);
        return;
      }
      case AssignTarget::Kind::NamespaceAttr: {
        const Value* ns = scope.lookup(target.name);
        if (!ns || !ns->is_namespace()) throw RuntimeError("cannot assign attribute on non-namespace object");
        if (!target.attribute.empty() && target.attribute[0] == '_') {
          throw RuntimeError(namespace_attribute_error(target.attribute));
        }
        ns->as_namespace().attributes.set(Value(target.attribute), std::move(value));
        return;
      }
    }
  }

  // SetBlock / FilterBlock: the body's text in a scope of its own, through the filters.
  Value render_block(const Node& node, const ScopePtr& scope) {
    RenderedText text(/*is_prompt=*/false);
    exec(node.body, std::make_shared<Scope>(scope), text);
    Value value(std::move(text.text));
    for (const auto& filter : node.filters) value = apply_filter_node(*filter, value, scope);
    return value;
  }

  // A macro (node.params, node.body) or a call block's caller, closing over the defining scope.
  // The closure is weak: a namespace that stores the macro must not keep its scope alive.
  Value make_callable(const std::string& name, const Node& node, const ScopePtr& scope) {
    std::weak_ptr<Scope> closure = scope;
    return Value::callable(name, [this, name, &node, closure](const CallArgs& args) {
      return call_macro(name, node, closure.lock(), args);
    });
  }

  Value call_macro(const std::string& name, const Node& node, ScopePtr closure, const CallArgs& args) {
    int max_depth = budget_.limits().max_call_depth;
    if (call_depth_ >= max_depth) {
      throw LimitExceeded(fmt::format(
          "maximum recursion depth exceeded calling '{}': more than {} nested calls (limit max_call_depth)", name,
          max_depth));
    }
    struct DepthGuard {
      int& depth;
      explicit DepthGuard(int& d) : depth(++d) {}
      ~DepthGuard() { --depth; }
    } guard(call_depth_);
    auto scope = std::make_shared<Scope>(closure ? closure : root_.lock());
    std::vector<bool> bound(node.params.size(), false);
    std::vector<Value> varargs;
    Dict kwargs;
    // Like jinja2, extra arguments are an error unless the body reads varargs / kwargs / caller.
    if (args.positional.size() > node.params.size() && !node.macro_reads_varargs) {
      throw RuntimeError(fmt::format("macro '{}' takes not more than {} argument(s)", name, node.params.size()));
    }
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < node.params.size()) {
        scope->vars[node.params[i].name] = args.positional[i];
        bound[i] = true;
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    for (const auto& [key, value] : args.keyword) {
      if (key == "caller" && node.macro_reads_caller) {
        scope->vars["caller"] = value;
        continue;
      }
      bool matched = false;
      for (size_t i = 0; i < node.params.size(); ++i) {
        if (node.params[i].name != key) continue;
        if (bound[i]) throw RuntimeError(fmt::format("macro '{}' got multiple values for argument '{}'", name, key));
        scope->vars[key] = value;
        bound[i] = matched = true;
      }
      if (!matched) {
        if (!node.macro_reads_kwargs) throw RuntimeError(fmt::format("macro '{}' takes no keyword argument '{}'", name, key));
        kwargs.set(Value(key), value);
      }
    }
    for (size_t i = 0; i < node.params.size(); ++i) {
      if (bound[i]) continue;
      const MacroParam& param = node.params[i];
      scope->vars[param.name] = param.default_value
                                    ? eval(*param.default_value, scope)
                                    : Value::undefined(fmt::format("parameter '{}' was not provided", param.name));
    }
    scope->vars["varargs"] = Value::tuple(std::move(varargs));
    scope->vars["kwargs"] = Value::dict(std::move(kwargs));
    RenderedText out(/*is_prompt=*/false);
    exec(node.body, scope, out);
    return Value(std::move(out.text));
  }

  // ---- expressions ----

  Value eval(const Expr& expr, const ScopePtr& scope) {
    return located(expr.location, [&] {
      budget_.add_steps(1);
      return eval_unlocated(expr, scope);
    });
  }

  CallArgs eval_args(const Expr& expr, const ScopePtr& scope) {
    CallArgs args;
    for (size_t i = 1; i < expr.children.size(); ++i) args.positional.push_back(eval(*expr.children[i], scope));
    for (const auto& keyword : expr.keywords) args.keyword.emplace_back(keyword.name, eval(*keyword.value, scope));
    return args;
  }

  static Value call_value(const Value& function, const CallArgs& args) {
    if (function.is_undefined()) function.fail_undefined();
    if (!function.is_callable()) throw RuntimeError(fmt::format("'{}' object is not callable", function.type_name()));
    return function.as_callable().call(args);
  }

  Value apply_filter_node(const Expr& filter, const Value& input, const ScopePtr& scope) {
    CallArgs args = eval_args(filter, scope);
    return located(filter.location, [&] { return apply_filter(filter.name, input, args); });
  }

  Value optional_value(const ExprPtr& expr, const ScopePtr& scope) {
    return expr ? eval(*expr, scope) : Value(nullptr);
  }

  Value eval_unlocated(const Expr& expr, const ScopePtr& scope) {
    switch (expr.kind) {
      case Expr::Kind::Literal:
        return expr.literal;
      case Expr::Kind::Name: {
        const Value* found = scope->lookup(expr.name);
        return found ? *found : Value::undefined(fmt::format("'{}' is undefined", expr.name));
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        std::vector<Value> items;
        items.reserve(expr.children.size());
        for (const auto& child : expr.children) items.push_back(eval(*child, scope));
        return expr.kind == Expr::Kind::List ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case Expr::Kind::Dict: {
        Dict dict;
        for (size_t i = 0; i + 1 < expr.children.size(); i += 2) {
          Value key = eval(*expr.children[i], scope);
          dict.set(std::move(key), eval(*expr.children[i + 1], scope));
        }
        return Value::dict(std::move(dict));
      }
      case Expr::Kind::GetAttr:
        return get_attribute(eval(*expr.children[0], scope), expr.name);
      case Expr::Kind::GetItem: {
        Value object = eval(*expr.children[0], scope);
        const Expr& key = *expr.children[1];
        if (key.kind == Expr::Kind::Slice) {
          return get_slice(object, optional_value(key.children[0], scope), optional_value(key.children[1], scope),
                           optional_value(key.children[2], scope));
        }
        return get_item(object, eval(key, scope));
      }
      case Expr::Kind::Slice:
        throw RuntimeError("a slice is only valid inside []");
      case Expr::Kind::Call: {
        const Expr& callee = *expr.children[0];
        if (callee.kind == Expr::Kind::GetAttr) {
          Value object = eval(*callee.children[0], scope);
          CallArgs args = eval_args(expr, scope);
          if (auto result = call_method(object, callee.name, args)) return *result;
          return call_value(get_attribute(object, callee.name), args);
        }
        Value function = eval(callee, scope);
        return call_value(function, eval_args(expr, scope));
      }
      case Expr::Kind::Filter:
        return apply_filter_node(expr, eval(*expr.children[0], scope), scope);
      case Expr::Kind::Test: {
        Value input = eval(*expr.children[0], scope);
        return Value(apply_test(expr.name, input, eval_args(expr, scope)));
      }
      case Expr::Kind::Unary: {
        Value operand = eval(*expr.children[0], scope);
        if (expr.name == "not") return Value(!operand.truthy());
        if (expr.name == "-") return unary_minus(operand);
        if (operand.is_undefined()) operand.fail_undefined();
        if (!operand.is_number()) throw RuntimeError(fmt::format("bad operand type for unary +: '{}'", operand.type_name()));
        return operand.is_bool() ? Value(operand.to_int()) : operand;
      }
      case Expr::Kind::Binary: {
        Value left = eval(*expr.children[0], scope);
        if (expr.name == "and") return left.truthy() ? eval(*expr.children[1], scope) : left;
        if (expr.name == "or") return left.truthy() ? left : eval(*expr.children[1], scope);
        return binary_operation(expr.name, left, eval(*expr.children[1], scope));
      }
      case Expr::Kind::Compare: {
        Value left = eval(*expr.children[0], scope);
        for (size_t i = 0; i < expr.ops.size(); ++i) {
          Value right = eval(*expr.children[i + 1], scope);
          if (!compare_values(expr.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::Conditional:
        if (eval(*expr.children[0], scope).truthy()) return eval(*expr.children[1], scope);
        if (expr.children[2]) return eval(*expr.children[2], scope);
        return Value::undefined(fmt::format(
            "the inline if-expression on line {} evaluated to false and no else section was defined.",
            expr.location.line));
    }
    return Value();
  }

  static bool compare_values(const std::string& op, const Value& left, const Value& right) {
    if (op == "==") return equals(left, right);
    if (op == "!=") return !equals(left, right);
    if (op == "in") return contains(right, left);
    if (op == "not in") return !contains(right, left);
    int c = compare(left, right, op);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  RenderBudget budget_;  // first: the thread's budget while everything below is built and released
  std::weak_ptr<Scope> root_;
  int call_depth_ = 0;
  std::vector<Value::NamespaceRef> namespaces_;
};

void check_expr(const Expr* expr) {
  if (!expr) return;
  if (expr->kind == Expr::Kind::Filter && !has_filter(expr->name)) {
    fail("chat template syntax error at line {}, column {}: No filter named '{}'.", expr->location.line,
         expr->location.column, expr->name);
  }
  if (expr->kind == Expr::Kind::Test && !has_test(expr->name)) {
    fail("chat template syntax error at line {}, column {}: No test named '{}'.", expr->location.line,
         expr->location.column, expr->name);
  }
  for (const auto& child : expr->children) check_expr(child.get());
  for (const auto& keyword : expr->keywords) check_expr(keyword.value.get());
}

void check_body(const Body& body) {
  for (const auto& node : body) {
    check_expr(node->expr.get());
    check_expr(node->condition.get());
    for (const auto& filter : node->filters) check_expr(filter.get());
    for (const auto& condition : node->conditions) check_expr(condition.get());
    for (const auto& param : node->params) check_expr(param.default_value.get());
    for (const auto& [name, value] : node->assignments) check_expr(value.get());
    for (const auto& branch : node->bodies) check_body(branch);
    check_body(node->body);
    check_body(node->else_body);
  }
}

}  // namespace

std::string render(const Program& program, const std::vector<std::pair<std::string, Value>>& variables,
                   const TemplateLimits& limits) {
  try {
    return Interpreter(limits).run(program, variables);
  } catch (const TemplateException& raised) {
    throw Error(raised.what());
  } catch (const LimitExceeded& limit) {
    throw TemplateLimitError(std::string("chat template error: ") + limit.what());
  } catch (const RuntimeError& error) {
    throw Error(std::string("chat template error: ") + error.what());
  }
}

void check_filters_and_tests(const Program& program) { check_body(program.body); }

}  // namespace splitflow::jinja
