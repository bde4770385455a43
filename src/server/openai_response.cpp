#include "server/openai_response.h"

namespace qspec::server {

namespace {

using Json = nlohmann::json;

bool is_chat(const ResponseHead& head) {
  return head.endpoint == Endpoint::kChat;
}

Json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

Json chunk(const ResponseHead& head, Json choice, bool include_usage) {
  choice["index"] = 0;
  Json out = {{"id", head.id},
              {"object", is_chat(head) ? "chat.completion.chunk" : "text_completion"},
              {"created", head.created},
              {"model", head.model},
              {"choices", Json::array({std::move(choice)})}};
  if (include_usage) out["usage"] = nullptr;
  return out;
}

// null when empty, as vLLM leaves a part that never started.
Json text_or_null(const std::string& text) {
  return text.empty() ? Json(nullptr) : Json(text);
}

}  // namespace

Json full_response(const ResponseHead& head, const JobOutput& output, const Usage& usage,
                   const std::vector<TokenId>& prompt_ids) {
  Json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", output.finish_reason}};
  if (is_chat(head)) {
    Json message = {{"role", "assistant"}};
    message["reasoning_content"] = text_or_null(output.text.reasoning);
    message["content"] = head.reasoning ? text_or_null(output.text.content) : Json(output.text.content);
    message["tool_calls"] = Json::array();
    choice["message"] = std::move(message);
  } else {
    choice["text"] = output.text.content;
  }
  if (head.include_token_ids) choice["token_ids"] = output.tokens;
  Json out = {{"id", head.id},
              {"object", is_chat(head) ? "chat.completion" : "text_completion"},
              {"created", head.created},
              {"model", head.model},
              {"choices", Json::array({std::move(choice)})},
              {"usage", usage_json(usage)}};
  if (head.include_token_ids) out["prompt_token_ids"] = prompt_ids;
  return out;
}

Json role_chunk(const ResponseHead& head, bool include_usage) {
  return chunk(head,
               {{"delta", {{"role", "assistant"}, {"content", ""}}},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}},
               include_usage);
}

std::optional<Json> delta_chunk(const ResponseHead& head, const JobOutput& output, bool include_usage) {
  if (output.text.empty() && !(head.include_token_ids && !output.tokens.empty())) return std::nullopt;
  Json choice = {{"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (is_chat(head)) {
    Json delta = Json::object();
    if (!output.text.reasoning.empty()) delta["reasoning_content"] = output.text.reasoning;
    if (!output.text.content.empty()) delta["content"] = output.text.content;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = output.text.content;
  }
  if (head.include_token_ids) choice["token_ids"] = output.tokens;
  return chunk(head, std::move(choice), include_usage);
}

Json finish_chunk(const ResponseHead& head, const std::string& finish_reason, bool include_usage) {
  Json choice = {{"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (is_chat(head)) {
    choice["delta"] = Json::object();
  } else {
    choice["text"] = "";
  }
  return chunk(head, std::move(choice), include_usage);
}

Json usage_chunk(const ResponseHead& head, const Usage& usage) {
  return {{"id", head.id},
          {"object", is_chat(head) ? "chat.completion.chunk" : "text_completion"},
          {"created", head.created},
          {"model", head.model},
          {"choices", Json::array()},
          {"usage", usage_json(usage)}};
}

std::string sse_event(const Json& json) {
  return "data: " + json_text(json) + "\n\n";
}

std::string json_text(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace qspec::server
