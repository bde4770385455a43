// The gated delta rule of Gated DeltaNet in two fp32 forms of the same math (arguments as
// Backend::gated_delta_rule): the per-token recurrence, and HF's chunked algorithm
// (torch_chunk_gated_delta_rule). Per value head h, with S[i_k][j_v] and per-token decay exp(g):
//   S = exp(g) S ;  delta = beta (v - S^T k) ;  S += k delta^T ;  o = S^T q
// The backend op uses the recurrence for T <= kGdnRecurrentMaxTokens and the chunked form beyond: decode and
// a verify block give bitwise the rows of single-token decode, and the replay of a verify block's record its
// states (what lossless speculative decoding is tested against); long prefills follow HF's chunked prefill.
// Tests may call either form on any T (both update the state).
#pragma once

#include <cstdint>

#include "backend/ops.h"

namespace qspec::cpu {

inline constexpr int kGdnChunkSize = 64;
inline constexpr int64_t kGdnRecurrentMaxTokens = kGdnReplayMaxRows;  // a DFlash block

void gated_delta_rule_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                                const Tensor& state, const GdnShape& shape);

// gdn_commit's recurrent part: the state advanced past every row of the record (S = decay S; S += k delta^T,
// the recurrence's own update). Arguments checked by the caller.
void replay_gated_delta_rule(const GdnReplayRows& replay, const Tensor& state, const GdnShape& shape);

void gated_delta_rule_chunked(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                              const Tensor& state, const GdnShape& shape, int chunk_size = kGdnChunkSize);

}  // namespace qspec::cpu
