// Robustness: random templates stitched from Jinja fragments either render or fail with one qspec::Error —
// never another exception, a crash or a hang.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja_template.h"

namespace qspec::jinja {
namespace {

const std::vector<std::string> kFragments = {
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{%-",
    "-%}",
    "{{-",
    "-}}",
    " if ",
    " elif ",
    " else ",
    " endif ",
    " for x in ",
    " endfor ",
    " set ",
    " = ",
    " macro m(a, b=1) ",
    " endmacro ",
    " m(1) ",
    " break ",
    " continue ",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ".",
    "|",
    " is ",
    " not ",
    " and ",
    " or ",
    " in ",
    "'s'",
    "\"t\"",
    "1",
    "2.5",
    "-",
    "+",
    "*",
    "/",
    "//",
    "%",
    "**",
    "~",
    "==",
    "<",
    "x",
    "messages",
    "messages[0]",
    ".role",
    ".content",
    "loop.index",
    "loop.previtem",
    "ns",
    "ns.v",
    "namespace(v=1)",
    "|trim",
    "|tojson",
    "|length",
    "|items",
    "|map(attribute='role')",
    "|join(', ')",
    "|first",
    "|string",
    " defined",
    " none",
    " string",
    " mapping",
    "raise_exception('r')",
    "range(3)",
    "[::-1]",
    "[1:]",
    "'a b'.split()",
    ".startswith('a')",
    "\n",
    "  ",
    "text",
    "é😀",
    "\\",
    "'",
    "\"",
    "x if y else z",
};

TEST(JinjaFuzz, RandomTemplatesRenderOrFailCleanly) {
  std::mt19937 random(20261129);
  nlohmann::ordered_json variables = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}},
      {"y", true}};
  RenderLimits limits;
  limits.max_loop_iterations = 10000;
  limits.max_output_bytes = 1 << 20;
  int rendered = 0;
  int failed = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string source;
    size_t pieces = 1 + random() % 24;
    for (size_t i = 0; i < pieces; ++i) source += kFragments[random() % kFragments.size()];
    try {
      Template(source, "fuzz").render(variables, limits);
      ++rendered;
    } catch (const Error& error) {
      ++failed;
      EXPECT_EQ(std::string(error.what()).rfind("fuzz", 0), 0u) << source << "\n" << error.what();
    } catch (const std::exception& error) {
      ADD_FAILURE() << "not a qspec::Error: " << error.what() << "\n" << source;
    }
  }
  // Both outcomes must occur, or the generator tests nothing.
  EXPECT_GT(rendered, 100);
  EXPECT_GT(failed, 100);
}

}  // namespace
}  // namespace qspec::jinja
