#include "tokenizer/jinja_template.h"

#include "core/error.h"
#include "tokenizer/jinja_json.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"

namespace qspec::jinja {

Template::Template(std::string_view source, std::string name)
    : name_(std::move(name)), body_(std::make_shared<const Body>(parse(tokenize(source, name_), name_))) {}

std::string Template::render(const nlohmann::ordered_json& variables, const RenderLimits& limits) const {
  if (!variables.is_object())
    fail("{}: template variables must be a JSON object, got {}", name_, variables.type_name());
  std::vector<std::pair<std::string, Value>> values;
  for (const auto& [key, json] : variables.items()) {
    try {
      values.emplace_back(key, from_json(json));
    } catch (const ValueError& error) {
      fail("{}: template variable '{}': {}", name_, key, error.what());
    }
  }
  return jinja::render(*body_, name_, values, limits);
}

}  // namespace qspec::jinja
