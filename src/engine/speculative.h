// Speculative generation (DESIGN.md "The speculative step"): per step the drafter (or an oracle list, which
// takes the place of a drafter's proposals when both are given) proposes K tokens after the bonus token, the
// target verifies [bonus, d1..dK] in one pass, the longest accepted prefix plus one target token are emitted,
// and the target's state is committed over exactly the emitted tokens. Greedy output equals generate()'s
// token for token; with sampling each emitted token has the distribution plain sampling gives it (drafts are
// a deterministic proposal: d is accepted with probability p(d), else the token is drawn from p without d).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "model/dflash.h"

namespace qspec {

inline constexpr int kDefaultSpecTokens = 15;  // without a drafter: the paper's block of 16 minus the bonus

struct SpeculativeOptions {
  int spec_tokens = 0;  // drafts per step K; 0: the drafter's block_size - 1 (kDefaultSpecTokens without one)
  int draft_window = 0;  // drafter sliding window W (keys within W - 1 positions), 0: off
  // Replaces the drafter's proposals when set: the drafts after output position i are
  // oracle_drafts[i .. i+K-1] (fewer near its end), e.g. the expected output with chosen wrong tokens, to
  // force acceptance lengths. A drafter given too still runs every step (its drafts are read back and
  // dropped, its context follows the target), so that timings at a forced acceptance include drafting.
  std::optional<std::vector<int32_t>> oracle_drafts;
};

// A drafter with its state for this sequence; the state holds the same tokens as the target's state.
struct Drafter {
  DFlashModel& model;
  DFlashState& state;
};

// The drafts per step K that `spec` asks of `drafter` (null: oracle drafts). Throws Error naming
// --spec-tokens or --draft-window when one is out of range (K above the drafter's block_size - 1, a negative
// window).
int drafts_per_step(const DFlashModel* drafter, const SpeculativeOptions& spec);

// Like generate(): on_token gets every emitted id in order (returning false stops after it), stop ids and
// max_tokens are honoured inside an accepted block, and the target state ends having consumed the prompt and
// every emitted token but the last (the drafter state likewise). `drafter` may be null when
// spec.oracle_drafts is set; when both are given, the drafter runs every step but the oracle's drafts replace
// its own. Throws Error naming the option on bad input.
GenerationResult generate_speculative(Qwen35Model& target, Qwen35State& state, const Drafter* drafter,
                                      std::span<const int32_t> prompt, const GenerationOptions& options,
                                      const SpeculativeOptions& spec, const TokenCallback& on_token = {});

// Reads a --draft-oracle file: a JSON array of token ids, each in [0, vocab_size). Throws Error naming the
// file and what is wrong.
std::vector<int32_t> read_draft_oracle(const std::string& path, int vocab_size);

}  // namespace qspec
