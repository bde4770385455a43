#include "cli/model_run_options.h"

#include <CLI/CLI.hpp>

namespace qspec::cli {

namespace {

// Refuses any value but `first` and `second` (CLI11 would also take true, yes, 1 and the like for a bool:
// one spelling of each is enough), and names both in the option's help.
void accept_one_of(CLI::Option& option, const std::string& first, const std::string& second) {
  option
      .check(CLI::Validator(
          [first, second](const std::string& value) {
            return value == first || value == second
                       ? std::string()
                       : "expected " + first + " or " + second + ", got '" + value + "'";
          },
          ""))
      ->type_name(first + "|" + second);
}

}  // namespace

void add_model_run_options(CLI::App& command, ModelRunOptions& options) {
  command.add_option("--model", options.model_dir, "checkpoint directory")->required();
  command.add_option("--tokenizer", options.tokenizer_dir,
                     "directory with tokenizer.json (and the chat template) when the checkpoint has none");
  command.add_option("--max-tokens,-n", options.max_tokens, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  command.add_option("--temperature", options.sampling.temperature, "0 = greedy");
  command.add_option("--top-k", options.sampling.top_k, "0 = all");
  command.add_option("--top-p", options.sampling.top_p);
  command.add_option("--seed", options.sampling.seed);
  add_backend_options(command, options.backend, options.backend_options);
  command.add_option("--ctx-size", options.context, "context length (default: prompt + max tokens)");
  command
      .add_option("--prefill-chunk", options.prefill_chunk,
                  "prompt tokens per forward pass (larger: faster prefill, more workspace memory)")
      ->check(CLI::PositiveNumber);
}

void add_backend_options(CLI::App& command, std::string& backend, BackendOptions& options) {
  command.add_option("--backend", backend, "cpu or cuda");
  CLI::Option* copies = command.add_option("--bf16-copies", options.bf16_copies,
                                           "on CUDA, keep a BF16 copy of each W4A16 weight for prefill's "
                                           "products (faster prefill, more memory)");
  accept_one_of(*copies, "on", "off");
  copies->default_str("on");
}

void add_draft_head_option(CLI::App& command, DraftHead& head) {
  CLI::Option* option = command.add_option_function<std::string>(
      "--draft-head",
      [&head](const std::string& value) { head = value == "w4a16" ? DraftHead::W4A16 : DraftHead::Target; },
      "the drafter's head: the target's own, or w4a16, a W4A16 g32 copy of a dense target head made at load "
      "(~28% of the bytes a draft step reads from it; drafts may differ, outputs do not; a W4A16 target head "
      "is used as it is)");
  accept_one_of(*option, "target", "w4a16");
  option->default_str("target");
}

}  // namespace qspec::cli
