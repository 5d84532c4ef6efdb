// The pipeline on CUDA stages (run by tests/gpu/run.sh). On a one-GPU machine every stage is placed on GPU 0
// (rig entries with ordinal = 0): the bridges still go device -> pinned host -> device through the boundary
// threads, which is what is under test. The tiny fixture, 2- and 3-stage plans:
//   - the same steps as the one-stage plan give the same logits within the dp4a family's tolerance (a pipeline cuts
//     decode batches into groups and prefill into micro-batches, so kernels see other row counts), and bit for bit
//     the same logits as the same split plan run again with random delays in every stage call and boundary copy,
//     over thousands of hand-offs (a stale or torn row would differ);
//   - a snapshot restores every stage; a stage that throws fails that step only.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "compiler/compile.h"
#include "runtime/cuda/executor.h"
#include "runtime/pipeline.h"
#include "tests/fixtures.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/pipeline_test_util.h"

using namespace qrig;
using namespace qrig::cuda::gputest;

namespace {

ir::Plan tiny_pipeline(int stages, int64_t micro = 128) {
  Gpu& g = Gpu::get();
  compiler::Rig rig;
  rig.name = "this-gpu-x" + std::to_string(stages);
  for (int s = 0; s < stages; ++s) {
    compiler::RigDevice d;
    d.kind = "cuda";
    d.name = g.info.name;
    d.arch = fmt::format("sm_{}", g.family_sm);
    d.sms = g.info.sms;
    d.memory_gib = 4.0;
    d.ordinal = 0;
    rig.devices.push_back(d);
  }
  const gguf::File f = gguf::File::open(qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf");
  compiler::CompileOptions co;
  co.context_length = 2048;
  co.max_sequences = 4;
  co.max_batch_tokens = 512;
  co.micro_batch = micro;
  co.ptx_jit = g.ptx;
  return compiler::compile(f, rig, co);
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> d(0, 999);
  std::vector<int32_t> t((size_t)n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Prefills of several lengths on 4 slots (micro-batches, a balanced remainder), then `decode` steps of all four.
std::vector<std::vector<float>> run_script(runtime::Backend& b, int decode) {
  std::mt19937 rng(7);
  std::vector<std::vector<float>> out;
  auto step = [&](const std::vector<runtime::StepInput>& batch) {
    auto r = b.step(batch);
    for (size_t k = 0; k < batch.size(); ++k)
      if (batch[k].want_logits) out.push_back(r[k]);
  };
  for (int s = 0; s < 4; ++s) b.reset(s);
  step({{0, random_tokens(rng, 300), true}});
  step({{1, random_tokens(rng, 260), true}, {2, random_tokens(rng, 70), true}, {3, random_tokens(rng, 5), true}});
  for (int t = 0; t < decode; ++t) {
    std::vector<runtime::StepInput> batch;
    for (int s = 0; s < 4; ++s) batch.push_back({s, random_tokens(rng, 1), true});
    step(batch);
  }
  return out;
}

double worst_rel(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, rel_err(a[i], b[i]));
  return w;
}

}  // namespace

TEST_CASE("CUDA pipeline: 2 and 3 stages compute the one-stage plan's logits; random delays change no bit",
          "[gpu][pipeline]") {
  const ir::Plan one = tiny_pipeline(1);
  REQUIRE(one.placement.size() == 1);
  auto ref_backend = runtime::make_backend(one);
  const auto ref = run_script(*ref_backend, 40);
  for (int stages : {2, 3}) {
    const ir::Plan split = tiny_pipeline(stages);
    REQUIRE(split.placement.size() == (size_t)stages);
    auto plain = runtime::make_backend(split);
    const auto got = run_script(*plain, 40);
    const double e = worst_rel(got, ref);
    // The one-stage plan runs a decode step of 4 sequences as one 4-row batch (two activation planes); the
    // pipeline may cut it into groups, and prefill into micro-batches: other kernels, the same numerics family.
    report("pipeline (tiny, cuda)", fmt::format("{} stages vs 1, 2 prefill + 40 decode steps", stages),
           "logits max rel err", e, 6e-2);
    CHECK(e <= 6e-2);
    auto st = plain->stage_stats();
    REQUIRE(st.size() == (size_t)stages);
    for (size_t s = 0; s + 1 < st.size(); ++s) CHECK(st[s].bridge_bytes > 0);

    // Thousands of hand-offs with every stage and boundary call delayed at random: bit for bit the plain run.
    test::Shaky sh = test::shaky_pipeline(split, true, 5, runtime::make_cuda_stages(split, {}));
    int64_t mismatches = 0, rows = 0;
    const auto want = run_script(*plain, 200);
    for (int round = 0; round < 6; ++round) {
      const auto again = run_script(*sh.backend, 200);
      REQUIRE(again.size() == want.size());
      for (size_t i = 0; i < want.size(); ++i, ++rows)
        mismatches += again[i].size() != want[i].size() ||
                      std::memcmp(again[i].data(), want[i].data(), want[i].size() * 4) != 0;
    }
    const auto shaky_stats = sh.backend->stage_stats();
    int64_t units = 0;
    for (const auto& s : shaky_stats) units += s.units;
    report("pipeline (tiny, cuda)", fmt::format("{} stages, {} rows, {} stage units, random delays", stages, rows, units),
           "rows differing from the undelayed run", (double)mismatches, -1);
    CHECK(mismatches == 0);
    CHECK(units > 2000);
  }
}

TEST_CASE("CUDA pipeline: snapshots restore every stage; a failing stage fails its step only", "[gpu][pipeline]") {
  const ir::Plan split = tiny_pipeline(3);
  test::Shaky sh = test::shaky_pipeline(split, false, 1, runtime::make_cuda_stages(split, {}));
  runtime::Backend& b = *sh.backend;
  std::mt19937 rng(3);
  const auto prompt = random_tokens(rng, 200), next = random_tokens(rng, 1);
  b.step({{0, prompt, false}});
  const auto snap = b.save(0);
  const auto first = b.step({{0, next, true}})[0];
  b.step({{0, random_tokens(rng, 30), false}});
  b.restore(0, *snap);
  CHECK(b.position(0) == 200);
  const auto again = b.step({{0, next, true}})[0];
  REQUIRE(again.size() == first.size());
  CHECK(std::memcmp(again.data(), first.data(), first.size() * 4) == 0);

  b.reset(0);
  const auto want = b.step({{0, prompt, true}})[0];
  for (size_t s = 0; s < sh.stages.size(); ++s) {
    b.reset(0);
    sh.stages[s]->calls = 0;
    sh.stages[s]->fail_at = 1;
    CHECK_THROWS_WITH(b.step({{0, prompt, true}}), Catch::Contains("injected failure"));
    sh.stages[s]->fail_at = -1;
    b.reset(0);
    const auto ok = b.step({{0, prompt, true}})[0];
    REQUIRE(ok.size() == want.size());
    CHECK(std::memcmp(ok.data(), want.data(), want.size() * 4) == 0);
  }
}
