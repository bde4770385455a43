#include "tokenizer/bpe.h"

#include <algorithm>
#include <mutex>

#include "core/error.h"

namespace qspec {
namespace {

// As in HF: long pieces (runs of spaces, base64 blobs) are rarely repeated, so only short ones are cached,
// and the cache stops growing when full instead of evicting.
constexpr size_t kMaxCachedPieceBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 17;

struct Symbol {
  TokenId id;
  int32_t prev, next;  // -1: none
  bool merged_away;
};

struct Candidate {
  int32_t rank;
  int32_t position;
  TokenId merged;
  // Heaps pop the greatest: make that the lowest rank, then the leftmost position.
  bool operator<(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : position > other.position;
  }
};

}  // namespace

Bpe::Bpe(std::vector<std::string> vocab, const std::vector<BpeMerge>& merges, bool ignore_merges)
    : vocab_(std::move(vocab)), merges_(merges.size()), ignore_merges_(ignore_merges) {
  token_of_bytes_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) token_of_bytes_.emplace(vocab_[id], static_cast<TokenId>(id));
  for (unsigned byte = 0; byte < 256; ++byte) {
    const char as_char = static_cast<char>(byte);
    const std::optional<TokenId> token = find(std::string_view(&as_char, 1));
    if (!token) fail("model.vocab has no token for byte 0x{:02X}", byte);
    byte_token_[byte] = *token;
  }
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& merge = merges[rank];
    merges_.insert_or_assign(merge.left, merge.right, {static_cast<int32_t>(rank), merge.merged});
  }
}

std::optional<TokenId> Bpe::find(std::string_view bytes) const {
  const auto found = token_of_bytes_.find(bytes);
  if (found == token_of_bytes_.end()) return std::nullopt;
  return found->second;
}

void Bpe::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    if (const std::optional<TokenId> whole = find(piece)) {
      out.push_back(*whole);
      return;
    }
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    merge_bytes(piece, out);
    return;
  }
  {
    const std::shared_lock lock(cache_mutex_);
    const auto cached = cache_.find(piece);
    if (cached != cache_.end()) {
      out.insert(out.end(), cached->second.begin(), cached->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_bytes(piece, out);
  const std::unique_lock lock(cache_mutex_);
  if (cache_.size() < kMaxCacheEntries) {
    cache_.emplace(std::string(piece),
                   std::vector<TokenId>(out.begin() + static_cast<ptrdiff_t>(first), out.end()));
  }
}

void Bpe::merge_bytes(std::string_view piece, std::vector<TokenId>& out) const {
  // Scratch space reused across calls: most pieces are a few bytes, and allocating per piece would dominate.
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate>
      candidates;  // a heap: std::pop_heap yields the lowest rank, then leftmost
  const auto count = static_cast<int32_t>(piece.size());
  symbols.resize(piece.size());
  candidates.clear();
  for (int32_t i = 0; i < count; ++i) {
    symbols[i] = {byte_token_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < count ? i + 1 : -1,
                  false};
  }
  const auto consider = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const MergeTable::Merge* merge = merges_.find(symbols[left].id, symbols[right].id)) {
      candidates.push_back({merge->rank, left, merge->merged});
      std::push_heap(candidates.begin(), candidates.end());
    }
  };
  for (int32_t i = 0; i + 1 < count; ++i) consider(i);

  while (!candidates.empty()) {
    std::pop_heap(candidates.begin(), candidates.end());
    const Candidate top = candidates.back();
    candidates.pop_back();
    Symbol& left = symbols[top.position];
    // Stale candidates: the left symbol was merged into its neighbour, or the pair changed since it was
    // queued.
    if (left.merged_away || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const MergeTable::Merge* current = merges_.find(left.id, right.id);
    if (current == nullptr || current->merged != top.merged) continue;

    left.id = top.merged;
    right.merged_away = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.position;
    if (left.prev >= 0) consider(left.prev);
    consider(top.position);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace qspec
