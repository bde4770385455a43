// A parsed Jinja template that renders like Python jinja2 in HF's sandboxed chat-template environment
// (trim_blocks, lstrip_blocks, loopcontrols, tojson with ensure_ascii=False, raise_exception, strftime_now).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_runtime.h"

namespace qspec::jinja {

class Template {
 public:
  // Parses `source`; `name` (a file name, say) starts every error message. Throws qspec::Error on syntax
  // errors.
  explicit Template(std::string_view source, std::string name = "template");

  // Renders with the members of `variables` (a JSON object) as template variables; key order is kept.
  std::string render(const nlohmann::ordered_json& variables, const RenderLimits& limits = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const Body> body_;
};

}  // namespace qspec::jinja
