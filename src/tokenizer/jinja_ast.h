// The syntax tree of a parsed template: expressions and statements, each with its source location.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct LiteralExpr {
  Value value;
};
struct NameExpr {
  std::string name;
};
struct ListExpr {
  std::vector<ExprPtr> items;
  bool is_tuple = false;
};
struct DictExpr {
  std::vector<std::pair<ExprPtr, ExprPtr>> entries;
};
struct AttributeExpr {
  ExprPtr object;
  std::string name;
};
struct SubscriptExpr {
  ExprPtr object;
  ExprPtr index;
};
struct SliceExpr {
  ExprPtr object;
  ExprPtr start, stop, step;  // each may be null
};
struct KeywordArgument {
  std::string name;
  ExprPtr value;
};
struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<KeywordArgument> keyword;
  ExprPtr star_args;    // *list
  ExprPtr star_kwargs;  // **dict
};
struct CallExpr {
  ExprPtr callee;
  Arguments arguments;
};
// `operand|name(args)`; a filter block's filters have no operand.
struct FilterExpr {
  ExprPtr operand;
  std::string name;
  Arguments arguments;
};
struct TestExpr {
  ExprPtr operand;
  std::string name;
  Arguments arguments;
  bool negated = false;
};
enum class UnaryOp { kNot, kNegate, kPlus };
struct UnaryExpr {
  UnaryOp op;
  ExprPtr operand;
};
enum class BinaryOp {
  kAnd,
  kOr,
  kAdd,
  kSubtract,
  kMultiply,
  kDivide,
  kFloorDivide,
  kModulo,
  kPower,
  kConcat
};
struct BinaryExpr {
  BinaryOp op;
  ExprPtr left, right;
};
// Python's chained comparison: `a < b <= c`.
struct CompareExpr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // operator ("==", "in", "not in", ...) and operand
};
struct ConditionalExpr {
  ExprPtr condition, then_value, else_value;  // else_value may be null (gives Undefined)
};

struct Expr {
  SourceLocation where;
  std::variant<LiteralExpr, NameExpr, ListExpr, DictExpr, AttributeExpr, SubscriptExpr, SliceExpr, CallExpr,
               FilterExpr, TestExpr, UnaryExpr, BinaryExpr, CompareExpr, ConditionalExpr>
      node;
};

struct Stmt;
using Body = std::vector<Stmt>;

struct TextStmt {
  std::string text;
};
struct OutputStmt {
  ExprPtr value;
};
struct IfStmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if and elif
  Body else_body;
};
struct ForStmt {
  std::vector<std::string> targets;  // one name, or several to unpack
  ExprPtr iterable;
  ExprPtr filter;  // `for x in y if cond`; may be null
  Body body;
  Body else_body;
};
// `set name = v`, `set a, b = v`, `set ns.attr = v`; `attribute` is set for the namespace form.
struct AssignTarget {
  std::vector<std::string> names;
  std::optional<std::string> attribute;
};
struct SetStmt {
  AssignTarget target;
  ExprPtr value;
};
struct SetBlockStmt {
  AssignTarget target;
  std::vector<ExprPtr> filters;  // FilterExpr without operand
  Body body;
};
struct MacroParameter {
  std::string name;
  ExprPtr default_value;  // may be null
};
struct MacroStmt {
  std::string name;
  std::vector<MacroParameter> parameters;
  std::shared_ptr<const Body> body;  // shared with the macro values that call it
};
struct FilterBlockStmt {
  std::vector<ExprPtr> filters;
  Body body;
};
struct WithStmt {
  std::vector<std::pair<AssignTarget, ExprPtr>> assignments;
  Body body;
};
// HF's `{% generation %}` marks assistant text for masks; rendering just outputs the body.
struct GenerationStmt {
  Body body;
};
struct BreakStmt {};
struct ContinueStmt {};

struct Stmt {
  SourceLocation where;
  std::variant<TextStmt, OutputStmt, IfStmt, ForStmt, SetStmt, SetBlockStmt, MacroStmt, FilterBlockStmt,
               WithStmt, GenerationStmt, BreakStmt, ContinueStmt>
      node;
};

}  // namespace qspec::jinja
