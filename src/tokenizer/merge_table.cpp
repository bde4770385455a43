#include "tokenizer/merge_table.h"

namespace qspec {
namespace {

uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

MergeTable::MergeTable(size_t pairs) {
  int bits = 4;
  while ((size_t{1} << bits) < 2 * pairs) ++bits;
  slots_.assign(size_t{1} << bits, Slot{kEmpty, {0, 0}});
  mask_ = slots_.size() - 1;
  shift_ = 64 - bits;
}

size_t MergeTable::first_slot(uint64_t key) const {
  // Fibonacci hashing: the pairs' ids are small and clustered, the multiply spreads them over the top bits.
  return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
}

void MergeTable::insert_or_assign(TokenId left, TokenId right, Merge merge) {
  const uint64_t key = pair_key(left, right);
  for (size_t slot = first_slot(key);; slot = (slot + 1) & mask_) {
    if (slots_[slot].key == kEmpty || slots_[slot].key == key) {
      slots_[slot] = {key, merge};
      return;
    }
  }
}

const MergeTable::Merge* MergeTable::find(TokenId left, TokenId right) const {
  const uint64_t key = pair_key(left, right);
  for (size_t slot = first_slot(key);; slot = (slot + 1) & mask_) {
    if (slots_[slot].key == key) return &slots_[slot].merge;
    if (slots_[slot].key == kEmpty) return nullptr;
  }
}

}  // namespace qspec
