#include "chat/jinja_parser.h"

#include "core/error.h"

#include <initializer_list>
#include <string_view>

namespace splitflow::jinja {
namespace {

// Deeper nesting than this is refused rather than risking the C++ stack.
constexpr int kMaxNestingDepth = 200;

std::string describe(const Token& token) {
  switch (token.kind) {
    case TokenKind::Text: return "template data";
    case TokenKind::VariableBegin: return "begin of print statement";
    case TokenKind::VariableEnd: return "end of print statement";
    case TokenKind::BlockBegin: return "begin of statement block";
    case TokenKind::BlockEnd: return "end of statement block";
    case TokenKind::String: return "string";
    case TokenKind::Integer: return "integer";
    case TokenKind::Float: return "float";
    case TokenKind::End: return "end of template";
    case TokenKind::Name:
    case TokenKind::Operator: return token.text;
  }
  return token.text;
}

ExprPtr make_expr(Expr::Kind kind, Location location) {
  auto expr = std::make_unique<Expr>();
  expr->kind = kind;
  expr->location = location;
  return expr;
}

NodePtr make_node(Node::Kind kind, Location location) {
  auto node = std::make_unique<Node>();
  node->kind = kind;
  node->location = location;
  return node;
}

void note_macro_reads(Node& node);
bool body_reads_name(const Body& body, std::string_view name);

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Program run() {
    Program program;
    program.body = parse_body({});
    if (current().kind != TokenKind::End) fail_at(current(), "unexpected '" + describe(current()) + "'");
    return program;
  }

 private:
  // ---- token stream ----
  const Token& current() const { return tokens_[pos_]; }
  const Token& look(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& advance() {
    const Token& token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }
  bool at_name(std::string_view name) const {
    return current().kind == TokenKind::Name && current().text == name;
  }
  bool at_op(std::string_view op) const {
    return current().kind == TokenKind::Operator && current().text == op;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    advance();
    return true;
  }

  [[noreturn]] void fail_at(const Token& token, const std::string& message) const {
    fail("chat template syntax error at line {}, column {}: {}", token.location.line, token.location.column,
         message);
  }
  [[noreturn]] void fail_expected(const std::string& what) const {
    fail_at(current(), "expected " + what + ", got '" + describe(current()) + "'");
  }
  const Token& expect_op(std::string_view op) {
    if (!at_op(op)) fail_expected("token '" + std::string(op) + "'");
    return advance();
  }
  const Token& expect_name() {
    if (current().kind != TokenKind::Name) fail_expected("name");
    return advance();
  }
  void expect_name(std::string_view name) {
    if (!at_name(name)) fail_expected("token '" + std::string(name) + "'");
    advance();
  }
  void expect_block_end() {
    if (current().kind != TokenKind::BlockEnd) fail_expected("token 'end of statement block'");
    advance();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& parser) : parser(parser) {
      if (++parser.depth_ > kMaxNestingDepth) parser.fail_at(parser.current(), "template nested too deeply");
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // ---- statements ----

  // Parses until `{% <one of end_names>`, leaving the stream at that name (jinja2's subparse).
  Body parse_body(std::initializer_list<std::string_view> end_names) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& token = current();
      if (token.kind == TokenKind::End) {
        if (end_names.size() == 0) return body;
        std::string names;
        for (auto name : end_names) names += (names.empty() ? "'" : " or '") + std::string(name) + "'";
        fail_at(token, "unexpected end of template, expected " + names);
      }
      if (token.kind == TokenKind::Text) {
        auto node = make_node(Node::Kind::Text, token.location);
        node->text = token.text;
        body.push_back(std::move(node));
        advance();
      } else if (token.kind == TokenKind::VariableBegin) {
        auto node = make_node(Node::Kind::Output, token.location);
        advance();
        node->expr = parse_tuple(true, false);
        if (current().kind != TokenKind::VariableEnd) fail_expected("token 'end of print statement'");
        advance();
        body.push_back(std::move(node));
      } else if (token.kind == TokenKind::BlockBegin) {
        advance();
        for (auto name : end_names) {
          if (at_name(name)) return body;
        }
        parse_statement(body);
        expect_block_end();
      } else {
        fail_at(token, "unexpected '" + describe(token) + "'");
      }
    }
  }

  // `%}` then the body up to one of end_names; with drop_end the end name is consumed.
  Body parse_block_body(std::initializer_list<std::string_view> end_names, bool drop_end) {
    expect_block_end();
    Body body = parse_body(end_names);
    if (drop_end) advance();
    return body;
  }

  void parse_statement(Body& body) {
    const Token& token = current();
    if (token.kind != TokenKind::Name) fail_at(token, "tag name expected");
    const std::string& name = token.text;
    if (name == "if") return body.push_back(parse_if());
    if (name == "for") return body.push_back(parse_for());
    if (name == "set") return body.push_back(parse_set());
    if (name == "macro") return body.push_back(parse_macro());
    if (name == "call") return body.push_back(parse_call_block());
    if (name == "filter") return body.push_back(parse_filter_block());
    if (name == "with") return body.push_back(parse_with());
    if (name == "generation") return body.push_back(parse_generation());
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(token, "'" + name + "' outside of a loop");
      body.push_back(make_node(name == "break" ? Node::Kind::Break : Node::Kind::Continue, token.location));
      advance();
      return;
    }
    static const char* kUnsupported[] = {"include", "import", "from", "extends", "block", "do", "autoescape"};
    for (const char* tag : kUnsupported) {
      if (name == tag) fail_at(token, "the '" + name + "' tag is not supported in chat templates");
    }
    fail_at(token, "encountered unknown tag '" + name + "'");
  }

  NodePtr parse_if() {
    auto node = make_node(Node::Kind::If, advance().location);
    while (true) {
      node->conditions.push_back(parse_tuple(false, false));
      node->bodies.push_back(parse_block_body({"elif", "else", "endif"}, false));
      std::string end = advance().text;
      if (end == "elif") continue;
      if (end == "else") node->bodies.push_back(parse_block_body({"endif"}, true));
      return node;
    }
  }

  NodePtr parse_for() {
    auto node = make_node(Node::Kind::For, advance().location);
    node->target = parse_assign_target(false);
    expect_name("in");
    node->expr = parse_tuple(false, false, "recursive");
    if (skip_name("if")) node->condition = parse_expression(true);
    if (at_name("recursive")) fail_at(current(), "recursive for loops are not supported");
    ++loop_depth_;
    node->body = parse_block_body({"endfor", "else"}, false);
    --loop_depth_;
    node->for_reads_loop = body_reads_name(node->body, "loop");
    if (advance().text == "else") node->else_body = parse_block_body({"endfor"}, true);
    return node;
  }

  NodePtr parse_set() {
    Location location = advance().location;
    AssignTarget target = parse_assign_target(true);
    if (skip_op("=")) {
      auto node = make_node(Node::Kind::Set, location);
      node->target = std::move(target);
      node->expr = parse_tuple(true, false);
      return node;
    }
    auto node = make_node(Node::Kind::SetBlock, location);
    node->target = std::move(target);
    while (skip_op("|")) node->filters.push_back(parse_filter(nullptr));
    node->body = parse_block_body({"endset"}, true);
    return node;
  }

  NodePtr parse_macro() {
    auto node = make_node(Node::Kind::Macro, advance().location);
    node->text = expect_name().text;
    node->params = parse_signature();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    node->body = parse_block_body({"endmacro"}, true);
    loop_depth_ = saved_loop_depth;
    note_macro_reads(*node);
    return node;
  }

  NodePtr parse_call_block() {
    auto node = make_node(Node::Kind::CallBlock, advance().location);
    if (at_op("(")) node->params = parse_signature();
    node->expr = parse_expression(true);
    if (node->expr->kind != Expr::Kind::Call) fail_at(current(), "expected call");
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    node->body = parse_block_body({"endcall"}, true);
    loop_depth_ = saved_loop_depth;
    note_macro_reads(*node);
    return node;
  }

  NodePtr parse_filter_block() {
    auto node = make_node(Node::Kind::FilterBlock, advance().location);
    node->filters.push_back(parse_filter(nullptr));
    while (skip_op("|")) node->filters.push_back(parse_filter(nullptr));
    node->body = parse_block_body({"endfilter"}, true);
    return node;
  }

  NodePtr parse_with() {
    auto node = make_node(Node::Kind::With, advance().location);
    while (current().kind != TokenKind::BlockEnd) {
      if (!node->assignments.empty()) expect_op(",");
      std::string name = expect_name().text;
      expect_op("=");
      node->assignments.emplace_back(std::move(name), parse_expression(true));
    }
    node->body = parse_block_body({"endwith"}, true);
    return node;
  }

  // transformers' {% generation %} marks assistant text for token masks; it renders its body as
  // a call block does (a scope of its own).
  NodePtr parse_generation() {
    auto node = make_node(Node::Kind::With, advance().location);
    node->body = parse_block_body({"endgeneration"}, true);
    return node;
  }

  std::vector<MacroParam> parse_signature() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!at_op(")")) {
      if (!params.empty()) expect_op(",");
      if (at_op(")")) break;
      MacroParam param;
      param.name = expect_name().text;
      if (skip_op("=")) {
        param.default_value = parse_expression(true);
      } else if (!params.empty() && params.back().default_value) {
        fail_at(current(), "non-default argument follows default argument");
      }
      params.push_back(std::move(param));
    }
    advance();
    return params;
  }

  // A name, `ns.attr` (with_namespace), or names separated by commas, optionally parenthesized.
  AssignTarget parse_assign_target(bool with_namespace) {
    AssignTarget target;
    if (with_namespace && current().kind == TokenKind::Name && look().kind == TokenKind::Operator &&
        look().text == ".") {
      target.kind = AssignTarget::Kind::NamespaceAttr;
      target.name = advance().text;
      advance();
      target.attribute = expect_name().text;
      return target;
    }
    std::vector<AssignTarget> elements;
    bool is_tuple = false;
    while (true) {
      if (!elements.empty()) expect_op(",");
      if (at_name("in") || at_op("=") || at_op("|") || at_op(")") || current().kind == TokenKind::BlockEnd) break;
      if (skip_op("(")) {
        elements.push_back(parse_assign_target(false));
        expect_op(")");
      } else {
        const Token& name = current();
        if (name.kind != TokenKind::Name) fail_at(name, "can't assign to '" + describe(name) + "'");
        if (name.text == "true" || name.text == "false" || name.text == "none" || name.text == "True" ||
            name.text == "False" || name.text == "None") {
          fail_at(name, "can't assign to 'const'");
        }
        elements.push_back(AssignTarget{AssignTarget::Kind::Name, name.text, "", {}});
        advance();
      }
      if (!at_op(",")) break;
      is_tuple = true;
    }
    if (elements.empty()) fail_expected("assignment target");
    if (!is_tuple) return std::move(elements[0]);
    target.kind = AssignTarget::Kind::Tuple;
    target.elements = std::move(elements);
    return target;
  }

  // ---- expressions ----

  bool is_tuple_end(std::string_view extra_end_name) const {
    TokenKind kind = current().kind;
    if (kind == TokenKind::VariableEnd || kind == TokenKind::BlockEnd || at_op(")")) return true;
    return !extra_end_name.empty() && at_name(extra_end_name);
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parentheses, std::string_view extra_end_name = {}) {
    Location location = current().location;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end_name)) break;
      items.push_back(parse_expression(with_condexpr));
      if (at_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) fail_at(current(), "expected an expression, got '" + describe(current()) + "'");
    }
    auto tuple = make_expr(Expr::Kind::Tuple, location);
    tuple->children = std::move(items);
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      Location location = advance().location;
      auto conditional = make_expr(Expr::Kind::Conditional, location);
      conditional->children.push_back(parse_or());
      conditional->children.push_back(std::move(expr));
      conditional->children.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      expr = std::move(conditional);
    }
    return expr;
  }

  ExprPtr binary(const char* op, Location location, ExprPtr left, ExprPtr right) {
    auto node = make_expr(Expr::Kind::Binary, location);
    node->name = op;
    node->children.push_back(std::move(left));
    node->children.push_back(std::move(right));
    return node;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      Location location = advance().location;
      left = binary("or", location, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      Location location = advance().location;
      left = binary("and", location, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      DepthGuard guard(*this);
      auto node = make_expr(Expr::Kind::Unary, advance().location);
      node->name = "not";
      node->children.push_back(parse_not());
      return node;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    Location location = current().location;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      static const char* kCompareOps[] = {"==", "!=", "<", "<=", ">", ">="};
      std::string op;
      for (const char* candidate : kCompareOps) {
        if (at_op(candidate)) op = candidate;
      }
      if (!op.empty()) {
        advance();
      } else if (at_name("in")) {
        advance();
        op = "in";
      } else if (at_name("not") && look().kind == TokenKind::Name && look().text == "in") {
        advance();
        advance();
        op = "not in";
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto node = make_expr(Expr::Kind::Compare, location);
    node->children.push_back(std::move(first));
    for (auto& operand : operands) node->children.push_back(std::move(operand));
    node->ops = std::move(ops);
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& op = advance();
      left = binary(op.text == "+" ? "+" : "-", op.location, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      Location location = advance().location;
      left = binary("~", location, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& op = advance();
      static const char* kOps[] = {"*", "/", "//", "%"};
      const char* name = "*";
      for (const char* candidate : kOps) {
        if (op.text == candidate) name = candidate;
      }
      left = binary(name, op.location, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      Location location = advance().location;
      left = binary("**", location, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      const Token& op = advance();
      node = make_expr(Expr::Kind::Unary, op.location);
      node->name = op.text == "-" ? "-" : "+";
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    switch (token.kind) {
      case TokenKind::Name: {
        advance();
        auto node = make_expr(Expr::Kind::Literal, token.location);
        if (token.text == "true" || token.text == "True") {
          node->literal = Value(true);
        } else if (token.text == "false" || token.text == "False") {
          node->literal = Value(false);
        } else if (token.text == "none" || token.text == "None") {
          node->literal = Value(nullptr);
        } else {
          node->kind = Expr::Kind::Name;
          node->name = token.text;
        }
        return node;
      }
      case TokenKind::String: {
        auto node = make_expr(Expr::Kind::Literal, token.location);
        std::string text;
        while (current().kind == TokenKind::String) text += advance().text;  // adjacent literals join
        node->literal = Value(std::move(text));
        return node;
      }
      case TokenKind::Integer:
      case TokenKind::Float: {
        advance();
        auto node = make_expr(Expr::Kind::Literal, token.location);
        node->literal = token.kind == TokenKind::Integer ? Value(token.integer) : Value(token.number);
        return node;
      }
      case TokenKind::Operator:
        if (token.text == "(") {
          advance();
          ExprPtr node = parse_tuple(true, true);
          expect_op(")");
          return node;
        }
        if (token.text == "[") return parse_list();
        if (token.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail_at(token, "unexpected '" + describe(token) + "'");
  }

  ExprPtr parse_list() {
    auto node = make_expr(Expr::Kind::List, advance().location);
    while (!at_op("]")) {
      if (!node->children.empty()) expect_op(",");
      if (at_op("]")) break;
      node->children.push_back(parse_expression(true));
    }
    advance();
    return node;
  }

  ExprPtr parse_dict() {
    auto node = make_expr(Expr::Kind::Dict, advance().location);
    while (!at_op("}")) {
      if (!node->children.empty()) expect_op(",");
      if (at_op("}")) break;
      node->children.push_back(parse_expression(true));
      expect_op(":");
      node->children.push_back(parse_expression(true));
    }
    advance();
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (at_op(".") || at_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (at_op("|")) {
        advance();
        node = parse_filter(std::move(node));
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& token = advance();
    if (token.text == ".") {
      const Token& attribute = advance();
      if (attribute.kind == TokenKind::Name) {
        auto getattr = make_expr(Expr::Kind::GetAttr, token.location);
        getattr->name = attribute.text;
        getattr->children.push_back(std::move(node));
        return getattr;
      }
      if (attribute.kind != TokenKind::Integer) fail_at(attribute, "expected name or number");
      auto getitem = make_expr(Expr::Kind::GetItem, token.location);
      auto index = make_expr(Expr::Kind::Literal, attribute.location);
      index->literal = Value(attribute.integer);
      getitem->children.push_back(std::move(node));
      getitem->children.push_back(std::move(index));
      return getitem;
    }
    std::vector<ExprPtr> args;
    while (!at_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    advance();
    auto getitem = make_expr(Expr::Kind::GetItem, token.location);
    getitem->children.push_back(std::move(node));
    if (args.size() == 1) {
      getitem->children.push_back(std::move(args[0]));
    } else {
      auto tuple = make_expr(Expr::Kind::Tuple, token.location);
      tuple->children = std::move(args);
      getitem->children.push_back(std::move(tuple));
    }
    return getitem;
  }

  ExprPtr parse_subscribed() {
    Location location = current().location;
    ExprPtr start;
    if (!at_op(":")) {
      start = parse_expression(true);
      if (!at_op(":")) return start;
    }
    advance();
    auto slice = make_expr(Expr::Kind::Slice, location);
    slice->children.push_back(std::move(start));
    slice->children.push_back(at_op(":") || at_op("]") || at_op(",") ? nullptr : parse_expression(true));
    if (skip_op(":")) {
      slice->children.push_back(at_op("]") || at_op(",") ? nullptr : parse_expression(true));
    } else {
      slice->children.push_back(nullptr);
    }
    return slice;
  }

  void parse_call_args(Expr& node) {
    expect_op("(");
    bool first = true;
    while (!at_op(")")) {
      if (!first) {
        expect_op(",");
        if (at_op(")")) break;
      }
      first = false;
      if (at_op("*") || at_op("**")) fail_at(current(), "*args and **kwargs in calls are not supported");
      if (current().kind == TokenKind::Name && look().kind == TokenKind::Operator && look().text == "=") {
        std::string name = advance().text;
        advance();
        node.keywords.push_back(KeywordArg{std::move(name), parse_expression(true)});
      } else {
        if (!node.keywords.empty()) fail_at(current(), "positional argument follows keyword argument");
        node.children.push_back(parse_expression(true));
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto node = make_expr(Expr::Kind::Call, current().location);
    node->children.push_back(std::move(callee));
    parse_call_args(*node);
    return node;
  }

  // `name(.name)*` and optional arguments; the input (children[0]) is `input`, null for blocks.
  ExprPtr parse_filter(ExprPtr input) {
    const Token& name = expect_name();
    auto node = make_expr(Expr::Kind::Filter, name.location);
    node->name = name.text;
    while (at_op(".")) {
      advance();
      node->name += "." + expect_name().text;
    }
    node->children.push_back(std::move(input));
    if (at_op("(")) parse_call_args(*node);
    return node;
  }

  ExprPtr parse_test(ExprPtr input) {
    Location location = advance().location;  // 'is'
    bool negated = skip_name("not");
    const Token& name = expect_name();
    auto node = make_expr(Expr::Kind::Test, location);
    node->name = name.text;
    while (at_op(".")) {
      advance();
      node->name += "." + expect_name().text;
    }
    node->children.push_back(std::move(input));
    const Token& next = current();
    if (at_op("(")) {
      parse_call_args(*node);
    } else if ((next.kind == TokenKind::Name || next.kind == TokenKind::String || next.kind == TokenKind::Integer ||
                next.kind == TokenKind::Float || at_op("[") || at_op("{")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      if (at_name("is")) fail_at(next, "You cannot chain multiple tests with is");
      node->children.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return node;
    auto not_node = make_expr(Expr::Kind::Unary, location);
    not_node->name = "not";
    not_node->children.push_back(std::move(node));
    return not_node;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

bool expr_reads_name(const Expr* expr, std::string_view name) {
  if (!expr) return false;
  if (expr->kind == Expr::Kind::Name && expr->name == name) return true;
  for (const auto& child : expr->children) {
    if (expr_reads_name(child.get(), name)) return true;
  }
  for (const auto& keyword : expr->keywords) {
    if (expr_reads_name(keyword.value.get(), name)) return true;
  }
  return false;
}

// Whether anything in `body` (nested macros included, as jinja2's symbol analysis does) reads `name`.
bool body_reads_name(const Body& body, std::string_view name) {
  for (const auto& node : body) {
    const Node& n = *node;
    if (expr_reads_name(n.expr.get(), name) || expr_reads_name(n.condition.get(), name)) return true;
    for (const auto& e : n.filters) {
      if (expr_reads_name(e.get(), name)) return true;
    }
    for (const auto& e : n.conditions) {
      if (expr_reads_name(e.get(), name)) return true;
    }
    for (const auto& p : n.params) {
      if (expr_reads_name(p.default_value.get(), name)) return true;
    }
    for (const auto& [target, value] : n.assignments) {
      if (expr_reads_name(value.get(), name)) return true;
    }
    for (const auto& branch : n.bodies) {
      if (body_reads_name(branch, name)) return true;
    }
    if (body_reads_name(n.body, name) || body_reads_name(n.else_body, name)) return true;
  }
  return false;
}

void note_macro_reads(Node& node) {
  node.macro_reads_varargs = body_reads_name(node.body, "varargs");
  node.macro_reads_kwargs = body_reads_name(node.body, "kwargs");
  node.macro_reads_caller = body_reads_name(node.body, "caller");
}

bool mentions_content(const Expr* expr) {
  if (!expr) return false;
  if (expr->kind == Expr::Kind::GetAttr && expr->name == "content") return true;
  if (expr->kind == Expr::Kind::Name && expr->name == "content") return true;
  if (expr->kind == Expr::Kind::GetItem && expr->children[1]->kind == Expr::Kind::Literal &&
      expr->children[1]->literal.is_string() && expr->children[1]->literal.as_string() == "content") {
    return true;
  }
  for (const auto& child : expr->children) {
    if (mentions_content(child.get())) return true;
  }
  return false;
}

bool iterates_content(const Body& body) {
  for (const auto& node : body) {
    if (node->kind == Node::Kind::For && mentions_content(node->expr.get())) return true;
    if (iterates_content(node->body) || iterates_content(node->else_body)) return true;
    for (const auto& branch : node->bodies) {
      if (iterates_content(branch)) return true;
    }
  }
  return false;
}

}  // namespace

Program parse(const std::string& source) {
  Program program = Parser(tokenize(source)).run();
  program.iterates_message_content = iterates_content(program.body);
  return program;
}

}  // namespace splitflow::jinja
