#include "server/server_metrics.h"

namespace qspec::server {

// vLLM's buckets, so that its dashboards' quantiles read the same.
ServerMetrics::ServerMetrics()
    : finished_by_reason_{{"stop", 0}, {"length", 0}, {"abort", 0}},
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}),
      queue_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
              30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void ServerMetrics::record(const FinishedRequest& request) {
  prompt_tokens_ += request.prompt_tokens;
  generation_tokens_ += request.generation_tokens;
  draft_tokens_ += request.draft_tokens;
  accepted_tokens_ += request.accepted_tokens;
  {
    std::lock_guard lock(mutex_);
    ++finished_by_reason_[request.finish_reason];
  }
  queue_.observe(request.queue_seconds);
  if (request.ttft_seconds >= 0) ttft_.observe(request.ttft_seconds);
  e2e_.observe(request.e2e_seconds);
}

void ServerMetrics::count_response(int status) {
  std::lock_guard lock(mutex_);
  ++responses_by_status_[status];
}

std::string ServerMetrics::render(const std::string& model_name, const EngineGauges& gauges) const {
  const Labels model{{"model_name", model_name}};
  PrometheusText out;
  out.add("vllm:num_requests_running", "gauge", "Requests being generated.", model, double(gauges.running));
  out.add("vllm:num_requests_waiting", "gauge", "Requests waiting for the engine.", model,
          double(gauges.waiting));
  out.add("vllm:kv_cache_usage_perc", "gauge",
          "Fraction of --max-model-len positions held by running requests (1 = full).", model,
          gauges.kv_cache_usage);
  out.add("vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", model,
          double(prompt_tokens_.load()));
  out.add("vllm:generation_tokens_total", "counter", "Generated tokens of finished requests.", model,
          double(generation_tokens_.load()));
  out.add("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", model,
          double(draft_tokens_.load()));
  out.add("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", model,
          double(accepted_tokens_.load()));
  std::vector<std::pair<Labels, double>> finished, responses;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [reason, count] : finished_by_reason_)
      finished.push_back({{{"model_name", model_name}, {"finished_reason", reason}}, double(count)});
    for (const auto& [status, count] : responses_by_status_)
      responses.push_back({{{"model_name", model_name}, {"status", std::to_string(status)}}, double(count)});
  }
  out.add("vllm:request_success_total", "counter", "Finished requests by finish reason.", finished);
  out.add_histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first generated token.",
                    model, ttft_.snapshot());
  out.add_histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.", model,
                    e2e_.snapshot());
  out.add_histogram("vllm:request_queue_time_seconds", "Time spent waiting for the engine.", model,
                    queue_.snapshot());
  out.add("qspec:http_responses_total", "counter", "HTTP responses by status (all endpoints).", responses);
  return out.text();
}

}  // namespace qspec::server
