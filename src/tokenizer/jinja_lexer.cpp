#include "tokenizer/jinja_lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/error.h"
#include "tokenizer/jinja_unicode.h"
#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// jinja2 treats \r\n, \r and \n alike and drops one trailing newline (keep_trailing_newline=False).
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string rstrip_space(std::string_view text) {
  std::u32string code_points = decode_utf8(text);
  while (!code_points.empty() && is_python_space(code_points.back())) code_points.pop_back();
  return encode_utf8(code_points);
}

bool all_space(std::string_view text) {
  std::u32string code_points = decode_utf8(text);
  return std::all_of(code_points.begin(), code_points.end(), is_python_space);
}

class Lexer {
 public:
  Lexer(std::string_view source, std::string_view name) : source_(normalize_newlines(source)), name_(name) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < source_.size(); ++i) {
      if (source_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    while (pos_ < source_.size()) {
      size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit(TokenType::kText, source_.substr(pos_), pos_);
        break;
      }
      lex_tag(tag);
    }
    emit(TokenType::kEnd, "", source_.size());
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    for (size_t i = source_.find('{', from); i != std::string::npos; i = source_.find('{', i + 1)) {
      if (i + 1 < source_.size() &&
          (source_[i + 1] == '{' || source_[i + 1] == '%' || source_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  SourceLocation locate(size_t offset) const {
    auto line = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - line_starts_.begin();
    size_t line_start = line_starts_[static_cast<size_t>(line - 1)];
    int column = 1;
    for (size_t i = line_start; i < offset && i < source_.size(); ++i) {
      if ((static_cast<unsigned char>(source_[i]) & 0xc0) != 0x80) ++column;
    }
    return {static_cast<int>(line), column};
  }

  [[noreturn]] void error(size_t offset, std::string_view message) const {
    SourceLocation where = locate(offset);
    fail("{}:{}:{}: {}", name_, where.line, where.column, message);
  }

  Token& emit(TokenType type, std::string text, size_t offset) {
    tokens_.push_back(Token{type, std::move(text), locate(offset)});
    return tokens_.back();
  }

  // The text before a tag, with `-` stripping or lstrip_blocks applied, then the tag itself.
  void lex_tag(size_t tag) {
    char kind = source_[tag + 1];
    size_t after = tag + 2;
    char sign =
        after < source_.size() && (source_[after] == '-' || source_[after] == '+') ? source_[after] : 0;
    std::string text = source_.substr(pos_, tag - pos_);
    emit_text_before_tag(std::move(text), sign, kind != '{', pos_);
    if (sign != 0) ++after;
    size_t raw_body = 0;
    if (kind == '%' && match_raw_begin(after, raw_body)) {
      lex_raw(tag, raw_body);
    } else if (kind == '#') {
      lex_comment(tag, after);
    } else {
      lex_expression_tag(tag, after, kind == '%');
    }
  }

  void emit_text_before_tag(std::string text, char sign, bool is_block_or_comment, size_t offset) {
    if (sign == '-') {
      text = rstrip_space(text);
    } else if (sign != '+' && is_block_or_comment) {
      size_t line_start = text.rfind('\n');
      line_start = line_start == std::string::npos ? 0 : line_start + 1;
      if ((line_start > 0 || line_starting_) && line_start < text.size() &&
          all_space(std::string_view(text).substr(line_start))) {
        text.resize(line_start);
      }
    }
    if (!text.empty()) emit(TokenType::kText, std::move(text), offset);
  }

  size_t skip_space(size_t at) const {
    while (at < source_.size()) {
      auto byte = static_cast<unsigned char>(source_[at]);
      if (byte < 0x80) {
        if (!is_ascii_space(source_[at]) && !(byte >= 0x1c && byte <= 0x1f)) break;
        ++at;
        continue;
      }
      size_t end = at + 1;
      while (end < source_.size() && (static_cast<unsigned char>(source_[end]) & 0xc0) == 0x80) ++end;
      std::u32string code_point = decode_utf8(std::string_view(source_).substr(at, end - at));
      if (!is_python_space(code_point[0])) break;
      at = end;
    }
    return at;
  }

  bool starts_with(size_t at, std::string_view text) const {
    return source_.compare(at, text.size(), text) == 0;
  }

  // `{% raw %}` (the sign is already consumed); on success `body` is where the raw text starts.
  bool match_raw_begin(size_t at, size_t& body) const {
    at = skip_space(at);
    if (!starts_with(at, "raw")) return false;
    at = skip_space(at + 3);
    if (starts_with(at, "-%}")) {
      body = skip_space(at + 3);
      return true;
    }
    if (starts_with(at, "%}")) {
      body = at + 2;
      return true;
    }
    return false;
  }

  void lex_raw(size_t tag, size_t body) {
    for (size_t at = source_.find("{%", body); at != std::string::npos; at = source_.find("{%", at + 2)) {
      size_t inner = at + 2;
      char sign =
          inner < source_.size() && (source_[inner] == '-' || source_[inner] == '+') ? source_[inner] : 0;
      if (sign != 0) ++inner;
      inner = skip_space(inner);
      if (!starts_with(inner, "endraw")) continue;
      inner = skip_space(inner + 6);
      size_t end = 0;
      if (!match_tag_end(inner, '%', end)) continue;
      pos_ = body;
      emit_text_before_tag(source_.substr(body, at - body), sign, true, body);
      pos_ = end;
      return;
    }
    error(tag, "unclosed '{% raw %}': no '{% endraw %}' follows");
  }

  void lex_comment(size_t tag, size_t body) {
    size_t close = source_.find("#}", body);
    if (close == std::string::npos) error(tag, "unclosed comment: '{#' has no matching '#}'");
    char sign =
        close > body && (source_[close - 1] == '-' || source_[close - 1] == '+') ? source_[close - 1] : 0;
    size_t end = close + 2;
    if (sign == '-') {
      end = skip_space(end);
    } else if (sign != '+' && end < source_.size() && source_[end] == '\n') {
      ++end;  // trim_blocks
    }
    finish_tag(end);
  }

  // Matches the end of a `{%` or `{{` tag at `at`; `end` is past it and past what it trims.
  bool match_tag_end(size_t at, char kind, size_t& end) const {
    if (kind == '%') {
      if (starts_with(at, "+%}")) {
        end = at + 3;
        return true;
      }
      if (starts_with(at, "-%}")) {
        end = skip_space(at + 3);
        return true;
      }
      if (starts_with(at, "%}")) {
        end = at + 2;
        if (end < source_.size() && source_[end] == '\n') ++end;  // trim_blocks
        return true;
      }
      return false;
    }
    if (starts_with(at, "-}}")) {
      end = skip_space(at + 3);
      return true;
    }
    if (starts_with(at, "}}")) {
      end = at + 2;
      return true;
    }
    return false;
  }

  void finish_tag(size_t end) {
    line_starting_ = end > 0 && source_[end - 1] == '\n';
    pos_ = end;
  }

  void lex_expression_tag(size_t tag, size_t at, bool is_block) {
    char kind = is_block ? '%' : '}';
    emit(is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin, is_block ? "{%" : "{{", tag);
    std::vector<char> brackets;
    std::string_view opener = is_block ? "'{%'" : "'{{'";
    while (true) {
      at = skip_space(at);
      if (at >= source_.size()) {
        error(tag, fmt::format("unclosed {} tag: the template ends before its '{}'", opener,
                               is_block ? "%}" : "}}"));
      }
      size_t end = 0;
      if (brackets.empty() && match_tag_end(at, kind, end)) {
        emit(is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, is_block ? "%}" : "}}", at);
        finish_tag(end);
        return;
      }
      at = lex_expression_token(at, brackets);
    }
  }

  size_t lex_expression_token(size_t at, std::vector<char>& brackets) {
    char c = source_[at];
    if (is_digit(c)) return lex_number(at);
    if (is_name_start(c)) {
      size_t end = at;
      while (end < source_.size() && is_name_char(source_[end])) ++end;
      emit(TokenType::kName, source_.substr(at, end - at), at);
      return end;
    }
    if (c == '\'' || c == '"') return lex_string(at);
    static constexpr std::string_view kTwoCharOperators[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwoCharOperators) {
      if (starts_with(at, op)) {
        emit(TokenType::kOperator, std::string(op), at);
        return at + 2;
      }
    }
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      error(at, fmt::format("unexpected character '{}' inside a tag", source_.substr(at, 1)));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) error(at, fmt::format("unexpected '{}'", c));
      if (brackets.back() != c) error(at, fmt::format("unexpected '{}', expected '{}'", c, brackets.back()));
      brackets.pop_back();
    }
    emit(TokenType::kOperator, std::string(1, c), at);
    return at + 1;
  }

  size_t scan_digits(size_t at) const {
    while (at < source_.size() &&
           (is_digit(source_[at]) || (source_[at] == '_' && at + 1 < source_.size() &&
                                      is_digit(source_[at + 1]) && at > 0 && is_digit(source_[at - 1])))) {
      ++at;
    }
    return at;
  }

  size_t lex_number(size_t start) {
    if (source_[start] == '0' && start + 1 < source_.size()) {
      char prefix = static_cast<char>(source_[start + 1] | 0x20);
      int base = prefix == 'x' ? 16 : (prefix == 'o' ? 8 : (prefix == 'b' ? 2 : 0));
      if (base != 0) return lex_prefixed_integer(start, base);
    }
    size_t end = scan_digits(start);
    // jinja2's float rule does not apply right after a '.', so `x.0.1` is two subscripts.
    bool may_be_float = start == 0 || source_[start - 1] != '.';
    bool is_float = false;
    if (may_be_float && end + 1 < source_.size() && source_[end] == '.' && is_digit(source_[end + 1])) {
      end = scan_digits(end + 1);
      is_float = true;
    }
    if (may_be_float && end < source_.size() && (source_[end] == 'e' || source_[end] == 'E')) {
      size_t exponent = end + 1;
      if (exponent < source_.size() && (source_[exponent] == '+' || source_[exponent] == '-')) ++exponent;
      if (exponent < source_.size() && is_digit(source_[exponent])) {
        end = scan_digits(exponent);
        is_float = true;
      }
    }
    std::string literal;
    for (size_t i = start; i < end; ++i) {
      if (source_[i] != '_') literal += source_[i];
    }
    Token& token = emit(is_float ? TokenType::kFloat : TokenType::kInteger, literal, start);
    if (is_float) {
      token.number = std::strtod(literal.c_str(), nullptr);
    } else {
      auto [ptr, ec] = std::from_chars(literal.data(), literal.data() + literal.size(), token.integer);
      if (ec != std::errc()) error(start, fmt::format("integer literal {} does not fit in 64 bits", literal));
    }
    return end;
  }

  size_t lex_prefixed_integer(size_t start, int base) {
    size_t end = start + 2;
    std::string digits;
    while (end < source_.size() &&
           (std::isxdigit(static_cast<unsigned char>(source_[end])) || source_[end] == '_')) {
      if (source_[end] != '_') digits += source_[end];
      ++end;
    }
    Token& token = emit(TokenType::kInteger, source_.substr(start, end - start), start);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), token.integer, base);
    if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size()) {
      error(start, fmt::format("invalid integer literal '{}'", token.text));
    }
    return end;
  }

  size_t lex_string(size_t start) {
    char quote = source_[start];
    std::string value;
    size_t at = start + 1;
    while (true) {
      if (at >= source_.size()) error(start, "unterminated string literal");
      char c = source_[at];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++at;
        continue;
      }
      if (at + 1 >= source_.size()) error(start, "unterminated string literal");
      at = unescape(at, value);
    }
    emit(TokenType::kString, std::move(value), start);
    return at + 1;
  }

  // Python's unicode-escape for the escape sequence at `at` (a backslash); returns the offset after it.
  size_t unescape(size_t at, std::string& value) const {
    char c = source_[at + 1];
    switch (c) {
      case '\n':
        return at + 2;
      case '\\':
      case '\'':
      case '"':
        value += c;
        return at + 2;
      case 'a':
        value += '\a';
        return at + 2;
      case 'b':
        value += '\b';
        return at + 2;
      case 'f':
        value += '\f';
        return at + 2;
      case 'n':
        value += '\n';
        return at + 2;
      case 'r':
        value += '\r';
        return at + 2;
      case 't':
        value += '\t';
        return at + 2;
      case 'v':
        value += '\v';
        return at + 2;
      case 'x':
        return unescape_hex(at, 2, value);
      case 'u':
        return unescape_hex(at, 4, value);
      case 'U':
        return unescape_hex(at, 8, value);
      default:
        break;
    }
    if (c >= '0' && c <= '7') {
      size_t end = at + 1;
      uint32_t code = 0;
      while (end < at + 4 && end < source_.size() && source_[end] >= '0' && source_[end] <= '7') {
        code = code * 8 + static_cast<uint32_t>(source_[end] - '0');
        ++end;
      }
      append_utf8(value, code);
      return end;
    }
    value += '\\';  // Python keeps unknown escapes as written.
    return at + 1;
  }

  size_t unescape_hex(size_t at, size_t digits, std::string& value) const {
    size_t begin = at + 2;
    uint32_t code = 0;
    auto [ptr, ec] = std::from_chars(source_.data() + begin,
                                     source_.data() + std::min(begin + digits, source_.size()), code, 16);
    if (ec != std::errc() || ptr != source_.data() + begin + digits || code > 0x10ffff) {
      error(at, fmt::format("invalid \\{} escape in string literal", source_[at + 1]));
    }
    append_utf8(value, code);
    return begin + digits;
  }

  std::string source_;
  std::string_view name_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, std::string_view template_name) {
  try {
    decode_utf8(source);
  } catch (const ValueError&) {
    fail("{}: the template is not valid UTF-8", template_name);
  }
  return Lexer(source, template_name).run();
}

}  // namespace qspec::jinja
