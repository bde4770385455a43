#include "server/http/openai_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/scheduler.h"
#include "server/api_error.h"
#include "server/generation_job.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/server_metrics.h"

namespace qspec::server {

namespace {

using Json = nlohmann::json;

// Bodies larger than this are refused (413) before they are read into memory.
constexpr size_t kMaxBodyBytes = size_t(8) << 20;
// How often a waiting HTTP thread checks that its client is still connected: a client that leaves is noticed
// within this time, so its generation stops at the next step after it.
constexpr auto kClientCheckInterval = std::chrono::milliseconds(5);
// HTTP threads beyond one per waiting request: the running request, health probes, metrics scrapes and idle
// keep-alive connections.
constexpr size_t kSpareHttpThreads = 32;

enum class Readiness { kLoading, kReady, kDraining };

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string random_hex_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}", rng());
}

void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& error) {
  if (error.status() == 429 || error.status() == 503) res.set_header("Retry-After", "1");
  send_json(res, error.status(), error.body());
}

// Writes `text` to the client; false when the client is gone.
bool write(httplib::DataSink& sink, const std::string& text) {
  return sink.is_writable() && sink.write(text.data(), text.size());
}

// Compares without an early exit, so that response time does not reveal how much of a key was right.
bool same_key(const std::string& given, const std::string& expected) {
  unsigned char difference = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) difference |= uint8_t(given[i] ^ expected[i % expected.size()]);
  return difference == 0;
}

}  // namespace

class OpenAiServer::Impl {
 public:
  explicit Impl(ServerOptions options)
      : options_(std::move(options)),
        model_name_(options_.served_model_name.empty() ? options_.model.model_dir
                                                       : options_.served_model_name),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()),
        scheduler_(options_.max_queue) {
    configure();
  }

  ~Impl() { stop_listening(); }

  void start() {
    if (options_.port == 0) {
      port_ = http_.bind_to_any_port(options_.host);
    } else if (http_.bind_to_port(options_.host, options_.port)) {
      port_ = options_.port;
    }
    if (port_ <= 0) fail("--host {} --port {}: cannot listen there", options_.host, options_.port);
    listener_ = std::thread([this] {
      http_.listen_after_bind();
      listener_done_ = true;
    });
    fmt::print(stderr, "qspec serve: listening on http://{}:{} (loading the model)\n", options_.host, port_);
  }

  int port() const { return port_; }

  void load_model() {
    model_ = std::make_unique<ServedModel>(options_.model);
    readiness_ = Readiness::kReady;
    fmt::print(stderr, "qspec serve: ready, model '{}' ({} positions of context){}\n", model_name_,
               model_->max_model_len(),
               model_->speculative() ? fmt::format(", drafter {}", options_.model.draft_model_dir) : "");
  }

  void drain_and_stop() {
    readiness_ = Readiness::kDraining;
    fmt::print(stderr, "qspec serve: draining ({} running, {} waiting)\n", scheduler_.running(),
               scheduler_.waiting());
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(options_.drain_timeout_seconds));
    const bool finished = scheduler_.close_and_wait(deadline) && wait_for_responses(deadline);
    if (!finished) {
      fmt::print(stderr, "qspec serve: drain timeout; cancelling what is left\n");
      abort_all_ = true;
      wait_for_responses(Clock::now() + std::chrono::seconds(2));
    }
    stop_listening();
    fmt::print(stderr, "qspec serve: stopped\n");
  }

 private:
  void configure() {
    const size_t threads = options_.max_queue + kSpareHttpThreads;
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_.set_payload_max_length(kMaxBodyBytes);
    http_.set_tcp_nodelay(true);  // each streamed token leaves at once
    // Idle keep-alive connections hold an HTTP thread, and shutdown waits for them: 2 s rather than 5.
    http_.set_keep_alive_timeout(2);
    http_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      // Errors httplib answers itself (no route, body too large, unreadable request) in OpenAI's shape.
      if (!res.body.empty() || res.is_chunked_content_provider_) return;
      const std::string message = res.status == 404   ? "no such endpoint"
                                  : res.status == 405 ? "method not allowed"
                                  : res.status == 413
                                      ? fmt::format("request body larger than {} bytes", kMaxBodyBytes)
                                      : fmt::format("malformed HTTP request (status {})", res.status);
      res.set_content(json_text(error_body(res.status, message)), "application/json");
    });
    http_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
          std::string message = "internal error";
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            message = e.what();
          }
          send_json(res, 500, error_body(500, message));
        });
    http_.set_logger([this](const httplib::Request&, const httplib::Response& res) {
      metrics_.count_response(res.status);
    });

    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) { answer_health(res); });
    http_.Get("/ping", [this](const httplib::Request&, httplib::Response& res) { answer_health(res); });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.render(model_name_, gauges()), "text/plain; version=0.0.4; charset=utf-8");
    });
    route_get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { answer_models(res); });
    route_post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      answer_generation(req, res, Endpoint::kCompletions);
    });
    route_post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      answer_generation(req, res, Endpoint::kChat);
    });
    // SageMaker's contract: {"messages"} is a chat, anything else a raw completion.
    route_post("/invocations", [this](const httplib::Request& req, httplib::Response& res) {
      const bool chat = parse_json_body(req.body).contains("messages");
      answer_generation(req, res, chat ? Endpoint::kChat : Endpoint::kCompletions);
    });
    route_post("/tokenize",
               [this](const httplib::Request& req, httplib::Response& res) { answer_tokenize(req, res); });
    route_post("/detokenize",
               [this](const httplib::Request& req, httplib::Response& res) { answer_detokenize(req, res); });
  }

  // A route whose errors (ApiError, qspec::Error from the tokenizer or the chat template) become OpenAI error
  // responses; /v1 routes check the API key first.
  template <typename Handler>
  auto guarded(const std::string& path, Handler handler) {
    return [this, path, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        if (path.starts_with("/v1/")) authenticate(req);
        handler(req, res);
      } catch (const ApiError& error) {
        send_error(res, error);
      } catch (const Error& error) {
        send_error(res, ApiError(400, error.what()));
      }
    };
  }
  template <typename Handler>
  void route_get(const std::string& path, Handler handler) {
    http_.Get(path, guarded(path, handler));
  }
  template <typename Handler>
  void route_post(const std::string& path, Handler handler) {
    http_.Post(path, guarded(path, handler));
  }

  void authenticate(const httplib::Request& req) const {
    if (options_.api_key.empty()) return;
    const std::string header = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    if (!header.starts_with(bearer) || !same_key(header.substr(bearer.size()), options_.api_key))
      throw ApiError(401, "missing or wrong API key (send \"Authorization: Bearer KEY\")");
  }

  void require_ready() const {
    switch (readiness_.load()) {
      case Readiness::kLoading:
        throw ApiError(503, "the model is still loading");
      case Readiness::kDraining:
        throw ApiError(503, "the server is shutting down");
      case Readiness::kReady:
        return;
    }
  }

  void answer_health(httplib::Response& res) const {
    switch (readiness_.load()) {
      case Readiness::kLoading:
        return send_error(res, ApiError(503, "loading"));
      case Readiness::kDraining:
        return send_error(res, ApiError(503, "draining"));
      case Readiness::kReady:
        return send_json(res, 200, {{"status", "ok"}});
    }
  }

  EngineGauges gauges() const {
    EngineGauges gauges;
    gauges.running = scheduler_.running();
    gauges.waiting = scheduler_.waiting();
    if (readiness_ != Readiness::kLoading)
      gauges.kv_cache_usage = double(positions_in_use_.load()) / model_->max_model_len();
    return gauges;
  }

  void answer_models(httplib::Response& res) const {
    require_ready();
    const Json model = {{"id", model_name_},
                        {"object", "model"},
                        {"created", created_},
                        {"owned_by", "qspec"},
                        {"root", options_.model.model_dir},
                        {"parent", nullptr},
                        {"max_model_len", model_->max_model_len()}};
    send_json(res, 200, {{"object", "list"}, {"data", Json::array({model})}});
  }

  void check_model(const std::string& name) const {
    if (!name.empty() && name != model_name_)
      throw ApiError(
          404, fmt::format("The model `{}` does not exist (this server serves `{}`)", name, model_name_),
          "model");
  }

  const Tokenizer& tokenizer(const char* param) const {
    if (!model_->tokenizer())
      bad_field(
          param,
          "this model has no tokenizer: send token ids and no stop strings, or serve it with --tokenizer");
    return model_->tokenizer()->tokenizer;
  }

  void check_ids(const std::vector<TokenId>& ids, const char* param) const {
    for (const TokenId id : ids)
      if (id >= model_->config().vocab_size)
        bad_field(param, "token id {} outside the vocabulary [0, {})", id, model_->config().vocab_size);
  }

  std::vector<TokenId> chat_prompt(const OpenAiRequest& request) const {
    const ChatTemplate* chat_template = model_->chat_template();
    if (!chat_template) bad_field("messages", "this model cannot chat: {}", model_->chat_template_error());
    return tokenizer("messages").encode(render_chat(*chat_template, request.messages, request.chat_options));
  }

  JobSpec job_spec(const OpenAiRequest& request, const std::string& id) const {
    JobSpec spec;
    spec.id = id;
    spec.streamed = request.stream;
    const bool chat = request.endpoint == Endpoint::kChat;
    const char* prompt_field = chat ? "messages" : "prompt";
    if (chat) {
      spec.prompt = chat_prompt(request);
      spec.options.stop_ids.push_back(end_of_turn_id(*model_->tokenizer()));
      spec.split_reasoning = true;
      spec.in_reasoning = request.chat_options.enable_thinking != false;
    } else if (request.prompt_text) {
      spec.prompt = tokenizer("prompt").encode(*request.prompt_text);
    } else {
      spec.prompt = request.prompt_ids;
    }
    check_ids(spec.prompt, prompt_field);
    if (spec.prompt.empty()) bad_field(prompt_field, "the prompt encodes to no tokens");
    const int64_t context = model_->max_model_len();
    const int64_t prompt_tokens = int64_t(spec.prompt.size());
    const int64_t max_tokens = request.max_tokens ? *request.max_tokens : chat ? context - prompt_tokens : 16;
    if (prompt_tokens + max_tokens > context || max_tokens < 1)
      throw ApiError(
          400,
          fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                      "tokens ({} in the {}, {} in the completion). Please reduce the {} or max_tokens.",
                      context, prompt_tokens + max_tokens, prompt_tokens, prompt_field, max_tokens,
                      prompt_field),
          request.max_tokens ? "max_tokens" : prompt_field);
    spec.options.max_tokens = int(max_tokens);
    spec.options.sampling = request.sampling;
    if (!request.seeded) spec.options.sampling.seed = std::random_device{}();
    spec.options.ignore_eos = request.ignore_eos;
    check_ids(request.stop_token_ids, "stop_token_ids");
    spec.options.stop_ids.insert(spec.options.stop_ids.end(), request.stop_token_ids.begin(),
                                 request.stop_token_ids.end());
    if (!request.stop.empty()) tokenizer("stop");
    spec.stop_strings = request.stop;
    return spec;
  }

  void answer_generation(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    require_ready();
    const OpenAiRequest request = parse_openai_request(parse_json_body(req.body), endpoint);
    check_model(request.model);
    const std::string request_id =
        req.has_header("X-Request-Id") ? req.get_header_value("X-Request-Id") : random_hex_id();
    ResponseHead head;
    head.endpoint = endpoint;
    head.id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + request_id;
    head.created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    head.model = model_name_;
    head.reasoning = endpoint == Endpoint::kChat && request.chat_options.enable_thinking != false;
    head.include_token_ids = request.return_token_ids;
    auto job = std::make_shared<GenerationJob>(job_spec(request, head.id), abort_all_);

    const Scheduler::Admission admission = scheduler_.submit([this, job, endpoint] {
      job->run(*model_, positions_in_use_);
      finished(*job, endpoint);
    });
    if (admission == Scheduler::Admission::kQueueFull)
      throw ApiError(429,
                     fmt::format("the queue is full ({} requests waiting); retry later", options_.max_queue));
    if (admission == Scheduler::Admission::kClosed) throw ApiError(503, "the server is shutting down");

    res.set_header("X-Request-Id", request_id);
    ++open_responses_;
    const auto release = [this, job](bool success) {
      if (!success) job->cancel();
      --open_responses_;
    };
    if (request.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [job, head, include_usage = request.include_usage](size_t, httplib::DataSink& sink) {
            return stream(*job, head, include_usage, sink);
          },
          release);
    } else {
      res.set_chunked_content_provider(
          "application/json",
          [job, head](size_t, httplib::DataSink& sink) { return respond_when_done(*job, head, sink); },
          release);
    }
  }

  // The whole response once the job is done; the client's connection is watched meanwhile.
  static bool respond_when_done(GenerationJob& job, const ResponseHead& head, httplib::DataSink& sink) {
    for (;;) {
      const JobOutput output = job.take(kClientCheckInterval);
      if (!sink.is_writable()) return false;
      if (output.finished) break;
    }
    const JobOutput output = job.total();
    const Json body = output.error.empty()
                          ? full_response(head, output, usage_of(job, output), job.spec().prompt)
                          : error_body(500, output.error);
    if (!write(sink, json_text(body))) return false;
    sink.done();
    return true;
  }

  // Server-sent events as the text arrives.
  static bool stream(GenerationJob& job, const ResponseHead& head, bool include_usage,
                     httplib::DataSink& sink) {
    if (head.endpoint == Endpoint::kChat && !write(sink, sse_event(role_chunk(head, include_usage))))
      return false;
    for (;;) {
      const JobOutput output = job.take(kClientCheckInterval);
      if (!sink.is_writable()) return false;
      if (const auto chunk = delta_chunk(head, output, include_usage);
          chunk && !write(sink, sse_event(*chunk)))
        return false;
      if (output.finished) {
        std::string tail;
        if (output.error.empty()) {
          tail = sse_event(finish_chunk(head, output.finish_reason, include_usage));
          if (include_usage) tail += sse_event(usage_chunk(head, usage_of(job, job.total())));
        } else {
          tail = sse_event(error_body(500, output.error));
        }
        if (!write(sink, tail + kSseDone)) return false;
        sink.done();
        return true;
      }
    }
  }

  static Usage usage_of(const GenerationJob& job, const JobOutput& total) {
    return {int64_t(job.spec().prompt.size()), int64_t(total.tokens.size())};
  }

  // On the engine thread when a job ends: metrics and the access log line.
  void finished(const GenerationJob& job, Endpoint endpoint) {
    const JobTimes times = job.times();
    const JobOutput output = job.total();
    FinishedRequest record;
    record.prompt_tokens = int64_t(job.spec().prompt.size());
    record.generation_tokens = int64_t(output.tokens.size());
    record.finish_reason = output.finish_reason;
    record.queue_seconds = seconds_between(times.arrival, times.started);
    if (times.has_first_token) record.ttft_seconds = seconds_between(times.arrival, times.first_token);
    record.e2e_seconds = seconds_between(times.arrival, times.finished);
    record.draft_tokens = output.draft_tokens;
    record.accepted_tokens = output.accepted_tokens;
    metrics_.record(record);
    if (options_.quiet) return;
    const Json line = {
        {"request_id", job.spec().id},
        {"endpoint", endpoint == Endpoint::kChat ? "chat" : "completions"},
        {"prompt_tokens", record.prompt_tokens},
        {"completion_tokens", record.generation_tokens},
        {"finish_reason", record.finish_reason},
        {"queue_ms", record.queue_seconds * 1e3},
        {"ttft_ms", record.ttft_seconds >= 0 ? Json(record.ttft_seconds * 1e3) : Json(nullptr)},
        {"e2e_ms", record.e2e_seconds * 1e3},
        // The engine's own time for the request (generate() from start to end, and to the first token): what
        // the server adds is the client's latency minus these (bench/server_bench.py).
        {"engine_ms", seconds_between(times.started, times.finished) * 1e3},
        {"engine_ttft_ms", times.has_first_token
                               ? Json(seconds_between(times.started, times.first_token) * 1e3)
                               : Json(nullptr)},
        {"draft_tokens", record.draft_tokens},
        {"accepted_tokens", record.accepted_tokens},
        {"acceptance", record.draft_tokens > 0
                           ? Json(double(record.accepted_tokens) / double(record.draft_tokens))
                           : Json(nullptr)}};
    fmt::print(stderr, "{}{}\n", output.error.empty() ? "" : "error: " + output.error + " ", json_text(line));
  }

  void answer_tokenize(const httplib::Request& req, httplib::Response& res) {
    require_ready();
    const auto body = parse_json_body(req.body);
    if (body.contains("model") && body["model"].is_string()) check_model(body["model"]);
    std::vector<TokenId> ids;
    if (body.contains("messages")) {
      ids = chat_prompt(parse_openai_request(body, Endpoint::kChat));
    } else {
      const auto prompt = body.find("prompt");
      if (prompt == body.end() || !prompt->is_string())
        bad_field("prompt", "expected a string (or give messages)");
      ids = tokenizer("prompt").encode(prompt->get<std::string>());
    }
    send_json(res, 200, {{"count", ids.size()}, {"max_model_len", model_->max_model_len()}, {"tokens", ids}});
  }

  void answer_detokenize(const httplib::Request& req, httplib::Response& res) {
    require_ready();
    const auto body = parse_json_body(req.body);
    if (body.contains("model") && body["model"].is_string()) check_model(body["model"]);
    const auto tokens = body.find("tokens");
    if (tokens == body.end() || !tokens->is_array()) bad_field("tokens", "expected a list of token ids");
    std::vector<TokenId> ids;
    for (size_t i = 0; i < tokens->size(); ++i) {
      const auto& id = (*tokens)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<TokenId>::max())
        bad_field(fmt::format("tokens[{}]", i), "expected a token id");
      ids.push_back(id.get<TokenId>());
    }
    const Tokenizer& text = tokenizer("tokens");
    for (size_t i = 0; i < ids.size(); ++i)
      if (!text.has_token(ids[i])) bad_field(fmt::format("tokens[{}]", i), "{} is no token", ids[i]);
    send_json(res, 200, {{"prompt", text.decode(ids)}});
  }

  bool wait_for_responses(Clock::time_point deadline) const {
    while (open_responses_ > 0) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  void stop_listening() {
    if (!listener_.joinable()) return;
    // httplib's stop() acts only on a running server: wait until the listener runs (or has given up), so that
    // a stop right after start (a model that fails to load at once) cannot leave it listening forever.
    while (!http_.is_running() && !listener_done_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http_.stop();
    listener_.join();
  }

  const ServerOptions options_;
  const std::string model_name_;
  const int64_t created_;
  std::unique_ptr<ServedModel> model_;  // set once, before readiness turns kReady
  std::atomic<Readiness> readiness_{Readiness::kLoading};
  std::atomic<bool> abort_all_{false};
  std::atomic<int64_t> positions_in_use_{0};
  std::atomic<int> open_responses_{0};
  ServerMetrics metrics_;
  Scheduler scheduler_;
  httplib::Server http_;
  int port_ = 0;
  std::thread listener_;
  std::atomic<bool> listener_done_{false};
};

OpenAiServer::OpenAiServer(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
OpenAiServer::~OpenAiServer() = default;
void OpenAiServer::start() {
  impl_->start();
}
int OpenAiServer::port() const {
  return impl_->port();
}
void OpenAiServer::load_model() {
  impl_->load_model();
}
void OpenAiServer::drain_and_stop() {
  impl_->drain_and_stop();
}

}  // namespace qspec::server
