// Differential test against Python jinja2: random well-formed templates from
// tools/oracle/chat_template_random_templates.py (whitespace control, trim/lstrip_blocks, nested blocks,
// loops, macros, filters, tests) must render byte-identical, and fail where jinja2 fails.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/jinja_template.h"

namespace qspec::jinja {
namespace {

TEST(JinjaRandomTemplates, RenderLikeJinja2) {
  std::ifstream file(std::filesystem::path(QSPEC_FIXTURES_DIR) / "chat_template" / "random_templates.json");
  nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(file);
  const auto& templates = fixture["templates"];
  ASSERT_GE(templates.size(), 300u);
  for (const auto& record : templates) {
    std::string source = record["template"].get<std::string>();
    SCOPED_TRACE(source);
    try {
      std::string rendered = Template(source, "random").render(fixture["variables"]);
      if (record.contains("expected")) {
        EXPECT_EQ(rendered, record["expected"].get<std::string>());
      } else {
        ADD_FAILURE() << "jinja2 fails with " << record["error"].get<std::string>() << ", qspec rendered "
                      << rendered;
      }
    } catch (const Error& error) {
      if (record.contains("expected")) ADD_FAILURE() << "jinja2 renders, qspec fails: " << error.what();
    }
  }
}

}  // namespace
}  // namespace qspec::jinja
