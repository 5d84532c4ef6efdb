// The sampler's list filters and suppressed ids (runtime/sampler.h): typical_p and XTC keep exactly the ids a
// plain full-sort reference keeps, suppressed ids are banned on both paths and listed by adjustments(), and
// with a top_k the candidate path (pick_top) still equals pick() on the full logits bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "runtime/sampler.h"
#include "tests/runtime/sampling_test_util.h"

using qrig::runtime::Sampler;
using qrig::runtime::SamplingParams;
using qrig::runtime::TopCandidates;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Logits whose softmax is exactly proportional to `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back((float)std::log(p));
  return l;
}

// The ids pick() draws over a fine sweep of uniforms (every id with weight shows up).
std::set<int32_t> drawn(const Sampler& s, const std::vector<float>& l, double xtc_uniform = 1.0) {
  std::set<int32_t> ids;
  for (int i = 0; i < 2000; ++i) ids.insert(s.pick(l.data(), (int32_t)l.size(), (i + 0.5) / 2000.0, nullptr, xtc_uniform));
  return ids;
}

// Full-sort reference of top_k -> typical_p -> top_p -> min_p -> XTC (when it fires): the ids kept.
std::set<int32_t> reference(const std::vector<float>& logits, int n_real, const SamplingParams& p,
                                                  bool xtc_fires) {
  struct C {
    float x;
    int32_t id;
  };
  std::vector<C> c;
  for (int i = 0; i < n_real; ++i)
    if (logits[(size_t)i] > -kInf) c.push_back({logits[(size_t)i], i});
  auto better = [](const C& a, const C& b) { return a.x > b.x || (a.x == b.x && a.id < b.id); };
  std::sort(c.begin(), c.end(), better);
  if (p.top_k > 0 && (size_t)p.top_k < c.size()) c.resize((size_t)p.top_k);
  auto probs = [&] {
    std::vector<double> pr;
    double z = 0;
    for (const C& e : c) z += std::exp(double(e.x) - double(c[0].x));
    for (const C& e : c) pr.push_back(std::exp(double(e.x) - double(c[0].x)) / z);
    return pr;
  };
  if (p.typical_p < 1.0f && c.size() > 1) {
    auto pr = probs();
    double h = 0;
    for (double q : pr) h -= q > 0 ? q * std::log(q) : 0;
    std::vector<size_t> idx(c.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return std::fabs(-std::log(pr[a]) - h) < std::fabs(-std::log(pr[b]) - h);
    });
    std::vector<C> kept;
    double cum = 0;
    for (size_t i : idx) {
      kept.push_back(c[i]);
      cum += pr[i];
      if (cum > p.typical_p) break;
    }
    std::sort(kept.begin(), kept.end(), better);
    c = kept;
  }
  if (p.top_p < 1.0f && c.size() > 1) {
    auto pr = probs();
    double cum = 0;
    size_t cut = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
      cum += pr[i];
      if (cum >= p.top_p - 1e-12) {
        cut = i + 1;
        break;
      }
    }
    c.resize(cut);
  }
  if (p.min_p > 0) {
    const float thr = c[0].x + std::log(p.min_p);
    std::erase_if(c, [&](const C& e) { return e.x < thr; });
  }
  if (xtc_fires && p.xtc_threshold <= 0.5f && c.size() >= 2) {
    auto pr = probs();
    size_t above = 0;
    while (above < pr.size() && pr[above] >= p.xtc_threshold) ++above;
    if (above >= 2) c.erase(c.begin(), c.begin() + (long)(above - 1));
  }
  std::set<int32_t> out;
  for (const C& e : c) out.insert(e.id);
  return out;
}

}  // namespace

TEST_CASE("typical_p keeps the ids closest to the entropy, even without the most likely one", "[runtime]") {
  // p = 0.3 then seven times 0.1: H = 1.97; the 0.1 ids (surprise 2.30) are closer to it than the 0.3 id
  // (surprise 1.20), so typical_p 0.5 keeps six of them (mass 0.6 > 0.5; ties: lower id first) and drops id 0.
  const auto l = logits_of({0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1});
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1;
  p.typical_p = 0.5f;
  CHECK(drawn(Sampler(p, 8), l) == std::set<int32_t>{1, 2, 3, 4, 5, 6});
  p.typical_p = 1.0f;  // off: every id
  CHECK(drawn(Sampler(p, 8), l).size() == 8);
  // A peaked distribution: the most likely id is the typical one.
  const auto peaked = logits_of({0.01, 0.9, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01});
  p.typical_p = 0.5f;
  CHECK(drawn(Sampler(p, 11), peaked) == std::set<int32_t>{1});
  p.typical_p = 0.0f;
  CHECK_THROWS_AS(Sampler(p, 8), std::invalid_argument);
  p.typical_p = 1.5f;
  CHECK_THROWS_AS(Sampler(p, 8), std::invalid_argument);
}

TEST_CASE("XTC removes the likely ids above the threshold but the least likely of them, when its draw fires", "[runtime]") {
  const auto l = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1;
  p.xtc_probability = 0.5f;
  p.xtc_threshold = 0.15f;
  Sampler s(p, 4);
  CHECK(drawn(s, l, 0.25) == std::set<int32_t>{2, 3});      // fires: 0.4 and 0.3 go, 0.2 (the last above) stays
  CHECK(drawn(s, l, 0.75) == std::set<int32_t>{0, 1, 2, 3});  // does not fire
  p.xtc_threshold = 0.35f;                                   // only one id reaches it: nothing is removed
  CHECK(drawn(Sampler(p, 4), l, 0.0) == std::set<int32_t>{0, 1, 2, 3});
  p.xtc_threshold = 0.6f;  // above 0.5: off
  CHECK(drawn(Sampler(p, 4), l, 0.0) == std::set<int32_t>{0, 1, 2, 3});
  // sample() draws XTC's number from the generator: with probability 1 it always fires.
  p.xtc_threshold = 0.15f;
  p.xtc_probability = 1.0f;
  Sampler always(p, 4);
  for (int i = 0; i < 200; ++i) {
    const int32_t id = always.sample(l.data(), 4);
    CHECK((id == 2 || id == 3));
  }
  // Greedy ignores XTC (and typical_p): the argmax.
  p.temperature = 0.0f;
  CHECK(Sampler(p, 4).sample(l.data(), 4) == 0);
}

TEST_CASE("typical_p and XTC keep what a full-sort reference keeps, on many random rows", "[runtime]") {
  std::mt19937_64 gen(77);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int ci = 0; ci < 300; ++ci) {
    const int n = 50 + (int)(gen() % 200);
    std::vector<float> l((size_t)n);
    for (float& x : l) x = nd(gen);
    SamplingParams p;
    p.temperature = 0.5f + u(gen);
    p.seed = gen();
    p.top_k = gen() % 2 ? 0 : 1 + (int)(gen() % 40);
    p.typical_p = gen() % 3 == 0 ? 1.0f : 0.05f + 0.9f * u(gen);
    p.top_p = gen() % 2 ? 1.0f : 0.3f + 0.7f * u(gen);
    p.min_p = gen() % 2 ? 0.0f : 0.2f * u(gen);
    p.xtc_probability = 1.0f;
    p.xtc_threshold = 0.05f + 0.4f * u(gen);
    Sampler s(p, n);
    for (bool fires : {false, true}) {
      INFO("case " << ci << " top_k " << p.top_k << " typical " << p.typical_p << " top_p " << p.top_p << " min_p "
                   << p.min_p << " xtc " << fires << " thr " << p.xtc_threshold);
      const auto want = reference(l, n, p, fires);
      std::set<int32_t> got;
      for (int i = 0; i < 4000; ++i) got.insert(s.pick(l.data(), n, (i + 0.5) / 4000.0, nullptr, fires ? 0.0 : 1.0));
      // Every id drawn is kept by the reference; every kept id with a weight the sweep resolves shows up.
      for (int32_t id : got) CHECK(want.count(id) == 1);
      CHECK(got.size() <= want.size());
      CHECK(got.size() >= std::min<size_t>(want.size(), 1));
    }
  }
}

TEST_CASE("with a top_k, typical_p and XTC on the best candidates equal pick() on the full logits", "[runtime]") {
  std::mt19937_64 gen(2025);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  int exercised = 0;
  for (int ci = 0; ci < 300; ++ci) {
    const int rows = 3000, real = 2990;
    std::vector<float> l((size_t)rows);
    for (float& x : l) x = nd(gen);
    SamplingParams p;
    qrig::runtime::test::random_top_params(gen, p);
    p.typical_p = gen() % 2 ? 1.0f : 0.1f + 0.89f * (float)u01(gen);
    p.xtc_probability = gen() % 2 ? 0.0f : (float)u01(gen);
    p.xtc_threshold = 0.02f + 0.5f * (float)u01(gen);
    Sampler s(p, real);
    if (gen() % 2) s.set_suppressed({(int32_t)(gen() % real), (int32_t)(gen() % real)});
    const int32_t k = p.temperature == 0.0f ? 1 : p.top_k;
    REQUIRE(s.can_pick_from_top(k));
    const TopCandidates t = s.top_candidates(l.data(), rows, k);
    if (!s.top_suffices(t)) continue;
    ++exercised;
    for (int j = 0; j < 10; ++j) {
      const double uj = u01(gen), xj = u01(gen);
      INFO("case " << ci << " draw " << j);
      REQUIRE(s.pick_top(t, uj, xj) == s.pick(l.data(), rows, uj, nullptr, xj));
    }
    // sample_top and sample consume the generator alike (XTC's draw included).
    Sampler a(p, real), b(p, real);
    a.set_suppressed(s.suppressed());
    b.set_suppressed(s.suppressed());
    for (int j = 0; j < 4; ++j) CHECK(a.sample_top(t) == b.sample(l.data(), rows));
  }
  CHECK(exercised >= 200);
}

TEST_CASE("suppressed ids cannot be sampled, on either path, until cleared", "[runtime]") {
  std::vector<float> l = {1.0f, 5.0f, 3.0f, 2.0f};
  SamplingParams g;
  g.temperature = 0.0f;
  Sampler s(g, 4);
  CHECK(s.sample(l.data(), 4) == 1);
  s.set_suppressed({1, 1});
  CHECK(s.suppressed() == std::vector<int32_t>{1});
  CHECK(s.sample(l.data(), 4) == 2);
  const TopCandidates t = s.top_candidates(l.data(), 4, 2);
  CHECK(t.n_cand == 3);
  CHECK(t.top.front().second == 2);
  CHECK(s.pick_top(t, 0.0) == 2);
  CHECK(s.logprob(l.data(), 4, 1) == -kInf);
  // adjustments() lists it as a ban, merged with a bias of the same id.
  SamplingParams b = g;
  b.logit_bias = {{1, 2.0f}, {3, 1.0f}};
  Sampler sb(b, 4);
  sb.set_suppressed({1});
  auto adj = sb.adjustments();
  REQUIRE(adj.size() == 2);
  CHECK(adj[0].id == 1);
  CHECK(adj[0].bias == -kInf);
  CHECK(adj[1].id == 3);
  CHECK(adj[1].bias == 1.0f);
  s.set_suppressed({});
  CHECK(s.sample(l.data(), 4) == 1);
  CHECK_THROWS_AS(s.set_suppressed({4}), std::invalid_argument);
}
