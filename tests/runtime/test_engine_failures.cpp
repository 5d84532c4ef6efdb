// Engine under injected failures (tests/runtime/test_backends.h FailingBackend, a constraint that throws): the
// request gets the error with its message and exactly one on_done, the tokens it produced before are the
// reference's, its slot forgets its cached state, and the requests after it still match their reference bit
// for bit.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <random>

#include "engine_test_util.h"

using namespace qrig;
using test::greedy;
using test::random_prompt;
using test::Result;
using test::submit;

namespace {

bool contains(const std::vector<int32_t>& v, int32_t t) { return std::find(v.begin(), v.end(), t) != v.end(); }

// The recording backend over a failing one, and pointers to both.
struct Backends {
  std::unique_ptr<test::RecordingBackend> owned;
  test::RecordingBackend* rec;
  test::FailingBackend* fail;
  explicit Backends(const ir::Plan& plan) {
    auto f = std::make_unique<test::FailingBackend>(plan);
    fail = f.get();
    owned = std::make_unique<test::RecordingBackend>(std::move(f));
    rec = owned.get();
  }
};

// allowed() throws on call number throw_at_allowed (only that call), accept() on call throw_at_accept; the
// constraint itself allows everything (returns false: nothing constrained), so outputs are the plain ones.
class ThrowingConstraint final : public runtime::TokenConstraint {
 public:
  ThrowingConstraint(int throw_at_allowed, int throw_at_accept)
      : throw_at_allowed_(throw_at_allowed), throw_at_accept_(throw_at_accept) {}
  bool allowed(std::vector<bool>&) override {
    if (++allowed_calls == throw_at_allowed_) throw std::runtime_error("constraint failed in allowed (test)");
    return false;
  }
  void accept(int32_t) override {
    if (++accept_calls == throw_at_accept_) throw std::runtime_error("constraint failed in accept (test)");
  }
  std::atomic<int> allowed_calls{0}, accept_calls{0};

 private:
  int throw_at_allowed_, throw_at_accept_;
};

}  // namespace

TEST_CASE("a step that throws fails its request with the message; the slot starts afresh, the queue goes on",
          "[runtime][fixtures]") {
  auto plan = test::plan_for(1, 128);
  // Prompts whose greedy outputs do not contain the poison (the 4th token X generates), which appears in X's
  // output only once: X's step feeding it back fails, after X has emitted 4 tokens.
  std::mt19937 rng(21);
  std::vector<int32_t> x, y, z;
  test::Reference rx, ry, rz;
  int32_t poison = -1;
  for (int attempt = 0; attempt < 50 && poison < 0; ++attempt) {
    x = random_prompt(rng, 10);
    rx = test::reference_greedy(plan, x, 8);
    const int32_t p = rx.tokens[3];
    if (contains(x, p) || contains({rx.tokens.begin(), rx.tokens.begin() + 3}, p)) continue;
    // Y extends X's prompt with X's first outputs and another token: reusable from X's state, if it were kept.
    y = test::concat(x, {rx.tokens[0], rx.tokens[1], 5});
    z = random_prompt(rng, 12);
    ry = test::reference_greedy(plan, y, 8);
    rz = test::reference_greedy(plan, z, 8);
    if (contains(y, p) || contains(ry.tokens, p) || contains(z, p) || contains(rz.tokens, p)) continue;
    poison = p;
  }
  REQUIRE(poison >= 0);
  Backends b(plan);
  b.fail->poison_token = poison;
  runtime::Engine e(std::move(b.owned));
  auto fx = submit(e, greedy(x, 8));
  auto fy = submit(e, greedy(y, 8));  // both wait for X's slot
  auto fz = submit(e, greedy(z, 8));
  Result r = fx.get();
  CHECK(r.done.reason == runtime::Finish::error);
  CHECK(r.done.error == b.fail->step_message);
  CHECK(r.tokens == std::vector<int32_t>(rx.tokens.begin(), rx.tokens.begin() + 4));
  CHECK(b.fail->failed_steps == 1);
  Result ry_got = fy.get(), rz_got = fz.get();
  CHECK(ry_got.done.reason == runtime::Finish::length);
  CHECK(ry_got.done.cached_tokens == 0);  // X's state is forgotten, not reused
  test::check_bitwise(*b.rec, y, ry_got, ry);
  CHECK(rz_got.done.reason == runtime::Finish::length);
  test::check_bitwise(*b.rec, z, rz_got, rz);
  for (const Result* q : {&r, &ry_got, &rz_got}) CHECK(q->done_calls == 1);
  CHECK(e.stats().requests_total == 3);
}

TEST_CASE("a failed step fails every request in it; both slots start afresh", "[runtime][fixtures]") {
  auto plan = test::plan_for(2, 128);
  std::mt19937 rng(22);
  const auto w = random_prompt(rng, 9);
  const auto rw = test::reference_greedy(plan, w, 40);
  // V's prompt carries the poison, a token W never sees.
  int32_t poison = 0;
  while (contains(w, poison) || contains(rw.tokens, poison)) ++poison;
  auto v = random_prompt(rng, 6);
  v[2] = poison;
  Backends b(plan);
  b.fail->poison_token = poison;
  runtime::Engine e(std::move(b.owned));
  // W decodes; once it has two tokens V arrives, and V's prompt shares W's next step.
  std::promise<void> two;
  auto count = std::make_shared<int>(0);
  auto fw = submit(e, greedy(w, 40), nullptr, [&two, count](const runtime::TokenEvent&) {
    if (++*count == 2) two.set_value();
  });
  two.get_future().wait();
  auto fv = submit(e, greedy(v, 8));
  Result rv = fv.get(), rw_got = fw.get();
  CHECK(rv.done.reason == runtime::Finish::error);
  CHECK(rv.done.error == b.fail->step_message);
  CHECK(rv.tokens.empty());
  CHECK(rw_got.done.reason == runtime::Finish::error);
  CHECK(rw_got.done.error == b.fail->step_message);
  REQUIRE(rw_got.tokens.size() >= 2);
  CHECK(rw_got.tokens.size() < 40);
  CHECK(rw_got.tokens == std::vector<int32_t>(rw.tokens.begin(), rw.tokens.begin() + (long)rw_got.tokens.size()));
  // W's prompt again, extended: nothing cached on either slot, and the output is the reference's.
  b.fail->poison_token = -1;
  const auto w2 = test::concat(w, {rw.tokens[0], 77});
  Result again = submit(e, greedy(w2, 8)).get();
  CHECK(again.done.cached_tokens == 0);
  test::check_bitwise(*b.rec, w2, again, test::reference_greedy(plan, w2, 8));
}

TEST_CASE("a restore that fails fails its request with the message; the slot's snapshots are dropped",
          "[runtime][fixtures]") {
  auto plan = test::plan_for(1, 128);
  std::mt19937 rng(23);
  const auto a = random_prompt(rng, 20);
  Backends b(plan);
  runtime::Engine e(std::move(b.owned));
  Result first = submit(e, greedy(a, 6)).get();
  CHECK(first.done.reason == runtime::Finish::length);
  // A + 7 would restore the snapshot taken at the end of A.
  const auto a7 = test::concat(a, {7});
  b.fail->fail_restore = true;
  Result r = submit(e, greedy(a7, 6)).get();
  CHECK(r.done.reason == runtime::Finish::error);
  CHECK(r.done.error == "could not prepare the sequence state: " + b.fail->restore_message);
  CHECK(r.tokens.empty());
  CHECK(r.done_calls == 1);
  CHECK(b.fail->failed_restores == 1);
  // The same request again: no snapshot is left to restore, it runs from scratch and matches a fresh run.
  b.fail->fail_restore = false;
  Result again = submit(e, greedy(a7, 6)).get();
  CHECK(again.done.reason == runtime::Finish::length);
  CHECK(again.done.cached_tokens == 0);
  CHECK(b.fail->failed_restores == 1);
  test::check_bitwise(*b.rec, a7, again, test::reference_greedy(plan, a7, 6));
  // A request queued behind one whose restore fails runs as if nothing had happened.
  b.fail->fail_restore = true;
  auto failing = submit(e, greedy(test::concat(a7, {8}), 6));  // would restore the snapshot at the end of A + 7
  const auto other = random_prompt(rng, 11);
  auto queued = submit(e, greedy(other, 6));  // needs no restore
  CHECK(failing.get().done.reason == runtime::Finish::error);
  CHECK(b.fail->failed_restores == 2);
  Result q = queued.get();
  CHECK(q.done.reason == runtime::Finish::length);
  test::check_bitwise(*b.rec, other, q, test::reference_greedy(plan, other, 6));
}

TEST_CASE("a constraint that throws fails only its request, once, with its message", "[runtime][fixtures]") {
  auto plan = test::plan_for(2, 128);
  std::mt19937 rng(24);
  struct Case {
    int at_allowed, at_accept;
    size_t tokens_before;  // tokens emitted before the failure
    std::string message;
  };
  // allowed() fails on its 3rd call (before the 3rd token's step), accept() on its 2nd (the 2nd token was
  // sampled but is not emitted).
  for (const Case& c : {Case{3, 0, 2, "constraint failed in allowed (test)"}, Case{0, 2, 1, "constraint failed in accept (test)"}}) {
    INFO("throws in " << (c.at_allowed ? "allowed" : "accept"));
    auto b = std::make_unique<test::RecordingBackend>(plan);
    const test::RecordingBackend& rec = *b;
    runtime::Engine e(std::move(b));
    const auto cp = random_prompt(rng, 10), pp = random_prompt(rng, 14);
    const auto ref_c = test::reference_greedy(plan, cp, 10), ref_p = test::reference_greedy(plan, pp, 10);
    auto constraint = std::make_shared<ThrowingConstraint>(c.at_allowed, c.at_accept);
    auto creq = greedy(cp, 10);
    creq.constraint = constraint;
    auto fc = submit(e, creq);
    auto fp = submit(e, greedy(pp, 10));  // runs beside it, in the same steps
    Result rc = fc.get(), rp = fp.get();
    CHECK(rc.done.reason == runtime::Finish::error);
    CHECK(rc.done.error == c.message);
    CHECK(rc.done_calls == 1);
    CHECK(rc.tokens == std::vector<int32_t>(ref_c.tokens.begin(), ref_c.tokens.begin() + (long)c.tokens_before));
    // No call after the failure (the engine keeps the first error rather than asking again).
    CHECK(constraint->allowed_calls == (c.at_allowed ? c.at_allowed : c.at_accept));
    CHECK(constraint->accept_calls == (c.at_accept ? c.at_accept : c.at_allowed - 1));
    CHECK(rp.done.reason == runtime::Finish::length);
    test::check_bitwise(rec, pp, rp, ref_p);
    // The failed request's slot kept nothing: its prompt extended is not served from a snapshot.
    const auto cp2 = test::concat(cp, {ref_c.tokens[0], 9});
    Result again = submit(e, greedy(cp2, 4)).get();
    CHECK(again.done.cached_tokens == 0);
    test::check_bitwise(rec, cp2, again, test::reference_greedy(plan, cp2, 4));
  }
}
