// Broken checkpoints and bad arguments through the qspec binary: each gets one clear error naming the file,
// tensor or option, and exit status 1 — never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "run_command.h"
#include "tiny_checkpoint.h"

namespace qspec {
namespace {

namespace fs = std::filesystem;
using testing_support::CommandResult;
using testing_support::run_command;

const fs::path kFixtures = fs::path(QSPEC_FIXTURES_DIR) / "qwen35";

// A copy of a fixture checkpoint (without its oracle files) in a temporary directory.
class BrokenCheckpoint : public ::testing::Test {
 protected:
  void copy_fixture(const std::string& name) {
    for (const auto& entry : fs::directory_iterator(kFixtures / name))
      if (entry.path().filename().string().rfind("oracle", 0) != 0)
        fs::copy_file(entry.path(), dir_.path() / entry.path().filename());
  }
  fs::path file(const std::string& name) const { return dir_.path() / name; }

  CommandResult generate(const std::string& extra = "--prompt-ids 1,2,3 --max-tokens 4") const {
    return run_command(std::string(QSPEC_BINARY) + " generate --model '" + dir_.str() + "' " + extra);
  }
  CommandResult inspect() const {
    return run_command(std::string(QSPEC_BINARY) + " inspect --model '" + dir_.str() + "'");
  }

  // Both commands fail cleanly with a message containing every one of `needles`.
  void expect_clean_failure(const std::vector<std::string>& needles, bool check_inspect = true) const {
    std::vector<CommandResult> results = {generate()};
    if (check_inspect) results.push_back(inspect());
    for (const CommandResult& r : results) {
      EXPECT_FALSE(r.signaled) << r.err;
      EXPECT_NE(r.exit_code, 0) << r.out;
      // inspect lists problem tensors on stdout and ends with the error on stderr; generate has only stderr.
      const std::string text = r.out + r.err;
      for (const std::string& needle : needles) EXPECT_NE(text.find(needle), std::string::npos) << text;
    }
  }

  tiny::TempDir dir_;
};

std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Rewrites the JSON header of a safetensors file in place (payload unchanged).
void edit_header(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  std::string bytes = read_file(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, length));
  edit(header);
  std::string text = header.dump();
  uint64_t new_length = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &new_length, 8);
  write_file(path, out + text + bytes.substr(8 + length));
}

// Re-writes a checkpoint file through the library writer after changing its tensor list.
void edit_tensors(const fs::path& path, const std::function<void(std::vector<TensorData>&)>& edit) {
  std::vector<TensorData> tensors;
  {
    TensorStore store = TensorStore::open_file(path.string());
    for (const TensorView* v : store.all())
      tensors.push_back({v->name, v->dtype, v->shape, std::vector<uint8_t>(v->data, v->data + v->nbytes)});
  }
  edit(tensors);
  write_safetensors(path.string(), tensors);
}

const std::string kEmbed = "model.embed_tokens.weight";

TEST_F(BrokenCheckpoint, IntactCopyWorks) {
  copy_fixture("causal-tied-bf16");
  CommandResult r = generate();
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(BrokenCheckpoint, TruncatedFile) {
  copy_fixture("causal-tied-bf16");
  std::string bytes = read_file(file("model.safetensors"));
  write_file(file("model.safetensors"), bytes.substr(0, bytes.size() / 2));
  expect_clean_failure({"model.safetensors"});
}

TEST_F(BrokenCheckpoint, HeaderLengthBeyondTheFile) {
  copy_fixture("causal-tied-bf16");
  std::string bytes = read_file(file("model.safetensors"));
  uint64_t lie = uint64_t(bytes.size()) * 4;
  std::memcpy(bytes.data(), &lie, 8);
  write_file(file("model.safetensors"), bytes);
  expect_clean_failure({"model.safetensors", "header"});
}

TEST_F(BrokenCheckpoint, OverlappingOffsets) {
  copy_fixture("causal-tied-bf16");
  std::string victim;
  edit_header(file("model.safetensors"), [&](nlohmann::json& h) {
    // Point the second tensor (in offset order) at the first one's bytes.
    std::vector<std::pair<int64_t, std::string>> by_offset;
    for (auto& [name, entry] : h.items())
      if (name != "__metadata__") by_offset.emplace_back(entry["data_offsets"][0].get<int64_t>(), name);
    std::sort(by_offset.begin(), by_offset.end());
    victim = by_offset[1].second;
    int64_t size = h[victim]["data_offsets"][1].get<int64_t>() - h[victim]["data_offsets"][0].get<int64_t>();
    h[victim]["data_offsets"] = {0, size};
  });
  expect_clean_failure({"model.safetensors", victim, "overlap"});
}

TEST_F(BrokenCheckpoint, UnknownDtype) {
  copy_fixture("causal-tied-bf16");
  edit_header(file("model.safetensors"), [](nlohmann::json& h) { h[kEmbed]["dtype"] = "Q4_K"; });
  expect_clean_failure({"model.safetensors", kEmbed, "Q4_K"});
}

TEST_F(BrokenCheckpoint, MissingTensor) {
  copy_fixture("causal-tied-bf16");
  const std::string gone = "model.layers.1.linear_attn.in_proj_z.weight";
  edit_tensors(file("model.safetensors"), [&](std::vector<TensorData>& t) {
    std::erase_if(t, [&](const TensorData& d) { return d.name == gone; });
  });
  expect_clean_failure({gone});
}

TEST_F(BrokenCheckpoint, WrongPackedShape) {
  copy_fixture("causal-w4a16-g32");
  const std::string packed = "model.layers.0.mlp.up_proj.weight_packed";
  edit_tensors(file("model.safetensors"), [&](std::vector<TensorData>& t) {
    for (TensorData& d : t)
      if (d.name == packed) {
        ASSERT_EQ(d.shape.size(), 2u);
        d.shape = {d.shape[0] / 2, d.shape[1] * 2};  // same bytes, wrong layout
      }
  });
  expect_clean_failure({packed});
}

TEST_F(BrokenCheckpoint, WrongArchitecture) {
  copy_fixture("causal-tied-bf16");
  nlohmann::json config = nlohmann::json::parse(read_file(file("config.json")));
  config["architectures"] = {"LlamaForCausalLM"};
  write_file(file("config.json"), config.dump());
  expect_clean_failure({"unsupported architecture LlamaForCausalLM", "config.json"});
}

TEST_F(BrokenCheckpoint, ShardNamedInTheIndexIsMissing) {
  copy_fixture("cg-untied-f16-sharded");
  fs::path shard;
  for (const auto& entry : fs::directory_iterator(dir_.path()))
    if (entry.path().filename().string().rfind("model-00002", 0) == 0) shard = entry.path();
  ASSERT_FALSE(shard.empty());
  fs::remove(shard);
  expect_clean_failure({shard.filename().string()});
}

TEST_F(BrokenCheckpoint, BadGenerateArguments) {
  copy_fixture("causal-tied-bf16");
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : {Case{"--prompt-ids 1,x,3", "--prompt-ids"}, Case{"--prompt-ids 1,999", "999"},
                        Case{"--prompt-ids 1,2 --max-tokens 10 --ctx-size 4", "context"},
                        Case{"--prompt-ids 1 --backend tpu", "--backend"},
                        Case{"--prompt-ids 1 --temperature -1", "temperature"},
                        Case{"--prompt-ids 1 --prefill-chunk 0", "--prefill-chunk"}}) {
    CommandResult r = generate(c.args);
    EXPECT_FALSE(r.signaled) << c.args;
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
  }
}

// Every command that loads a model takes --bf16-copies on|off and refuses other values before loading
// anything (the value reaches the backend through BackendOptions; the CPU has no use for the copies).
TEST(CliErrors, Bf16CopiesTakesOnOrOff) {
  const std::string model = (kFixtures / "causal-tied-bf16").string();
  for (const std::string command : {"generate --prompt-ids 1", "chat", "serve", "bench"}) {
    const CommandResult r = run_command(std::string(QSPEC_BINARY) + " " + command + " --model '" + model +
                                        "' --bf16-copies yes </dev/null");
    EXPECT_FALSE(r.signaled) << command;
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_NE(r.err.find("--bf16-copies: expected on or off, got 'yes'"), std::string::npos)
        << command << ": " << r.err;
  }
  for (const char* value : {"on", "off"}) {
    const CommandResult r = run_command(std::string(QSPEC_BINARY) + " generate --model '" + model +
                                        "' --prompt-ids 1 --max-tokens 2 --bf16-copies " + value);
    EXPECT_EQ(r.exit_code, 0) << value << ": " << r.err;
  }
}

}  // namespace
}  // namespace qspec
