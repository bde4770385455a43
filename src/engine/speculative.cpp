#include "engine/speculative.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/config_fields.h"

namespace qspec {

namespace {

void check_oracle_ids(const std::vector<int32_t>& oracle, int vocab_size) {
  for (size_t i = 0; i < oracle.size(); ++i)
    if (oracle[i] < 0 || oracle[i] >= vocab_size)
      fail("draft oracle: element {} is {}, expected a token id in [0, {})", i, oracle[i], vocab_size);
}

// Where verification stopped: the number of drafts accepted and the target's own token after them.
struct Verdict {
  int accepted = 0;
  int32_t next = 0;
};

// Greedy: a draft is accepted while it is the argmax of its row (best[j], one per verified row).
Verdict verify_greedy(std::span<const int32_t> best, std::span<const int32_t> drafts) {
  for (size_t j = 0; j < drafts.size(); ++j)
    if (best[j] != drafts[j]) return {int(j), best[j]};
  return {int(drafts.size()), best[drafts.size()]};
}

// Sampling: a draft is accepted with probability p(d) of its row's distribution, else the token is drawn from
// p without d (renormalised); after K accepted drafts the next token is drawn from the last row. Each emitted
// token has the target's distribution.
Verdict verify_sampled(Sampler& sampler, const std::vector<float>& logits, size_t vocab,
                       std::span<const int32_t> drafts) {
  auto row = [&](size_t j) { return std::span<const float>(logits.data() + j * vocab, vocab); };
  for (size_t j = 0; j < drafts.size(); ++j) {
    const std::vector<TokenProbability>& p = sampler.distribution(row(j));
    auto found =
        std::find_if(p.begin(), p.end(), [&](const TokenProbability& t) { return t.id == drafts[j]; });
    const double p_draft = found == p.end() ? 0.0 : found->probability;
    if (sampler.uniform() < p_draft) continue;
    return {int(j), sampler.draw(p, drafts[j])};
  }
  return {int(drafts.size()), sampler.sample(row(drafts.size()))};
}

}  // namespace

int drafts_per_step(const DFlashModel* drafter, const SpeculativeOptions& spec) {
  if (spec.spec_tokens < 0) fail("--spec-tokens: expected >= 1, got {}", spec.spec_tokens);
  if (spec.draft_window < 0) fail("--draft-window: expected >= 0, got {}", spec.draft_window);
  if (!drafter) {
    // A verify step takes the bonus token and the drafts: at most kGdnReplayMaxRows rows (the GDN replay);
    // a drafter's block is held to it when it loads.
    constexpr int kMaxDrafts = int{kGdnReplayMaxRows} - 1;
    if (spec.spec_tokens > kMaxDrafts)
      fail("--spec-tokens: {} drafts, expected at most {} (a verify step takes at most {} rows)",
           spec.spec_tokens, kMaxDrafts, kGdnReplayMaxRows);
    return spec.spec_tokens > 0 ? spec.spec_tokens : kDefaultSpecTokens;
  }
  const DFlashConfig& c = drafter->config();
  if (spec.spec_tokens > c.block_size - 1)
    fail("--spec-tokens: {} drafts do not fit the drafter's block of {} ({}): at most {}", spec.spec_tokens,
         c.block_size, c.source, c.block_size - 1);
  return spec.spec_tokens > 0 ? spec.spec_tokens : c.block_size - 1;
}

GenerationResult generate_speculative(Qwen35Model& target, Qwen35State& state, const Drafter* drafter,
                                      std::span<const int32_t> prompt, const GenerationOptions& options,
                                      const SpeculativeOptions& spec, const TokenCallback& on_token) {
  const Qwen35Config& config = target.config();
  check_generation_request(config, state, prompt, options);
  if (!drafter && !spec.oracle_drafts)
    fail("speculative generation: no drafter (--draft-model) and no --draft-oracle");
  const int max_drafts = drafts_per_step(drafter ? &drafter->model : nullptr, spec);
  if (spec.oracle_drafts) check_oracle_ids(*spec.oracle_drafts, config.vocab_size);
  if (drafter && drafter->state.n_context != state.n_past)
    fail("speculative generation: the drafter state holds {} tokens, the target state {}",
         drafter->state.n_context, state.n_past);
  if (drafter && drafter->state.max_context < state.max_context)
    fail("speculative generation: the drafter state's context of {} is shorter than the target's {}",
         drafter->state.max_context, state.max_context);

  GenerationResult result;
  result.finish_reason = "length";
  if (options.max_tokens == 0) return result;
  const std::vector<int32_t> stops = stop_ids_of(config, options);
  Sampler sampler(options.sampling);
  Backend& backend = target.backend();
  const auto vocab = static_cast<size_t>(config.vocab_size);
  const std::vector<int> feature_layers =
      drafter ? drafter->model.config().target_layer_ids : std::vector<int>{};
  // Buffers of the steps, sized here so that a step allocates nothing on the host but its record in
  // result.steps: the verify's argmax ids (greedy) or logits (sampling), the block, the features.
  DeviceArgmax device_argmax(backend, max_drafts + 1);
  std::vector<float> logits;
  std::vector<int32_t> block;
  block.reserve(size_t(max_drafts) + 1);
  std::vector<Tensor> features;
  features.reserve(feature_layers.size());
  // The drafter's context follows the target: the features of every token the target consumes.
  auto add_context = [&](const ForwardOutput& out, int64_t rows) {
    if (!drafter) return;
    features.clear();
    for (const Tensor& h : out.hidden) features.push_back(h.rows_view(0, rows));
    drafter->model.add_context(drafter->state, features);
  };

  auto start = std::chrono::steady_clock::now();
  ForwardOutput out =
      prefill(target, state, prompt, options, feature_layers, [&](const ForwardOutput& chunk) {
        if (drafter) add_context(chunk, chunk.hidden.front().rows);  // no features without one
      });
  int32_t bonus = next_token(sampler, device_argmax, backend, out.logits);
  result.prefill_seconds = seconds_since(start);

  // Appends one token; false once generation ends with it.
  auto emit = [&](int32_t id) {
    result.tokens.push_back(id);
    const bool keep_going = !on_token || on_token(id);
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      result.finish_reason = "stop";
      return false;
    }
    return keep_going && int(result.tokens.size()) < options.max_tokens;
  };

  result.tokens.reserve(size_t(options.max_tokens));
  result.steps.reserve(size_t(options.max_tokens));
  ForwardOptions verify;
  verify.all_logits = true;
  verify.hidden_layers = feature_layers;
  verify.advance = false;
  start = std::chrono::steady_clock::now();
  bool more = emit(bonus);
  while (more) {
    const int emitted = int(result.tokens.size());
    int count = std::min(max_drafts, options.max_tokens - emitted);
    block.assign(1, bonus);
    // With oracle drafts too, the drafter still runs every step (its drafts read back, then replaced), so
    // that a timed run at a forced acceptance pays for drafting as a real one does.
    if (drafter) {
      // Greedy drafts, chosen on the device: only their ids are read back.
      const DraftOutput draft = drafter->model.draft(drafter->state, bonus, spec.draft_window);
      block.resize(size_t(count) + 1);
      backend.read(block.data() + 1, draft.ids.rows_view(0, count));
    }
    if (spec.oracle_drafts) {
      const std::vector<int32_t>& oracle = *spec.oracle_drafts;
      count = std::clamp(int(oracle.size()) - emitted, 0, count);
      block.resize(1);
      block.insert(block.end(), oracle.begin() + emitted, oracle.begin() + emitted + count);
    }
    const std::span<const int32_t> drafts(block.data() + 1, size_t(count));

    out = target.forward(state, block, verify);
    Verdict verdict;
    if (sampler.greedy()) {
      verdict = verify_greedy(device_argmax(out.logits), drafts);
    } else {
      logits.resize(block.size() * vocab);
      backend.read(logits.data(), out.logits);
      verdict = verify_sampled(sampler, logits, vocab, drafts);
    }
    result.steps.push_back({std::vector<int32_t>(drafts.begin(), drafts.end()), verdict.accepted});
    result.draft_tokens += count;
    result.accepted_tokens += verdict.accepted;

    // The target consumes the bonus and every token emitted in this step but the last: as many rows as
    // tokens emitted.
    int rows = 0;
    for (int j = 0; j < verdict.accepted && more; ++j, ++rows) more = emit(drafts[size_t(j)]);
    if (more) {
      more = emit(verdict.next);
      ++rows;
    }
    target.commit(state, rows);
    add_context(out, rows);
    bonus = verdict.next;
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

std::vector<int32_t> read_draft_oracle(const std::string& path, int vocab_size) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("--draft-oracle: cannot open {}", path);
  std::ostringstream text;
  text << file.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail("--draft-oracle {}: invalid JSON: {}", path, e.what());
  }
  if (!json.is_array())
    fail("--draft-oracle {}: expected a JSON array of token ids, got {}", path, json_excerpt(json));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < json.size(); ++i) {
    const nlohmann::json& id = json[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
      fail("--draft-oracle {}: element {} is {}, expected a token id in [0, {})", path, i, json_excerpt(id),
           vocab_size);
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace qspec
