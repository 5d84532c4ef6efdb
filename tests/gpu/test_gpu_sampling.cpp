// The top-k candidate selection (runtime/cuda/sampling.h) against its CPU reference,
// runtime::Sampler::top_candidates, on the same logits and sampler state: per row a random sampler (greedy
// or top_k, temperatures, top_p / min_p, logit biases with bans, presence / frequency penalties of either
// sign, repetition below and above 1, a penalty history that hits the best ids) and a random K in 1..64.
// Vocabularies: 248320 rows of which 248077 real (Qwen3.5; the padding rows hold large logits that must
// never be chosen) and the tiny fixture's 1088 / 1033; R = 1, 3, 17 rows; rows of many equal logits, rows
// with NaN, -inf and +inf, rows without any candidate. Outputs are poisoned first. Thresholds:
//   candidate ids and logits, n_cand, n_pos_inf, max   exact   (the same float operations, no FMA)
//   lse                                                1e-6 relative (chunk sums in float, then double)
//   Sampler::pick_top on the GPU candidates            == Sampler::pick on the full logits, for many uniforms
//   the logits                                         unchanged (the selection only reads them)
//   a repeated run                                     bit-equal
// "[.bench]": time per selection at R = 1, 8 and 64 rows of 248320 logits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <random>

#include "runtime/cuda/sampling.h"
#include "runtime/sampler.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/runtime/sampling_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;
using runtime::Sampler;
using runtime::SamplingParams;
using runtime::TopCandidates;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

KernelLoader gpu_loader() {
  return [](const Variant& v) { return Gpu::get().load(v); };
}

// Row kinds: plain normal logits, coarse values (many exact ties), all equal, some NaN / -inf, a +inf,
// mostly -inf (fewer candidates than K), no candidate at all.
enum class RowKind { normal, ties, equal, holes, pos_inf, sparse, none };

std::vector<float> make_row(std::mt19937_64& g, int64_t rows, int64_t real, RowKind kind) {
  std::vector<float> l = randn((size_t)rows, g(), 0.0f, 1.0f + (float)(g() % 8));
  auto any = [&] { return (size_t)(g() % (uint64_t)real); };
  switch (kind) {
    case RowKind::normal: break;
    case RowKind::ties:
      for (float& x : l) x = std::round(x * 2.0f) / 2.0f;
      break;
    case RowKind::equal:
      for (float& x : l) x = 0.25f;
      break;
    case RowKind::holes:
      for (int i = 0; i < 200; ++i) l[any()] = (i % 2) ? kNaN : -kInf;
      break;
    case RowKind::pos_inf:
      l[any()] = kInf;
      l[any()] = kInf;
      break;
    case RowKind::sparse:
      for (float& x : l) x = -kInf;
      for (int i = 0; i < 20; ++i) l[any()] = (float)(int)(g() % 7);
      break;
    case RowKind::none:
      for (float& x : l) x = (g() % 2) ? -kInf : kNaN;
      break;
  }
  for (int64_t i = real; i < rows; ++i) l[(size_t)i] = 1e30f;  // padding rows: never candidates
  return l;
}

// A random sampler for a row (see the file comment), and how many candidates to fetch for it.
struct RowCase {
  SamplingParams p;
  std::vector<int32_t> history;
  int32_t k = 1;
};

RowCase make_case(std::mt19937_64& g, const std::vector<float>& l, int64_t real) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto pick = [&](int lo, int hi) { return lo + (int)(g() % (uint64_t)(hi - lo + 1)); };
  RowCase c;
  SamplingParams& p = c.p;
  runtime::test::random_top_params(g, p);
  p.penalty_last_n = -1;
  // Ids near the top of the row (so that biases and penalties reorder the best) or anywhere.
  std::vector<int32_t> best;
  {
    std::vector<std::pair<float, int32_t>> v;
    for (int64_t i = 0; i < real; ++i)
      if (l[(size_t)i] > -kInf) v.push_back({l[(size_t)i], (int32_t)i});
    const size_t n = std::min<size_t>(100, v.size());
    std::partial_sort(v.begin(), v.begin() + (ptrdiff_t)n, v.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (size_t i = 0; i < n; ++i) best.push_back(v[i].second);
  }
  auto some_id = [&] {
    return (!best.empty() && pick(0, 2)) ? best[(size_t)pick(0, (int)best.size() - 1)] : (int32_t)pick(0, (int)real - 1);
  };
  for (int i = pick(0, 30); i > 0; --i) {
    const int kind = pick(0, 4);
    p.logit_bias.push_back({some_id(), kind == 0 ? -100.0f : kind == 1 ? 100.0f * u(g) : -100.0f + 200.0f * u(g)});
  }
  for (int i = pick(0, 150); i > 0; --i) c.history.push_back(some_id());
  c.k = pick(1, 64);
  if (p.temperature > 0.0f) c.k = std::max(c.k, p.top_k);
  return c;
}

struct Errors {
  double lse = 0;
  int64_t rows = 0, picks = 0, fallbacks = 0;
};

// One selection of R rows against the CPU reference; returns the GPU candidates.
std::vector<TopCandidates> check_selection(TopKSelector& sel, int64_t rows, int64_t real, int64_t R,
                                           const std::vector<RowKind>& kinds, uint64_t seed, Errors& err) {
  Gpu& gpu = Gpu::get();
  std::mt19937_64 g(seed);
  std::vector<float> all;
  std::vector<std::vector<float>> ls;
  std::vector<RowCase> cases;
  std::vector<TopKRow> req;
  std::vector<Sampler> samplers;
  for (int64_t r = 0; r < R; ++r) {
    ls.push_back(make_row(g, rows, real, kinds[(size_t)r % kinds.size()]));
    all.insert(all.end(), ls.back().begin(), ls.back().end());
    cases.push_back(make_case(g, ls.back(), real));
    samplers.emplace_back(cases.back().p, (int32_t)real);
    for (int32_t id : cases.back().history) samplers.back().accept(id);
    req.push_back(top_k_row(samplers.back(), cases.back().k));
  }
  DeviceBuffer<float> dl(0, all.size(), "logits");
  dl.upload(all);
  sel.poison_outputs();
  sel.enqueue(dl.data(), req, gpu.stream.get());
  const std::vector<TopCandidates> got = sel.collect(gpu.stream.get());
  REQUIRE(got.size() == (size_t)R);
  CHECK(cpu::test::bit_equal(dl.download(), all));  // read only

  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (int64_t r = 0; r < R; ++r) {
    const Sampler& s = samplers[(size_t)r];
    const TopCandidates want = s.top_candidates(ls[(size_t)r].data(), (int32_t)rows, cases[(size_t)r].k);
    const TopCandidates& t = got[(size_t)r];
    INFO("vocab " << real << " R " << R << " row " << r << " kind " << (int)kinds[(size_t)r % kinds.size()] << " k "
                  << cases[(size_t)r].k << " temp " << s.params().temperature << " top_k " << s.params().top_k);
    CHECK(t.n_cand == want.n_cand);
    CHECK(t.n_pos_inf == want.n_pos_inf);
    CHECK(t.max == want.max);
    REQUIRE(t.top.size() == want.top.size());
    for (size_t i = 0; i < t.top.size(); ++i) {
      INFO("candidate " << i);
      CHECK(t.top[i].second == want.top[i].second);
      CHECK(t.top[i].first == want.top[i].first);
    }
    if (std::isfinite(want.max)) {
      const double e = std::abs(t.lse - want.lse) / std::max(1.0, std::abs(want.lse));
      err.lse = std::max(err.lse, e);
      CHECK(e <= 1e-6);
    } else {
      CHECK(t.lse == 0.0);
    }
    ++err.rows;
    // The sampler's decision from the GPU candidates is the full-logits decision.
    if (s.can_pick_from_top(cases[(size_t)r].k) && s.top_suffices(t)) {
      for (int j = 0; j < 20; ++j) {
        const double u = u01(g);
        REQUIRE(s.pick_top(t, u) == s.pick(ls[(size_t)r].data(), (int32_t)rows, u));
        ++err.picks;
      }
      for (const auto& [x, id] : t.top)
        CHECK(s.logprob_top(t, id) == Approx(s.logprob(ls[(size_t)r].data(), (int32_t)rows, id)).margin(1e-5));
    } else {
      ++err.fallbacks;
    }
  }
  return got;
}

bool same(const std::vector<TopCandidates>& a, const std::vector<TopCandidates>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].top != b[i].top || a[i].n_cand != b[i].n_cand || a[i].n_pos_inf != b[i].n_pos_inf ||
        std::memcmp(&a[i].lse, &b[i].lse, sizeof(double)) != 0)
      return false;
  return true;
}

// A selector as a plan sizes it, with room for `adjust` bias/penalty entries per row.
TopKSelector selector(int64_t rows, int64_t real, int64_t max_rows, int64_t adjust = 1 << 16) {
  std::vector<std::string> names;
  for (const Variant& v : top_k_variants()) names.push_back(v.name);
  return TopKSelector(gpu_loader(), names, 0, rows, real, max_rows, adjust);
}

const std::vector<RowKind> kAllKinds = {RowKind::normal, RowKind::ties,    RowKind::normal, RowKind::holes,
                                        RowKind::equal,  RowKind::pos_inf, RowKind::sparse, RowKind::none};

}  // namespace

TEST_CASE("top-k selection on the tiny vocabulary matches Sampler::top_candidates", "[gpu][short]") {
  const int64_t rows = 1088, real = 1033;
  TopKSelector sel = selector(rows, real, 17);
  CHECK(sel.n_chunks() == 1);
  Errors err;
  for (int64_t R : {int64_t{1}, int64_t{3}, int64_t{17}})
    for (uint64_t seed = 0; seed < 4; ++seed) check_selection(sel, rows, real, R, kAllKinds, 100 * R + seed, err);
  report("topk_select", "V=1033/1088", "lse rel err", err.lse, 1e-6);
  CHECK(err.picks > 0);
}

TEST_CASE("top-k selection on the Qwen3.5 vocabulary matches Sampler::top_candidates and decides like pick", "[gpu]") {
  const int64_t rows = 248320, real = 248077;
  TopKSelector sel = selector(rows, real, 64);
  CHECK(sel.n_chunks() == (real + top_k_chunk_ids() - 1) / top_k_chunk_ids());
  Errors err;
  for (int64_t R : {int64_t{1}, int64_t{3}, int64_t{17}}) {
    for (uint64_t seed = 0; seed < 3; ++seed) {
      const std::vector<RowKind> kinds = R == 1 ? std::vector<RowKind>{kAllKinds[(size_t)seed * 3 % kAllKinds.size()]}
                                                : kAllKinds;
      const auto first = check_selection(sel, rows, real, R, kinds, 7000 + 10 * R + seed, err);
      if (seed == 0) {  // the same inputs again: bit-equal
        Errors again;
        CHECK(same(check_selection(sel, rows, real, R, kinds, 7000 + 10 * R + seed, again), first));
      }
    }
  }
  report("topk_select", "V=248077/248320 R=1,3,17", "lse rel err", err.lse, 1e-6);
  INFO(err.rows << " rows, " << err.picks << " picks compared, " << err.fallbacks << " rows fall back");
  CHECK(err.picks > 0);
}

TEST_CASE("top-k selection refuses bad requests", "[gpu][short]") {
  Gpu& gpu = Gpu::get();
  TopKSelector sel = selector(1088, 1033, 4);
  DeviceBuffer<float> dl(0, 4 * 1088, "logits");
  dl.fill_bytes(0);
  TopKRow ok;
  ok.k = 8;
  CHECK_THROWS_AS(sel.enqueue(dl.data(), {}, gpu.stream.get()), KernelError);
  CHECK_THROWS_AS(sel.enqueue(dl.data(), std::vector<TopKRow>(5, ok), gpu.stream.get()), KernelError);
  TopKRow bad = ok;
  bad.k = 65;
  CHECK_THROWS_AS(sel.enqueue(dl.data(), {bad}, gpu.stream.get()), KernelError);
  bad = ok;
  bad.adjust = {{5, 1.0f, 0}, {5, 2.0f, 0}};  // not increasing
  CHECK_THROWS_AS(sel.enqueue(dl.data(), {bad}, gpu.stream.get()), KernelError);
  bad.adjust = {{1033, 1.0f, 0}};  // a padding row
  CHECK_THROWS_AS(sel.enqueue(dl.data(), {bad}, gpu.stream.get()), KernelError);
  CHECK_THROWS_AS(sel.collect(gpu.stream.get()), KernelError);  // nothing queued
  {  // more adjustments than the plan sized the buffers for: not selected here (the backend samples on the host)
    TopKSelector small = selector(1088, 1033, 4, 2);
    TopKRow many = ok;
    many.adjust = {{1, 1.0f, 0}, {2, 1.0f, 0}, {3, 1.0f, 0}};
    CHECK_FALSE(small.fits(many));
    CHECK_THROWS_AS(small.enqueue(dl.data(), {many}, gpu.stream.get()), KernelError);
    many.adjust.pop_back();
    CHECK(small.fits(many));
  }
  sel.enqueue(dl.data(), {ok, ok}, gpu.stream.get());
  CHECK(sel.pending());
  CHECK_THROWS_AS(sel.enqueue(dl.data(), {ok}, gpu.stream.get()), KernelError);  // not collected yet
  const auto got = sel.collect(gpu.stream.get());
  REQUIRE(got.size() == 2);
  CHECK(got[0].n_cand == 1033);
  REQUIRE(got[0].top.size() == 8);
  for (int i = 0; i < 8; ++i) CHECK(got[0].top[(size_t)i] == std::make_pair(0.0f, (int32_t)i));  // ties: lowest ids
  CHECK(got[0].lse == Approx(std::log(1033.0)));
}

TEST_CASE("top-k selection time per step (248320 logits)", "[.bench][sampling]") {
  Gpu& gpu = Gpu::get();
  const int64_t rows = 248320, real = 248077;
  TopKSelector sel = selector(rows, real, 64);
  std::mt19937_64 g(3);
  for (int64_t R : {int64_t{1}, int64_t{8}, int64_t{64}}) {
    std::vector<float> all;
    std::vector<TopKRow> req;
    for (int64_t r = 0; r < R; ++r) {
      auto l = make_row(g, rows, real, RowKind::normal);
      all.insert(all.end(), l.begin(), l.end());
      SamplingParams p = SamplingParams::qwen_defaults(true);
      p.seed = 1;
      Sampler s(p, (int32_t)real);
      for (int i = 0; i < 300; ++i) s.accept((int32_t)(g() % (uint64_t)real));
      req.push_back(top_k_row(s, 20));
    }
    DeviceBuffer<float> dl(0, all.size(), "logits");
    dl.upload(all);
    for (int i = 0; i < 5; ++i) {  // warm-up
      sel.enqueue(dl.data(), req, gpu.stream.get());
      sel.collect(gpu.stream.get());
    }
    const int iters = 200;
    Event e0(0), e1(0);
    e0.record(gpu.stream.get());
    for (int i = 0; i < iters; ++i) {
      sel.enqueue(dl.data(), req, gpu.stream.get());
      sel.collect(gpu.stream.get());
    }
    e1.record(gpu.stream.get());
    e1.sync();
    const double us = Event::elapsed_ms(e0, e1) * 1e3 / iters;
    std::printf("top-k selection, %lld row(s) of 248320 logits, k 20, 300 penalised ids: %.1f us per step "
                "(upload, 2 kernels, download, sync)\n", (long long)R, us);
  }
}
