// chat/jinja_ast.h — the parsed template: expression and statement nodes, as jinja2's parser
// builds them (jinja2/nodes.py), for the subset of Jinja that chat templates use.
#pragma once

#include "chat/jinja_lexer.h"
#include "chat/jinja_value.h"

#include <memory>
#include <string>
#include <vector>

namespace splitflow::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct KeywordArg {
  std::string name;
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    Literal,      // literal
    Name,         // name
    List,         // [children...]
    Tuple,        // (children...)
    Dict,         // {children[0]: children[1], ...} (keys and values interleaved)
    GetAttr,      // children[0].name
    GetItem,      // children[0][children[1]]
    Slice,        // start:stop:step as children[0..2]; each may be null
    Call,         // children[0](children[1..], keywords)
    Filter,       // children[0] | name(children[1..], keywords)
    Test,         // children[0] is name(children[1..], keywords)
    Unary,        // name ("-", "+", "not") children[0]
    Binary,       // children[0] name children[1] for + - * / // % ** ~ and or
    Compare,      // children[0] ops[0] children[1] ops[1] children[2] ... (chained like Python)
    Conditional,  // children[1] if children[0] else children[2] (children[2] may be null)
  };

  Kind kind;
  Location location;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<KeywordArg> keywords;
  std::vector<std::string> ops;  // Compare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

// A `set`/`for` target: a name, a tuple of names to unpack, or `ns.attr` on a namespace.
struct AssignTarget {
  enum class Kind { Name, Tuple, NamespaceAttr };
  Kind kind = Kind::Name;
  std::string name;                   // Name; NamespaceAttr: the namespace variable
  std::string attribute;              // NamespaceAttr
  std::vector<AssignTarget> elements; // Tuple
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Node {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // if/elif chain: conditions[i] guards bodies[i]; bodies has one more for else
    For,          // for target in expr [if filter] body [else else_body]
    Set,          // set target = expr
    SetBlock,     // set target [| filters] body endset: filters applied to the body's text
    Macro,        // macro name(params) body
    CallBlock,    // call[(params)] expr body: body becomes `caller` for the call
    FilterBlock,  // filter f body: filter expression applied to the body's text
    With,         // with name = expr, ... body (a new scope)
    Break,
    Continue,
  };

  Kind kind;
  Location location;
  std::string text;                  // Text; Macro name
  ExprPtr expr;                      // Output, For iterable, Set value, CallBlock call
  ExprPtr condition;                 // For: the `if` that filters the items
  std::vector<ExprPtr> filters;      // SetBlock, FilterBlock: Filter nodes without input
                                     // (children[0] null), applied in order to the body's text
  AssignTarget target;               // For, Set, SetBlock
  std::vector<ExprPtr> conditions;   // If
  std::vector<Body> bodies;          // If branches
  Body body;                         // For, SetBlock, Macro, CallBlock, FilterBlock, With
  Body else_body;                    // For
  std::vector<MacroParam> params;    // Macro, CallBlock (caller's params)
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // With
  // Macro, CallBlock: whether the body reads these names (then extra arguments are accepted).
  bool macro_reads_varargs = false;
  bool macro_reads_kwargs = false;
  bool macro_reads_caller = false;
  // For: whether the body reads `loop`; like jinja2, the loop object is only built then.
  bool for_reads_loop = false;
};

// A parsed template.
struct Program {
  Body body;
  // Whether some for loop iterates a `.content` / `['content']` value: the template then handles
  // OpenAI content-part lists itself (see ChatTemplate::render).
  bool iterates_message_content = false;
};

}  // namespace splitflow::jinja
