#include "cli/chat_input.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace qspec::cli {

namespace {

nlohmann::ordered_json parse_json_file(const std::string& path) {
  // A directory opens as a stream that reads nothing.
  std::ifstream file(path, std::ios::binary);
  if (!file || std::filesystem::is_directory(path)) fail("--chat {}: cannot open as a file", path);
  std::stringstream contents;
  contents << file.rdbuf();
  try {
    return nlohmann::ordered_json::parse(contents.str());
  } catch (const nlohmann::json::parse_error& error) {
    fail("--chat {}: malformed JSON: {}", path, error.what());
  }
}

void check_messages(const nlohmann::ordered_json& messages, const std::string& path) {
  if (!messages.is_array())
    fail("--chat {}: expected a JSON array of messages or an object with \"messages\", got {}", path,
         messages.type_name());
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
      fail("--chat {}: message {} is not an object with a string \"role\"", path, i);
  }
}

}  // namespace

ChatInput read_chat_input(const std::string& path) {
  const nlohmann::ordered_json json = parse_json_file(path);
  ChatInput input;
  if (json.is_object()) {
    if (!json.contains("messages")) fail("--chat {}: the object has no \"messages\"", path);
    input.messages = json["messages"];
    if (json.contains("tools")) input.tools = json["tools"];
    if (!input.tools.is_null() && !input.tools.is_array())
      fail("--chat {}: \"tools\" must be a list of tool schemas or null, got {}", path,
           input.tools.type_name());
  } else {
    input.messages = json;
  }
  check_messages(input.messages, path);
  return input;
}

ChatOptions cli_chat_options(bool no_thinking, const nlohmann::ordered_json& tools) {
  ChatOptions options;
  options.tools = tools;
  options.add_generation_prompt = true;
  if (no_thinking) options.enable_thinking = false;
  return options;
}

}  // namespace qspec::cli
