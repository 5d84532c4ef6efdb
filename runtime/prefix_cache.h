// The prefix cache shared by all slots (issue 15, docs/prefix-cache.md): a radix tree over token ids whose nodes
// own copies of the attention layers' KV entries for their span of positions and, at the plan's snapshot points,
// the recurrent (conv + GDN) state there. A request restores the longest cached prefix that ends at one of its own
// cut points into any free slot (copying only the KV entries that slot does not already hold), so its output is
// what prefilling it from scratch gives, bit for bit on the CPU. Bytes are held within the plan's budget
// (plan.prefix_cache.budget_bytes), least recently used first out. Used by the engine's worker thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "ir/plan.h"
#include "runtime/backend.h"

namespace qrig::runtime {

// Where a prompt's prefill is cut (every position, ascending, in (0, size)), and which cuts are snapshotted.
// Cuts depend only on the tokens before them (except the one before the last token), so a cut of a prompt is a
// cut of every prompt sharing the tokens up to it: ir::PrefixCachePolicy says which.
struct PrefixCut {
  int64_t pos = 0;
  bool snapshot = false;
};
std::vector<PrefixCut> prefix_cuts(const ir::PrefixCachePolicy& policy, const std::vector<int32_t>& prompt);

struct PrefixCacheStats {
  int64_t hits = 0;          // restores from the index
  int64_t hit_tokens = 0;    // prompt tokens those restores skipped
  int64_t inserts = 0;       // snapshots taken into the index
  int64_t evictions = 0;     // nodes or snapshots dropped for room
  int64_t bytes = 0;         // held now (KV spans + snapshots)
  int64_t budget = 0;
  int64_t nodes = 0;
};

class PrefixCache {
 public:
  struct Node;
  // budget 0: holds nothing (lookups miss, inserts do nothing). A positive budget needs a backend with kv_spans().
  PrefixCache(Backend& backend, int64_t budget_bytes);
  ~PrefixCache();

  // The deepest node with a snapshot whose tokens are a prefix of `prompt` ending at one of `cuts` (a cut is
  // always below the prompt's end); nullptr when there is none.
  struct Hit {
    const Node* node = nullptr;
    int64_t pos = 0;
  };
  Hit lookup(const std::vector<int32_t>& prompt, const std::vector<PrefixCut>& cuts);
  // Puts the hit's state into `slot`, whose KV entries below `valid` already hold exactly the hit's tokens there
  // (computed at the same cuts): copies the rest of the KV spans, then restores the snapshot (the slot's position
  // becomes hit.pos). Throws RuntimeError from the backend (the slot's state is then unknown).
  void restore(const Hit& hit, int slot, int64_t valid);
  // Takes `slot`'s state at position tokens.size() into the index: its KV entries (those not cached yet) and a
  // snapshot. The slot's entries below that position must be what prefilling `tokens` at its cuts computes.
  // Makes room by evicting; does nothing when the budget cannot hold it. Backend errors propagate (nothing is
  // changed then).
  void insert(int slot, const std::vector<int32_t>& tokens);

  const PrefixCacheStats& stats() const { return stats_; }
  int64_t budget() const { return budget_; }

 private:
  Node* split(Node* n, int64_t at);
  bool make_room(int64_t need, const std::vector<const Node*>& keep);
  void drop(Node* n, const std::vector<const Node*>& keep);  // a leaf, with its KV and snapshot
  int64_t node_bytes(const Node& n) const;

  Backend& backend_;
  int64_t budget_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace qrig::runtime
