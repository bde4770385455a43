// Unit tests of the Jinja interpreter: what jinja2 parity fixtures cannot show — error locations and
// constructs, malformed templates, and the guards against runaway templates and input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"
#include "error_message.h"
#include "tokenizer/jinja_template.h"

namespace qspec::jinja {
namespace {

const nlohmann::ordered_json kNoVariables = nlohmann::ordered_json::object();

std::string render(std::string_view source,
                   const nlohmann::ordered_json& variables = nlohmann::ordered_json::object(),
                   const RenderLimits& limits = {}) {
  return Template(source, "t.jinja").render(variables, limits);
}

// The message of the qspec::Error that parsing or rendering `source` throws ("" when none is thrown).
std::string error_of(std::string_view source,
                     const nlohmann::ordered_json& variables = nlohmann::ordered_json::object(),
                     const RenderLimits& limits = {}) {
  return testing_support::error_message([&] { render(source, variables, limits); }, "");
}

TEST(Jinja, RendersTheConstructsChatTemplatesUse) {
  nlohmann::ordered_json variables = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  std::string source =
      "{%- set ns = namespace(count=0) %}\n"
      "{%- macro show(m, prefix='> ') %}{{ prefix ~ m.role }}:{{ m.content | trim }}{% endmacro %}\n"
      "{%- for m in messages if m.role != 'system' %}\n"
      "    {%- set ns.count = ns.count + 1 %}\n"
      "    {{- show(m) }}{% if loop.last %}!{% endif %}\n"
      "{%- endfor %}\n"
      "{{- ' ' ~ ns.count ~ ' ' ~ (messages | map(attribute='role') | list | tojson) }}\n";
  EXPECT_EQ(render(source, variables), "> user:hi! 1 [\"user\"]");
}

TEST(Jinja, WhitespaceControlAndHfBlockTrimming) {
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n"), "  x\n");  // lstrip_blocks + trim_blocks
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("a {{ 'b' }}\n c"), "a b\n c");  // no trimming after '}}'
  EXPECT_EQ(render("{% if true +%}\ny{% endif %}"), "\ny");
  EXPECT_EQ(render("x  {%+ if true %}y{% endif %}"), "x  y");
  EXPECT_EQ(render("{# comment #}\nz\n"), "z");  // the template's final newline is dropped
}

TEST(Jinja, LoopVariables) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}"),
            "103TrueFalse3b;212FalseFalse3ac;321FalseTrue3b;");
  EXPECT_EQ(
      render("{% for x in [1, 2, 3, 4] if x is odd %}{{ x }}/{{ loop.length }} {% else %}none{% endfor %}"),
      "1/2 3/2 ");
  EXPECT_EQ(
      render("{% for k, v in {'a': 1, 'b': 2} | items %}{% if k == 'b' %}{% break %}{% endif %}{{ k }}{{ v }}"
             "{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}"),
      "a1empty");
}

TEST(Jinja, MacrosTakeDefaultsAndKeywords) {
  EXPECT_EQ(
      render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}"),
      "1B1243");
  EXPECT_EQ(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
            "t.jinja:1:34: m(): macro 'm' takes not more than 1 argument(s)");
}

TEST(Jinja, UnknownFilterNamesItAndItsLine) {
  EXPECT_EQ(error_of("line one\n  {{ messages | nosuch }}"), "t.jinja:2:17: unknown filter 'nosuch'");
}

TEST(Jinja, UnknownTestNamesItAndItsLine) {
  EXPECT_EQ(error_of("\n\n{% if x is shiny %}{% endif %}"), "t.jinja:3:12: unknown test 'shiny'");
}

TEST(Jinja, UnclosedBlockNamesWhereItOpened) {
  EXPECT_EQ(
      error_of("{% if x %}\n  {% for a in b %}\n{% endif %}"),
      "t.jinja:3:4: unexpected '{% endif %}': the innermost open block is '{% for %}' at line 2, column 6, "
      "which ends with '{% endfor %}'");
  EXPECT_EQ(
      error_of("{% if x %}\nbody"),
      "t.jinja:2:5: unclosed '{% if %}' opened at line 1, column 4: the template ends before '{% endif %}'");
  EXPECT_EQ(error_of("{% macro m() %}"),
            "t.jinja:1:16: unclosed '{% macro %}' opened at line 1, column 4: the template ends before "
            "'{% endmacro %}'");
}

TEST(Jinja, UnclosedTagsCommentsAndStringsAreReportedWhereTheyStart) {
  EXPECT_EQ(error_of("abc\n {{ x"), "t.jinja:2:2: unclosed '{{' tag: the template ends before its '}}'");
  EXPECT_EQ(error_of("{% if true"), "t.jinja:1:1: unclosed '{%' tag: the template ends before its '%}'");
  EXPECT_EQ(error_of("a {# note"), "t.jinja:1:3: unclosed comment: '{#' has no matching '#}'");
  EXPECT_EQ(error_of("{% raw %} x"), "t.jinja:1:1: unclosed '{% raw %}': no '{% endraw %}' follows");
  EXPECT_EQ(error_of("{{ 'abc }}"), "t.jinja:1:4: unterminated string literal");
  EXPECT_EQ(error_of("{{ (1 }}"), "t.jinja:1:7: unexpected '}', expected ')'");
  EXPECT_EQ(error_of("{{ 1 ] }}"), "t.jinja:1:6: unexpected ']'");
  EXPECT_EQ(error_of("{{ 1 @ 2 }}"), "t.jinja:1:6: unexpected character '@' inside a tag");
}

TEST(Jinja, MalformedStatementsAreNamed) {
  EXPECT_EQ(error_of("{% foo %}"), "t.jinja:1:4: unknown tag 'foo'");
  EXPECT_EQ(error_of("{% endfor %}"), "t.jinja:1:4: unexpected '{% endfor %}' with no open block");
  EXPECT_EQ(error_of("{% include 'x' %}"), "t.jinja:1:4: the '{% include %}' tag is not supported");
  EXPECT_EQ(error_of("{% break %}"), "t.jinja:1:4: '{% break %}' outside a for-loop");
  EXPECT_EQ(error_of("{% for x in y %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}"),
            "t.jinja:1:35: '{% continue %}' outside a for-loop");
  EXPECT_EQ(error_of("{% for x y %}{% endfor %}"), "t.jinja:1:10: expected 'in' in '{% for %}', found 'y'");
  EXPECT_EQ(error_of("{% set x = 1 2 %}"), "t.jinja:1:14: expected '%}' to end '{% set %}', found '2'");
  EXPECT_EQ(error_of("{{ }}"), "t.jinja:1:4: expected an expression, found '}}'");
  EXPECT_EQ(error_of("{{ 1 + }}"), "t.jinja:1:8: expected an expression, found '}}'");
  EXPECT_EQ(error_of("{% macro m(a=1, b) %}{% endmacro %}"),
            "t.jinja:1:18: a macro parameter without a default follows one with a default");
}

TEST(Jinja, RuntimeErrorsNameLocationConstructAndCause) {
  nlohmann::ordered_json variables = {{"message", {{"role", "user"}}}};
  EXPECT_EQ(error_of("\n  {{ message.tool.name }}", variables),
            "t.jinja:2:18: attribute '.name': 'dict object' has no attribute 'tool'");
  EXPECT_EQ(error_of("{{ missing + 1 }}"), "t.jinja:1:12: '+' operator: 'missing' is undefined");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"),
            "t.jinja:1:6: '+' operator: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{{ 'x' | items | list }}"),
            "t.jinja:1:10: filter 'items': Can only get item pairs from a mapping.");
  EXPECT_EQ(error_of("{% for x in 5 %}{% endfor %}"),
            "t.jinja:1:4: '{% for %}': 'int' object is not iterable");
  EXPECT_EQ(error_of("{{ [].append(1) }}"),
            "t.jinja:1:6: .append(): access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(error_of("{% set x = 5 %}{% set x.y = 1 %}"),
            "t.jinja:1:19: '{% set %}': cannot assign attribute on non-namespace object 'x'");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"),
            "t.jinja:1:24: '+' operator: integer overflow (values beyond 64 bits are not supported)");
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessageAndLocation) {
  EXPECT_EQ(
      error_of("{%- if true %}\n    {{- raise_exception('No user query found in messages.') }}\n{% endif %}"),
      "t.jinja:2:9: raise_exception(): No user query found in messages.");
}

TEST(Jinja, RunawayMacroRecursionIsStopped) {
  std::string message = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(message.find("macro 'f' nested deeper than 100 calls (runaway recursion?)"), std::string::npos)
      << message;
  RenderLimits shallow;
  shallow.max_macro_depth = 3;
  EXPECT_EQ(render("{% macro f(n) %}{{ n }}{% if n < 3 %}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(1) }}",
                   kNoVariables, shallow),
            "123");
  EXPECT_NE(error_of("{% macro f(n) %}{{ n }}{{ f(n + 1) }}{% endmacro %}{{ f(1) }}", kNoVariables, shallow)
                .find("nested deeper than 3"),
            std::string::npos);
}

TEST(Jinja, RunawayLoopsAreStopped) {
  RenderLimits limits;
  limits.max_loop_iterations = 1000;
  EXPECT_EQ(error_of("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
                     kNoVariables, limits),
            "t.jinja:1:29: '{% for %}': more than 1000 loop iterations in one render");
  EXPECT_EQ(error_of("{{ range(100001) | length }}"),
            "t.jinja:1:4: range(): Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
}

TEST(Jinja, HugeOutputIsRefused) {
  RenderLimits limits;
  limits.max_output_bytes = 64;
  EXPECT_EQ(error_of("{% for i in range(100) %}{{ i }}{% endfor %}", kNoVariables, limits),
            "t.jinja:1:26: '{{ }}': output would exceed 64 bytes");
  EXPECT_EQ(error_of("{{ 'abc' * 100000000 }}"),
            "t.jinja:1:10: '*' operator: string repetition would exceed 67108864 bytes");
}

TEST(Jinja, DeepNestingIsRefusedNotRecursedInto) {
  std::string parentheses = std::string(200, '(') + "1" + std::string(200, ')');
  EXPECT_NE(error_of("{{ " + parentheses + " }}").find("nested deeper than 128 levels"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 200; ++i) blocks += "{% if true %}";
  EXPECT_NE(error_of(blocks).find("nested deeper than 128 levels"), std::string::npos);
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_NE(error_of("{{ " + nots + "1 }}").find("nested deeper than 128 levels"), std::string::npos);

  nlohmann::ordered_json deep = 1;
  for (int i = 0; i < 300; ++i) deep = nlohmann::ordered_json::array({deep});
  EXPECT_EQ(error_of("{{ x }}", {{"x", deep}}),
            "t.jinja: template variable 'x': JSON nested deeper than 256 levels");
  EXPECT_EQ(
      error_of("{% set ns = namespace(x=1) %}{% for i in range(300) %}{% set ns.x = [ns.x] %}{% endfor %}"),
      "t.jinja:1:69: list: value nested deeper than 256 levels");
}

TEST(Jinja, NamespacesCannotFormCycles) {
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = ns %}"),
            "t.jinja:1:30: '{% set %}': a namespace attribute cannot hold a namespace or a function");
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.f = [ns] %}"),
            "t.jinja:1:30: '{% set %}': a namespace attribute cannot hold a namespace or a function");
}

TEST(Jinja, InvalidUtf8IsRefused) {
  EXPECT_EQ(error_of("abc \xff"), "t.jinja: the template is not valid UTF-8");
  EXPECT_EQ(error_of("{{ x | length }}", {{"x", "\xc3"}}),
            "t.jinja:1:8: filter 'length': string is not valid UTF-8");
}

TEST(Jinja, VariablesMustBeAnObject) {
  EXPECT_EQ(error_of("x", nlohmann::ordered_json::array()),
            "t.jinja: template variables must be a JSON object, got array");
}

TEST(Jinja, LineAndColumnCountCodePointsAndNormalisedNewlines) {
  EXPECT_EQ(error_of("é😀\r\n\r\n  ü {{ x | nosuch }}"), "t.jinja:3:12: unknown filter 'nosuch'");
}

}  // namespace
}  // namespace qspec::jinja
