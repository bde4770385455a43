#include "server/openai_request.h"

#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace qspec::server {

namespace {

using Json = nlohmann::ordered_json;

// Returns the field, or nullptr when it is absent or null (OpenAI treats null as "not given").
const Json* field(const Json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

bool boolean(const Json& value, const std::string& name) {
  if (!value.is_boolean()) bad_field(name, "expected a boolean, got {}", value.type_name());
  return value.get<bool>();
}

int64_t integer(const Json& value, const std::string& name, int64_t min, int64_t max) {
  if (!value.is_number_integer()) bad_field(name, "expected an integer, got {}", value.type_name());
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(max))
    bad_field(name, "expected an integer in [{}, {}], got {}", min, max, value.get<uint64_t>());
  const int64_t number = value.get<int64_t>();
  if (number < min || number > max)
    bad_field(name, "expected an integer in [{}, {}], got {}", min, max, number);
  return number;
}

double number(const Json& value, const std::string& name) {
  if (!value.is_number()) bad_field(name, "expected a number, got {}", value.type_name());
  const double result = value.get<double>();
  if (!std::isfinite(result)) bad_field(name, "expected a finite number");
  return result;
}

const std::string& string(const Json& value, const std::string& name) {
  if (!value.is_string()) bad_field(name, "expected a string, got {}", value.type_name());
  return value.get_ref<const std::string&>();
}

std::vector<TokenId> token_ids(const Json& value, const std::string& name) {
  std::vector<TokenId> ids;
  for (size_t i = 0; i < value.size(); ++i)
    ids.push_back(
        TokenId(integer(value[i], fmt::format("{}[{}]", name, i), 0, std::numeric_limits<TokenId>::max())));
  return ids;
}

// A field qspec does not implement: refused unless it has the value that asks for nothing.
void refuse_unless(const Json& body, const char* name, bool (*asks_nothing)(const Json&), const char* why) {
  const Json* value = field(body, name);
  if (value && !(asks_nothing && asks_nothing(*value))) bad_field(name, "{} is not supported", why);
}

bool is_false(const Json& v) {
  return v.is_boolean() && !v.get<bool>();
}
bool is_zero(const Json& v) {
  return v.is_number() && v.get<double>() == 0.0;
}
bool is_one(const Json& v) {
  return v.is_number() && v.get<double>() == 1.0;
}
bool is_empty(const Json& v) {
  return (v.is_array() || v.is_object()) && v.empty();
}
bool is_text_format(const Json& v) {
  return v.is_object() && v.size() == 1 && v.value("type", "") == "text";
}
bool is_no_tool_choice(const Json& v) {
  return v.is_string() && (v == "none" || v == "auto");
}
bool is_true(const Json& v) {
  return v.is_boolean() && v.get<bool>();
}

void refuse_unsupported(const Json& body, Endpoint endpoint) {
  refuse_unless(body, "n", is_one, "n other than 1 (one choice per request)");
  refuse_unless(body, "best_of", is_one, "best_of other than 1");
  refuse_unless(body, "logprobs", endpoint == Endpoint::kChat ? is_false : nullptr, "logprobs");
  refuse_unless(body, "top_logprobs", is_zero, "top_logprobs");
  refuse_unless(body, "prompt_logprobs", nullptr, "prompt_logprobs");
  refuse_unless(body, "echo", is_false, "echo");
  refuse_unless(body, "suffix", nullptr, "suffix");
  refuse_unless(body, "presence_penalty", is_zero, "presence_penalty");
  refuse_unless(body, "frequency_penalty", is_zero, "frequency_penalty");
  refuse_unless(body, "repetition_penalty", is_one, "repetition_penalty");
  refuse_unless(body, "min_p", is_zero, "min_p");
  refuse_unless(body, "min_tokens", is_zero, "min_tokens");
  refuse_unless(body, "logit_bias", is_empty, "logit_bias");
  refuse_unless(body, "tools", is_empty, "tools (tool calling)");
  refuse_unless(body, "tool_choice", is_no_tool_choice, "tool_choice");
  refuse_unless(body, "functions", is_empty, "functions (tool calling)");
  refuse_unless(body, "function_call", nullptr, "function_call (tool calling)");
  refuse_unless(body, "response_format", is_text_format, "response_format other than {\"type\": \"text\"}");
  refuse_unless(body, "use_beam_search", is_false, "beam search");
  refuse_unless(body, "include_stop_str_in_output", is_false, "include_stop_str_in_output");
  refuse_unless(body, "skip_special_tokens", is_true, "skip_special_tokens false");
  refuse_unless(body, "continue_final_message", is_false, "continue_final_message");
  refuse_unless(body, "chat_template", nullptr, "a request's own chat_template");
  for (const char* guided :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"})
    refuse_unless(body, guided, nullptr, "structured output");
}

void parse_prompt(const Json& body, OpenAiRequest& request) {
  const Json* prompt = field(body, "prompt");
  if (!prompt) bad_field("prompt", "required");
  const Json* one = prompt;
  // A list of one prompt (what batch clients send for a single one) is that prompt.
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
    one = &(*prompt)[0];
  if (one->is_string()) {
    request.prompt_text = one->get<std::string>();
    if (request.prompt_text->empty()) bad_field("prompt", "expected at least one token, got an empty string");
    return;
  }
  if (!one->is_array())
    bad_field("prompt", "expected a string or a list of token ids, got {}", prompt->type_name());
  for (const Json& item : *one)
    if (item.is_string() || item.is_array())
      bad_field("prompt", "a list of several prompts is not supported (one prompt per request)");
  request.prompt_ids = token_ids(*one, "prompt");
  if (request.prompt_ids.empty()) bad_field("prompt", "expected at least one token, got an empty list");
}

std::string text_of_content(const Json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad_field(name, "expected a string or a list of content parts, got {}", content.type_name());
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part_name = fmt::format("{}[{}]", name, i);
    const Json& part = content[i];
    if (!part.is_object()) bad_field(part_name, "expected a content part object, got {}", part.type_name());
    const Json* type = field(part, "type");
    if (!type || !type->is_string() || *type != "text")
      bad_field(part_name + ".type", "only \"text\" content parts are supported");
    const Json* part_text = field(part, "text");
    if (!part_text) bad_field(part_name + ".text", "required");
    if (i > 0) text += "\n";  // vLLM joins text parts with newlines
    text += string(*part_text, part_name + ".text");
  }
  return text;
}

void parse_messages(const Json& body, OpenAiRequest& request) {
  const Json* messages = field(body, "messages");
  if (!messages) bad_field("messages", "required");
  if (!messages->is_array() || messages->empty())
    bad_field("messages", "expected a non-empty list of messages, got {}",
              messages->is_array() ? "an empty list" : messages->type_name());
  request.messages = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string name = fmt::format("messages[{}]", i);
    const Json& message = (*messages)[i];
    if (!message.is_object()) bad_field(name, "expected an object, got {}", message.type_name());
    const Json* role = field(message, "role");
    if (!role) bad_field(name + ".role", "required");
    const std::string& role_name = string(*role, name + ".role");
    if (role_name != "system" && role_name != "developer" && role_name != "user" &&
        role_name != "assistant" && role_name != "tool")
      bad_field(name + ".role", "expected system, developer, user, assistant or tool, got '{}'", role_name);
    Json normalised = message;
    const Json* content = field(message, "content");
    normalised["content"] = content ? text_of_content(*content, name + ".content") : "";
    request.messages.push_back(std::move(normalised));
  }
  request.chat_options.add_generation_prompt = true;
  if (const Json* add = field(body, "add_generation_prompt"))
    request.chat_options.add_generation_prompt = boolean(*add, "add_generation_prompt");
  if (const Json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object())
      bad_field("chat_template_kwargs", "expected an object, got {}", kwargs->type_name());
    for (const auto& [key, value] : kwargs->items()) {
      if (key == "enable_thinking") {
        request.chat_options.enable_thinking = boolean(value, "chat_template_kwargs.enable_thinking");
      } else {
        request.chat_options.variables[key] = value;
      }
    }
  }
}

void parse_stop(const Json& body, OpenAiRequest& request) {
  if (const Json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      request.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i)
        request.stop.push_back(string((*stop)[i], fmt::format("stop[{}]", i)));
    } else {
      bad_field("stop", "expected a string or a list of strings, got {}", stop->type_name());
    }
    for (const std::string& text : request.stop)
      if (text.empty()) bad_field("stop", "a stop string must not be empty");
  }
  if (const Json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array())
      bad_field("stop_token_ids", "expected a list of token ids, got {}", ids->type_name());
    request.stop_token_ids = token_ids(*ids, "stop_token_ids");
  }
}

void parse_sampling(const Json& body, OpenAiRequest& request) {
  // OpenAI's defaults: temperature 1, top_p 1; no top_k.
  request.sampling.temperature = 1.0f;
  if (const Json* value = field(body, "temperature")) {
    const double temperature = number(*value, "temperature");
    if (temperature < 0) bad_field("temperature", "expected a number >= 0, got {}", temperature);
    request.sampling.temperature = float(temperature);
  }
  if (const Json* value = field(body, "top_p")) {
    const double top_p = number(*value, "top_p");
    if (!(top_p > 0 && top_p <= 1)) bad_field("top_p", "expected a number in (0, 1], got {}", top_p);
    request.sampling.top_p = float(top_p);
  }
  if (const Json* value = field(body, "top_k")) {
    // vLLM's -1 and 0 both mean "all tokens".
    request.sampling.top_k =
        int(std::max<int64_t>(0, integer(*value, "top_k", -1, std::numeric_limits<int>::max())));
  }
  if (const Json* value = field(body, "seed")) {
    if (!value->is_number_integer() || (!value->is_number_unsigned() && value->get<int64_t>() < 0))
      bad_field("seed", "expected an integer >= 0, got {}", value->dump());
    request.sampling.seed = value->get<uint64_t>();
    request.seeded = true;
  }
}

}  // namespace

nlohmann::ordered_json parse_json_body(std::string_view body) {
  Json parsed;
  try {
    // The callback sees each value's depth before the value is built.
    parsed = Json::parse(body, [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth)
        throw ApiError(400, fmt::format("request body: JSON nested deeper than {} levels", kMaxJsonDepth));
      return true;
    });
  } catch (const nlohmann::json::parse_error& error) {
    throw ApiError(400, fmt::format("request body: malformed JSON: {}", error.what()));
  }
  if (!parsed.is_object())
    throw ApiError(400, fmt::format("request body: expected a JSON object, got {}", parsed.type_name()));
  return parsed;
}

OpenAiRequest parse_openai_request(const Json& body, Endpoint endpoint) {
  OpenAiRequest request;
  request.endpoint = endpoint;
  refuse_unsupported(body, endpoint);
  if (const Json* model = field(body, "model")) request.model = string(*model, "model");
  if (endpoint == Endpoint::kChat) {
    parse_messages(body, request);
  } else {
    parse_prompt(body, request);
  }
  // Chat's newer name wins when both are given, as in vLLM.
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (const Json* value = field(body, name))
      request.max_tokens = int(integer(*value, name, 1, std::numeric_limits<int>::max()));
  parse_sampling(body, request);
  parse_stop(body, request);
  if (const Json* value = field(body, "ignore_eos")) request.ignore_eos = boolean(*value, "ignore_eos");
  if (const Json* value = field(body, "return_token_ids"))
    request.return_token_ids = boolean(*value, "return_token_ids");
  if (const Json* value = field(body, "stream")) request.stream = boolean(*value, "stream");
  if (const Json* options = field(body, "stream_options")) {
    if (!request.stream) bad_field("stream_options", "only allowed with stream: true");
    if (!options->is_object())
      bad_field("stream_options", "expected an object, got {}", options->type_name());
    if (const Json* usage = field(*options, "include_usage"))
      request.include_usage = boolean(*usage, "stream_options.include_usage");
  }
  return request;
}

}  // namespace qspec::server
