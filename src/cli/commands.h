// Each subcommand registers itself on the CLI app; its callback runs the command and throws qspec::Error on
// bad input.
#pragma once

namespace CLI {
class App;
}

namespace qspec::cli {

void register_commands(CLI::App& app);
void register_inspect(CLI::App& app);
void register_generate(CLI::App& app);
void register_chat(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_synth(CLI::App& app);
void register_bench(CLI::App& app);
void register_serve(CLI::App& app);

}  // namespace qspec::cli
