#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace qspec::cli {

void register_inspect(CLI::App& app) { app.add_subcommand("inspect", "what a checkpoint holds"); }

}  // namespace qspec::cli
