#include "tokenizer/chat_template.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace qspec {

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot open chat template file {}", path.string());
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

nlohmann::ordered_json read_json(const std::filesystem::path& path) {
  try {
    return nlohmann::ordered_json::parse(read_text(path));
  } catch (const nlohmann::json::exception& error) {
    fail("{}: not valid JSON: {}", path.string(), error.what());
  }
}

// The `chat_template` field of tokenizer_config.json or chat_template.json: a string or [{name, template}].
std::vector<std::pair<std::string, jinja::Template>> templates_from_field(const nlohmann::ordered_json& field,
                                                                          const std::filesystem::path& path) {
  std::string file_name = path.filename().string();
  std::vector<std::pair<std::string, jinja::Template>> named;
  if (field.is_string()) {
    named.emplace_back("default", jinja::Template(field.get<std::string>(), file_name + ":chat_template"));
    return named;
  }
  if (!field.is_array())
    fail("{}: 'chat_template' must be a string or a list of {{name, template}}", path.string());
  for (const auto& entry : field) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      fail("{}: each entry of 'chat_template' needs a string 'name' and a string 'template'", path.string());
    }
    std::string name = entry["name"].get<std::string>();
    named.emplace_back(name, jinja::Template(entry["template"].get<std::string>(),
                                             file_name + ":chat_template[" + name + "]"));
  }
  if (named.empty()) fail("{}: 'chat_template' is an empty list", path.string());
  return named;
}

// transformers' special_tokens_map: the named special tokens that are set, as strings.
nlohmann::ordered_json special_tokens_of(const nlohmann::ordered_json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  if (!config.is_object()) return tokens;
  for (const char* name :
       {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(name)) continue;
    const auto& token = config[name];
    if (token.is_string()) {
      tokens[name] = token;
    } else if (token.is_object() && token.contains("content") && token["content"].is_string()) {
      tokens[name] = token["content"];  // a serialized AddedToken
    }
  }
  return tokens;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, std::string name) {
  templates_.emplace_back("default", jinja::Template(source, std::move(name)));
}

ChatTemplate::ChatTemplate(std::vector<std::pair<std::string, jinja::Template>> named)
    : templates_(std::move(named)) {}

ChatTemplate ChatTemplate::from_file(const std::filesystem::path& path) {
  return ChatTemplate(read_text(path), path.filename().string());
}

ChatTemplate ChatTemplate::from_model_dir(const std::filesystem::path& directory) {
  std::filesystem::path tokenizer_config_path = directory / "tokenizer_config.json";
  nlohmann::ordered_json tokenizer_config = std::filesystem::exists(tokenizer_config_path)
                                                ? read_json(tokenizer_config_path)
                                                : nlohmann::ordered_json();
  std::optional<ChatTemplate> chat;
  std::filesystem::path jinja_file = directory / "chat_template.jinja";
  std::filesystem::path processor_config_path = directory / "chat_template.json";
  if (std::filesystem::exists(jinja_file)) {
    chat = from_file(jinja_file);
  } else if (tokenizer_config.is_object() && tokenizer_config.contains("chat_template")) {
    chat = ChatTemplate(templates_from_field(tokenizer_config["chat_template"], tokenizer_config_path));
  } else if (std::filesystem::exists(processor_config_path)) {
    nlohmann::ordered_json processor_config = read_json(processor_config_path);
    if (processor_config.is_object() && processor_config.contains("chat_template")) {
      chat = ChatTemplate(templates_from_field(processor_config["chat_template"], processor_config_path));
    }
  }
  if (!chat) {
    fail(
        "{}: no chat template (looked for chat_template.jinja, and a 'chat_template' field in "
        "tokenizer_config.json and chat_template.json)",
        directory.string());
  }
  chat->special_tokens_ = special_tokens_of(tokenizer_config);
  return std::move(*chat);
}

const jinja::Template& ChatTemplate::select(const ChatOptions& options) const {
  auto find = [&](std::string_view name) -> const jinja::Template* {
    for (const auto& [template_name, parsed] : templates_) {
      if (template_name == name) return &parsed;
    }
    return nullptr;
  };
  if (options.template_name) {
    if (const jinja::Template* chosen = find(*options.template_name)) return *chosen;
    fail("chat template '{}' does not exist", *options.template_name);
  }
  if (templates_.size() == 1) return templates_.front().second;
  if (!options.tools.is_null()) {
    if (const jinja::Template* tool_use = find("tool_use")) return *tool_use;
  }
  if (const jinja::Template* fallback = find("default")) return *fallback;
  fail("the model has several chat templates and none is named 'default'; choose one by name");
}

std::string render_chat(const ChatTemplate& chat_template, const nlohmann::ordered_json& messages,
                        const ChatOptions& options) {
  if (!messages.is_array()) fail("chat messages must be a JSON array, got {}", messages.type_name());
  if (!options.variables.is_object()) fail("chat template variables must be a JSON object");
  nlohmann::ordered_json variables = {
      {"messages", messages},
      {"tools", options.tools},
      {"documents", options.documents},
      {"add_generation_prompt", options.add_generation_prompt},
  };
  for (const auto& [key, value] : chat_template.special_tokens().items()) variables[key] = value;
  if (options.enable_thinking) variables["enable_thinking"] = *options.enable_thinking;
  for (const auto& [key, value] : options.variables.items()) variables[key] = value;
  return chat_template.select(options).render(variables);
}

}  // namespace qspec
