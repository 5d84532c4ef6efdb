// Sample groups (Engine::submit_group, OpenAI `n`): the prompt is prefilled once; every other sample starts
// from the prompt's snapshot and logits in the same slot, so its tokens and logits equal a plain run bit for
// bit, and a seeded sample equals the same request submitted alone. A group never blocks other requests,
// survives a cancelled or failed first sample, and min_tokens holds end-of-generation back.
#include <catch2/catch.hpp>

#include <future>
#include <random>

#include "engine_test_util.h"

using namespace qrig;
using test::greedy;
using test::random_prompt;
using test::Result;

namespace {

// Submits a group and returns one future per sample.
std::vector<std::future<Result>> submit_group(runtime::Engine& e, std::vector<runtime::Request> reqs,
                                              std::vector<uint64_t>* ids = nullptr) {
  std::vector<std::future<Result>> out;
  std::vector<runtime::Callbacks> cbs;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto prom = std::make_shared<std::promise<Result>>();
    auto res = std::make_shared<Result>();
    runtime::Callbacks cb;
    cb.on_token = [res](const runtime::TokenEvent& ev) {
      res->tokens.push_back(ev.token);
      res->events.push_back(ev);
    };
    cb.on_done = [res, prom](const runtime::DoneEvent& d) {
      res->done = d;
      if (++res->done_calls == 1) prom->set_value(*res);
    };
    cbs.push_back(cb);
    out.push_back(prom->get_future());
  }
  auto got = e.submit_group(std::move(reqs), std::move(cbs));
  if (ids) *ids = got;
  return out;
}

runtime::Request seeded(std::vector<int32_t> prompt, int64_t n, uint64_t seed) {
  runtime::Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 40;
  r.sampling.seed = seed;
  r.max_tokens = n;
  return r;
}

}  // namespace

TEST_CASE("a greedy group of 3 prefills once; each sample equals the plain run bit for bit", "[runtime]") {
  auto plan = test::plan_for(2);
  std::mt19937 rng(41);
  const auto prompt = random_prompt(rng, 60);
  auto backend = std::make_unique<test::RecordingBackend>(plan);
  const test::RecordingBackend& rec = *backend;
  runtime::Engine e(std::move(backend));
  auto fs = submit_group(e, {greedy(prompt, 6), greedy(prompt, 6), greedy(prompt, 6)});
  std::vector<Result> rs;
  for (auto& f : fs) rs.push_back(f.get());
  const auto ref = test::reference_greedy(plan, prompt, 6);
  for (size_t i = 0; i < rs.size(); ++i) {
    INFO("sample " << i);
    CHECK(rs[i].done.reason == runtime::Finish::length);
    CHECK(rs[i].done.prompt_tokens == (int64_t)prompt.size());
    CHECK(rs[i].done.cached_tokens == (i == 0 ? 0 : (int64_t)prompt.size()));
    test::check_bitwise(rec, prompt, rs[i], ref);
  }
  const runtime::EngineStats st = e.stats();
  CHECK(st.prompt_tokens_total == (int64_t)prompt.size());  // one prefill
  CHECK(st.cached_tokens_total == 2 * (int64_t)prompt.size());
  CHECK(st.requests_total == 3);
}

TEST_CASE("a seeded sample of a group equals the same request alone", "[runtime]") {
  auto plan = test::plan_for(1);
  std::mt19937 rng(42);
  const auto prompt = random_prompt(rng, 40);
  runtime::Engine e(runtime::make_backend(plan));
  auto fs = submit_group(e, {seeded(prompt, 8, 11), seeded(prompt, 8, 12), seeded(prompt, 8, 13)});
  std::vector<Result> group;
  for (auto& f : fs) group.push_back(f.get());
  for (uint64_t seed : {11, 12, 13}) {
    // Alone: after an unrelated prompt, so nothing of the slot's own state is reused; the shared prefix cache
    // (docs/prefix-cache.md) still holds the prompt up to its last token, restored exactly as prefilled.
    test::submit(e, greedy(random_prompt(rng, 30), 2)).get();
    Result alone = test::submit(e, seeded(prompt, 8, seed)).get();
    INFO("seed " << seed);
    CHECK(alone.done.cached_tokens == (plan.prefix_cache.mode == "shared" ? (int64_t)prompt.size() - 1 : 0));
    CHECK(alone.tokens == group[seed - 11].tokens);
  }
  // The draws differ between the samples (three seeds, eight tokens each from the top 40).
  CHECK((group[0].tokens != group[1].tokens || group[1].tokens != group[2].tokens));
}

TEST_CASE("a group's waiting samples do not block other requests", "[runtime]") {
  auto plan = test::plan_for(2);
  std::mt19937 rng(43);
  const auto prompt = random_prompt(rng, 30), other = random_prompt(rng, 20);
  runtime::Engine e(runtime::make_backend(plan));
  auto fs = submit_group(e, {greedy(prompt, 40), greedy(prompt, 40), greedy(prompt, 40)});
  // Queued behind the group's two waiting samples, it runs in the free slot while the first sample generates.
  auto fo = test::submit(e, greedy(other, 2));
  Result ro = fo.get();
  CHECK(ro.done.reason == runtime::Finish::length);
  CHECK(fs[0].wait_for(std::chrono::seconds(0)) != std::future_status::ready);  // still generating: 40 tokens
  for (auto& f : fs) CHECK(f.get().tokens.size() == 40);
  CHECK(e.stats().prompt_tokens_total == (int64_t)(prompt.size() + other.size()));
}

TEST_CASE("cancelling samples of a group: the others still finish, prefilling on their own if need be", "[runtime]") {
  auto plan = test::plan_for(1);
  std::mt19937 rng(44);
  const auto prompt = random_prompt(rng, 50);
  const auto ref = test::reference_greedy(plan, prompt, 4);
  SECTION("the first sample, before its prefill ran") {
    runtime::Engine e(runtime::make_backend(plan));
    // A long request holds the only slot, so the group waits in the queue.
    auto busy = test::submit(e, greedy(random_prompt(rng, 20), 30));
    std::vector<uint64_t> ids;
    auto fs = submit_group(e, {greedy(prompt, 4), greedy(prompt, 4), greedy(prompt, 4)}, &ids);
    e.cancel(ids[0]);
    busy.get();
    CHECK(fs[0].get().done.reason == runtime::Finish::cancelled);
    Result r1 = fs[1].get(), r2 = fs[2].get();
    CHECK(r1.tokens == ref.tokens);
    CHECK(r2.tokens == ref.tokens);
    CHECK(r1.done.cached_tokens == 0);  // no group prefill to start from: prefilled like any request
  }
  SECTION("a waiting sample") {
    runtime::Engine e(runtime::make_backend(plan));
    std::vector<uint64_t> ids;
    auto fs = submit_group(e, {greedy(prompt, 4), greedy(prompt, 4), greedy(prompt, 4)}, &ids);
    e.cancel(ids[1]);
    Result r0 = fs[0].get(), r1 = fs[1].get(), r2 = fs[2].get();
    CHECK(r1.done.reason == runtime::Finish::cancelled);
    CHECK(r0.tokens == ref.tokens);
    CHECK(r2.tokens == ref.tokens);
    CHECK(r2.done.cached_tokens == (int64_t)prompt.size());
    CHECK(e.stats().prompt_tokens_total == (int64_t)prompt.size());
  }
}

TEST_CASE("submit_group refuses samples of different prompts and queues nothing then", "[runtime]") {
  auto plan = test::plan_for(1);
  runtime::Engine e(runtime::make_backend(plan));
  std::vector<runtime::Callbacks> cbs(2);
  CHECK_THROWS_AS(e.submit_group({greedy({1, 2, 3}, 2), greedy({1, 2, 4}, 2)}, cbs), runtime::EngineError);
  CHECK_THROWS_AS(e.submit_group({greedy({1, 2, 3}, 2)}, cbs), runtime::EngineError);
  CHECK(e.stats().queued == 0);
}

TEST_CASE("min_tokens holds the stop tokens back until that many tokens are generated", "[runtime]") {
  auto plan = test::plan_for(1);
  std::mt19937 rng(45);
  const auto prompt = random_prompt(rng, 20);
  runtime::Engine e(runtime::make_backend(plan));
  // A stop token the bias makes certain: without min_tokens the output ends at once.
  runtime::Request r = greedy(prompt, 20);
  r.stop_tokens = {7};
  r.sampling.logit_bias = {{7, 100.0f}};
  Result plain = test::submit(e, r).get();
  CHECK(plain.tokens.empty());
  CHECK(plain.done.reason == runtime::Finish::stop);
  r.min_tokens = 5;
  Result held = test::submit(e, r).get();
  CHECK(held.tokens.size() == 5);  // then the stop token comes
  CHECK(held.done.reason == runtime::Finish::stop);
  for (int32_t t : held.tokens) CHECK(t != 7);
  r.stop_tokens = {(int32_t)plan.vocab_real + 5};
  CHECK_THROWS(test::submit(e, r));  // a stop id outside the vocabulary cannot be suppressed
}
