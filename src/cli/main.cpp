// qspec: one binary, subcommands in the style of llama.cpp's tools.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"qspec: Qwen3.5 inference with INT4 weights and DFlash speculative decoding"};
  app.require_subcommand(1);
  qspec::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const qspec::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
