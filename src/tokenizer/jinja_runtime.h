// The interpreter: renders a parsed template with jinja2's scoping (for-loops and macros get their own
// scope, if-blocks do not), loop variables, macros, namespaces and loop controls.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

struct RenderLimits {
  int max_macro_depth = 100;                 // nested macro calls (runaway recursion)
  int64_t max_loop_iterations = 10'000'000;  // all for-loop iterations of one render
  size_t max_output_bytes = size_t{256} << 20;
};

// Throws qspec::Error naming `template_name`, the line, column and construct of any runtime error, including
// raise_exception() from the template.
std::string render(const Body& body, std::string_view template_name,
                   const std::vector<std::pair<std::string, Value>>& variables,
                   const RenderLimits& limits = {});

}  // namespace qspec::jinja
