#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace qspec::cli {

void register_generate(CLI::App& app) { app.add_subcommand("generate", "generate tokens from a prompt"); }

}  // namespace qspec::cli
