// How many ways a GEMM kernel splits K over blocks: the count with the least estimated time, in waves of
// blocks times the chunks a block computes plus a split's fixed cost. Host code, kept apart from the kernel
// so that the rule is checked on the CPU (tests/test_split_by_waves.cpp).
#pragma once

#include <cstdint>
#include <limits>

namespace qspec::cuda {

// K's `chunks` chunks split `wanted` ways: chunks_per_split each (the last may have fewer), and the count of
// splits that gives, fewer than `wanted` when the chunks do not spread that far (7 chunks 6 ways: 4 of 2).
struct KSplit {
  int64_t splits, chunks_per_split;
};

inline KSplit split_k(int64_t chunks, int64_t wanted) {
  const int64_t per_split = (chunks + wanted - 1) / wanted;
  return {(chunks + per_split - 1) / per_split, per_split};
}

// Over wanted = 1 .. max_splits: the count with the fewest waves x (chunks_per_split + cost_chunks), waves
// = ceil(tiles / concurrent(wanted)), concurrent(s) being how many tiles split s ways run at once (0: not
// at all). Counts the chunks do not give exactly and splits of fewer than min_chunks chunks (beyond one
// split) are skipped; ties go to fewer splits.
template <typename Concurrent>
int64_t splits_by_waves(int64_t tiles, int64_t chunks, int64_t max_splits, int64_t min_chunks,
                        int64_t cost_chunks, Concurrent concurrent) {
  int64_t best = 1, best_cost = std::numeric_limits<int64_t>::max();
  for (int64_t wanted = 1; wanted <= max_splits; ++wanted) {
    const KSplit split = split_k(chunks, wanted);
    if (split.splits != wanted || (wanted > 1 && split.chunks_per_split < min_chunks)) continue;
    const int64_t at_once = concurrent(wanted);
    if (at_once <= 0) continue;
    const int64_t cost = (tiles + at_once - 1) / at_once * (split.chunks_per_split + cost_chunks);
    if (cost < best_cost) {
      best = wanted;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace qspec::cuda
