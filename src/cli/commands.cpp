#include "cli/commands.h"

namespace qspec::cli {

void register_commands(CLI::App& app) {
  register_inspect(app);
  register_generate(app);
  register_chat(app);
  register_tokenize(app);
  register_synth(app);
  register_bench(app);
#if QSPEC_HAVE_SERVER
  register_serve(app);
#endif
}

}  // namespace qspec::cli
