// qspec tokenize, run as a process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <string>

#include "test_tokenizer_support.h"

namespace qspec {
namespace {

struct ProcessResult {
  int exit_code;
  std::string output;  // stdout and stderr
};

ProcessResult run_qspec(const std::string& arguments) {
  const std::string command = std::string(QSPEC_BINARY) + " tokenize " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buffer;
  while (const size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

const std::string kModel = "--model " + test::qwen_tokenizer_dir();

TEST(TokenizeCli, EncodesToCommaSeparatedIds) {
  const ProcessResult run = run_qspec(kModel + " --text 'Hello, how are you?'");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output, "9419,11,1204,513,488,30\n");
}

TEST(TokenizeCli, JsonHasIdsAndTokens) {
  const ProcessResult run = run_qspec(kModel + " --json --text '<|im_start|>user\n'");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json out = nlohmann::json::parse(run.output);
  EXPECT_EQ(out.at("ids"), nlohmann::json({248045, 846, 198}));
  EXPECT_EQ(out.at("tokens"), nlohmann::json({"<|im_start|>", "user", "Ċ"}));
}

TEST(TokenizeCli, NoSpecialEncodesControlTokensAsText) {
  const ProcessResult run = run_qspec(kModel + " --no-special --text '<|im_end|>'");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("248046"), std::string::npos) << run.output;
}

TEST(TokenizeCli, DecodesIds) {
  EXPECT_EQ(run_qspec(kModel + " --decode 248045,846,198,9419").output, "<|im_start|>user\nHello");
  EXPECT_EQ(run_qspec(kModel + " --no-special --decode 248045,846,198,9419").output, "user\nHello");
}

TEST(TokenizeCli, EncodesAFile) {
  const ProcessResult run = run_qspec(kModel + " --file " QSPEC_FIXTURES_DIR "/tokenizer/large.json");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_GT(run.output.size(), 100u);
}

TEST(TokenizeCli, BadInputIsOneClearError) {
  const std::pair<std::string, std::string> cases[] = {
      {"--model /nonexistent --text x", "/nonexistent/tokenizer.json: cannot open"},
      {kModel + " --decode 12,x", "--decode: expected comma-separated token ids"},
      {kModel + " --decode 248999", "token id 248999 is not a token"},
      {kModel + " --text a --decode 1", "exactly one of --text, --file, --chat, --decode"},
      {kModel, "exactly one of --text, --file, --chat, --decode"},
      {kModel + " --file /nonexistent.txt", "--file /nonexistent.txt: cannot open"},
      {kModel + " --decode 1 --bench 2", "--bench: times encoding; give --text, --file or --chat"},
      {kModel + " --text \"$(printf 'a\\377')\"", "the text to encode is not valid UTF-8"},
  };
  for (const auto& [arguments, message] : cases) {
    const ProcessResult run = run_qspec(arguments);
    EXPECT_EQ(run.exit_code, 1) << arguments << ": " << run.output;
    EXPECT_NE(run.output.find("error: "), std::string::npos) << arguments << ": " << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << arguments << ": " << run.output;
  }
}

}  // namespace
}  // namespace qspec
