// The server's metrics under vLLM's names (so dashboards, routers and the Gateway API inference extension
// work unchanged), each labelled with model_name, plus qspec's own HTTP response counter.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "server/prometheus.h"

namespace qspec::server {

// What one finished request adds.
struct FinishedRequest {
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  std::string finish_reason;  // "stop", "length" or "abort" (cancelled: client gone or shutdown)
  double queue_seconds = 0;
  double ttft_seconds = -1;  // < 0: no token was generated
  double e2e_seconds = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
};

// The state of the engine at the time of a scrape.
struct EngineGauges {
  size_t running = 0;
  size_t waiting = 0;
  double kv_cache_usage = 0;  // 0..1
};

class ServerMetrics {
 public:
  ServerMetrics();
  void record(const FinishedRequest& request);
  void count_response(int status);
  std::string render(const std::string& model_name, const EngineGauges& gauges) const;

 private:
  std::atomic<int64_t> prompt_tokens_{0}, generation_tokens_{0}, draft_tokens_{0}, accepted_tokens_{0};
  mutable std::mutex mutex_;
  std::map<std::string, int64_t> finished_by_reason_;
  std::map<int, int64_t> responses_by_status_;
  Histogram ttft_, e2e_, queue_;
};

}  // namespace qspec::server
