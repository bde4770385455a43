// Chat rendering as HF's apply_chat_template does it: a model's Jinja chat template rendered with the
// messages, tools, add_generation_prompt and other template variables.
//
//   qspec::ChatTemplate chat = qspec::ChatTemplate::from_model_dir("models/qwen3.5-4b");
//   qspec::ChatOptions options;
//   options.add_generation_prompt = true;
//   options.enable_thinking = false;
//   std::string prompt = qspec::render_chat(chat, messages, options);
//
// Messages and tools are nlohmann::ordered_json (parse request bodies with ordered_json::parse) because
// key order is visible in the output: `tojson` of tool schemas and `arguments|items` keep insertion order,
// as Python dicts do.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_template.h"

namespace qspec {

struct ChatOptions {
  // A list of tool schemas, or null for none (the template then sees `tools` as None, like HF).
  nlohmann::ordered_json tools = nullptr;
  // RAG documents, or null (HF passes `documents`, usually None).
  nlohmann::ordered_json documents = nullptr;
  bool add_generation_prompt = false;
  // nullopt leaves `enable_thinking` undefined in the template (HF passes it only when given).
  std::optional<bool> enable_thinking;
  // Further template variables (an object): the tokenizer's special tokens (bos_token, eos_token, ...) as HF
  // passes them (from_model_dir reads those itself), and kwargs such as date_string or add_vision_id. They
  // override the variables above.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  // Which of several named templates to use; nullopt picks "tool_use" when tools are given, else "default".
  std::optional<std::string> template_name;
};

class ChatTemplate {
 public:
  // One unnamed template from source text; `name` starts error messages.
  ChatTemplate(std::string_view source, std::string name);

  // Loads a model's template as transformers does: chat_template.jinja, else the `chat_template` of
  // tokenizer_config.json (a string, or a list of {name, template}), else chat_template.json. The named
  // special tokens of tokenizer_config.json (bos_token, eos_token, ...) become template variables, as
  // apply_chat_template passes them.
  static ChatTemplate from_model_dir(const std::filesystem::path& directory);
  static ChatTemplate from_file(const std::filesystem::path& path);

  // HF's choice among named templates (see ChatOptions::template_name).
  const jinja::Template& select(const ChatOptions& options) const;

  // Special tokens passed to every render (a JSON object of strings).
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  explicit ChatTemplate(std::vector<std::pair<std::string, jinja::Template>> named);

  std::vector<std::pair<std::string, jinja::Template>> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

// Renders `messages` (a JSON array of message objects). Throws qspec::Error with the template location on
// any template error, including the template's own raise_exception (e.g. "No user query found in messages.").
std::string render_chat(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                        const ChatOptions& options = {});

}  // namespace qspec
