// Jinja semantics against Python jinja2: every snippet of tests/fixtures/chat_template/jinja_snippets.json
// (rendered in HF's chat-template environment by tools/oracle/chat_template_jinja_snippets.py) must render
// byte-identical, or fail with jinja2's message (or, for Python-specific wording, fail at all).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/jinja_template.h"

namespace qspec::jinja {
namespace {

TEST(JinjaSnippets, RenderLikeJinja2) {
  std::ifstream file(std::filesystem::path(QSPEC_FIXTURES_DIR) / "chat_template" / "jinja_snippets.json");
  nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(file);
  const auto& snippets = fixture["snippets"];
  ASSERT_GE(snippets.size(), 100u);
  for (const auto& snippet : snippets) {
    std::string source = snippet["template"].get<std::string>();
    SCOPED_TRACE(source);
    if (snippet.contains("expected")) {
      try {
        EXPECT_EQ(Template(source, "snippet").render(snippet["variables"]),
                  snippet["expected"].get<std::string>());
      } catch (const Error& error) {
        ADD_FAILURE() << "unexpected error: " << error.what();
      }
      continue;
    }
    std::string expected_error = snippet["error"].get<std::string>();
    try {
      std::string rendered = Template(source, "snippet").render(snippet["variables"]);
      ADD_FAILURE() << "expected the error '" << expected_error << "', rendered: " << rendered;
    } catch (const Error& error) {
      std::string message = error.what();
      EXPECT_EQ(message.rfind("snippet:", 0), 0u) << message;
      if (!snippet.value("error_any", false)) {
        EXPECT_NE(message.find(expected_error), std::string::npos) << message;
      }
    }
  }
}

}  // namespace
}  // namespace qspec::jinja
