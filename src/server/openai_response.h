// OpenAI response bodies for /v1/completions and /v1/chat/completions: the whole response, and the chunks
// of a stream (server-sent events, ending with "data: [DONE]").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/generation_job.h"
#include "server/openai_request.h"

namespace qspec::server {

// What every response and chunk of one request repeats.
struct ResponseHead {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool reasoning = false;  // a chat reply with a reasoning part (thinking on)
  bool include_token_ids = false;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// The non-streamed response for `output` (finished).
nlohmann::json full_response(const ResponseHead& head, const JobOutput& output, const Usage& usage,
                             const std::vector<TokenId>& prompt_ids);

// The first chunk of a chat stream: the assistant's role.
nlohmann::json role_chunk(const ResponseHead& head, bool include_usage);
// A chunk with new text (nullopt when `output` adds nothing to send). `include_usage`: the chunk carries
// "usage": null, as OpenAI's do when usage comes at the end.
std::optional<nlohmann::json> delta_chunk(const ResponseHead& head, const JobOutput& output,
                                          bool include_usage);
// The chunk that carries finish_reason.
nlohmann::json finish_chunk(const ResponseHead& head, const std::string& finish_reason, bool include_usage);
// The last chunk when stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk(const ResponseHead& head, const Usage& usage);

// One server-sent event carrying `json`.
std::string sse_event(const nlohmann::json& json);
constexpr const char* kSseDone = "data: [DONE]\n\n";

// JSON text; invalid UTF-8 (which the server never produces on purpose) becomes U+FFFD instead of throwing.
std::string json_text(const nlohmann::json& json);

}  // namespace qspec::server
