// Step graphs by key, for a model whose steps repeat a few shapes: the first step of a key runs its ops
// directly (ops may size their workspaces then), the second records them, later ones replay the recording
// (one launch). A recording reads and writes the buffers it was recorded with: a key must tell apart every
// input a step reads through a pointer that can change, and clear() is due when the model reallocates one.
// Recordings made before the backend reallocated one of its own workspaces are dropped on the next run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "backend/ops.h"

namespace qspec {

template <typename Key>
class StepGraphCache {
 public:
  StepGraphCache(Backend& backend, size_t capacity) : backend_(backend), capacity_(capacity) {}

  // Off: every step runs its ops directly (also on backends that cannot record).
  void set_enabled(bool enabled) {
    enabled_ = enabled;
    graphs_.clear();
  }
  void clear() { graphs_.clear(); }

  // `ops` is called directly or recorded (converted to a std::function only then, so a replay allocates
  // nothing).
  template <typename Ops>
  void run(const Key& key, const Ops& ops) {
    if (!enabled_ || !backend_.can_capture()) {
      ops();
      return;
    }
    if (backend_.workspace_generation() != generation_) {
      graphs_.clear();
      generation_ = backend_.workspace_generation();
    }
    auto found = graphs_.find(key);
    if (found == graphs_.end()) {
      if (graphs_.size() >= capacity_) graphs_.clear();
      graphs_.emplace(key, nullptr);  // a null graph: seen once, recorded on its next step
      ops();
      return;
    }
    if (!found->second) found->second = backend_.capture(ops);
    found->second->launch();
  }

 private:
  Backend& backend_;
  size_t capacity_;
  bool enabled_ = true;
  uint64_t generation_ = 0;  // the backend's workspace generation the recordings were made in
  std::map<Key, std::unique_ptr<StepGraph>> graphs_;
};

}  // namespace qspec
