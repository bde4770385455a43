// qspec bench: per-step latency of the target model (decode M = 1, verify M = K, prefill of chosen lengths),
// each against the bytes it must move, printed as a table and recorded as JSON under bench/results/.
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/loaded_model.h"
#include "io/checkpoint.h"

namespace qspec::cli {

namespace {

struct BenchArgs {
  std::string model_dir;
  std::string backend = "cpu";
  int context = 64;  // tokens already in the cache when decode and verify steps are timed
  int verify_tokens = 16;
  std::vector<int> prefill = {64, 2048, 8192};
  int repeats = 5;
  double bandwidth_gbs = 4160.0;  // measured H200 read bandwidth (GB/s), the limit steps are compared with
  std::string out_dir = "bench/results";
  std::string commit;
  bool no_graphs = false;
};

struct StepResult {
  std::string name;
  int tokens = 0;
  std::vector<double> ms;  // one per timed repetition
  double bytes = 0;        // the fewest bytes the step must move

  double median_ms() const {
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    return sorted[sorted.size() / 2];
  }
};

double elapsed_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::vector<int32_t> random_tokens(int count, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& t : tokens) t = id(rng);
  return tokens;
}

// Bytes a step reads and writes besides the weights: every GDN state read and written, the KV cache read.
double state_bytes(const Qwen35Config& c, int64_t context) {
  int64_t gdn_layers = std::count(c.layer_types.begin(), c.layer_types.end(), LayerType::LinearAttention);
  int64_t attention_layers = c.num_layers - gdn_layers;
  double gdn = double(gdn_layers) * c.linear_num_value_heads * c.linear_key_head_dim *
               c.linear_value_head_dim * sizeof(float) * 2;
  double kv = double(attention_layers) * double(context) * c.num_kv_heads * c.head_dim * 2 * sizeof(float);
  return gdn + kv;
}

void run_bench(const BenchArgs& args) {
  LoadedModel loaded = LoadedModel::open(args.model_dir, args.backend);
  Qwen35Model& model = *loaded.model;
  model.set_step_graphs(!args.no_graphs);
  Backend& backend = *loaded.backend;
  const Qwen35Config& c = model.config();
  CheckpointReport report = check_checkpoint(c, *loaded.store);
  double weight_bytes = 0;
  for (const auto& [format, bytes] : report.bytes_by_format) weight_bytes += double(bytes);

  const int max_prefill =
      args.prefill.empty() ? 0 : *std::max_element(args.prefill.begin(), args.prefill.end());
  const int steps_context = args.context + (args.repeats + 1) * (1 + args.verify_tokens);
  auto state = model.new_state(std::max(max_prefill, steps_context));
  std::vector<StepResult> results;
  auto time_step = [&](StepResult& r, const std::function<void()>& step) {
    for (int i = 0; i < args.repeats + 1; ++i) {  // the first run warms up
      auto start = std::chrono::steady_clock::now();
      step();
      backend.synchronize();
      if (i > 0) r.ms.push_back(elapsed_ms(start));
    }
  };

  // Decode and verify from a cache of args.context tokens.
  std::vector<int32_t> context = random_tokens(args.context, c.vocab_size, 1);
  model.forward(*state, context, ForwardOptions{});
  StepResult decode{"decode", 1, {}, weight_bytes + state_bytes(c, args.context)};
  time_step(decode, [&] {
    int32_t token = 17;
    model.forward(*state, std::span<const int32_t>(&token, 1), ForwardOptions{});
  });
  results.push_back(decode);
  std::vector<int32_t> block = random_tokens(args.verify_tokens, c.vocab_size, 2);
  StepResult verify{"verify", args.verify_tokens, {}, weight_bytes + state_bytes(c, args.context)};
  ForwardOptions all_rows;
  all_rows.all_logits = true;
  time_step(verify, [&] { model.forward(*state, block, all_rows); });
  results.push_back(verify);

  for (int length : args.prefill) {
    std::vector<int32_t> prompt = random_tokens(length, c.vocab_size, 3);
    StepResult prefill{fmt::format("prefill {}", length), length, {}, weight_bytes + state_bytes(c, length)};
    time_step(prefill, [&] {
      model.reset(*state);
      model.forward(*state, prompt, ForwardOptions{});
    });
    results.push_back(prefill);
  }

  const std::string device = backend.device_name();
  nlohmann::json record = {
      {"device", device},
      {"backend", backend.name()},
      {"commit", args.commit},
      {"model", args.model_dir},
      {"architecture", c.architecture},
      {"weight_bytes", weight_bytes},
      {"bandwidth_limit_gbs", args.bandwidth_gbs},
      {"context", args.context},
      {"repeats", args.repeats},
      {"step_graphs", !args.no_graphs && backend.can_capture()},
      {"steps", nlohmann::json::array()},
  };
  fmt::print("{} on {} ({}), weights {:.3f} GB, limit {:.0f} GB/s\n", args.model_dir, device, backend.name(),
             weight_bytes / 1e9, args.bandwidth_gbs);
  fmt::print("{:<14} {:>7} {:>11} {:>11} {:>10} {:>9} {:>10}\n", "step", "tokens", "median ms", "limit ms",
             "GB/s", "% limit", "tok/s");
  for (const StepResult& r : results) {
    double ms = r.median_ms();
    double limit_ms = r.bytes / (args.bandwidth_gbs * 1e9) * 1e3;
    double gbs = r.bytes / (ms * 1e-3) / 1e9;
    fmt::print("{:<14} {:>7} {:>11.3f} {:>11.3f} {:>10.1f} {:>8.1f}% {:>10.1f}\n", r.name, r.tokens, ms,
               limit_ms, gbs, 100.0 * limit_ms / ms, r.tokens / (ms * 1e-3));
    record["steps"].push_back({{"name", r.name},
                               {"tokens", r.tokens},
                               {"median_ms", ms},
                               {"ms", r.ms},
                               {"bytes", r.bytes},
                               {"gb_per_s", gbs},
                               {"limit_ms", limit_ms},
                               {"percent_of_limit", 100.0 * limit_ms / ms}});
  }

  std::filesystem::create_directories(args.out_dir);
  std::time_t now = std::time(nullptr);
  std::string device_tag = device;
  std::replace_if(
      device_tag.begin(), device_tag.end(), [](char ch) { return !std::isalnum(uint8_t(ch)); }, '-');
  std::string path = fmt::format("{}/{:%Y%m%d-%H%M%S}-{}-{}.json", args.out_dir, fmt::gmtime(now),
                                 backend.name(), device_tag.substr(0, 40));
  std::ofstream out(path);
  out << record.dump(2) << "\n";
  if (!out.flush()) fail("{}: cannot write the benchmark record", path);
  fmt::print("recorded {}\n", path);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  if (const char* commit = std::getenv("QSPEC_COMMIT")) args->commit = commit;
  CLI::App* cmd =
      app.add_subcommand("bench", "time decode, verify and prefill steps against the bandwidth limit");
  cmd->add_option("--model", args->model_dir, "checkpoint directory")->required();
  cmd->add_option("--backend", args->backend, "cpu | cuda");
  cmd->add_option("--context", args->context, "tokens in the cache for decode/verify steps")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--verify-tokens", args->verify_tokens, "tokens per verify step")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill", args->prefill, "prompt lengths to time")->delimiter(',');
  cmd->add_option("--repeats", args->repeats, "timed repetitions per step (median reported)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--bandwidth", args->bandwidth_gbs, "memory bandwidth limit in GB/s")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--out", args->out_dir, "directory for the JSON record");
  cmd->add_option("--commit", args->commit, "commit id to record (default: $QSPEC_COMMIT)");
  cmd->add_flag("--no-graphs", args->no_graphs, "run every op directly instead of replaying step graphs");
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace qspec::cli
