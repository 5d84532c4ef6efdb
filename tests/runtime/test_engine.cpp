// Engine: continuous batching gives the logits of a plain forward loop bit for bit, alone or with other
// requests running; prefix reuse skips prompt work and continues the same state; cancel, limits and errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "engine_test_util.h"

using namespace qrig;

using test::greedy;
using test::random_prompt;
using test::Result;
using test::submit;

TEST_CASE("engine output equals a plain decode loop bit for bit, alone and in a batch", "[runtime][fixtures]") {
  auto plan = test::plan_for(4, 256, 96);  // small step budget: prompts are prefilled over several steps
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {5, 70, 130, 1, 64, 33, 100, 17}) prompts.push_back(random_prompt(rng, n));
  std::vector<test::Reference> ref;
  for (const auto& p : prompts) ref.push_back(test::reference_greedy(plan, p, 12));

  auto alone_backend = std::make_unique<test::RecordingBackend>(plan);
  const test::RecordingBackend& alone_rec = *alone_backend;
  runtime::Engine alone(std::move(alone_backend));
  for (size_t k = 0; k < 2; ++k) {
    INFO("request " << k << " alone");
    auto r = submit(alone, greedy(prompts[k], 12)).get();
    test::check_bitwise(alone_rec, prompts[k], r, ref[k]);
    CHECK(r.done.reason == runtime::Finish::length);
    CHECK(r.done.generated_tokens == 12);
  }
  auto batched_backend = std::make_unique<test::RecordingBackend>(plan);
  const test::RecordingBackend& batched_rec = *batched_backend;
  runtime::Engine batched(std::move(batched_backend));
  std::vector<std::future<Result>> futs;
  for (const auto& p : prompts) futs.push_back(submit(batched, greedy(p, 12)));  // 8 requests, 4 slots
  for (size_t k = 0; k < prompts.size(); ++k) {
    INFO("request " << k << " batched");
    auto r = futs[k].get();
    test::check_bitwise(batched_rec, prompts[k], r, ref[k]);
    CHECK(r.done.prompt_tokens == (int64_t)prompts[k].size());
  }
  auto st = batched.stats();
  CHECK(st.requests_total == 8);
  CHECK(st.generated_tokens_total == 96);
}

namespace {

// max |a - b| / max |b| over the real vocabulary.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, (double)std::abs(a[(size_t)i] - b[(size_t)i]));
    den = std::max(den, (double)std::abs(b[(size_t)i]));
  }
  return num / den;
}

}  // namespace

TEST_CASE("prefix reuse: a follow-up sharing the prompt skips it and continues the same state", "[runtime][fixtures]") {
  auto plan = test::plan_for(1);
  std::mt19937 rng(11);
  auto prompt = random_prompt(rng, 90);
  auto backend = std::make_unique<test::RecordingBackend>(plan);
  const test::RecordingBackend& rec = *backend;
  runtime::Engine e(std::move(backend));
  auto first = submit(e, greedy(prompt, 6)).get();
  CHECK(first.done.cached_tokens == 0);
  test::check_bitwise(rec, prompt, first, test::reference_greedy(plan, prompt, 6));
  // Multi-turn: previous prompt + generated tokens + new text. The slot's state has seen the prompt and the
  // first five generated tokens (fed one per step); the reference is fed the same pieces.
  const std::vector<int32_t> fed(first.tokens.begin(), first.tokens.end() - 1);
  const std::vector<int32_t> added = {42, 43};
  auto follow = test::concat(test::concat(prompt, fed), added);
  auto second = submit(e, greedy(follow, 6)).get();
  CHECK(second.done.cached_tokens == (int64_t)(prompt.size() + fed.size()));
  std::vector<std::vector<int32_t>> pieces = {prompt};
  for (int32_t t : fed) pieces.push_back({t});
  pieces.push_back(added);
  test::check_bitwise(rec, follow, second, test::reference_greedy(plan, pieces, 6));
  // Same prompt again with a different continuation: the snapshot at the end of the first prompt is used.
  auto again = test::concat(prompt, {7});
  auto third = submit(e, greedy(again, 6)).get();
  CHECK(third.done.cached_tokens == (int64_t)prompt.size());
  test::check_bitwise(rec, again, third, test::reference_greedy(plan, {prompt, {7}}, 6));
  // And the reuse agrees with fresh whole-prompt runs up to rounding (the GDN chunks are cut elsewhere).
  for (const auto& [p, r] : {std::pair{follow, second}, std::pair{again, third}}) {
    auto fresh = test::reference_greedy(plan, p, 6);
    CHECK(r.tokens == fresh.tokens);
    CHECK(rel_diff(rec.logits_after(p).at(0), fresh.logits[0], plan.vocab_real) < 1e-5);
  }
}

TEST_CASE("cancel, stop tokens, limits and errors", "[runtime][fixtures]") {
  auto plan = test::plan_for(2, 128);
  runtime::Engine e(runtime::make_backend(plan));
  std::mt19937 rng(3);
  // Two long generations (120 tokens each, the whole context) hold both slots; each is cancelled from its
  // own token callback after a few tokens, so the engine sees the cancel before its next step: each ends as
  // cancelled with exactly that many tokens, which are the reference's. The first also holds the engine
  // thread at its first token while a third request is submitted and cancelled.
  std::promise<void> held, release;
  std::shared_future<void> released = release.get_future().share();
  auto on_token = [&](int k, int n, std::shared_future<uint64_t> id) {
    auto count = std::make_shared<int>(0);
    return [&e, &held, released, k, n, id, count](const runtime::TokenEvent&) {
      ++*count;
      if (k == 0 && *count == 1) {
        held.set_value();
        released.wait();
      }
      if (*count == n) e.cancel(id.get());
    };
  };
  std::vector<std::vector<int32_t>> long_prompts = {random_prompt(rng, 8), random_prompt(rng, 8)};
  std::vector<std::future<Result>> running;
  for (int k = 0; k < 2; ++k) {
    std::promise<uint64_t> id;  // the callback waits for it: the first tokens may come before submit returns
    uint64_t got = 0;
    running.push_back(submit(e, greedy(long_prompts[(size_t)k], 1000), &got, on_token(k, 5 + 2 * k, id.get_future().share())));
    id.set_value(got);
  }
  // The third request is cancelled before the engine looks at its queue again: it ends without running.
  held.get_future().wait();
  uint64_t queued_id = 0;
  auto queued = submit(e, greedy(random_prompt(rng, 8), 50), &queued_id);
  e.cancel(queued_id);
  release.set_value();
  auto q = queued.get();
  CHECK(q.done.reason == runtime::Finish::cancelled);
  CHECK(q.tokens.empty());
  CHECK(q.done.generated_tokens == 0);
  CHECK(q.done_calls == 1);
  for (int k = 0; k < 2; ++k) {
    INFO("long request " << k);
    auto r = running[(size_t)k].get();
    CHECK(r.done.reason == runtime::Finish::cancelled);
    CHECK(r.tokens.size() == (size_t)(5 + 2 * k));
    CHECK(r.done.generated_tokens == 5 + 2 * k);
    CHECK(r.tokens == test::reference_greedy(plan, long_prompts[(size_t)k], 5 + 2 * k).tokens);
  }
  // A stop token ends generation without being emitted.
  auto prompt = random_prompt(rng, 12);
  auto ref = test::reference_greedy(plan, prompt, 8).tokens;
  auto req = greedy(prompt, 8);
  req.stop_tokens = {ref[3]};
  auto stopped = submit(e, req).get();
  CHECK(stopped.done.reason == runtime::Finish::stop);
  auto first_stop = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  CHECK(stopped.tokens == std::vector<int32_t>(ref.begin(), ref.begin() + first_stop));
  // max_tokens beyond the context is clipped to what fits.
  auto fill = greedy(random_prompt(rng, 120), 1000);
  auto clipped = submit(e, fill).get();
  CHECK(clipped.done.reason == runtime::Finish::length);
  CHECK(clipped.tokens.size() == 8);
  // Prompts that do not fit, empty prompts, bad ids.
  try {
    e.submit(greedy(random_prompt(rng, 128), 1), {});
    FAIL("expected ContextOverflow");
  } catch (const runtime::ContextOverflow& c) {
    CHECK(c.n_prompt == 128);
    CHECK(c.n_ctx == 128);
  }
  CHECK_THROWS_AS(e.submit(greedy({}, 1), {}), runtime::EngineError);
  CHECK_THROWS_AS(e.submit(greedy({1, 5000}, 1), {}), runtime::EngineError);
  // Logprobs: the chosen token's log-probability is the maximum under greedy.
  auto lp = greedy(random_prompt(rng, 5), 3);
  lp.top_logprobs = 3;
  std::vector<runtime::TokenEvent> evs;
  std::promise<void> done;
  runtime::Callbacks cb;
  cb.on_token = [&](const runtime::TokenEvent& ev) { evs.push_back(ev); };
  cb.on_done = [&](const runtime::DoneEvent&) { done.set_value(); };
  e.submit(lp, cb);
  done.get_future().get();
  REQUIRE(evs.size() == 3);
  for (const auto& ev : evs) {
    REQUIRE(ev.top.size() == 3);
    CHECK(ev.top[0].id == ev.token);
    CHECK(ev.logprob == Approx(ev.top[0].logprob));
    CHECK(ev.logprob <= 0);
    CHECK(ev.top[1].logprob <= ev.top[0].logprob);
  }
}

TEST_CASE("requests that free slots will take do not count against the queue bound", "[runtime][fixtures]") {
  auto plan = test::plan_for(3, 128);
  runtime::Engine e(runtime::make_backend(plan), /*max_queue=*/1);
  std::mt19937 rng(6);
  std::vector<std::future<Result>> futs;
  // Three at once on three free slots: none waits, so none is refused even with a bound of 1 waiting.
  for (int k = 0; k < 3; ++k) CHECK_NOTHROW(futs.push_back(submit(e, greedy(random_prompt(rng, 8), 40))));
  for (auto& f : futs) CHECK(f.get().done.reason == runtime::Finish::length);
}

TEST_CASE("queue bound and shutdown", "[runtime][fixtures]") {
  auto plan = test::plan_for(1, 128);
  runtime::Engine e(runtime::make_backend(plan), /*max_queue=*/2);
  std::mt19937 rng(5);
  std::vector<std::future<Result>> futs;
  futs.push_back(submit(e, greedy(random_prompt(rng, 8), 60)));
  // Fill the queue; the third waiting request is refused.
  bool refused = false;
  for (int k = 0; k < 4 && !refused; ++k) {
    try {
      futs.push_back(submit(e, greedy(random_prompt(rng, 8), 60)));
    } catch (const runtime::QueueFull&) {
      refused = true;
    }
  }
  CHECK(refused);
  e.shutdown(false);  // cancels everything still running or queued; each gets exactly one on_done
  for (auto& f : futs) {
    auto r = f.get();
    CHECK((r.done.reason == runtime::Finish::cancelled || r.done.reason == runtime::Finish::length));
  }
  CHECK_THROWS_AS(e.submit(greedy({1, 2}, 1), {}), runtime::EngineError);
}

namespace {

// A backend that checks every step against the plan's tokens-per-step and can be told to fail snapshots.
class StrictBackend final : public test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    int64_t n = 0;
    for (const auto& in : batch) n += (int64_t)in.tokens.size();
    max_step_ = std::max(max_step_.load(), n);
    if (n > plan().max_batch_tokens) throw runtime::RuntimeError("step larger than the plan allows");
    return ForwardingBackend::step(batch);
  }
  std::shared_ptr<runtime::Snapshot> save(int slot) const override {
    if (fail_save_) throw runtime::RuntimeError("out of device memory (test)");
    return ForwardingBackend::save(slot);
  }

  std::atomic<int64_t> max_step_{0};
  bool fail_save_ = false;
};

}  // namespace

TEST_CASE("steps never exceed the plan's tokens per step, however many sequences decode", "[runtime][fixtures]") {
  // 4 slots, 8 tokens per step: three generating sequences and a 40-token prompt must share each step.
  auto plan = test::plan_for(4, 128, /*batch=*/8);
  auto backend = std::make_unique<StrictBackend>(plan);
  StrictBackend* strict = backend.get();
  runtime::Engine e(std::move(backend));
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::future<Result>> futs;
  for (int k = 0; k < 4; ++k) {
    prompts.push_back(random_prompt(rng, k == 3 ? 40 : 5));
    futs.push_back(submit(e, greedy(prompts.back(), 12)));
  }
  for (size_t k = 0; k < futs.size(); ++k) {
    Result r = futs[k].get();
    CHECK(r.done.reason == runtime::Finish::length);
    CHECK(r.tokens == test::reference_greedy(plan, prompts[k], 12).tokens);
  }
  CHECK(strict->max_step_ <= 8);
  CHECK(strict->max_step_ >= 4);
}

TEST_CASE("a snapshot that cannot be taken does not fail the request", "[runtime][fixtures]") {
  auto plan = test::plan_for(1, 128);
  auto backend = std::make_unique<StrictBackend>(plan);
  backend->fail_save_ = true;
  runtime::Engine e(std::move(backend));
  std::mt19937 rng(8);
  const auto prompt = random_prompt(rng, 9);
  Result r = submit(e, greedy(prompt, 6)).get();
  CHECK(r.done.reason == runtime::Finish::length);
  CHECK(r.tokens == test::reference_greedy(plan, prompt, 6).tokens);
  // the same prompt again: no snapshot to reuse, same answer
  Result again = submit(e, greedy(prompt, 6)).get();
  CHECK(again.tokens == r.tokens);
}

namespace {

// A backend that selects sampling candidates "on its device" the way the CUDA backend does (k best after the
// sampler's bias and penalties), here with the host reference Sampler::top_candidates, so the engine's use of
// step_select is tested without a GPU.
class SelectingBackend final : public test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int32_t top_k_max() const override { return 64; }
  std::vector<std::vector<float>> step_select(const std::vector<runtime::StepInput>& batch,
                                              const std::vector<Select>& select,
                                              std::vector<std::optional<runtime::TopCandidates>>& top) override {
    std::vector<std::vector<float>> logits = step(batch);
    top.assign(batch.size(), std::nullopt);
    for (size_t k = 0; k < batch.size(); ++k) {
      if (logits[k].empty() || select[k].k <= 0) continue;
      CHECK(select[k].k <= top_k_max());
      runtime::TopCandidates c =
          select[k].sampler->top_candidates(logits[k].data(), (int32_t)vocab_rows(), select[k].k);
      if (!select[k].sampler->top_suffices(c)) continue;  // the logits go back instead
      top[k] = std::move(c);
      logits[k].clear();
      ++selected_;
    }
    return logits;
  }
  std::atomic<int64_t> selected_{0};
};

}  // namespace

TEST_CASE("sampling from device-selected candidates gives the tokens and logprobs of sampling from the logits",
          "[runtime][fixtures]") {
  auto plan = test::plan_for(3, 128);
  std::mt19937 rng(11);
  std::vector<runtime::Request> reqs;
  for (int k = 0; k < 5; ++k) {
    runtime::Request r;
    r.prompt = random_prompt(rng, 6 + k);
    r.max_tokens = 14;
    r.sampling = runtime::SamplingParams::qwen_defaults(k % 2 == 0);  // top_k 20, presence penalty
    r.sampling.seed = 40 + k;
    if (k == 1) r.sampling.temperature = 0;                      // greedy: k = 1
    if (k == 2) r.top_logprobs = 5;                              // logprobs from the candidates
    if (k == 3) r.sampling.top_k = 0;                            // no top_k: the logits, always
    if (k == 4) r.sampling.logit_bias = {{3, 5.0f}, {9, -100.0f}}, r.sampling.repetition_penalty = 1.2f;
    reqs.push_back(r);
  }
  auto run_all = [&](std::unique_ptr<runtime::Backend> b) {
    runtime::Engine e(std::move(b));
    std::vector<std::vector<runtime::TokenEvent>> events(reqs.size());
    std::vector<std::future<void>> done;
    for (size_t k = 0; k < reqs.size(); ++k) {
      auto prom = std::make_shared<std::promise<void>>();
      done.push_back(prom->get_future());
      runtime::Callbacks cb;
      cb.on_token = [&events, k](const runtime::TokenEvent& ev) { events[k].push_back(ev); };
      cb.on_done = [prom](const runtime::DoneEvent&) { prom->set_value(); };
      e.submit(reqs[k], cb);
    }
    for (auto& f : done) f.get();
    return events;
  };
  const auto plain = run_all(runtime::make_backend(plan));
  auto sel_backend = std::make_unique<SelectingBackend>(plan);
  SelectingBackend* sel = sel_backend.get();
  const auto selected = run_all(std::move(sel_backend));
  CHECK(sel->selected_ > 0);
  for (size_t k = 0; k < reqs.size(); ++k) {
    INFO("request " << k);
    REQUIRE(plain[k].size() == selected[k].size());
    for (size_t i = 0; i < plain[k].size(); ++i) {
      CHECK(plain[k][i].token == selected[k][i].token);
      if (reqs[k].top_logprobs >= 0) {
        CHECK(std::abs(plain[k][i].logprob - selected[k][i].logprob) <= 1e-5);
        REQUIRE(plain[k][i].top.size() == selected[k][i].top.size());
        for (size_t j = 0; j < plain[k][i].top.size(); ++j) CHECK(plain[k][i].top[j].id == selected[k][i].top[j].id);
      }
    }
  }
}

TEST_CASE("requests that finish on their own leave the engine idle: stats say so, shutdown(true) returns",
          "[runtime][fixtures]") {
  auto plan = test::plan_for(2, 128);
  runtime::Engine e(runtime::make_backend(plan));
  std::mt19937 rng(9);
  auto a = submit(e, greedy(random_prompt(rng, 6), 4));
  auto b = submit(e, greedy(random_prompt(rng, 9), 7));
  CHECK(a.get().done.reason == runtime::Finish::length);
  CHECK(b.get().done.reason == runtime::Finish::length);
  // Nothing wakes the engine after the last step: its own bookkeeping must already say idle.
  int64_t running = -1;
  for (int i = 0; i < 200 && running != 0; ++i) {
    running = e.stats().running;
    if (running != 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(running == 0);
  CHECK(e.stats().queued == 0);
  std::promise<void> returned;
  auto done = returned.get_future();
  std::thread t([&] {
    e.shutdown(true);
    returned.set_value();
  });
  const bool in_time = done.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  CHECK(in_time);
  if (!in_time) e.cancel(987654321);  // any wake-up lets the engine see it is idle, so the test ends
  t.join();
}

TEST_CASE("a request's end is announced after its slot counts as free (a client that asks at once sees it idle)",
          "[runtime][fixtures]") {
  auto plan = test::plan_for(2, 128);
  runtime::Engine e(runtime::make_backend(plan));
  std::mt19937 rng(10);
  for (const bool cancel : {false, true}) {
    INFO((cancel ? "cancelled" : "finished on its own"));
    auto seen = std::make_shared<std::promise<std::pair<int64_t, int64_t>>>();
    auto started = std::make_shared<std::promise<void>>();
    auto first = std::make_shared<bool>(true);
    runtime::Callbacks cb;
    cb.on_token = [started, first](const runtime::TokenEvent&) {
      if (std::exchange(*first, false)) started->set_value();
    };
    // What a client that reads /health as soon as its response ends would see.
    cb.on_done = [&e, seen](const runtime::DoneEvent&) {
      const runtime::EngineStats s = e.stats();
      seen->set_value({s.running, s.queued});
    };
    const uint64_t id = e.submit(greedy(random_prompt(rng, 6), cancel ? 100 : 3), cb);
    if (cancel) {
      started->get_future().wait();
      e.cancel(id);
    }
    const auto [running, queued] = seen->get_future().get();
    CHECK(running == 0);
    CHECK(queued == 0);
  }
}
