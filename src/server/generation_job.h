// One generation request between the HTTP thread that answers its client and the engine's worker thread that
// runs it: the worker publishes text and ids as tokens arrive, the HTTP thread takes them (streaming) or
// waits for the end, and either side can end it early (a disconnected client cancels; a stop string ends).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/reply_text.h"
#include "engine/served_model.h"

namespace qspec::server {

using Clock = std::chrono::steady_clock;

struct JobSpec {
  std::string id;
  std::vector<TokenId> prompt;
  GenerationOptions options;
  std::vector<std::string> stop_strings;
  bool split_reasoning = false;  // a chat reply: reasoning apart from the answer
  bool in_reasoning = false;     // the prompt opened a <think> block
  bool streamed = false;         // the HTTP thread takes output as it comes (else only at the end)
};

// What the HTTP thread has not taken yet (streaming), or everything (at the end).
struct JobOutput {
  ReplyDelta text;
  std::vector<TokenId> tokens;
  bool finished = false;
  std::string finish_reason;    // when finished: "stop", "length" or "abort"
  std::string error;            // when finished by an engine error
  int64_t draft_tokens = 0;     // when finished: speculative decoding's proposals
  int64_t accepted_tokens = 0;  // and how many of them were accepted
};

struct JobTimes {
  Clock::time_point arrival, started, first_token, finished;
  bool has_first_token = false;
};

class GenerationJob {
 public:
  // `abort_all` (the server's shutdown flag) cancels every job when set; it must outlive the job.
  GenerationJob(JobSpec spec, const std::atomic<bool>& abort_all);

  const JobSpec& spec() const { return spec_; }

  // On the worker thread: runs the request unless it was cancelled while it waited. `positions_in_use` is
  // kept at the number of context positions the request holds while it runs.
  void run(ServedModel& model, std::atomic<int64_t>& positions_in_use);

  // On the HTTP thread: waits up to `timeout` for new output, then takes what is new.
  JobOutput take(Clock::duration timeout);
  // The whole output so far (the final one once finished).
  JobOutput total() const;
  void cancel() { cancelled_ = true; }
  JobTimes times() const;

 private:
  bool cancelled() const { return cancelled_ || abort_all_; }
  void publish(const ReplyDelta& delta, std::optional<TokenId> id);
  void finish(const std::string& finish_reason, const std::string& error, int64_t draft_tokens = 0,
              int64_t accepted_tokens = 0);

  const JobSpec spec_;
  const std::atomic<bool>& abort_all_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  JobOutput pending_, total_;
  JobTimes times_;
};

}  // namespace qspec::server
