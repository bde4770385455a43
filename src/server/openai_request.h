// An OpenAI /v1/completions or /v1/chat/completions request body, checked field by field: a wrong type or
// value is an ApiError 400 naming the field, a field asking for something qspec does not do (n > 1,
// logprobs, tools, response_format, penalties, ...) is a 400 naming it rather than being ignored, and fields
// that change nothing (user, n = 1, ...) or that qspec does not know are ignored, as vLLM does.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/token_id.h"

namespace qspec::server {

enum class Endpoint { kCompletions, kChat };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty when not given
  // Completions: the prompt as text, or as token ids (prompt_text empty).
  std::optional<std::string> prompt_text;
  std::vector<TokenId> prompt_ids;
  // Chat: the messages (content normalised to a string) and the template options.
  nlohmann::ordered_json messages;
  ChatOptions chat_options;
  std::optional<int> max_tokens;  // not given: 16 for completions (OpenAI), the rest of the context for chat
  SamplingParams sampling;
  bool seeded = false;  // `seed` was given; otherwise each request draws one
  std::vector<std::string> stop;
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;
  bool return_token_ids = false;  // vLLM's extension: the prompt's and the completion's ids in the response
};

// The largest JSON nesting a request body may have; deeper bodies are refused before they are built.
constexpr int kMaxJsonDepth = 64;

// Parses a request body (ordered, as chat templates see key order). Throws ApiError 400 for malformed JSON,
// invalid UTF-8, nesting deeper than kMaxJsonDepth, or a body that is not an object.
nlohmann::ordered_json parse_json_body(std::string_view body);

// Throws ApiError 400 naming the first bad field.
OpenAiRequest parse_openai_request(const nlohmann::ordered_json& body, Endpoint endpoint);

}  // namespace qspec::server
