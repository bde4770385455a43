// Runs a command line through the shell and captures its exit status, stdout and stderr (for CLI tests).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace qspec::testing_support {

struct CommandResult {
  int exit_code = -1;     // -1 when the process did not exit normally
  bool signaled = false;  // killed by a signal (a crash)
  std::string out;
  std::string err;
};

inline CommandResult run_command(const std::string& command) {
  static int counter = 0;
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() /
      ("qspec-cmd-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".stderr");
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>'" + err_path.string() + "'").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  // The shell reports a child killed by signal N as exit status 128 + N.
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
    result.signaled = result.exit_code > 128;
  } else {
    result.signaled = WIFSIGNALED(status);
  }
  std::stringstream err;
  err << std::ifstream(err_path).rdbuf();
  result.err = err.str();
  std::filesystem::remove(err_path);
  return result;
}

}  // namespace qspec::testing_support
