// Every conversation of tests/fixtures/chat_template/cases.json (rendered by HF transformers' chat-template
// code, see tools/oracle/chat_template_cases.py) must render byte-identical, or fail with the same message.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace qspec {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(QSPEC_FIXTURES_DIR) / "chat_template";

nlohmann::ordered_json load_cases() {
  std::ifstream file(kFixtures / "cases.json");
  return nlohmann::ordered_json::parse(file);
}

ChatOptions options_of(const nlohmann::ordered_json& test_case) {
  ChatOptions options;
  options.tools = test_case["tools"];
  options.add_generation_prompt = test_case["add_generation_prompt"].get<bool>();
  for (const auto& [key, value] : test_case["variables"].items()) {
    if (key == "enable_thinking") {
      options.enable_thinking = value.get<bool>();
    } else {
      options.variables[key] = value;
    }
  }
  return options;
}

TEST(ChatTemplateCases, RenderLikeTransformers) {
  nlohmann::ordered_json fixture = load_cases();
  const auto& cases = fixture["cases"];
  ASSERT_GE(cases.size(), 30u);
  std::map<std::string, ChatTemplate> templates;
  size_t raising = 0;
  for (const auto& test_case : cases) {
    std::string name = test_case["name"].get<std::string>();
    SCOPED_TRACE(name);
    std::string template_file = test_case["template"].get<std::string>();
    if (!templates.count(template_file)) {
      templates.emplace(template_file, ChatTemplate::from_file(kFixtures / template_file));
    }
    const ChatTemplate& chat = templates.at(template_file);
    ChatOptions options = options_of(test_case);
    if (test_case.contains("expected")) {
      EXPECT_EQ(render_chat(chat, test_case["messages"], options), test_case["expected"].get<std::string>());
      continue;
    }
    ++raising;
    std::string expected_error = test_case["error"].get<std::string>();
    try {
      std::string rendered = render_chat(chat, test_case["messages"], options);
      ADD_FAILURE() << "expected the error '" << expected_error << "', rendered:\n" << rendered;
    } catch (const Error& error) {
      if (!test_case.value("error_any", false)) {
        EXPECT_NE(std::string(error.what()).find(expected_error), std::string::npos) << error.what();
      }
      EXPECT_NE(std::string(error.what()).find(template_file + ":"), std::string::npos) << error.what();
    }
  }
  EXPECT_GE(raising, 5u);
}

}  // namespace
}  // namespace qspec
