// Shared by the engine tests: a CPU plan of the tiny fixture, submitting a request and waiting for its result,
// greedy requests, and the reference they are held to: a plain executor run fed the same pieces, whose logits
// the engine's must equal bit for bit (the CPU backend runs each slot on its own, so batching, chunked prefill
// and prefix reuse change no bit when the pieces are the same).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "runtime/cpu/executor.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "test_backends.h"
#include "tests/fixtures.h"

namespace qrig::test {

inline const std::string kTiny = qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf";

// The engine tests run on a one-stage plan, and again (ctest entry runtime_pipeline) with QRIG_TEST_CPU_STAGES=3 on
// a 3-stage pipeline of CPU stages, which must behave the same (its logits are the one-stage plan's bit for bit).
inline int test_cpu_stages() {
  const char* e = std::getenv("QRIG_TEST_CPU_STAGES");
  return e && *e ? std::max(1, std::atoi(e)) : 1;
}

inline ir::Plan plan_for(int64_t slots, int64_t ctx = 256, int64_t batch = 512) {
  gguf::File f = gguf::File::open(kTiny);
  compiler::CompileOptions co;
  co.context_length = ctx;
  co.max_sequences = slots;
  co.max_batch_tokens = batch;
  co.micro_batch = std::max<int64_t>(128, batch / 2 / 64 * 64);
  std::string rig;
  for (int k = 0; k < test_cpu_stages(); ++k) rig += "[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n";
  ir::Plan p = compiler::compile(f, compiler::Rig::parse(rig, "t"), co);
  REQUIRE(p.placement.size() == (size_t)test_cpu_stages());
  return p;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<runtime::TokenEvent> events;
  runtime::DoneEvent done;
  int done_calls = 0;
};

// Submits and returns a future of the result. on_token, when given, also sees every token (engine thread).
inline std::future<Result> submit(runtime::Engine& e, runtime::Request r, uint64_t* id_out = nullptr,
                                  std::function<void(const runtime::TokenEvent&)> on_token = nullptr) {
  auto prom = std::make_shared<std::promise<Result>>();
  auto res = std::make_shared<Result>();
  runtime::Callbacks cb;
  cb.on_token = [res, on_token](const runtime::TokenEvent& ev) {
    res->tokens.push_back(ev.token);
    res->events.push_back(ev);
    if (on_token) on_token(ev);
  };
  cb.on_done = [res, prom](const runtime::DoneEvent& d) {
    res->done = d;
    if (++res->done_calls == 1) prom->set_value(*res);
  };
  uint64_t id = e.submit(std::move(r), cb);
  if (id_out) *id_out = id;
  return prom->get_future();
}

inline runtime::Request greedy(std::vector<int32_t> prompt, int64_t n) {
  runtime::Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.penalty_last_n = 0;
  r.max_tokens = n;
  return r;
}

inline std::vector<int32_t> random_prompt(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> d(0, 999);
  std::vector<int32_t> p((size_t)n);
  for (auto& t : p) t = d(rng);
  return p;
}

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A plain run on the executor: feeds `pieces` one forward call each (the prompt, as the engine cut it), then
// decodes n greedy tokens one at a time. tokens[i] is the argmax of logits[i].
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

// How the engine cuts tokens [begin, end) of a prompt it prefills from `begin` (docs/prefix-cache.md): at the
// prompt's cut points (runtime/prefix_cache.h), and a call starting off the GDN chunk grid ends on it. Written out
// here, not taken from the engine, so that a change to either shows.
inline std::vector<std::vector<int32_t>> engine_calls(const ir::Plan& plan, const std::vector<int32_t>& prompt,
                                                      int64_t begin) {
  std::vector<int64_t> stops;
  for (const auto& c : runtime::prefix_cuts(plan.prefix_cache, prompt))
    if (c.pos > begin) stops.push_back(c.pos);
  stops.push_back((int64_t)prompt.size());
  // A step holds max_batch_tokens: from a position on the grid, pieces up to the next grid line or cut while they
  // fit (the first one cut to the budget when even it does not).
  const int64_t C = plan.gdn_chunk, budget = plan.max_batch_tokens;
  std::vector<std::vector<int32_t>> calls;
  int64_t pos = begin;
  for (int64_t stop : stops) {
    while (pos < stop) {
      int64_t e;
      if (pos % C != 0) e = std::min(stop, (pos / C + 1) * C);
      else if (stop - pos <= budget) e = stop;
      else e = (pos + budget) / C * C;
      if (e - pos > budget || e <= pos) e = pos + budget;
      calls.emplace_back(prompt.begin() + pos, prompt.begin() + e);
      pos = e;
    }
  }
  return calls;
}

// The pieces as the requests fed them: each piece is the part of a request's prompt (all pieces so far) that it
// prefilled, cut as engine_calls does; single tokens (generated ones fed back) stay as they are.
inline std::vector<std::vector<int32_t>> cut_like_engine(const ir::Plan& plan,
                                                         const std::vector<std::vector<int32_t>>& pieces) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> seen;
  for (const auto& p : pieces) {
    const int64_t begin = (int64_t)seen.size();
    seen.insert(seen.end(), p.begin(), p.end());
    if (p.size() == 1) {
      out.push_back(p);
      continue;
    }
    for (auto& c : engine_calls(plan, seen, begin)) out.push_back(std::move(c));
  }
  return out;
}

inline Reference reference_greedy(const ir::Plan& plan, const std::vector<std::vector<int32_t>>& pieces, int64_t n) {
  runtime::CpuExecutor ex(plan, runtime::open_plan_model(plan));
  auto s = ex.new_sequence();
  Reference ref;
  std::vector<float> logits;
  for (const auto& p : cut_like_engine(plan, pieces)) logits = ex.forward(s, p, {(int32_t)p.size() - 1});
  for (int64_t i = 0; i < n; ++i) {
    int32_t best = (int32_t)(std::max_element(logits.begin(), logits.begin() + plan.vocab_real) - logits.begin());
    ref.tokens.push_back(best);
    ref.logits.push_back(logits);
    if (i + 1 < n) logits = ex.forward(s, {best}, {0});
  }
  return ref;
}

inline Reference reference_greedy(const ir::Plan& plan, const std::vector<int32_t>& prompt, int64_t n) {
  return reference_greedy(plan, std::vector<std::vector<int32_t>>{prompt}, n);
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every logits row the engine's backend returned for this request (after prompt, prompt + tokens[0], ...)
// equals the reference's row bit for bit; the tokens are the reference's.
inline void check_bitwise(const RecordingBackend& rec, const std::vector<int32_t>& prompt, const Result& r,
                          const Reference& ref) {
  CHECK(r.tokens == ref.tokens);
  const size_t n = std::min(r.tokens.size(), ref.tokens.size());
  std::vector<int32_t> seen = prompt;
  size_t mismatched = 0, missing = 0;
  for (size_t i = 0; i < n; ++i) {
    auto rows = rec.logits_after(seen);
    if (rows.empty()) ++missing;
    for (const auto& row : rows) mismatched += !bit_equal(row, ref.logits[i]);
    seen.push_back(r.tokens[i]);
  }
  INFO("rows compared: " << n);
  CHECK(missing == 0);
  CHECK(mismatched == 0);
}

}  // namespace qrig::test
