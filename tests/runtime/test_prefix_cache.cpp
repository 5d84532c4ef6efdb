// The shared prefix cache (runtime/prefix_cache.h): cut points of a prompt worked out by hand, the radix tree's
// splits and LRU budget on the CPU backend (a restored slot continues exactly as the slot it was taken from), and
// the engine reusing a shared system prompt in another slot and an identical prompt, each output bit for bit a
// plain run's from scratch (fed at the same cut points, as a cache-off run is).
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <random>

#include "engine_test_util.h"
#include "runtime/prefix_cache.h"

using namespace qrig;
using test::greedy;
using test::random_prompt;
using test::Result;
using test::submit;

namespace {

ir::PrefixCachePolicy policy() {
  ir::PrefixCachePolicy pc;
  pc.mode = "shared";
  pc.budget_bytes = 1 << 20;
  pc.chunk = 64;
  pc.turn_start = 1001;
  pc.header_end = 5;
  pc.header_max = 3;
  return pc;
}

// A ChatML-like prompt of the tiny vocabulary: <|im_start|> role \n body <|im_end|> \n per message, then the
// generation header. Bodies are random ids below 1000 other than the newline (5).
std::vector<int32_t> chat(const ir::Plan& plan, std::mt19937& rng, const std::vector<int>& bodies) {
  std::vector<int32_t> p;
  std::uniform_int_distribution<int32_t> d(10, 999);
  const int32_t ts = (int32_t)plan.prefix_cache.turn_start, nl = (int32_t)plan.prefix_cache.header_end;
  for (int n : bodies) {
    p.insert(p.end(), {ts, 77, nl});
    for (int i = 0; i < n; ++i) {
      int32_t t = d(rng);
      p.push_back(t == nl ? 11 : t);
    }
    p.insert(p.end(), {1002, nl});
  }
  p.insert(p.end(), {ts, 78, nl});
  return p;
}

}  // namespace

TEST_CASE("prefix cuts: message starts, header ends, chunks and the last token; snapshots where the plan says",
          "[runtime]") {
  const ir::PrefixCachePolicy pc = policy();
  // positions: 0 ts, 1 role, 2 \n | 3..9 body | 10 ts 11 role 12 \n | 13..69 | 70 ts 71 72 \n (header of 3) | 73..
  std::vector<int32_t> p(80, 20);
  p[0] = p[10] = p[70] = 1001;
  p[2] = p[12] = 5;
  p[73] = 5;  // 3 tokens after the turn start at 70: still its header
  p[75] = 1001;  // a turn start whose header never ends within 3 tokens
  const auto cuts = runtime::prefix_cuts(pc, p);
  std::vector<std::pair<int64_t, bool>> got;
  for (const auto& c : cuts) got.emplace_back(c.pos, c.snapshot);
  // 3: header end of message 1; 10, 13: start and header end of message 2 (the end of the first message:
  // snapshots); 64: chunk; 70, 74: message 3 (74 the last header: a snapshot); 75: message 4; 79: the last token.
  const std::vector<std::pair<int64_t, bool>> want = {{3, false},  {10, true}, {13, true}, {64, true},
                                                      {70, false}, {74, true}, {75, false}, {79, true}};
  CHECK(got == want);
  // No markers: chunks and the last token only; a one-token prompt has no cut.
  ir::PrefixCachePolicy none = pc;
  none.turn_start = none.header_end = -1;
  got.clear();
  for (const auto& c : runtime::prefix_cuts(none, p)) got.emplace_back(c.pos, c.snapshot);
  CHECK(got == std::vector<std::pair<int64_t, bool>>{{64, true}, {79, true}});
  CHECK(runtime::prefix_cuts(pc, {1001}).empty());
}

TEST_CASE("prefix cache: a node restored into another slot continues as the slot it came from; splits; LRU budget",
          "[runtime][fixtures]") {
  auto plan = test::plan_for(2);
  REQUIRE(plan.prefix_cache.mode == "shared");
  auto be = runtime::make_backend(plan);
  std::mt19937 rng(5);
  const auto a = random_prompt(rng, 100);
  auto b = std::vector<int32_t>(a.begin(), a.begin() + 50);
  for (int32_t t : random_prompt(rng, 30)) b.push_back(t);
  const int64_t snap = be->snapshot_bytes();
  const int64_t kv_tok = be->save_kv(0, 0, 0)->bytes();  // an empty span
  CHECK(kv_tok == 0);
  runtime::PrefixCache cache(*be, 8 * snap);
  be->step({{0, a, false}});
  cache.insert(0, a);
  const int64_t per_pos = be->save_kv(0, 0, 1)->bytes();
  CHECK(cache.stats().bytes == 100 * per_pos + snap);
  // b shares a's first 50 tokens: the node splits there; b's node holds only its own 30 positions.
  be->reset(1);
  be->step({{1, b, false}});
  cache.insert(1, b);
  CHECK(cache.stats().nodes == 3);
  CHECK(cache.stats().bytes == 130 * per_pos + 2 * snap);
  // a's state restored into slot 1 (which holds b's first 50 positions already) continues exactly as slot 0.
  std::vector<runtime::PrefixCut> cuts_a = {{100, true}};
  auto ax = test::concat(a, {7});
  auto hit = cache.lookup(ax, cuts_a);
  REQUIRE(hit.node);
  CHECK(hit.pos == 100);
  cache.restore(hit, 1, 50);
  CHECK(be->position(1) == 100);
  auto out = be->step({{0, {7, 8}, true}, {1, {7, 8}, true}});
  CHECK(test::bit_equal(out[0], out[1]));
  // Not a cut of the prompt: no hit.
  CHECK(!cache.lookup(ax, {{99, true}}).node);
  CHECK(!cache.lookup(ax, {}).node);
  // A budget of two snapshots and little KV: the least recently used goes first, bytes stay within it.
  runtime::PrefixCache small(*be, 2 * snap + 120 * per_pos);
  be->reset(0);
  be->step({{0, a, false}});
  small.insert(0, a);
  be->reset(1);
  be->step({{1, b, false}});
  small.insert(1, b);  // needs 30 more positions and a snapshot: a's snapshot (inner after the split) goes
  CHECK(small.stats().evictions >= 1);
  CHECK(small.stats().bytes <= small.budget());
  CHECK(small.lookup(test::concat(b, {1}), {{80, true}}).node);
  CHECK(!small.lookup(ax, cuts_a).node);
  // Larger than the whole budget: not taken, nothing breaks.
  runtime::PrefixCache tiny(*be, snap / 2);
  tiny.insert(0, a);
  CHECK(tiny.stats().bytes == 0);
  CHECK(!tiny.lookup(ax, cuts_a).node);
}

TEST_CASE("prefix cache in the engine: a shared system prompt in another slot, an identical re-send", "[runtime][fixtures]") {
  auto plan = test::plan_for(2);
  const bool shared = plan.prefix_cache.mode == "shared";
  REQUIRE(plan.prefix_cache.turn_start >= 0);
  std::mt19937 rng(9);
  auto backend = std::make_unique<test::RecordingBackend>(plan);
  const test::RecordingBackend& rec = *backend;
  runtime::Engine e(std::move(backend));
  const auto a = chat(plan, rng, {70, 12});
  // b: a's system message, then another question.
  const size_t sys_end = 70 + 5;  // the first message: 3 header tokens, 70 body tokens, <|im_end|> \n
  auto b = std::vector<int32_t>(a.begin(), a.begin() + (long)sys_end);
  const auto tail = chat(plan, rng, {9});
  b.insert(b.end(), tail.begin(), tail.end());
  // a holds slot 0 (generating) while b runs: b takes slot 1 and restores the system message and the next
  // header there. a is cancelled once b is done.
  auto started = std::make_shared<std::promise<void>>();
  auto once = std::make_shared<std::atomic<bool>>(false);
  uint64_t id_a = 0;
  auto fa = submit(e, greedy(a, 150), &id_a, [started, once](const runtime::TokenEvent&) {
    if (!once->exchange(true)) started->set_value();
  });
  started->get_future().wait();
  Result rb = submit(e, greedy(b, 5)).get();
  e.cancel(id_a);
  Result ra = fa.get();
  REQUIRE(ra.tokens.size() >= 6);
  test::check_bitwise(rec, a, ra, test::reference_greedy(plan, a, (int64_t)ra.tokens.size()));
  test::check_bitwise(rec, b, rb, test::reference_greedy(plan, b, 5));
  if (shared) {
    CHECK(rb.done.cached_tokens == (int64_t)sys_end + 3);
  } else {
    CHECK(rb.done.cached_tokens == 0);
  }
  // The same prompt again: all but its last token (a per-slot plan: its slot's snapshot at the end of a is not
  // below the end of the prompt, so nothing).
  Result ra2 = submit(e, greedy(a, 6)).get();
  CHECK(ra2.done.cached_tokens == (shared ? (int64_t)a.size() - 1 : 0));
  CHECK(ra2.tokens == std::vector<int32_t>(ra.tokens.begin(), ra.tokens.begin() + 6));
  test::check_bitwise(rec, a, ra2, test::reference_greedy(plan, a, 6));
  const auto st = e.stats();
  if (shared) {
    CHECK(st.prefix.hits == 2);
    CHECK(st.prefix.bytes > 0);
    CHECK(st.prefix.bytes <= st.prefix.budget);
  }
}
