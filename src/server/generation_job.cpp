#include "server/generation_job.h"

#include <utility>

#include "core/error.h"

namespace qspec::server {

namespace {

void append(JobOutput& to, const ReplyDelta& delta, std::optional<TokenId> id) {
  to.text.reasoning += delta.reasoning;
  to.text.content += delta.content;
  if (id) to.tokens.push_back(*id);
}

}  // namespace

GenerationJob::GenerationJob(JobSpec spec, const std::atomic<bool>& abort_all)
    : spec_(std::move(spec)), abort_all_(abort_all) {
  times_.arrival = Clock::now();
}

void GenerationJob::run(ServedModel& model, std::atomic<int64_t>& positions_in_use) {
  {
    std::lock_guard lock(mutex_);
    times_.started = Clock::now();
  }
  if (cancelled()) {
    finish("abort", "");
    return;
  }
  const Tokenizer* tokenizer = model.tokenizer() ? &model.tokenizer()->tokenizer : nullptr;
  std::optional<ReplyText> text;
  if (tokenizer) text.emplace(*tokenizer, spec_.split_reasoning, spec_.in_reasoning, spec_.stop_strings);
  positions_in_use = int64_t(spec_.prompt.size());
  try {
    const GenerationResult result = model.generate(spec_.prompt, spec_.options, [&](TokenId id) {
      ++positions_in_use;
      publish(text ? text->push(id) : ReplyDelta{}, id);
      return !cancelled() && !(text && text->stopped_by());
    });
    if (text) publish(text->finish(), std::nullopt);
    std::string reason = result.finish_reason;
    if (text && text->stopped_by()) {
      reason = "stop";
    } else if (cancelled() && result.finish_reason != "stop" &&
               int(result.tokens.size()) < spec_.options.max_tokens) {
      reason = "abort";
    }
    finish(reason, "", result.draft_tokens, result.accepted_tokens);
  } catch (const std::exception& error) {
    finish("abort", error.what());
  }
  positions_in_use = 0;
}

void GenerationJob::publish(const ReplyDelta& delta, std::optional<TokenId> id) {
  {
    std::lock_guard lock(mutex_);
    if (id && !times_.has_first_token) {
      times_.first_token = Clock::now();
      times_.has_first_token = true;
    }
    append(pending_, delta, id);
    append(total_, delta, id);
  }
  // A non-streamed request's HTTP thread waits for the end (and its client): a wake-up per token would only
  // take CPU time from the engine.
  if (spec_.streamed) changed_.notify_all();
}

void GenerationJob::finish(const std::string& finish_reason, const std::string& error, int64_t draft_tokens,
                           int64_t accepted_tokens) {
  {
    std::lock_guard lock(mutex_);
    times_.finished = Clock::now();
    for (JobOutput* output : {&pending_, &total_}) {
      output->finished = true;
      output->finish_reason = finish_reason;
      output->error = error;
      output->draft_tokens = draft_tokens;
      output->accepted_tokens = accepted_tokens;
    }
  }
  changed_.notify_all();
}

JobOutput GenerationJob::take(Clock::duration timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [this] {
    return pending_.finished || !pending_.tokens.empty() || !pending_.text.empty();
  });
  JobOutput taken = std::move(pending_);
  pending_ = JobOutput{};
  pending_.finished = taken.finished;
  pending_.finish_reason = taken.finish_reason;
  pending_.error = taken.error;
  return taken;
}

JobOutput GenerationJob::total() const {
  std::lock_guard lock(mutex_);
  return total_;
}

JobTimes GenerationJob::times() const {
  std::lock_guard lock(mutex_);
  return times_;
}

}  // namespace qspec::server
