// Prefix reuse against stale state: a slot's cached tokens and snapshots must stop being offered once another
// request has overwritten the state they describe, and with several slots a request must reuse the slot
// that really holds its prefix. Every output is compared bit for bit with a plain run fed the same pieces.
#include <catch2/catch.hpp>

#include <future>
#include <random>

#include "engine_test_util.h"

using namespace qrig;
using test::greedy;
using test::random_prompt;
using test::Result;
using test::submit;

namespace {

// The pieces a slot was fed for `prompt` + the first `fed` generated tokens, one step each.
std::vector<std::vector<int32_t>> pieces_of(const std::vector<int32_t>& prompt, const std::vector<int32_t>& gen, size_t fed) {
  std::vector<std::vector<int32_t>> p = {prompt};
  for (size_t i = 0; i < fed; ++i) p.push_back({gen[i]});
  return p;
}

}  // namespace

TEST_CASE("prefix reuse: prompt A, an unrelated B, then A + x in one slot recomputes A", "[runtime][fixtures]") {
  auto plan = test::plan_for(1);
  std::mt19937 rng(31);
  const auto a = random_prompt(rng, 70), bp = random_prompt(rng, 40);
  auto backend = std::make_unique<test::RecordingBackend>(plan);
  const test::RecordingBackend& rec = *backend;
  runtime::Engine e(std::move(backend));
  Result ra = submit(e, greedy(a, 5)).get();
  // B is unrelated and shorter than A: its KV entries overwrite A's first positions.
  Result rb = submit(e, greedy(bp, 5)).get();
  CHECK(rb.done.cached_tokens == 0);
  test::check_bitwise(rec, bp, rb, test::reference_greedy(plan, bp, 5));
  // A's snapshot (at the end of A) and A's tokens no longer describe the slot: A + x starts from scratch.
  const auto ax = test::concat(a, {11, 12});
  Result rax = submit(e, greedy(ax, 6)).get();
  CHECK(rax.done.cached_tokens == 0);
  test::check_bitwise(rec, ax, rax, test::reference_greedy(plan, ax, 6));
  // A's full history (A + its fed outputs) + x, after B: also nothing reused.
  const auto a_hist = test::concat(test::concat(a, {ra.tokens.begin(), ra.tokens.end() - 1}), {13});
  Result rh = submit(e, greedy(a_hist, 4)).get();
  CHECK(rh.done.cached_tokens == 0);
  test::check_bitwise(rec, a_hist, rh, test::reference_greedy(plan, a_hist, 4));
  // While A + x's own state is still there, its extension is reused (the check above is not vacuous).
  const auto rh_next = test::concat(test::concat(a_hist, {rh.tokens.begin(), rh.tokens.end() - 1}), {14});
  Result rn = submit(e, greedy(rh_next, 3)).get();
  CHECK(rn.done.cached_tokens == (int64_t)(a_hist.size() + rh.tokens.size() - 1));
  std::vector<std::vector<int32_t>> pieces = pieces_of(a_hist, rh.tokens, rh.tokens.size() - 1);
  pieces.push_back({14});
  test::check_bitwise(rec, rh_next, rn, test::reference_greedy(plan, pieces, 3));
}

TEST_CASE("prefix reuse with two slots: each follow-up continues the slot that holds its prefix", "[runtime][fixtures]") {
  auto plan = test::plan_for(2);
  std::mt19937 rng(32);
  const auto a = random_prompt(rng, 50), b = random_prompt(rng, 50);
  auto backend = std::make_unique<test::RecordingBackend>(plan);
  const test::RecordingBackend& rec = *backend;
  runtime::Engine e(std::move(backend));
  // A and B run side by side, one per slot.
  auto fa = submit(e, greedy(a, 5));
  auto fb = submit(e, greedy(b, 5));
  Result ra = fa.get(), rb = fb.get();
  test::check_bitwise(rec, a, ra, test::reference_greedy(plan, a, 5));
  test::check_bitwise(rec, b, rb, test::reference_greedy(plan, b, 5));
  // Follow-ups in the opposite order, together: B's continuation, then A's from its prompt's snapshot.
  const auto b_next = test::concat(test::concat(b, {rb.tokens.begin(), rb.tokens.end() - 1}), {21, 22});
  const auto a_again = test::concat(a, {23});
  auto fb2 = submit(e, greedy(b_next, 6));
  auto fa2 = submit(e, greedy(a_again, 6));
  Result rb2 = fb2.get(), ra2 = fa2.get();
  CHECK(rb2.done.cached_tokens == (int64_t)(b.size() + rb.tokens.size() - 1));
  CHECK(ra2.done.cached_tokens == (int64_t)a.size());
  auto pb = pieces_of(b, rb.tokens, rb.tokens.size() - 1);
  pb.push_back({21, 22});
  test::check_bitwise(rec, b_next, rb2, test::reference_greedy(plan, pb, 6));
  test::check_bitwise(rec, a_again, ra2, test::reference_greedy(plan, {a, {23}}, 6));
  // A third prompt, unrelated, takes the slot used longest ago; A's and B's prefixes on the other stay usable.
  const auto c = random_prompt(rng, 30);
  Result rc = submit(e, greedy(c, 4)).get();
  CHECK(rc.done.cached_tokens == 0);
  test::check_bitwise(rec, c, rc, test::reference_greedy(plan, c, 4));
  // Whichever slot C took, the request extending it is served from C's state, the others from scratch or
  // their own snapshots: each result is still the reference's.
  const auto c_next = test::concat(test::concat(c, {rc.tokens.begin(), rc.tokens.end() - 1}), {24});
  Result rc2 = submit(e, greedy(c_next, 3)).get();
  CHECK(rc2.done.cached_tokens == (int64_t)(c.size() + rc.tokens.size() - 1));
  auto pc = pieces_of(c, rc.tokens, rc.tokens.size() - 1);
  pc.push_back({24});
  test::check_bitwise(rec, c_next, rc2, test::reference_greedy(plan, pc, 3));
}
