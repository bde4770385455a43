// A conversation given on the command line (a messages file) and how the CLI renders conversations with a
// model's chat template: always with the generation prompt, thinking left to the template unless turned off.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "engine/model_tokenizer.h"
#include "tokenizer/chat_template.h"

namespace qspec::cli {

struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;  // a list of tool schemas, or null
};

// Reads MESSAGES.json: a JSON array of message objects, or an object with "messages" and optional "tools".
// Throws qspec::Error naming the file when it cannot be read, is not JSON or does not have that shape.
ChatInput read_chat_input(const std::string& path);

// The template options of every CLI render: add_generation_prompt, and enable_thinking false with
// --no-thinking (otherwise undefined, as HF leaves it, so the template's default applies).
ChatOptions cli_chat_options(bool no_thinking, const nlohmann::ordered_json& tools = nullptr);

}  // namespace qspec::cli
