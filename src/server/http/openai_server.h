// `qspec serve`: the OpenAI-compatible HTTP server (cpp-httplib). It listens before the model is loaded
// (/health answers 503 meanwhile), runs generations through the Scheduler on one engine thread, answers
// health, metrics and models from the HTTP threads while a generation runs, and drains on shutdown.
// Endpoints, fields and decisions: docs/server.md.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/served_model.h"

namespace qspec::server {

struct ServerOptions {
  ServedModelOptions model;
  std::string host = "127.0.0.1";
  int port = 8000;                // 0: any free port (port() tells which)
  std::string api_key;            // empty: no authentication
  std::string served_model_name;  // empty: the model directory as given
  size_t max_queue = 64;          // waiting requests beyond the running one; more get 429
  double drain_timeout_seconds = 30;
  bool quiet = false;  // no access log
};

class OpenAiServer {
 public:
  explicit OpenAiServer(ServerOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  // Binds and answers from background threads (not ready yet). Throws qspec::Error when it cannot bind.
  void start();
  int port() const;
  // Loads the model (progress on stderr); the server is then ready. Throws qspec::Error.
  void load_model();
  // Readiness 503 and new requests refused (503), accepted requests finished for up to the drain timeout
  // (then cancelled), then the listener stops.
  void drain_and_stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qspec::server
