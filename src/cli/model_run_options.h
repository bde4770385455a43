// The options that generate and chat share: the model, its backend and tokenizer, and how to sample; and the
// backend's options, which every command that loads a model shares.
#pragma once

#include <string>

#include "backend/ops.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "model/dflash.h"

namespace CLI {
class App;
}

namespace qspec::cli {

struct ModelRunOptions {
  std::string model_dir;
  std::string tokenizer_dir;  // empty: the model directory's own tokenizer, if it has one
  std::string backend = "cpu";
  BackendOptions backend_options;
  int max_tokens = 32;
  int context = 0;                                        // 0: prompt + max_tokens
  int prefill_chunk = GenerationOptions{}.prefill_chunk;  // prompt tokens per forward pass
  SamplingParams sampling;
};

// Registers --model, --tokenizer, --backend, --bf16-copies, --max-tokens, --ctx-size, --prefill-chunk and the
// sampling options on `command`; `options` must outlive the parse.
void add_model_run_options(CLI::App& command, ModelRunOptions& options);

// Registers --backend and --bf16-copies on `command`; `backend` and `options` must outlive the parse.
void add_backend_options(CLI::App& command, std::string& backend, BackendOptions& options);

// Registers --draft-head target|w4a16 (the draft step's head, model/dflash.h) on `command`; `head` must
// outlive the parse.
void add_draft_head_option(CLI::App& command, DraftHead& head);

}  // namespace qspec::cli
