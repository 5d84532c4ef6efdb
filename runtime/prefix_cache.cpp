// The shared prefix cache (prefix_cache.h): cut points of a prompt, and the radix tree with its LRU budget.
#include "runtime/prefix_cache.h"

#include <algorithm>

#include "runtime/errors.h"

namespace qrig::runtime {

std::vector<PrefixCut> prefix_cuts(const ir::PrefixCachePolicy& pc, const std::vector<int32_t>& prompt) {
  const int64_t n = (int64_t)prompt.size();
  std::map<int64_t, bool> cuts;  // position -> snapshot
  auto add = [&](int64_t pos, bool snap) {
    if (pos <= 0 || pos >= n) return;
    bool& s = cuts[pos];
    s = s || snap;
  };
  if (pc.chunk > 0)
    for (int64_t p = pc.chunk; p < n; p += pc.chunk) add(p, true);
  if (pc.turn_start >= 0) {
    int64_t message = 0, last_header = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (prompt[(size_t)i] != pc.turn_start) continue;
      // A message starts here; the second one's start is the end of the first (the system prompt, tools).
      ++message;
      add(i, message == 2);
      for (int64_t j = i + 1; j <= i + pc.header_max && j < n; ++j) {
        if (prompt[(size_t)j] == pc.turn_start) break;
        if (prompt[(size_t)j] == pc.header_end) {
          add(j + 1, message == 2);
          last_header = j + 1;
          break;
        }
      }
    }
    add(last_header, true);  // the start of the last turn: the generation prompt's header
  }
  add(n - 1, true);  // an identical prompt restores here and runs only its last token
  std::vector<PrefixCut> out;
  for (const auto& [pos, snap] : cuts) out.push_back({pos, snap});
  return out;
}

struct PrefixCache::Node {
  Node* parent = nullptr;
  int64_t begin = 0, end = 0;
  std::vector<int32_t> edge;  // tokens [begin, end)
  std::map<int32_t, std::unique_ptr<Node>> children;
  std::shared_ptr<KvSpan> kv;      // positions [begin, end)
  std::shared_ptr<Snapshot> snap;  // the state at `end`
  uint64_t last_use = 0;
};

PrefixCache::PrefixCache(Backend& backend, int64_t budget_bytes)
    : backend_(backend), budget_(std::max<int64_t>(0, budget_bytes)), root_(std::make_unique<Node>()) {
  if (budget_ > 0 && !backend_.kv_spans())
    throw RuntimeError("the plan gives the shared prefix cache a budget, but this backend cannot copy KV entries "
                       "between slots: recompile the plan (its prefix cache budget is 0 there)");
  stats_.budget = budget_;
}

PrefixCache::~PrefixCache() = default;

int64_t PrefixCache::node_bytes(const Node& n) const {
  return (n.kv ? n.kv->bytes() : 0) + (n.snap ? backend_.snapshot_bytes() : 0);
}

PrefixCache::Hit PrefixCache::lookup(const std::vector<int32_t>& prompt, const std::vector<PrefixCut>& cuts) {
  Hit best;
  if (budget_ == 0) return best;
  Node* n = root_.get();
  size_t c = 0;
  const int64_t len = (int64_t)prompt.size();
  while (n->end < len) {
    auto it = n->children.find(prompt[(size_t)n->end]);
    if (it == n->children.end()) break;
    Node* child = it->second.get();
    if (child->end > len || !std::equal(child->edge.begin(), child->edge.end(), prompt.begin() + child->begin)) break;
    n = child;
    while (c < cuts.size() && cuts[c].pos < n->end) ++c;
    if (n->snap && c < cuts.size() && cuts[c].pos == n->end) best = {n, n->end};
  }
  return best;
}

void PrefixCache::restore(const Hit& hit, int slot, int64_t valid) {
  if (!hit.node) throw RuntimeError("prefix cache: restore of no hit");
  std::vector<const Node*> path;
  for (const Node* n = hit.node; n && n != root_.get(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  for (const Node* n : path)
    if (n->end > valid) backend_.restore_kv(slot, *n->kv, std::max(n->begin, valid), n->end);
  backend_.restore(slot, *hit.node->snap);
  ++clock_;
  for (const Node* n : path) const_cast<Node*>(n)->last_use = clock_;
  ++stats_.hits;
  stats_.hit_tokens += hit.pos;
}

// Cuts node n at position `at` (begin < at < end): a new parent holds [begin, at), n keeps [at, end) and its
// snapshot and children.
PrefixCache::Node* PrefixCache::split(Node* n, int64_t at) {
  auto up = std::make_unique<Node>();
  up->parent = n->parent;
  up->begin = n->begin;
  up->end = at;
  up->edge.assign(n->edge.begin(), n->edge.begin() + (at - n->begin));
  up->kv = backend_.slice_kv(*n->kv, n->begin, at);
  std::shared_ptr<KvSpan> low = backend_.slice_kv(*n->kv, at, n->end);
  up->last_use = n->last_use;
  Node* parent = n->parent;
  std::unique_ptr<Node> self = std::move(parent->children.at(n->edge.front()));
  n->edge.erase(n->edge.begin(), n->edge.begin() + (at - n->begin));
  n->begin = at;
  n->kv = std::move(low);
  n->parent = up.get();
  Node* u = up.get();
  u->children.emplace(n->edge.front(), std::move(self));
  parent->children[u->edge.front()] = std::move(up);
  ++stats_.nodes;
  return u;
}

void PrefixCache::drop(Node* n, const std::vector<const Node*>& keep) {
  stats_.bytes -= node_bytes(*n);
  Node* parent = n->parent;
  parent->children.erase(n->edge.front());
  --stats_.nodes;
  // A parent left without children or snapshot holds nothing anyone can restore (unless it is being extended).
  if (parent != root_.get() && parent->children.empty() && !parent->snap &&
      std::find(keep.begin(), keep.end(), parent) == keep.end())
    drop(parent, keep);
}

// Evicts least recently used entries (leaves whole, or the snapshots of inner nodes) until `need` more bytes fit,
// never touching the nodes in `keep` (the path being inserted). False when that cannot be done.
bool PrefixCache::make_room(int64_t need, const std::vector<const Node*>& keep) {
  if (need > budget_) return false;
  while (stats_.bytes + need > budget_) {
    Node* victim = nullptr;
    std::vector<Node*> stack{root_.get()};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (auto& [t, c] : n->children) stack.push_back(c.get());
      if (n == root_.get() || std::find(keep.begin(), keep.end(), n) != keep.end()) continue;
      if (!n->children.empty() && !n->snap) continue;
      if (!victim || n->last_use < victim->last_use) victim = n;
    }
    if (!victim) return false;
    ++stats_.evictions;
    if (victim->children.empty()) {
      drop(victim, keep);
    } else {
      stats_.bytes -= backend_.snapshot_bytes();
      victim->snap.reset();
    }
  }
  return true;
}

void PrefixCache::insert(int slot, const std::vector<int32_t>& tokens) {
  if (budget_ == 0 || tokens.empty()) return;
  const int64_t p = (int64_t)tokens.size();
  // The deepest node matching, and how far into its edge.
  Node* n = root_.get();
  int64_t matched = 0;  // tokens of `tokens` the tree holds along this path
  std::vector<const Node*> path;
  while (matched < p) {
    auto it = n->children.find(tokens[(size_t)matched]);
    if (it == n->children.end()) break;
    Node* child = it->second.get();
    int64_t k = child->begin;
    while (k < child->end && k < p && child->edge[(size_t)(k - child->begin)] == tokens[(size_t)k]) ++k;
    matched = k;
    n = child;
    path.push_back(n);
    if (k < child->end) break;  // inside the child's edge
  }
  const int64_t snap_bytes = backend_.snapshot_bytes();
  if (n != root_.get() && matched < n->end) {  // inside n's edge: split there, so that n's rest may be evicted
    n = split(n, matched);
    path.back() = n;
  }
  if (n->end == p && n != root_.get()) {  // a node ends here already
    ++clock_;
    for (const Node* q : path) const_cast<Node*>(q)->last_use = clock_;
    if (n->snap) return;
    if (!make_room(snap_bytes, path)) return;
    n->snap = backend_.save(slot);
    stats_.bytes += snap_bytes;
    ++stats_.inserts;
    return;
  }
  // A new leaf [matched, p): its KV entries and a snapshot.
  const int64_t need = (p - matched) * backend_.save_kv(slot, p - 1, p)->bytes() + snap_bytes;
  if (!make_room(need, path)) return;
  std::shared_ptr<KvSpan> kv = backend_.save_kv(slot, matched, p);
  std::shared_ptr<Snapshot> snap = backend_.save(slot);
  ++clock_;
  for (const Node* q : path) const_cast<Node*>(q)->last_use = clock_;
  {
    auto leaf = std::make_unique<Node>();
    leaf->parent = n;
    leaf->begin = matched;
    leaf->end = p;
    leaf->edge.assign(tokens.begin() + matched, tokens.end());
    leaf->kv = std::move(kv);
    leaf->snap = std::move(snap);
    leaf->last_use = clock_;
    stats_.bytes += node_bytes(*leaf);
    n->children[leaf->edge.front()] = std::move(leaf);
    ++stats_.nodes;
  }
  ++stats_.inserts;
}

}  // namespace qrig::runtime
