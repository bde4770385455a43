#include "tokenizer/jinja_parser.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"

namespace qspec::jinja {

namespace {

struct OpenBlock {
  std::string_view tag;
  SourceLocation where;
  std::vector<std::string_view> end_tags;
};

std::string describe(const Token& token) {
  switch (token.type) {
    case TokenType::kText:
      return "template text";
    case TokenType::kVariableBegin:
      return "'{{'";
    case TokenType::kVariableEnd:
      return "'}}'";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "'%}'";
    case TokenType::kString:
      return "a string literal";
    case TokenType::kEnd:
      return "the end of the template";
    default:
      return fmt::format("'{}'", token.text);
  }
}

template <typename Node>
ExprPtr make_expr(SourceLocation where, Node node) {
  return std::make_unique<Expr>(Expr{where, std::move(node)});
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, std::string_view name) : tokens_(tokens), name_(name) {}

  Body parse_template() { return parse_body(nullptr); }

 private:
  // Counts nesting of blocks and bracketed expressions while alive.
  class DepthGuard {
   public:
    DepthGuard(Parser& parser, const Token& at) : parser_(parser) {
      if (++parser_.depth_ > kMaxParseDepth) {
        parser_.error(at, fmt::format("blocks or brackets nested deeper than {} levels", kMaxParseDepth));
      }
    }
    ~DepthGuard() { --parser_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& parser_;
  };

  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& token = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return token;
  }
  bool at_operator(std::string_view op) const {
    return peek().type == TokenType::kOperator && peek().text == op;
  }
  bool at_name(std::string_view name) const { return peek().type == TokenType::kName && peek().text == name; }
  bool skip_operator(std::string_view op) {
    if (!at_operator(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void error(const Token& at, std::string_view message) const {
    fail("{}:{}:{}: {}", name_, at.where.line, at.where.column, message);
  }
  [[noreturn]] void error(SourceLocation where, std::string_view message) const {
    fail("{}:{}:{}: {}", name_, where.line, where.column, message);
  }

  void expect_operator(std::string_view op, std::string_view context) {
    if (!skip_operator(op))
      error(peek(), fmt::format("expected '{}' {}, found {}", op, context, describe(peek())));
  }
  std::string expect_name(std::string_view context) {
    if (peek().type != TokenType::kName)
      error(peek(), fmt::format("expected a name {}, found {}", context, describe(peek())));
    return next().text;
  }
  void expect_block_end(std::string_view tag) {
    if (peek().type != TokenType::kBlockEnd) {
      error(peek(), fmt::format("expected '%}}' to end '{{% {} %}}', found {}", tag, describe(peek())));
    }
    next();
  }

  // ---- statements ----

  // Parses until a `{% tag %}` whose name ends `open` (returns with that name token current) or the end.
  Body parse_body(const OpenBlock* open) {
    Body body;
    while (true) {
      const Token& token = peek();
      switch (token.type) {
        case TokenType::kText:
          body.push_back(Stmt{token.where, TextStmt{token.text}});
          next();
          break;
        case TokenType::kVariableBegin: {
          next();
          ExprPtr value = parse_tuple(true);
          if (peek().type != TokenType::kVariableEnd) {
            error(peek(), fmt::format("expected '}}}}' to end the '{{{{' at line {}, column {}, found {}",
                                      token.where.line, token.where.column, describe(peek())));
          }
          next();
          body.push_back(Stmt{token.where, OutputStmt{std::move(value)}});
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& keyword = peek(1);
          if (keyword.type != TokenType::kName) error(keyword, "expected a tag name after '{%'");
          if (open != nullptr &&
              std::find(open->end_tags.begin(), open->end_tags.end(), keyword.text) != open->end_tags.end()) {
            next();
            return body;
          }
          next();
          body.push_back(parse_statement(open));
          break;
        }
        case TokenType::kEnd:
          if (open != nullptr) {
            error(token,
                  fmt::format("unclosed '{{% {} %}}' opened at line {}, column {}: the template ends before "
                              "'{{% {} %}}'",
                              open->tag, open->where.line, open->where.column, open->end_tags.back()));
          }
          return body;
        default:
          error(token, fmt::format("unexpected {}", describe(token)));
      }
    }
  }

  Stmt parse_statement(const OpenBlock* open) {
    const Token& keyword = peek();
    DepthGuard guard(*this, keyword);
    const std::string& tag = keyword.text;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "generation") return parse_generation();
    if (tag == "break" || tag == "continue") return parse_loop_control();
    static constexpr std::string_view kUnsupported[] = {"call",  "include", "import",     "from", "extends",
                                                        "block", "do",      "autoescape", "trans"};
    if (std::find(std::begin(kUnsupported), std::end(kUnsupported), tag) != std::end(kUnsupported)) {
      error(keyword, fmt::format("the '{{% {} %}}' tag is not supported", tag));
    }
    if (open != nullptr) {
      error(keyword,
            fmt::format("unexpected '{{% {} %}}': the innermost open block is '{{% {} %}}' at line {}, "
                        "column {}, which ends with '{{% {} %}}'",
                        tag, open->tag, open->where.line, open->where.column, open->end_tags.back()));
    }
    if (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif") {
      error(keyword, fmt::format("unexpected '{{% {} %}}' with no open block", tag));
    }
    error(keyword, fmt::format("unknown tag '{}'", tag));
  }

  Stmt parse_if() {
    SourceLocation where = next().where;
    IfStmt node;
    OpenBlock open{"if", where, {"elif", "else", "endif"}};
    while (true) {
      ExprPtr condition = parse_tuple(false);
      expect_block_end("if");
      Body body = parse_body(&open);
      node.branches.emplace_back(std::move(condition), std::move(body));
      std::string ending = next().text;
      if (ending == "elif") continue;
      if (ending == "else") {
        expect_block_end("else");
        OpenBlock open_else{"else", where, {"endif"}};
        node.else_body = parse_body(&open_else);
        next();
      }
      expect_block_end("endif");
      return Stmt{where, std::move(node)};
    }
  }

  std::vector<std::string> parse_target_names(std::string_view context) {
    std::vector<std::string> names;
    bool parenthesized = skip_operator("(");
    do {
      names.push_back(expect_name(context));
    } while (skip_operator(","));
    if (parenthesized) expect_operator(")", context);
    return names;
  }

  Stmt parse_for() {
    SourceLocation where = next().where;
    ForStmt node;
    node.targets = parse_target_names("as the loop variable of '{% for %}'");
    if (!skip_name("in"))
      error(peek(), fmt::format("expected 'in' in '{{% for %}}', found {}", describe(peek())));
    node.iterable = parse_tuple(false);
    if (skip_name("if")) node.filter = parse_expression(true);
    if (at_name("recursive")) error(peek(), "recursive for-loops are not supported");
    expect_block_end("for");
    ++loop_depth_;
    OpenBlock open{"for", where, {"else", "endfor"}};
    node.body = parse_body(&open);
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end("else");
      OpenBlock open_else{"else", where, {"endfor"}};
      node.else_body = parse_body(&open_else);
      next();
    }
    expect_block_end("endfor");
    return Stmt{where, std::move(node)};
  }

  AssignTarget parse_assign_target(std::string_view context) {
    AssignTarget target;
    if (peek().type == TokenType::kName && peek(1).type == TokenType::kOperator && peek(1).text == ".") {
      target.names.push_back(next().text);
      next();
      target.attribute = expect_name(context);
      return target;
    }
    target.names = parse_target_names(context);
    return target;
  }

  Stmt parse_set() {
    SourceLocation where = next().where;
    AssignTarget target = parse_assign_target("to assign in '{% set %}'");
    if (skip_operator("=")) {
      ExprPtr value = parse_tuple(true);
      expect_block_end("set");
      return Stmt{where, SetStmt{std::move(target), std::move(value)}};
    }
    SetBlockStmt node{std::move(target), {}, {}};
    while (skip_operator("|")) node.filters.push_back(parse_filter(nullptr));
    expect_block_end("set");
    OpenBlock open{"set", where, {"endset"}};
    node.body = parse_body(&open);
    next();
    expect_block_end("endset");
    return Stmt{where, std::move(node)};
  }

  Stmt parse_macro() {
    SourceLocation where = next().where;
    MacroStmt node;
    node.name = expect_name("for the macro");
    expect_operator("(", "after the macro name");
    while (!skip_operator(")")) {
      if (!node.parameters.empty()) expect_operator(",", "between macro parameters");
      if (skip_operator(")")) break;
      MacroParameter parameter{expect_name("as a macro parameter"), nullptr};
      if (skip_operator("=")) {
        parameter.default_value = parse_expression(true);
      } else if (!node.parameters.empty() && node.parameters.back().default_value) {
        error(peek(), "a macro parameter without a default follows one with a default");
      }
      node.parameters.push_back(std::move(parameter));
    }
    expect_block_end("macro");
    int outer_loop_depth = loop_depth_;
    loop_depth_ = 0;
    OpenBlock open{"macro", where, {"endmacro"}};
    node.body = std::make_shared<const Body>(parse_body(&open));
    loop_depth_ = outer_loop_depth;
    next();
    expect_block_end("endmacro");
    return Stmt{where, std::move(node)};
  }

  Stmt parse_filter_block() {
    SourceLocation where = next().where;
    FilterBlockStmt node;
    do {
      node.filters.push_back(parse_filter(nullptr));
    } while (skip_operator("|"));
    expect_block_end("filter");
    OpenBlock open{"filter", where, {"endfilter"}};
    node.body = parse_body(&open);
    next();
    expect_block_end("endfilter");
    return Stmt{where, std::move(node)};
  }

  Stmt parse_with() {
    SourceLocation where = next().where;
    WithStmt node;
    while (peek().type != TokenType::kBlockEnd) {
      if (!node.assignments.empty()) expect_operator(",", "between '{% with %}' assignments");
      AssignTarget target;
      target.names = parse_target_names("to assign in '{% with %}'");
      expect_operator("=", "in '{% with %}'");
      node.assignments.emplace_back(std::move(target), parse_expression(true));
    }
    expect_block_end("with");
    OpenBlock open{"with", where, {"endwith"}};
    node.body = parse_body(&open);
    next();
    expect_block_end("endwith");
    return Stmt{where, std::move(node)};
  }

  Stmt parse_generation() {
    SourceLocation where = next().where;
    expect_block_end("generation");
    OpenBlock open{"generation", where, {"endgeneration"}};
    GenerationStmt node{parse_body(&open)};
    next();
    expect_block_end("endgeneration");
    return Stmt{where, std::move(node)};
  }

  Stmt parse_loop_control() {
    const Token& keyword = next();
    if (loop_depth_ == 0) error(keyword, fmt::format("'{{% {} %}}' outside a for-loop", keyword.text));
    expect_block_end(keyword.text);
    if (keyword.text == "break") return Stmt{keyword.where, BreakStmt{}};
    return Stmt{keyword.where, ContinueStmt{}};
  }

  // ---- expressions ----

  bool at_tuple_end() const {
    TokenType type = peek().type;
    return type == TokenType::kVariableEnd || type == TokenType::kBlockEnd || type == TokenType::kEnd ||
           at_operator(")") || at_name("if") || at_name("recursive");
  }

  // A comma-separated list becomes a tuple (`{{ a, b }}`, `set x = 1, 2`).
  ExprPtr parse_tuple(bool with_condition) {
    SourceLocation where = peek().where;
    ExprPtr first = parse_expression(with_condition);
    if (!at_operator(",")) return first;
    ListExpr tuple{{}, true};
    tuple.items.push_back(std::move(first));
    while (skip_operator(",")) {
      if (at_tuple_end()) break;
      tuple.items.push_back(parse_expression(with_condition));
    }
    return make_expr(where, std::move(tuple));
  }

  ExprPtr parse_expression(bool with_condition) { return with_condition ? parse_conditional() : parse_or(); }

  ExprPtr parse_conditional() {
    ExprPtr value = parse_or();
    while (at_name("if")) {
      SourceLocation where = next().where;
      ExprPtr condition = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_conditional() : nullptr;
      value = make_expr(where, ConditionalExpr{std::move(condition), std::move(value), std::move(otherwise)});
    }
    return value;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      SourceLocation where = next().where;
      left = make_expr(where, BinaryExpr{BinaryOp::kOr, std::move(left), parse_and()});
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      SourceLocation where = next().where;
      left = make_expr(where, BinaryExpr{BinaryOp::kAnd, std::move(left), parse_not()});
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      const Token& token = next();
      DepthGuard guard(*this, token);
      return make_expr(token.where, UnaryExpr{UnaryOp::kNot, parse_not()});
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    SourceLocation where = peek().where;
    ExprPtr first = parse_math1();
    CompareExpr compare{std::move(first), {}};
    while (true) {
      static constexpr std::string_view kOperators[] = {"==", "!=", "<", "<=", ">", ">="};
      const Token& token = peek();
      if (token.type == TokenType::kOperator &&
          std::find(std::begin(kOperators), std::end(kOperators), token.text) != std::end(kOperators)) {
        next();
        compare.rest.emplace_back(token.text, parse_math1());
      } else if (at_name("in")) {
        next();
        compare.rest.emplace_back("in", parse_math1());
      } else if (at_name("not") && peek(1).type == TokenType::kName && peek(1).text == "in") {
        next();
        next();
        compare.rest.emplace_back("not in", parse_math1());
      } else {
        break;
      }
    }
    if (compare.rest.empty()) return std::move(compare.first);
    return make_expr(where, std::move(compare));
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_operator("+") || at_operator("-")) {
      const Token& token = next();
      BinaryOp op = token.text == "+" ? BinaryOp::kAdd : BinaryOp::kSubtract;
      left = make_expr(token.where, BinaryExpr{op, std::move(left), parse_concat()});
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_operator("~")) {
      SourceLocation where = next().where;
      left = make_expr(where, BinaryExpr{BinaryOp::kConcat, std::move(left), parse_math2()});
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_power();
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      const Token& token = next();
      BinaryOp op = token.text == "*"    ? BinaryOp::kMultiply
                    : token.text == "/"  ? BinaryOp::kDivide
                    : token.text == "//" ? BinaryOp::kFloorDivide
                                         : BinaryOp::kModulo;
      left = make_expr(token.where, BinaryExpr{op, std::move(left), parse_power()});
    }
    return left;
  }

  ExprPtr parse_power() {
    ExprPtr left = parse_unary(true);
    while (at_operator("**")) {
      SourceLocation where = next().where;
      left = make_expr(where, BinaryExpr{BinaryOp::kPower, std::move(left), parse_unary(true)});
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      const Token& token = next();
      DepthGuard guard(*this, token);
      UnaryOp op = token.text == "-" ? UnaryOp::kNegate : UnaryOp::kPlus;
      node = make_expr(token.where, UnaryExpr{op, parse_unary(false)});
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_chain(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& token = peek();
    switch (token.type) {
      case TokenType::kName: {
        next();
        if (token.text == "true" || token.text == "True")
          return make_expr(token.where, LiteralExpr{Value(true)});
        if (token.text == "false" || token.text == "False")
          return make_expr(token.where, LiteralExpr{Value(false)});
        if (token.text == "none" || token.text == "None")
          return make_expr(token.where, LiteralExpr{Value(None{})});
        return make_expr(token.where, NameExpr{token.text});
      }
      case TokenType::kString: {
        std::string text;
        while (peek().type == TokenType::kString) text += next().text;  // adjacent literals concatenate
        return make_expr(token.where, LiteralExpr{Value(std::move(text))});
      }
      case TokenType::kInteger:
        next();
        return make_expr(token.where, LiteralExpr{Value(token.integer)});
      case TokenType::kFloat:
        next();
        return make_expr(token.where, LiteralExpr{Value(token.number)});
      default:
        break;
    }
    DepthGuard guard(*this, token);
    if (skip_operator("(")) {
      if (skip_operator(")")) return make_expr(token.where, ListExpr{{}, true});
      ExprPtr inner = parse_tuple(true);
      expect_operator(")", "to close '('");
      return inner;
    }
    if (skip_operator("[")) {
      ListExpr list;
      while (!skip_operator("]")) {
        if (!list.items.empty()) expect_operator(",", "between list items");
        if (skip_operator("]")) break;
        list.items.push_back(parse_expression(true));
      }
      return make_expr(token.where, std::move(list));
    }
    if (skip_operator("{")) {
      DictExpr dict;
      while (!skip_operator("}")) {
        if (!dict.entries.empty()) expect_operator(",", "between dict items");
        if (skip_operator("}")) break;
        ExprPtr key = parse_expression(true);
        expect_operator(":", "after a dict key");
        dict.entries.emplace_back(std::move(key), parse_expression(true));
      }
      return make_expr(token.where, std::move(dict));
    }
    error(token, fmt::format("expected an expression, found {}", describe(token)));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const Token& token = peek();
      if (skip_operator(".")) {
        if (peek().type == TokenType::kInteger) {
          ExprPtr index = make_expr(peek().where, LiteralExpr{Value(peek().integer)});
          next();
          node = make_expr(token.where, SubscriptExpr{std::move(node), std::move(index)});
        } else {
          node = make_expr(token.where, AttributeExpr{std::move(node), expect_name("after '.'")});
        }
      } else if (skip_operator("[")) {
        DepthGuard guard(*this, token);
        node = parse_subscript(std::move(node), token.where);
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object, SourceLocation where) {
    ExprPtr start;
    if (!at_operator(":")) {
      ExprPtr index = parse_tuple(true);
      if (skip_operator("]")) return make_expr(where, SubscriptExpr{std::move(object), std::move(index)});
      start = std::move(index);
    }
    expect_operator(":", "in a subscript");
    ExprPtr stop;
    ExprPtr step;
    if (!at_operator(":") && !at_operator("]")) stop = parse_expression(true);
    if (skip_operator(":") && !at_operator("]")) step = parse_expression(true);
    expect_operator("]", "to close the slice");
    return make_expr(where, SliceExpr{std::move(object), std::move(start), std::move(stop), std::move(step)});
  }

  Arguments parse_arguments() {
    const Token& open = peek();
    DepthGuard guard(*this, open);
    expect_operator("(", "to start the arguments");
    Arguments arguments;
    bool first = true;
    while (!skip_operator(")")) {
      if (!first) expect_operator(",", "between arguments");
      first = false;
      if (skip_operator(")")) break;
      if (skip_operator("**")) {
        arguments.star_kwargs = parse_expression(true);
      } else if (skip_operator("*")) {
        arguments.star_args = parse_expression(true);
      } else if (peek().type == TokenType::kName && peek(1).type == TokenType::kOperator &&
                 peek(1).text == "=") {
        std::string name = next().text;
        next();
        arguments.keyword.push_back(KeywordArgument{std::move(name), parse_expression(true)});
      } else {
        if (!arguments.keyword.empty()) error(peek(), "a positional argument follows a keyword argument");
        arguments.positional.push_back(parse_expression(true));
      }
    }
    return arguments;
  }

  ExprPtr parse_call(ExprPtr callee) {
    SourceLocation where = callee->where;
    return make_expr(where, CallExpr{std::move(callee), parse_arguments()});
  }

  ExprPtr parse_filter(ExprPtr operand) {
    const Token& token = peek();
    std::string name = expect_name("after '|'");
    if (!has_filter(name)) error(token, fmt::format("unknown filter '{}'", name));
    Arguments arguments;
    if (at_operator("(")) arguments = parse_arguments();
    return make_expr(token.where, FilterExpr{std::move(operand), std::move(name), std::move(arguments)});
  }

  ExprPtr parse_test(ExprPtr operand) {
    SourceLocation where = peek().where;
    bool negated = skip_name("not");
    const Token& token = peek();
    std::string name = expect_name("after 'is'");
    if (!has_test(name)) error(token, fmt::format("unknown test '{}'", name));
    Arguments arguments;
    const Token& next_token = peek();
    bool bare_argument = (next_token.type == TokenType::kName && next_token.text != "else" &&
                          next_token.text != "or" && next_token.text != "and" && next_token.text != "is") ||
                         next_token.type == TokenType::kString || next_token.type == TokenType::kInteger ||
                         next_token.type == TokenType::kFloat || at_operator("[") || at_operator("{");
    if (at_operator("(")) {
      arguments = parse_arguments();
    } else if (bare_argument) {
      arguments.positional.push_back(parse_postfix(parse_primary()));
    }
    return make_expr(where, TestExpr{std::move(operand), std::move(name), std::move(arguments), negated});
  }

  ExprPtr parse_filter_chain(ExprPtr node) {
    while (true) {
      if (skip_operator("|")) {
        node = parse_filter(std::move(node));
      } else if (skip_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& tokens_;
  std::string_view name_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, std::string_view template_name) {
  return Parser(tokens, template_name).parse_template();
}

}  // namespace qspec::jinja
