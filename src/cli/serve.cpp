// qspec serve: the OpenAI-compatible HTTP server (src/server, docs/server.md). SIGTERM or SIGINT drains it:
// readiness turns 503, accepted requests finish (up to --drain-timeout), then it exits 0.
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <csignal>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

#include "cli/commands.h"
#include "cli/model_run_options.h"
#include "core/error.h"
#include "server/http/openai_server.h"

namespace qspec::cli {

namespace {

// SIGTERM and SIGINT are taken by sigwait on one thread rather than by a handler, so shutdown runs as
// ordinary code. They are blocked before any thread starts, so every thread inherits the mask.
class ShutdownSignals {
 public:
  ShutdownSignals() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGTERM);
    sigaddset(&signals_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client that leaves mid-write is an error result, not a signal
  }

  // Waits for one of the signals; false when `stop` is requested first.
  bool wait(const std::stop_token& stop) const {
    const timespec poll_interval{0, 100'000'000};
    while (!stop.stop_requested())
      if (sigtimedwait(&signals_, nullptr, &poll_interval) > 0) return true;
    return false;
  }

 private:
  sigset_t signals_;
};

void run_serve(const server::ServerOptions& options) {
  const ShutdownSignals signals;
  server::OpenAiServer server(options);
  server.start();
  std::mutex mutex;
  std::condition_variable signalled;
  bool shutdown_requested = false;
  // Joined (and stopped) on every way out, including a model that fails to load.
  std::jthread signal_waiter([&](std::stop_token stop) {
    if (!signals.wait(stop)) return;
    std::lock_guard lock(mutex);
    shutdown_requested = true;
    signalled.notify_all();
  });
  server.load_model();
  std::unique_lock lock(mutex);
  signalled.wait(lock, [&] { return shutdown_requested; });
  lock.unlock();
  server.drain_and_stop();
}

}  // namespace

void register_serve(CLI::App& app) {
  auto options = std::make_shared<server::ServerOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (docs/server.md)");
  cmd->add_option("--model", options->model.model_dir, "checkpoint directory")->required();
  cmd->add_option("--draft-model", options->model.draft_model_dir,
                  "DFlash drafter directory (speculative decoding)");
  add_draft_head_option(*cmd, options->model.draft_head);
  cmd->add_option("--spec-tokens", options->model.speculative.spec_tokens,
                  "drafts per step with --draft-model (default: the drafter's block size - 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
         "--draft-window", options->model.speculative.draft_window,
         "drafter sliding window with --draft-model: keys within W-1 positions, when context + block > W "
         "(0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--tokenizer", options->model.tokenizer_dir,
                  "directory with tokenizer.json (and the chat template) when the checkpoint has none");
  add_backend_options(*cmd, options->model.backend, options->model.backend_options);
  cmd->add_option("--max-model-len", options->model.max_model_len,
                  "context positions per request, prompt + completion (default: the model's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", options->model.prefill_chunk,
                  "prompt tokens per forward pass (larger: faster prefill, more workspace memory)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--host", options->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", options->port, "port (0: any free one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", options->api_key, "require \"Authorization: Bearer KEY\" on /v1 endpoints");
  cmd->add_option("--served-model-name", options->served_model_name,
                  "the model's name in the API (default: --model)");
  cmd->add_option("--max-queue", options->max_queue, "requests that may wait; more get 429")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--drain-timeout", options->drain_timeout_seconds,
                  "seconds that SIGTERM waits for accepted requests before cancelling them")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--quiet", options->quiet, "no access log");
  cmd->callback([options] { run_serve(*options); });
}

}  // namespace qspec::cli
