// The pipeline (runtime/pipeline.h) on CPU stages: a plan split over 2 and 3 CPU "devices" computes exactly what
// the one-stage plan computes (logits bit for bit: prefill, prefill then decode, several sequences of different
// lengths together), whatever the timing of its threads; snapshots restore every stage; a stage that throws fails
// that step only, on every stage, and the next steps run; the units a step is cut into follow the plan's rules.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "compiler/compile.h"
#include "runtime/cpu/executor.h"
#include "runtime/engine.h"
#include "runtime/pipeline.h"
#include "tests/fixtures.h"
#include "tests/pipeline_test_util.h"

using namespace qrig;
using qrig::test::Shaky;
using qrig::test::ShakyStage;
using qrig::test::shaky_pipeline;

namespace {

const std::string kTiny = fixtures::shared_path("fixtures/tiny.gguf");
const std::string kTinyMtp = fixtures::shared_path("fixtures/tiny-mtp.gguf");

std::string cpu_rig(int devices) {
  std::string s = "[rig]\nname = \"cpu-test\"\n";
  for (int k = 0; k < devices; ++k) s += "[[device]]\nkind = \"cpu\"\nmemory_gib = 2.0\n";
  return s;
}

ir::Plan plan_with(int stages, const std::string& model = kTiny, int64_t micro = 128, int64_t slots = 4) {
  gguf::File f = gguf::File::open(model);
  compiler::CompileOptions co;
  co.context_length = 1024;
  co.max_sequences = slots;
  co.micro_batch = micro;
  return compiler::compile(f, compiler::Rig::parse(cpu_rig(stages), "test rig"), co);
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> d(0, 999);
  std::vector<int32_t> t((size_t)n);
  for (auto& x : t) x = d(rng);
  return t;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// One script of steps over several slots: prefills of different lengths (some not multiples of the micro-batch,
// one leaving a remainder below the recurrent threshold), decode steps of everyone together, and a step mixing a
// prefill with decodes. Returns every logits row in order.
std::vector<std::vector<float>> run_script(runtime::Backend& b) {
  std::mt19937 rng(7);
  std::vector<std::vector<float>> out;
  auto step = [&](const std::vector<runtime::StepInput>& batch) {
    auto r = b.step(batch);
    for (size_t k = 0; k < batch.size(); ++k)
      if (batch[k].want_logits) out.push_back(r[k]);
  };
  for (int s = 0; s < b.slots(); ++s) b.reset(s);
  step({{0, random_tokens(rng, 300), true}});                       // 128 + 128 + 44
  step({{1, random_tokens(rng, 260), true}, {2, random_tokens(rng, 70), true}});  // 128 + 64 + 68 (balanced)
  step({{3, random_tokens(rng, 1), true}});
  for (int t = 0; t < 4; ++t) {
    std::vector<runtime::StepInput> batch;
    for (int s = 0; s < 4; ++s) batch.push_back({s, random_tokens(rng, 1), true});
    step(batch);
  }
  step({{0, random_tokens(rng, 1), true}, {3, random_tokens(rng, 200), false}, {1, random_tokens(rng, 1), true}});
  step({{3, random_tokens(rng, 1), true}, {2, random_tokens(rng, 17), true}});
  return out;
}

}  // namespace

TEST_CASE("pipeline units: micro-batches at chunk multiples, a short remainder balanced, decode groups",
          "[runtime][pipeline][fixtures]") {
  const ir::Plan p = plan_with(3);
  REQUIRE(p.pipeline_micro_batch == 128);
  REQUIRE(p.gdn_recurrent_below == 16);
  auto sizes = [&](int64_t T) {
    std::vector<int64_t> s;
    for (const auto& u : runtime::pipeline_units(p, {{0, std::vector<int32_t>((size_t)T, 1), true}}))
      for (const auto& pc : u.pieces) s.push_back(pc.count);
    return s;
  };
  CHECK(sizes(300) == std::vector<int64_t>{128, 128, 44});
  CHECK(sizes(260) == std::vector<int64_t>{128, 64, 68});  // 4 tokens alone would run the recurrent GDN
  CHECK(sizes(128) == std::vector<int64_t>{128});
  CHECK(sizes(5) == std::vector<int64_t>{5});
  // A micro-batch too short to give a short piece whole chunks is refused.
  gguf::File f = gguf::File::open(kTiny);
  compiler::CompileOptions co;
  co.context_length = 1024;
  co.micro_batch = 64;
  CHECK_THROWS_WITH(compiler::compile(f, compiler::Rig::parse(cpu_rig(2), "t"), co), Catch::Contains("below 128"));
  // Only the last piece of an input wants logits; pieces of one slot never share a unit; small inputs pack.
  const auto u = runtime::pipeline_units(p, {{0, std::vector<int32_t>(130, 1), true}, {1, std::vector<int32_t>(20, 1), true},
                                             {2, std::vector<int32_t>(30, 1), false}});
  REQUIRE(u.size() == 2);
  CHECK(u[0].pieces.size() == 1);  // slot 0: 130 = 64 + 66 (2 tokens alone would be too short)
  CHECK(u[0].pieces[0].count == 64);
  CHECK(!u[0].pieces[0].want_logits);
  CHECK(u[1].pieces.size() == 3);  // slot 0's last 66 tokens, slot 1, slot 2
  CHECK(u[1].rows == 116);
  CHECK(u[1].pieces[0].want_logits);
  CHECK(!u[1].pieces[2].want_logits);
  // Decode of 4 sequences on 3 stages: 3 groups (the CPU plan's groups are single sequences at least).
  std::vector<runtime::StepInput> dec;
  for (int s = 0; s < 4; ++s) dec.push_back({s, {1}, true});
  const auto g = runtime::pipeline_units(p, dec);
  CHECK(g.size() == 3);
  int64_t rows = 0;
  for (const auto& x : g) rows += x.rows;
  CHECK(rows == 4);
}

TEST_CASE("2- and 3-stage CPU plans give the one-stage plan's logits bit for bit", "[runtime][pipeline][fixtures]") {
  for (const std::string& model : {kTiny, kTinyMtp}) {
    const ir::Plan one = plan_with(1, model);
    REQUIRE(one.placement.size() == 1);
    auto ref_backend = runtime::make_backend(one);
    const auto ref = run_script(*ref_backend);
    REQUIRE(ref.size() > 10);
    for (int stages : {2, 3}) {
      const ir::Plan split = plan_with(stages, model);
      REQUIRE(split.placement.size() == (size_t)stages);
      INFO(model << ", " << stages << " stages");
      auto b = runtime::make_backend(split);
      const auto got = run_script(*b);
      REQUIRE(got.size() == ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        INFO("row " << i);
        CHECK(bit_equal(got[i], ref[i]));
      }
      // Every stage was busy and every boundary moved rows.
      const auto st = b->stage_stats();
      REQUIRE(st.size() == (size_t)stages);
      for (size_t s = 0; s < st.size(); ++s) {
        CHECK(st[s].units > 0);
        CHECK(st[s].busy_s > 0);
        if (s + 1 < st.size()) CHECK(st[s].bridge_bytes > 0);
      }
    }
  }
}

TEST_CASE("pipeline threads in any order: random delays in every stage and boundary change no bit",
          "[runtime][pipeline][fixtures]") {
  const ir::Plan one = plan_with(1);
  auto ref_backend = runtime::make_backend(one);
  const auto ref = run_script(*ref_backend);
  const ir::Plan split = plan_with(3);
  for (uint32_t seed : {11u, 12u, 13u}) {
    Shaky sh = shaky_pipeline(split, true, seed);
    const auto got = run_script(*sh.backend);
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(bit_equal(got[i], ref[i]));
  }
}

TEST_CASE("a pipeline snapshot restores every stage", "[runtime][pipeline][fixtures]") {
  const ir::Plan split = plan_with(3);
  auto b = runtime::make_backend(split);
  std::mt19937 rng(3);
  const auto prompt = random_tokens(rng, 150), next = random_tokens(rng, 1);
  b->step({{0, prompt, false}});
  const auto snap = b->save(0);
  CHECK(snap->position == 150);
  const auto first = b->step({{0, next, true}})[0];
  b->step({{0, random_tokens(rng, 40), false}});  // move on, then go back
  b->restore(0, *snap);
  CHECK(b->position(0) == 150);
  CHECK(bit_equal(b->step({{0, next, true}})[0], first));
  b->reset(0);
  CHECK(b->position(0) == 0);
}

TEST_CASE("a stage that throws fails that step on every stage; the next steps run; no thread blocks",
          "[runtime][pipeline][fixtures]") {
  const ir::Plan split = plan_with(3);
  const ir::Plan one = plan_with(1);
  auto ref_backend = runtime::make_backend(one);
  std::mt19937 rng(5);
  const auto prompt = random_tokens(rng, 300);  // with the 3 tokens below: units of 128, 128 and 47 rows
  ref_backend->reset(0);
  const auto want = ref_backend->step({{0, prompt, true}})[0];

  Shaky sh = shaky_pipeline(split, false);
  // Every stage, at every unit of the step, in turn.
  for (size_t s = 0; s < sh.stages.size(); ++s)
    for (int at = 0; at < 3; ++at) {
      INFO("stage " << s << ", compute call " << at);
      sh.stages[s]->calls = 0;
      sh.stages[s]->fail_at = at;
      bool threw = false;
      try {
        sh.backend->step({{0, prompt, true}, {1, random_tokens(rng, 3), true}});
      } catch (const std::exception& e) {
        threw = true;
        CHECK(std::string(e.what()).find("injected failure on " + sh.stages[s]->device()) != std::string::npos);
      }
      CHECK(threw);
      sh.stages[s]->fail_at = -1;
      // The engine resets the failed step's slots; the next step computes what it should.
      sh.backend->reset(0);
      sh.backend->reset(1);
      CHECK(sh.backend->position(0) == 0);
      CHECK(bit_equal(sh.backend->step({{0, prompt, true}})[0], want));
      sh.backend->reset(0);
    }
  // Repeated random injection, bounded: every step either succeeds with the right logits or fails cleanly.
  std::uniform_int_distribution<int> which(0, (int)sh.stages.size() - 1), when(0, 4);
  for (auto* st : sh.stages) st->jitter = true;
  int failed = 0;
  for (int round = 0; round < 60; ++round) {
    ShakyStage* st = sh.stages[(size_t)which(rng)];
    st->calls = 0;
    st->fail_at = when(rng);
    try {
      const auto r = sh.backend->step({{0, prompt, true}});
      CHECK(bit_equal(r[0], want));
    } catch (const std::runtime_error&) {
      ++failed;
    }
    st->fail_at = -1;
    sh.backend->reset(0);
  }
  CHECK(failed > 0);
  CHECK(failed < 60);
}

TEST_CASE("pipeline inputs are validated before any stage runs", "[runtime][pipeline][fixtures]") {
  const ir::Plan split = plan_with(2);
  auto b = runtime::make_backend(split);
  CHECK_THROWS_WITH(b->step({{0, {5000}, true}}), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(b->step({{9, {1}, true}}), Catch::Contains("no slot 9"));
  CHECK_THROWS_WITH(b->step({{0, std::vector<int32_t>(1025, 1), true}}), Catch::Contains("context overflow"));
  CHECK_THROWS_WITH(b->step({{0, {1}, true}, {0, {2}, true}}), Catch::Contains("twice"));
  CHECK(b->position(0) == 0);
  CHECK(b->step({{0, {1, 2, 3}, true}})[0].size() == (size_t)b->vocab_rows());
}

TEST_CASE("the simulated host link makes each crossing last what its bytes take", "[runtime][pipeline][fixtures]") {
  const ir::Plan split = plan_with(2);
  runtime::BackendOptions bo;
  bo.simulate_link_gbps = 0.001;  // 1 MB/s: 300 rows x 256 floats = 307 KB each way
  auto b = runtime::make_backend(split, bo);
  std::mt19937 rng(9);
  b->step({{0, random_tokens(rng, 300), true}});
  const auto st = b->stage_stats();
  REQUIRE(st.size() == 2);
  CHECK(st[0].bridge_bytes == 300 * 256 * 4);
  CHECK(st[0].bridge_s >= 2 * 0.3072 * 0.95);  // down and up
}


TEST_CASE("the engine on a pipeline: a stage failing mid-request fails that request only, the next one is served",
          "[runtime][pipeline][fixtures]") {
  const ir::Plan split = plan_with(3, kTiny, 128, 2);
  const ir::Plan one = plan_with(1, kTiny, 128, 2);
  std::mt19937 rng(21);
  const auto prompt = random_tokens(rng, 270);
  // The reference: greedy tokens of the one-stage plan.
  auto run = [&](runtime::Engine& e) {
    runtime::Request r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.sampling.penalty_last_n = 0;
    r.max_tokens = 12;
    auto prom = std::make_shared<std::promise<std::pair<std::vector<int32_t>, runtime::DoneEvent>>>();
    auto toks = std::make_shared<std::vector<int32_t>>();
    runtime::Callbacks cb;
    cb.on_token = [toks](const runtime::TokenEvent& ev) { toks->push_back(ev.token); };
    cb.on_done = [toks, prom](const runtime::DoneEvent& d) { prom->set_value({*toks, d}); };
    e.submit(std::move(r), cb);
    return prom->get_future().get();
  };
  runtime::Engine ref(runtime::make_backend(one));
  const auto want = run(ref);
  REQUIRE(want.second.reason != runtime::Finish::error);
  REQUIRE(want.first.size() == 12);

  Shaky sh = shaky_pipeline(split, true);
  ShakyStage* middle = sh.stages[1];
  runtime::Engine e(std::move(sh.backend));
  for (int at : {1, 4}) {  // in the prefill; in a decode step
    middle->calls = 0;
    middle->fail_at = at;
    const auto bad = run(e);
    CHECK(bad.second.reason == runtime::Finish::error);
    CHECK(bad.second.error.find("injected failure on cpu:1") != std::string::npos);
    middle->fail_at = -1;
    const auto good = run(e);
    CHECK(good.second.reason != runtime::Finish::error);
    CHECK(good.first == want.first);
  }
}
