// The BPE merges keyed by token pair, as a flat open-addressing hash table: BPE looks up every adjacent pair
// of every piece, and a node-based map made that the encoder's hottest spot.
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/token_id.h"

namespace qspec {

class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    TokenId merged;
  };

  // Room for `pairs` distinct pairs at most half full.
  explicit MergeTable(size_t pairs);

  // Ids must be non-negative. Inserting more distinct pairs than the constructor's `pairs` is a logic error.
  void insert_or_assign(TokenId left, TokenId right, Merge merge);
  const Merge* find(TokenId left, TokenId right) const;

 private:
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of non-negative ids has this key

  size_t first_slot(uint64_t key) const;

  std::vector<Slot> slots_;
  size_t mask_;
  int shift_;
};

}  // namespace qspec
