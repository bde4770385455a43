// qspec bench: per-step latency of the target model (decode M = 1, verify M = K, prefill of chosen lengths),
// each against the bytes it must move, printed as a table and recorded as JSON under bench/results/. With a
// drafter also the draft step and the commit (GDN replay) of a verify step; with --e2e the competition's
// end-to-end protocol (dflash-system.md §8) at chosen oracle acceptance lengths (with a drafter also with the
// drafter running every step).
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
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "cli/commands.h"
#include "cli/model_run_options.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/model_tokenizer.h"
#include "engine/speculative.h"
#include "io/checkpoint.h"

namespace qspec::cli {

namespace {

struct BenchArgs {
  std::string model_dir;
  std::string backend = "cpu";
  BackendOptions backend_options;
  int context = 64;  // tokens already in the cache when decode and verify steps are timed
  int verify_tokens = 16;
  std::vector<int> prefill = {64, 2048, 8192};
  int repeats = 5;
  double bandwidth_gbs = 4160.0;  // measured H200 read bandwidth (GB/s), the limit steps are compared with
  std::string out_dir = "bench/results";
  std::string commit;
  bool no_graphs = false;
  std::string draft_model;
  DraftHead draft_head = DraftHead::Target;
  int draft_window = 0;
  bool e2e = false;
  std::vector<int> e2e_prompts = {64, 2048,
                                  8192};        // prompt tokens per category; 128 new tokens at 64, else 256
  std::vector<int> acceptance = {1, 4, 8, 16};  // tokens per speculative step the oracle drafts give
  int warmups = 5;
  int e2e_runs = 10;
};

constexpr const char* kFiller = "The quick brown fox jumps over the lazy dog. ";

// The competition prompt: the filler sentence repeated prompt_tokens / 10 times, encoded with the model's
// tokenizer; without one, ten fixed ids stand in for the sentence.
std::vector<int32_t> filler_prompt(const std::optional<ModelTokenizer>& tokenizer, int prompt_tokens,
                                   int vocab) {
  const int repeats = std::max(1, prompt_tokens / 10);
  if (tokenizer) {
    std::string text;
    for (int i = 0; i < repeats; ++i) text += kFiller;
    return tokenizer->tokenizer.encode(text);
  }
  std::vector<int32_t> ids;
  for (int i = 0; i < repeats * 10; ++i) ids.push_back(int32_t((i % 10) * 7919 % vocab));
  return ids;
}

// Drafts that make every step emit `length` tokens (length - 1 accepted): the expected output with a wrong
// token at every output index that is a multiple of `length`.
std::vector<int32_t> oracle_for_acceptance(const std::vector<int32_t>& expected, int length, int vocab) {
  std::vector<int32_t> oracle = expected;
  for (size_t i = size_t(length); i < oracle.size(); i += size_t(length)) oracle[i] = (oracle[i] + 1) % vocab;
  return oracle;
}

struct EndToEndResult {
  int prompt_tokens = 0, new_tokens = 0;
  int acceptance = 0;  // 0: plain decoding
  std::vector<double> ms;
  double mean_acceptance_length = 0;
  // Per timed request: the prefill, and the decode time per step (a speculative step, or one plain token
  // after the first).
  std::vector<double> prefill_ms, step_ms;
  // Speculative: a verify step alone at the middle of a request's context, timed apart. A step's time less it
  // is all the rest of the step: the commit (GDN replay), the host's work and the argmax read-back.
  std::vector<double> verify_ms;
  // With the drafter running every step (its drafts replaced by the oracle's): a draft step alone at the
  // same context, which the rest of a step then leaves out too (the rest then holds the drafter's context
  // pass over the accepted rows, the feature hand-off).
  bool drafter = false;
  std::vector<double> draft_ms;
  // Part of that rest, timed apart: the context pass of as many rows as a step at this acceptance emits.
  std::vector<double> context_ms;
  int drafter_context = 0;  // the drafter state's tokens after the last request (it follows the target's)
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct StepResult {
  std::string name;
  int tokens = 0;
  std::vector<double> ms;  // one per timed repetition
  double bytes = 0;        // the fewest bytes the step must move

  double median_ms() const { return median(ms); }
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

// Bytes a product with `w` reads: its dense weight, or its packed words and scales.
double linear_bytes(const LinearWeight& w) {
  double bytes = 0;
  for (const Tensor* t : {&w.weight, &w.packed, &w.scales})
    if (!t->empty()) bytes += double(t->element_bytes());
  return bytes;
}

// The fewest bytes a draft step moves: the drafter's layers and final norm (not the context pass's fc and
// hidden_norm), the head it drafts through (the target's or its W4A16 copy), and every drafter layer's K and
// V (F32) of `context` tokens and the block.
double draft_step_bytes(const TensorStore& drafter, const DFlashConfig& dc, const LinearWeight& head,
                        int64_t context) {
  double bytes = linear_bytes(head);
  for (const TensorView* t : drafter.all())
    if (t->name.starts_with("layers.") || t->name == "norm.weight") bytes += double(t->nbytes);
  const double kv_row = 2.0 * dc.num_kv_heads * dc.head_dim * sizeof(float);
  return bytes + double(dc.num_layers) * double(context + dc.block_size) * kv_row;
}

// Bytes of the buffers a sequence's state holds: KV caches, GDN states, the pending verify rows.
double allocated_state_bytes(const Qwen35State& state) {
  double bytes = 0;
  for (const Qwen35State::Layer& layer : state.layers)
    for (const auto* buffer :
         {&layer.k_cache, &layer.v_cache, &layer.conv_state, &layer.recurrent_state, &layer.pending_conv_in,
          &layer.pending_keys, &layer.pending_decays, &layer.pending_deltas})
      if (*buffer) bytes += double((*buffer)->tensor().element_bytes());
  return bytes;
}

// Times `step`, each run up to a synchronize: `warmups` untimed runs, then `runs` timed ones (ms).
std::vector<double> time_runs(Backend& backend, int warmups, int runs, const std::function<void()>& step) {
  std::vector<double> ms;
  for (int i = 0; i < warmups + runs; ++i) {
    auto start = std::chrono::steady_clock::now();
    step();
    backend.synchronize();
    if (i >= warmups) ms.push_back(elapsed_ms(start));
  }
  return ms;
}

// A step graph is recorded on its key's second run and replayed from the third (StepGraphCache): the
// warm-ups before a step's timed runs.
constexpr int kGraphWarmups = 2;

// Resets `state` and feeds it `prompt` and the first half of `output`, the middle of a request's context
// (the mean context of its steps), handing each forward's rows of `hidden_layers` to `on_features`. Returns
// the half.
size_t feed_to_middle(Qwen35Model& model, Qwen35State& state, const std::vector<int32_t>& prompt,
                      const std::vector<int32_t>& output, const std::vector<int>& hidden_layers,
                      const std::function<void(std::span<const Tensor>)>& on_features) {
  model.reset(state);
  ForwardOptions prefill;
  prefill.logits = false;
  prefill.hidden_layers = hidden_layers;
  on_features(model.forward(state, prompt, prefill).hidden);
  const size_t half = output.size() / 2;
  if (half > 0) on_features(model.forward(state, std::span(output.data(), half), prefill).hidden);
  return half;
}

// A speculative step's verify block at the middle of a request: the bonus and kDefaultSpecTokens drafts from
// output[half] on (fewer at the output's end).
std::vector<int32_t> middle_block(const std::vector<int32_t>& output, size_t half) {
  const size_t end = std::min<size_t>(output.size(), half + kDefaultSpecTokens + 1);
  return {output.begin() + static_cast<std::ptrdiff_t>(half),
          output.begin() + static_cast<std::ptrdiff_t>(end)};
}

// The target and the drafter fed to the middle of a request (feed_to_middle), the drafter's context the
// target's features. Returns the half.
size_t feed_drafter_to_middle(Qwen35Model& model, Qwen35State& state, DFlashModel& drafter,
                              DFlashState& draft_state, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& output) {
  drafter.reset(draft_state);
  return feed_to_middle(
      model, state, prompt, output, drafter.config().target_layer_ids,
      [&](std::span<const Tensor> features) { drafter.add_context(draft_state, features); });
}

// The speculative steps' verify (a block of the bonus and kDefaultSpecTokens drafts, every row's logits and
// the rows of `hidden_layers` (a drafter's features), the state left for a commit; a verify may follow an
// uncommitted one) alone at the middle of the request's context (a verify's attention grows with it):
// warm-ups, then one time per timed request.
std::vector<double> time_verify_step(const BenchArgs& args, Qwen35Model& model, Backend& backend,
                                     Qwen35State& state, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& output,
                                     const std::vector<int>& hidden_layers) {
  const size_t half = feed_to_middle(model, state, prompt, output, {}, [](std::span<const Tensor>) {});
  ForwardOptions verify;
  verify.all_logits = true;
  verify.advance = false;
  verify.hidden_layers = hidden_layers;
  const std::vector<int32_t> block = middle_block(output, half);
  backend.synchronize();
  const std::vector<double> ms = time_runs(backend, std::max(kGraphWarmups, args.warmups), args.e2e_runs,
                                           [&] { model.forward(state, block, verify); });
  model.commit(state, 0);
  return ms;
}

// The drafter's draft step alone at the middle of the request's context, its context the target's features
// of `prompt` and the first half of `output`: warm-ups, then one time per timed request.
std::vector<double> time_draft_step(const BenchArgs& args, Qwen35Model& model, Backend& backend,
                                    Qwen35State& state, DFlashModel& drafter, DFlashState& draft_state,
                                    const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  const size_t half = feed_drafter_to_middle(model, state, drafter, draft_state, prompt, output);
  return time_runs(backend, std::max(kGraphWarmups, args.warmups), args.e2e_runs,
                   [&] { drafter.draft(draft_state, output[half], args.draft_window); });
}

// The drafter's context pass of `rows` rows alone (a step's feature hand-off when it emits `rows` tokens) at
// the middle of the request's context: the first rows of a verify block's features, as a step hands them
// over, appended at the same position in every run. Warm-ups, then one time per timed request.
std::vector<double> time_context_pass(const BenchArgs& args, Qwen35Model& model, Backend& backend,
                                      Qwen35State& state, DFlashModel& drafter, DFlashState& draft_state,
                                      const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                                      int rows) {
  const size_t half = feed_drafter_to_middle(model, state, drafter, draft_state, prompt, output);
  ForwardOptions verify;
  verify.logits = false;
  verify.advance = false;
  verify.hidden_layers = drafter.config().target_layer_ids;
  std::vector<Tensor> features;
  for (const Tensor& h : model.forward(state, middle_block(output, half), verify).hidden)
    features.push_back(h.rows_view(0, std::min<int64_t>(rows, h.rows)));
  const int middle = draft_state.n_context;
  const std::vector<double> ms =
      time_runs(backend, std::max(kGraphWarmups, args.warmups), args.e2e_runs, [&] {
        draft_state.n_context = middle;
        drafter.add_context(draft_state, features);
      });
  model.commit(state, 0);
  return ms;
}

// The competition protocol per category: warm-ups, then timed requests (prefill + decode) at temperature 0,
// batch 1: plain decoding, then speculative decoding with oracle drafts at each acceptance length, and with a
// drafter also each acceptance length with the drafter running every step (the oracle's drafts in place of
// its own), whose time a real run at that acceptance would pay.
std::vector<EndToEndResult> run_end_to_end(const BenchArgs& args, Qwen35Model& model, Backend& backend,
                                           DFlashModel* drafter) {
  const Qwen35Config& c = model.config();
  const std::optional<ModelTokenizer> tokenizer = open_model_tokenizer(args.model_dir, "", c.vocab_size);
  std::vector<EndToEndResult> results;
  for (int prompt_tokens : args.e2e_prompts) {
    const std::vector<int32_t> prompt = filler_prompt(tokenizer, prompt_tokens, c.vocab_size);
    GenerationOptions options;
    options.max_tokens = prompt_tokens <= 64 ? 128 : 256;
    options.ignore_eos = true;
    options.prefill_chunk = 8192;
    auto state = model.new_state(int(prompt.size()) + options.max_tokens);
    std::unique_ptr<DFlashState> draft_state = drafter ? drafter->new_state(state->max_context) : nullptr;
    std::vector<int32_t> expected;  // the last request's output
    auto time_requests = [&](EndToEndResult& r, const std::function<GenerationResult()>& request) {
      for (int i = 0; i < args.warmups + args.e2e_runs; ++i) {
        model.reset(*state);
        if (draft_state) drafter->reset(*draft_state);
        auto start = std::chrono::steady_clock::now();
        const GenerationResult g = request();
        backend.synchronize();
        if (i >= args.warmups) {
          r.ms.push_back(elapsed_ms(start));
          r.prefill_ms.push_back(g.prefill_seconds * 1e3);
          const size_t steps = g.steps.empty() ? g.tokens.size() - 1 : g.steps.size();
          if (steps > 0) r.step_ms.push_back(g.decode_seconds * 1e3 / double(steps));
        }
        if (!g.steps.empty())
          r.mean_acceptance_length =
              double(g.accepted_tokens + int64_t(g.steps.size())) / double(g.steps.size());
        if (draft_state) r.drafter_context = draft_state->n_context;
        expected = g.tokens;
      }
    };
    auto row = [&](int acceptance) {
      EndToEndResult r;
      r.prompt_tokens = int(prompt.size());
      r.new_tokens = options.max_tokens;
      r.acceptance = acceptance;
      return r;
    };
    EndToEndResult plain = row(0);
    plain.mean_acceptance_length = 1.0;
    time_requests(plain, [&] { return generate(model, *state, prompt, options); });
    results.push_back(plain);
    const std::vector<int32_t> greedy = expected;
    const std::vector<double> verify_ms = time_verify_step(args, model, backend, *state, prompt, greedy, {});
    // With the drafter running, a verify also writes its features.
    const std::vector<double> feature_verify_ms =
        drafter ? time_verify_step(args, model, backend, *state, prompt, greedy,
                                   drafter->config().target_layer_ids)
                : std::vector<double>{};
    const std::vector<double> draft_ms =
        drafter ? time_draft_step(args, model, backend, *state, *drafter, *draft_state, prompt, greedy)
                : std::vector<double>{};
    for (int acceptance : args.acceptance) {
      SpeculativeOptions spec;
      spec.oracle_drafts = oracle_for_acceptance(greedy, acceptance, c.vocab_size);
      spec.draft_window = args.draft_window;
      EndToEndResult r = row(acceptance);
      r.verify_ms = verify_ms;
      time_requests(r, [&] { return generate_speculative(model, *state, nullptr, prompt, options, spec); });
      results.push_back(r);
      if (!drafter) continue;
      const Drafter pair{*drafter, *draft_state};
      EndToEndResult d = row(acceptance);
      d.drafter = true;
      d.verify_ms = feature_verify_ms;
      d.draft_ms = draft_ms;
      d.context_ms =
          time_context_pass(args, model, backend, *state, *drafter, *draft_state, prompt, greedy, acceptance);
      time_requests(d, [&] { return generate_speculative(model, *state, &pair, prompt, options, spec); });
      results.push_back(d);
    }
  }
  return results;
}

void run_bench(const BenchArgs& args) {
  for (int a : args.acceptance)
    if (a < 1 || a > kDefaultSpecTokens + 1)
      fail("--acceptance: {} tokens per step, expected 1..{}", a, kDefaultSpecTokens + 1);
  if (args.draft_model.empty() && args.draft_head != DraftHead::Target)
    fail("bench: --draft-head needs --draft-model");
  LoadedModel loaded = LoadedModel::open(args.model_dir, args.backend, args.backend_options);
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
  const int64_t in_use_with_state = backend.device_memory_in_use();
  std::vector<StepResult> results;
  auto time_step = [&](StepResult& r, const std::function<void()>& step) {
    r.ms = time_runs(backend, 1, args.repeats, step);  // the first run warms up
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

  std::optional<LoadedDrafter> drafter;
  if (!args.draft_model.empty()) {
    // The draft step over a context of args.context tokens, and the commit (GDN replay) of a whole verify
    // step.
    drafter.emplace(LoadedDrafter::open(args.draft_model, loaded, args.model_dir, args.draft_head));
    drafter->model->set_step_graphs(!args.no_graphs);
    const DFlashConfig& dc = drafter->model->config();
    auto draft_state = drafter->model->new_state(state->max_context);
    model.reset(*state);
    ForwardOptions features;
    features.logits = false;
    features.hidden_layers = dc.target_layer_ids;
    drafter->model->add_context(*draft_state, model.forward(*state, context, features).hidden);
    const bool quantized_head = drafter->model->head().quantized() && !model.weights().lm_head.quantized();
    StepResult draft{quantized_head ? "draft (w4a16 head)" : "draft",
                     dc.block_size,
                     {},
                     draft_step_bytes(*drafter->store, dc, drafter->model->head(), args.context)};
    time_step(draft, [&] { drafter->model->draft(*draft_state, 17, args.draft_window); });
    results.push_back(draft);
    const std::vector<int32_t> verify_block(size_t(dc.block_size), 17);
    ForwardOptions pending = all_rows;
    pending.advance = false;
    StepResult commit{fmt::format("commit {}", dc.block_size), dc.block_size, {}, state_bytes(c, 0)};
    for (int i = 0; i < args.repeats + 1; ++i) {
      model.forward(*state, verify_block, pending);
      backend.synchronize();
      auto start = std::chrono::steady_clock::now();
      model.commit(*state, dc.block_size);
      backend.synchronize();
      if (i > 0) commit.ms.push_back(elapsed_ms(start));
    }
    results.push_back(commit);
  }

  for (int length : args.prefill) {
    std::vector<int32_t> prompt = random_tokens(length, c.vocab_size, 3);
    StepResult prefill{fmt::format("prefill {}", length), length, {}, weight_bytes + state_bytes(c, length)};
    time_step(prefill, [&] {
      model.reset(*state);
      model.forward(*state, prompt, ForwardOptions{});
    });
    results.push_back(prefill);
  }

  const int64_t in_use_after_steps = backend.device_memory_in_use();
  const double state_allocated = allocated_state_bytes(*state);
  const std::string device = backend.device_name();
  nlohmann::json record = {
      {"device", device},
      {"backend", backend.name()},
      {"commit", args.commit},
      {"model", args.model_dir},
      {"architecture", c.architecture},
      {"weight_bytes", weight_bytes},
      {"dequantized_copy_bytes", model.dequantized_bytes()},
      {"bandwidth_limit_gbs", args.bandwidth_gbs},
      {"context", args.context},
      {"repeats", args.repeats},
      {"step_graphs", !args.no_graphs && backend.can_capture()},
      {"draft_model", args.draft_model},
      {"draft_head", args.draft_head == DraftHead::W4A16 ? "w4a16" : "target"},
      {"state_context", state->max_context},
      {"state_bytes", state_allocated},
      {"device_memory_in_use_with_state", in_use_with_state},
      {"device_memory_in_use_after_steps", in_use_after_steps},
      {"steps", nlohmann::json::array()},
  };
  fmt::print("{} on {} ({}), weights {:.3f} GB, limit {:.0f} GB/s\n", args.model_dir, device, backend.name(),
             weight_bytes / 1e9, args.bandwidth_gbs);
  if (in_use_with_state >= 0)
    fmt::print(
        "memory: weights {:.3f} GB (+ {:.3f} GB of BF16 copies for prefill), state for {} tokens {:.3f} GB "
        "(KV, GDN, pending verify rows); device in use {:.3f} GB with weights and state, {:.3f} GB after the "
        "steps (workspaces {:.3f} GB)\n",
        weight_bytes / 1e9, double(model.dequantized_bytes()) / 1e9, state->max_context,
        state_allocated / 1e9, double(in_use_with_state) / 1e9, double(in_use_after_steps) / 1e9,
        double(in_use_after_steps - in_use_with_state) / 1e9);
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

  if (args.e2e) {
    record["end_to_end"] = nlohmann::json::array();
    // "verify ms" ("draft ms"): a verify (draft) step alone at the middle of a request's context; "rest ms":
    // a speculative step less them (the commit, the host's work, the argmax read-back and, with the drafter
    // running ("+d"), its context pass: issue 5's "everything else per step"); "context ms": that context
    // pass alone, part of the rest.
    fmt::print("\n{:<8} {:>6} {:>11} {:>11} {:>12} {:>10} {:>11} {:>9} {:>10} {:>9} {:>8} {:>10}\n", "prompt",
               "new", "acceptance", "median ms", "decode tok/s", "measured", "prefill ms", "ms/step",
               "verify ms", "draft ms", "rest ms", "context ms");
    for (const EndToEndResult& r :
         run_end_to_end(args, model, backend, drafter ? drafter->model.get() : nullptr)) {
      const double ms = median(r.ms);
      const double step_ms = r.step_ms.empty() ? 0.0 : median(r.step_ms);
      const std::string acceptance =
          r.acceptance == 0 ? "plain" : fmt::format("{}{}", r.acceptance, r.drafter ? "+d" : "");
      fmt::print("{:<8} {:>6} {:>11} {:>11.2f} {:>12.1f} {:>10.2f} {:>11.2f} {:>9.3f}", r.prompt_tokens,
                 r.new_tokens, acceptance, ms, r.new_tokens / (ms * 1e-3), r.mean_acceptance_length,
                 median(r.prefill_ms), step_ms);
      nlohmann::json entry = {{"prompt_tokens", r.prompt_tokens},
                              {"new_tokens", r.new_tokens},
                              {"acceptance_length", r.acceptance},
                              {"measured_acceptance_length", r.mean_acceptance_length},
                              {"median_ms", ms},
                              {"ms", r.ms},
                              {"median_prefill_ms", median(r.prefill_ms)},
                              {"prefill_ms", r.prefill_ms},
                              {"median_step_ms", step_ms},
                              {"step_ms", r.step_ms},
                              {"drafter", r.drafter}};
      if (!r.verify_ms.empty()) {
        const double verify_ms = median(r.verify_ms);
        const double draft_ms = r.drafter ? median(r.draft_ms) : 0.0;
        fmt::print(" {:>10.3f} {:>9} {:>8.3f} {:>10}", verify_ms,
                   r.drafter ? fmt::format("{:.3f}", draft_ms) : "", step_ms - verify_ms - draft_ms,
                   r.drafter ? fmt::format("{:.3f}", median(r.context_ms)) : "");
        entry["verify_ms"] = r.verify_ms;
        entry["median_verify_ms"] = verify_ms;
        if (r.drafter) {
          entry["draft_ms"] = r.draft_ms;
          entry["median_draft_ms"] = draft_ms;
          entry["context_ms"] = r.context_ms;
          entry["median_context_ms"] = median(r.context_ms);
          entry["drafter_context"] = r.drafter_context;
        }
        entry["median_rest_ms"] = step_ms - verify_ms - draft_ms;
      }
      fmt::print("\n");
      record["end_to_end"].push_back(entry);
    }
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
  add_backend_options(*cmd, args->backend, args->backend_options);
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
  cmd->add_option("--draft-model", args->draft_model,
                  "DFlash drafter: also time the draft step and the commit, and with --e2e each "
                  "acceptance length again with the drafter running every step");
  add_draft_head_option(*cmd, args->draft_head);
  cmd->add_option("--draft-window", args->draft_window, "drafter sliding window for the draft step (0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag(
      "--e2e", args->e2e,
      "end-to-end competition protocol: filler prompts, temperature 0, plain and at each --acceptance");
  cmd->add_option("--e2e-prompts", args->e2e_prompts,
                  "prompt lengths of the categories (64 -> 128 new tokens, "
                  "else 256)")
      ->delimiter(',');
  cmd->add_option("--acceptance", args->acceptance, "oracle acceptance lengths (tokens per step, 1..16)")
      ->delimiter(',');
  cmd->add_option("--warmups", args->warmups, "untimed requests per end-to-end case")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--e2e-runs", args->e2e_runs, "timed requests per end-to-end case (median reported)")
      ->check(CLI::PositiveNumber);
  cmd->callback([args] { run_bench(*args); });
}

}  // namespace qspec::cli
