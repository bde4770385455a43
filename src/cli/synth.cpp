// qspec synth: a synthetic checkpoint with a published model's exact layout and random weights.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/commands.h"
#include "io/synthetic_checkpoint.h"

namespace qspec::cli {

void register_synth(CLI::App& app) {
  auto args = std::make_shared<SynthOptions>();
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("synth", "write a synthetic checkpoint (real layout, random weights)");
  cmd->add_option("--arch", args->arch,
                  "qwen3.5-4b | qwen3.5-tiny (the real vocabulary, hidden 64) | dflash-qwen3.5-4b (the nota "
                  "drafter's layout) | dflash-qwen3.5-tiny (a drafter for qwen3.5-tiny)");
  cmd->add_option("--tokenizer", args->tokenizer_dir,
                  "copy this directory's tokenizer files into the checkpoint");
  cmd->add_option("--format", args->format, "bf16 | w4a16-g32 | w4a16-g128");
  cmd->add_option("--seed", args->seed);
  cmd->add_option("--out", *out, "output directory")->required();
  cmd->callback([args, out] { write_synthetic_checkpoint(*out, *args); });
}

}  // namespace qspec::cli
