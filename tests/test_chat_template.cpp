// The chat-template API: loading a model directory's template like transformers, choosing among named
// templates, and passing options to the template the way apply_chat_template does.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "error_message.h"
#include "temp_dir.h"
#include "tokenizer/chat_template.h"

namespace qspec {
namespace {

const std::filesystem::path kQwen35 =
    std::filesystem::path(QSPEC_FIXTURES_DIR) / "chat_template" / "qwen3_5.jinja";

using testing_support::TempDir;

nlohmann::ordered_json hello() {
  return nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hello"}])");
}

std::string error_of(const std::function<void()>& action) {
  return testing_support::error_message(action, "");
}

TEST(ChatTemplate, EnableThinkingAbsentTrueFalseLikeHf) {
  ChatTemplate chat = ChatTemplate::from_file(kQwen35);
  ChatOptions options;
  options.add_generation_prompt = true;
  const std::string prefix = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(render_chat(chat, hello(), options), prefix + "<think>\n");
  options.enable_thinking = true;
  EXPECT_EQ(render_chat(chat, hello(), options), prefix + "<think>\n");
  options.enable_thinking = false;
  EXPECT_EQ(render_chat(chat, hello(), options), prefix + "<think>\n\n</think>\n\n");
  options.add_generation_prompt = false;
  EXPECT_EQ(render_chat(chat, hello(), options), "<|im_start|>user\nHello<|im_end|>\n");
}

TEST(ChatTemplate, TemplateErrorsNameTheFileAndLine) {
  ChatTemplate chat = ChatTemplate::from_file(kQwen35);
  auto messages = nlohmann::ordered_json::parse(R"([{"role": "assistant", "content": "hi"}])");
  // qwen3_5.jinja line 79 is `{{- raise_exception('No user query found in messages.') }}`.
  EXPECT_EQ(error_of([&] { render_chat(chat, messages); }),
            "qwen3_5.jinja:79:9: raise_exception(): No user query found in messages.");
  EXPECT_EQ(error_of([&] { render_chat(chat, nlohmann::ordered_json::object()); }),
            "chat messages must be a JSON array, got object");
}

TEST(ChatTemplate, KeyOrderOfToolsAndArgumentsIsKept) {
  ChatTemplate chat(
      "{% for t in tools %}{{ t | tojson }}{% endfor %}|"
      "{% for k, v in messages[0].arguments | items %}{{ k }}={{ v }};{% endfor %}",
      "order.jinja");
  ChatOptions options;
  options.tools = nlohmann::ordered_json::parse(R"([{"zeta": 1, "alpha": {"y": 2, "b": 3}}])");
  auto messages = nlohmann::ordered_json::parse(R"([{"arguments": {"z": 1, "a": "x"}}])");
  EXPECT_EQ(render_chat(chat, messages, options), R"({"zeta": 1, "alpha": {"y": 2, "b": 3}}|z=1;a=x;)");
}

TEST(ChatTemplate, VariablesReachTheTemplateAndToolsDefaultToNone) {
  ChatTemplate chat(
      "{{ bos_token }}{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}"
      "{{ enable_thinking is defined }}{{ date_string }}",
      "vars.jinja");
  ChatOptions options;
  options.variables = {{"bos_token", "<s>"}, {"date_string", "1 Jan 2026"}};
  EXPECT_EQ(render_chat(chat, hello(), options), "<s>TrueTrueFalseFalse1 Jan 2026");
}

TEST(ChatTemplate, ModelDirPrefersChatTemplateJinja) {
  TempDir dir;
  dir.write("chat_template.jinja", "from jinja file\n");
  dir.write("tokenizer_config.json", R"({"chat_template": "from tokenizer_config"})");
  EXPECT_EQ(render_chat(ChatTemplate::from_model_dir(dir.path()), hello()), "from jinja file");
}

TEST(ChatTemplate, ModelDirReadsTokenizerConfigString) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "x", "chat_template": "{{ messages[0].content }}!"})");
  EXPECT_EQ(render_chat(ChatTemplate::from_model_dir(dir.path()), hello()), "Hello!");
}

TEST(ChatTemplate, ModelDirSpecialTokensBecomeVariablesLikeHf) {
  TempDir dir;
  dir.write("tokenizer_config.json",
            R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true},
                                        "unk_token": null, "chat_template": "{{ bos_token }}|{{ eos_token }}|"})");
  dir.write("chat_template.jinja",
            "{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|{{ pad_token }}");
  ChatTemplate chat = ChatTemplate::from_model_dir(dir.path());
  EXPECT_EQ(render_chat(chat, hello()), "<s>|</s>|False|");
  ChatOptions options;
  options.variables = {{"eos_token", "<eos>"}, {"pad_token", "<pad>"}};
  EXPECT_EQ(render_chat(chat, hello(), options), "<s>|<eos>|False|<pad>");
}

TEST(ChatTemplate, NamedTemplatesAreChosenLikeHf) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "plain"},
                                                          {"name": "tool_use", "template": "tools"},
                                                          {"name": "rag", "template": "rag"}]})");
  ChatTemplate chat = ChatTemplate::from_model_dir(dir.path());
  ChatOptions options;
  EXPECT_EQ(render_chat(chat, hello(), options), "plain");
  options.tools = nlohmann::ordered_json::array();
  EXPECT_EQ(render_chat(chat, hello(), options), "tools");
  options.template_name = "rag";
  EXPECT_EQ(render_chat(chat, hello(), options), "rag");
  options.template_name = "nope";
  EXPECT_EQ(error_of([&] { render_chat(chat, hello(), options); }), "chat template 'nope' does not exist");
}

TEST(ChatTemplate, ModelDirFallsBackToProcessorChatTemplateJson) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "x"})");
  dir.write("chat_template.json", R"({"chat_template": "processor"})");
  EXPECT_EQ(render_chat(ChatTemplate::from_model_dir(dir.path()), hello()), "processor");
}

TEST(ChatTemplate, BadModelDirsGetOneClearError) {
  TempDir dir;
  EXPECT_EQ(error_of([&] { ChatTemplate::from_model_dir(dir.path()); }),
            dir.path().string() +
                ": no chat template (looked for chat_template.jinja, and a 'chat_template' field in "
                "tokenizer_config.json and chat_template.json)");
  dir.write("tokenizer_config.json", "{not json");
  EXPECT_NE(error_of([&] {
              ChatTemplate::from_model_dir(dir.path());
            }).find((dir.path() / "tokenizer_config.json").string() + ": not valid JSON"),
            std::string::npos);
  dir.write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_EQ(error_of([&] { ChatTemplate::from_model_dir(dir.path()); }),
            (dir.path() / "tokenizer_config.json").string() +
                ": 'chat_template' must be a string or a list of {name, template}");
  dir.write("tokenizer_config.json",
            R"({"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "rag"}]})");
  EXPECT_EQ(error_of([&] { ChatTemplate::from_model_dir(dir.path()); }),
            (dir.path() / "tokenizer_config.json").string() +
                ": each entry of 'chat_template' needs a string 'name' and a string 'template'");
  dir.write("tokenizer_config.json",
            R"({"chat_template": [{"name": "a", "template": "x"}, {"name": "b", "template": "y"}]})");
  ChatTemplate chat = ChatTemplate::from_model_dir(dir.path());
  EXPECT_EQ(error_of([&] { render_chat(chat, hello()); }),
            "the model has several chat templates and none is named 'default'; choose one by name");
  dir.write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  EXPECT_EQ(error_of([&] { ChatTemplate::from_model_dir(dir.path()); }),
            "tokenizer_config.json:chat_template:1:7: expected an expression, found '%}'");
  EXPECT_EQ(error_of([&] { ChatTemplate::from_file(dir.path() / "missing.jinja"); }),
            "cannot open chat template file " + (dir.path() / "missing.jinja").string());
}

}  // namespace
}  // namespace qspec
