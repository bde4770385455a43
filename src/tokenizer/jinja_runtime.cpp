#include "tokenizer/jinja_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_operators.h"

namespace qspec::jinja {

namespace {

// jinja2's scoping: the template, each for-loop iteration, each macro call and each block-set body get a
// scope; `set` writes to the innermost one and lookups walk outwards.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}

  const Value* find(std::string_view name) const {
    for (const Scope* scope = this; scope != nullptr; scope = scope->parent_.get()) {
      for (const auto& [variable, value] : scope->variables_) {
        if (variable == name) return &value;
      }
    }
    return nullptr;
  }

  void set(const std::string& name, Value value) {
    for (auto& [variable, existing] : variables_) {
      if (variable == name) {
        existing = std::move(value);
        return;
      }
    }
    variables_.emplace_back(name, std::move(value));
  }

 private:
  std::shared_ptr<Scope> parent_;
  std::vector<std::pair<std::string, Value>> variables_;
};

using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

std::string describe(const Expr& expr) {
  struct Describer {
    std::string operator()(const LiteralExpr&) const { return "literal"; }
    std::string operator()(const NameExpr& node) const { return fmt::format("'{}'", node.name); }
    std::string operator()(const ListExpr& node) const { return node.is_tuple ? "tuple" : "list"; }
    std::string operator()(const DictExpr&) const { return "dict literal"; }
    std::string operator()(const AttributeExpr& node) const {
      return fmt::format("attribute '.{}'", node.name);
    }
    std::string operator()(const SubscriptExpr&) const { return "subscript"; }
    std::string operator()(const SliceExpr&) const { return "slice"; }
    std::string operator()(const CallExpr& node) const {
      if (const auto* name = std::get_if<NameExpr>(&node.callee->node)) return name->name + "()";
      if (const auto* attribute = std::get_if<AttributeExpr>(&node.callee->node))
        return "." + attribute->name + "()";
      return "call";
    }
    std::string operator()(const FilterExpr& node) const { return fmt::format("filter '{}'", node.name); }
    std::string operator()(const TestExpr& node) const { return fmt::format("test '{}'", node.name); }
    std::string operator()(const UnaryExpr& node) const {
      return node.op == UnaryOp::kNot ? "'not'" : (node.op == UnaryOp::kNegate ? "unary '-'" : "unary '+'");
    }
    std::string operator()(const BinaryExpr& node) const {
      return fmt::format("'{}' operator", operator_symbol(node.op));
    }
    std::string operator()(const CompareExpr&) const { return "comparison"; }
    std::string operator()(const ConditionalExpr&) const { return "conditional expression"; }
  };
  return std::visit(Describer{}, expr.node);
}

std::string describe(const Stmt& stmt) {
  struct Describer {
    std::string operator()(const TextStmt&) const { return "text"; }
    std::string operator()(const OutputStmt&) const { return "'{{ }}'"; }
    std::string operator()(const IfStmt&) const { return "'{% if %}'"; }
    std::string operator()(const ForStmt&) const { return "'{% for %}'"; }
    std::string operator()(const SetStmt&) const { return "'{% set %}'"; }
    std::string operator()(const SetBlockStmt&) const { return "'{% set %}' block"; }
    std::string operator()(const MacroStmt& node) const { return fmt::format("macro '{}'", node.name); }
    std::string operator()(const FilterBlockStmt&) const { return "'{% filter %}'"; }
    std::string operator()(const WithStmt&) const { return "'{% with %}'"; }
    std::string operator()(const GenerationStmt&) const { return "'{% generation %}'"; }
    std::string operator()(const BreakStmt&) const { return "'{% break %}'"; }
    std::string operator()(const ContinueStmt&) const { return "'{% continue %}'"; }
  };
  return std::visit(Describer{}, stmt.node);
}

// Counts one level of macro nesting while alive.
class NestedCall {
 public:
  explicit NestedCall(int& depth) : depth_(depth) { ++depth_; }
  ~NestedCall() { --depth_; }
  NestedCall(const NestedCall&) = delete;
  NestedCall& operator=(const NestedCall&) = delete;

 private:
  int& depth_;
};

class Interpreter {
 public:
  Interpreter(std::string_view name, const RenderLimits& limits) : name_(name), limits_(limits) {}

  std::string run(const Body& body, const std::vector<std::pair<std::string, Value>>& variables) {
    auto root = std::make_shared<Scope>(nullptr);
    for (const auto& [variable, value] : variables) root->set(variable, value);
    std::string out;
    execute_body(body, root, out);
    return out;
  }

 private:
  [[noreturn]] void fail_at(SourceLocation where, std::string_view construct,
                            std::string_view message) const {
    fail("{}:{}:{}: {}: {}", name_, where.line, where.column, construct, message);
  }

  void append(std::string& out, std::string_view text) const {
    if (out.size() + text.size() > limits_.max_output_bytes) {
      throw ValueError(fmt::format("output would exceed {} bytes", limits_.max_output_bytes));
    }
    out += text;
  }

  // ---- statements ----

  Flow execute_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const Stmt& stmt : body) {
      Flow flow = execute(stmt, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow execute(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    try {
      return std::visit([&](const auto& node) { return exec(node, scope, out); }, stmt.node);
    } catch (const ValueError& error) {
      fail_at(stmt.where, describe(stmt), error.what());
    }
  }

  Flow exec(const TextStmt& node, const ScopePtr&, std::string& out) {
    append(out, node.text);
    return Flow::kNormal;
  }

  Flow exec(const OutputStmt& node, const ScopePtr& scope, std::string& out) {
    append(out, evaluate(*node.value, scope).str());
    return Flow::kNormal;
  }

  Flow exec(const IfStmt& node, const ScopePtr& scope, std::string& out) {
    for (const auto& [condition, body] : node.branches) {
      if (evaluate(*condition, scope).truthy()) return execute_body(body, scope, out);
    }
    return execute_body(node.else_body, scope, out);
  }

  void bind_targets(const std::vector<std::string>& names, const Value& value, Scope& scope) {
    if (names.size() == 1) {
      scope.set(names[0], value);
      return;
    }
    std::vector<Value> parts = iterate(value);
    if (parts.size() != names.size()) {
      throw ValueError(
          parts.size() > names.size()
              ? fmt::format("too many values to unpack (expected {})", names.size())
              : fmt::format("not enough values to unpack (expected {}, got {})", names.size(), parts.size()));
    }
    for (size_t i = 0; i < names.size(); ++i) scope.set(names[i], parts[i]);
  }

  static Value make_loop(const std::vector<Value>& items, size_t index) {
    auto count = static_cast<int64_t>(items.size());
    auto i = static_cast<int64_t>(index);
    std::vector<std::pair<Value, Value>> entries = {
        {Value("index"), Value(i + 1)},        {Value("index0"), Value(i)},
        {Value("revindex"), Value(count - i)}, {Value("revindex0"), Value(count - i - 1)},
        {Value("first"), Value(i == 0)},       {Value("last"), Value(i == count - 1)},
        {Value("length"), Value(count)},       {Value("depth"), Value(1)},
        {Value("depth0"), Value(0)},
    };
    if (index > 0) entries.emplace_back(Value("previtem"), items[index - 1]);
    if (index + 1 < items.size()) entries.emplace_back(Value("nextitem"), items[index + 1]);
    entries.emplace_back(Value("cycle"), make_function("cycle", [index](CallArguments& args) {
                           if (args.positional.empty()) throw ValueError("no items for cycling given");
                           return args.positional[index % args.positional.size()];
                         }));
    return Value::dict(std::move(entries));
  }

  Flow exec(const ForStmt& node, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(evaluate(*node.iterable, scope));
    if (node.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        count_iteration();
        auto filter_scope = std::make_shared<Scope>(scope);
        bind_targets(node.targets, item, *filter_scope);
        if (evaluate(*node.filter, filter_scope).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      count_iteration();
      auto body_scope = std::make_shared<Scope>(scope);
      bind_targets(node.targets, items[i], *body_scope);
      body_scope->set("loop", make_loop(items, i));
      if (execute_body(node.body, body_scope, out) == Flow::kBreak) break;
    }
    if (items.empty()) execute_body(node.else_body, std::make_shared<Scope>(scope), out);
    return Flow::kNormal;
  }

  void count_iteration() {
    if (++iterations_ > limits_.max_loop_iterations) {
      throw ValueError(
          fmt::format("more than {} loop iterations in one render", limits_.max_loop_iterations));
    }
  }

  void assign(const AssignTarget& target, const Value& value, const ScopePtr& scope) {
    if (target.attribute) {
      const Value* object = scope->find(target.names[0]);
      if (object == nullptr || !object->is_namespace()) {
        throw ValueError(
            fmt::format("cannot assign attribute on non-namespace object '{}'", target.names[0]));
      }
      if (value.holds_reference())
        throw ValueError("a namespace attribute cannot hold a namespace or a function");
      object->as_namespace().set(*target.attribute, value);
      return;
    }
    bind_targets(target.names, value, *scope);
  }

  Flow exec(const SetStmt& node, const ScopePtr& scope, std::string&) {
    assign(node.target, evaluate(*node.value, scope), scope);
    return Flow::kNormal;
  }

  Value apply_filters(const std::vector<ExprPtr>& filters, Value input, const ScopePtr& scope) {
    for (const ExprPtr& expr : filters) {
      const auto& filter = std::get<FilterExpr>(expr->node);
      try {
        CallArguments args = evaluate_arguments(filter.arguments, scope);
        input = apply_filter(filter.name, input, args);
      } catch (const ValueError& error) {
        fail_at(expr->where, describe(*expr), error.what());
      }
    }
    return input;
  }

  std::string render_block(const Body& body, const ScopePtr& scope) {
    std::string text;
    execute_body(body, std::make_shared<Scope>(scope), text);
    return text;
  }

  Flow exec(const SetBlockStmt& node, const ScopePtr& scope, std::string&) {
    Value text = apply_filters(node.filters, Value(render_block(node.body, scope)), scope);
    assign(node.target, text, scope);
    return Flow::kNormal;
  }

  Flow exec(const MacroStmt& node, const ScopePtr& scope, std::string&) {
    std::weak_ptr<Scope> defining = scope;
    scope->set(node.name, make_function(node.name, [this, &node, defining](CallArguments& args) {
                 return call_macro(node, defining, args);
               }));
    return Flow::kNormal;
  }

  Flow exec(const FilterBlockStmt& node, const ScopePtr& scope, std::string& out) {
    append(out, apply_filters(node.filters, Value(render_block(node.body, scope)), scope).str());
    return Flow::kNormal;
  }

  Flow exec(const WithStmt& node, const ScopePtr& scope, std::string& out) {
    auto inner = std::make_shared<Scope>(scope);
    for (const auto& [target, value] : node.assignments) assign(target, evaluate(*value, scope), inner);
    return execute_body(node.body, inner, out);
  }

  Flow exec(const GenerationStmt& node, const ScopePtr& scope, std::string& out) {
    return execute_body(node.body, scope, out);
  }

  Flow exec(const BreakStmt&, const ScopePtr&, std::string&) { return Flow::kBreak; }
  Flow exec(const ContinueStmt&, const ScopePtr&, std::string&) { return Flow::kContinue; }

  Value call_macro(const MacroStmt& macro, const std::weak_ptr<Scope>& defining, CallArguments& args) {
    ScopePtr parent = defining.lock();
    if (!parent)
      throw ValueError(fmt::format("macro '{}' was called after the block defining it ended", macro.name));
    if (macro_depth_ >= limits_.max_macro_depth) {
      throw ValueError(fmt::format("macro '{}' nested deeper than {} calls (runaway recursion?)", macro.name,
                                   limits_.max_macro_depth));
    }
    const auto& parameters = macro.parameters;
    if (args.positional.size() > parameters.size()) {
      throw ValueError(
          fmt::format("macro '{}' takes not more than {} argument(s)", macro.name, parameters.size()));
    }
    auto scope = std::make_shared<Scope>(parent);
    std::vector<bool> bound(parameters.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      scope->set(parameters[i].name, args.positional[i]);
      bound[i] = true;
    }
    for (const auto& [name, value] : args.keyword) {
      auto it = std::find_if(parameters.begin(), parameters.end(),
                             [&](const MacroParameter& p) { return p.name == name; });
      if (it == parameters.end())
        throw ValueError(fmt::format("macro '{}' takes no keyword argument '{}'", macro.name, name));
      auto index = static_cast<size_t>(it - parameters.begin());
      if (bound[index])
        throw ValueError(fmt::format("macro '{}' got multiple values for argument '{}'", macro.name, name));
      scope->set(name, value);
      bound[index] = true;
    }
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (bound[i]) continue;
      scope->set(parameters[i].name,
                 parameters[i].default_value
                     ? evaluate(*parameters[i].default_value, scope)
                     : Value::undefined(fmt::format("'{}' is undefined", parameters[i].name)));
    }
    NestedCall nested(macro_depth_);
    std::string text;
    execute_body(*macro.body, scope, text);
    return Value(std::move(text));
  }

  // ---- expressions ----

  Value evaluate(const Expr& expr, const ScopePtr& scope) {
    try {
      return std::visit([&](const auto& node) { return eval(node, scope); }, expr.node);
    } catch (const ValueError& error) {
      fail_at(expr.where, describe(expr), error.what());
    }
  }

  Value eval(const LiteralExpr& node, const ScopePtr&) { return node.value; }

  Value eval(const NameExpr& node, const ScopePtr& scope) {
    if (const Value* value = scope->find(node.name)) return *value;
    if (const Value* global = find_global(node.name)) return *global;
    return Value::undefined(fmt::format("'{}' is undefined", node.name));
  }

  Value eval(const ListExpr& node, const ScopePtr& scope) {
    std::vector<Value> items;
    items.reserve(node.items.size());
    for (const ExprPtr& item : node.items) items.push_back(evaluate(*item, scope));
    return node.is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }

  Value eval(const DictExpr& node, const ScopePtr& scope) {
    std::vector<std::pair<Value, Value>> entries;
    entries.reserve(node.entries.size());
    for (const auto& [key, value] : node.entries)
      entries.emplace_back(evaluate(*key, scope), evaluate(*value, scope));
    return Value::dict(std::move(entries));
  }

  Value eval(const AttributeExpr& node, const ScopePtr& scope) {
    return get_attribute(evaluate(*node.object, scope), node.name);
  }

  Value eval(const SubscriptExpr& node, const ScopePtr& scope) {
    Value object = evaluate(*node.object, scope);
    return get_item(object, evaluate(*node.index, scope));
  }

  Value eval(const SliceExpr& node, const ScopePtr& scope) {
    Value object = evaluate(*node.object, scope);
    auto bound = [&](const ExprPtr& expr) { return expr ? evaluate(*expr, scope) : Value(None{}); };
    Value start = bound(node.start);
    Value stop = bound(node.stop);
    return get_slice(object, start, stop, bound(node.step));
  }

  CallArguments evaluate_arguments(const Arguments& arguments, const ScopePtr& scope) {
    CallArguments args;
    for (const ExprPtr& expr : arguments.positional) args.positional.push_back(evaluate(*expr, scope));
    if (arguments.star_args) {
      for (Value& item : iterate(evaluate(*arguments.star_args, scope)))
        args.positional.push_back(std::move(item));
    }
    for (const KeywordArgument& keyword : arguments.keyword) {
      args.keyword.emplace_back(keyword.name, evaluate(*keyword.value, scope));
    }
    if (arguments.star_kwargs) {
      Value mapping = evaluate(*arguments.star_kwargs, scope);
      if (!mapping.is_dict())
        throw ValueError(fmt::format("argument after ** must be a mapping, not {}", mapping.type_name()));
      for (const auto& [key, value] : mapping.as_dict().entries) {
        if (!key.is_string()) throw ValueError("keywords must be strings");
        args.keyword.emplace_back(key.as_string(), value);
      }
    }
    return args;
  }

  Value eval(const CallExpr& node, const ScopePtr& scope) {
    Value callee = evaluate(*node.callee, scope);
    callee.require_defined();
    if (!callee.is_function())
      throw ValueError(fmt::format("'{}' object is not callable", callee.type_name()));
    CallArguments args = evaluate_arguments(node.arguments, scope);
    return callee.as_function().call(args);
  }

  Value eval(const FilterExpr& node, const ScopePtr& scope) {
    Value input = evaluate(*node.operand, scope);
    CallArguments args = evaluate_arguments(node.arguments, scope);
    return apply_filter(node.name, input, args);
  }

  Value eval(const TestExpr& node, const ScopePtr& scope) {
    Value input = evaluate(*node.operand, scope);
    CallArguments args = evaluate_arguments(node.arguments, scope);
    return Value(apply_test(node.name, input, args) != node.negated);
  }

  Value eval(const UnaryExpr& node, const ScopePtr& scope) {
    return unary_operation(node.op, evaluate(*node.operand, scope));
  }

  Value eval(const BinaryExpr& node, const ScopePtr& scope) {
    Value left = evaluate(*node.left, scope);
    if (node.op == BinaryOp::kAnd) return left.truthy() ? evaluate(*node.right, scope) : left;
    if (node.op == BinaryOp::kOr) return left.truthy() ? left : evaluate(*node.right, scope);
    Value right = evaluate(*node.right, scope);
    if (node.op == BinaryOp::kConcat) {
      std::string text = left.str();
      std::string tail = right.str();
      if (text.size() + tail.size() > kMaxBuiltSize)
        throw ValueError(fmt::format("string would exceed {} bytes", kMaxBuiltSize));
      return Value(text + tail);
    }
    return binary_operation(node.op, left, right);
  }

  static bool compare_values(const std::string& op, const Value& left, const Value& right) {
    if (op == "==") return equals(left, right);
    if (op == "!=") return !equals(left, right);
    if (op == "in") return contains(right, left);
    if (op == "not in") return !contains(right, left);
    int order = compare(left, right, op);
    if (op == "<") return order < 0;
    if (op == "<=") return order <= 0;
    if (op == ">") return order > 0;
    return order >= 0;
  }

  Value eval(const CompareExpr& node, const ScopePtr& scope) {
    Value left = evaluate(*node.first, scope);
    for (const auto& [op, operand] : node.rest) {
      Value right = evaluate(*operand, scope);
      if (!compare_values(op, left, right)) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  Value eval(const ConditionalExpr& node, const ScopePtr& scope) {
    if (evaluate(*node.condition, scope).truthy()) return evaluate(*node.then_value, scope);
    if (node.else_value) return evaluate(*node.else_value, scope);
    return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
  }

  std::string_view name_;
  const RenderLimits& limits_;
  int macro_depth_ = 0;
  int64_t iterations_ = 0;
};

}  // namespace

std::string render(const Body& body, std::string_view template_name,
                   const std::vector<std::pair<std::string, Value>>& variables, const RenderLimits& limits) {
  return Interpreter(template_name, limits).run(body, variables);
}

}  // namespace qspec::jinja
