// Tests of text/sampler: greedy and random sampling, the truncation chain, bias, penalties, masks,
// log-probabilities, parameter checks, and the cost of one step on a full 248320-row Qwen3.5 vocabulary.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "runtime/sampler.h"
#include "tests/runtime/sampling_test_util.h"

using qrig::runtime::Sampler;
using qrig::runtime::SamplingParams;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams seeded(uint64_t seed, float temperature = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

std::vector<float> random_logits(std::mt19937_64& gen, int n, float scale = 3.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

int32_t argmax(const std::vector<float>& v, int n) {
  return int32_t(std::max_element(v.begin(), v.begin() + n) - v.begin());
}

// Independent reference of the documented chain (full sort, no cleverness): the ordered candidates with
// their final weights, in id order (the documented walk order). Float exponentials, double sums.
std::vector<std::pair<int32_t, double>> reference_chain(const std::vector<float>& logits, int n_real,
                                                        const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> c;
  for (int i = 0; i < n_real; ++i) c.push_back({logits[size_t(i)], i});
  auto better = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::sort(c.begin(), c.end(), better);
  if (p.top_k > 0 && size_t(p.top_k) < c.size()) c.resize(size_t(p.top_k));
  const float mx = c[0].first;
  if (p.top_p < 1.0f) {
    double z = 0;
    for (auto& x : c) z += std::exp(x.first - mx);
    double cum = 0;
    size_t cut = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
      cum += std::exp(c[i].first - mx);
      if (cum >= p.top_p * z) {
        cut = i + 1;
        break;
      }
    }
    c.resize(cut);
  }
  if (p.min_p > 0) {
    const float thr = mx + std::log(p.min_p);
    std::erase_if(c, [&](auto& x) { return x.first < thr; });
  }
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.second < b.second; });
  std::vector<std::pair<int32_t, double>> out;
  const float inv_t = 1.0f / p.temperature;
  for (auto& x : c) out.push_back({x.second, std::exp((x.first - mx) * inv_t)});
  return out;
}

int32_t reference_pick(const std::vector<std::pair<int32_t, double>>& w, double u) {
  double total = 0;
  for (auto& x : w) total += x.second;
  double acc = 0;
  for (auto& x : w) {
    if (x.second <= 0) continue;
    acc += x.second;
    if (u * total < acc) return x.first;
  }
  return w.back().first;
}

}  // namespace

TEST_CASE("greedy is the argmax, lowest id on ties, NaN never wins", "[runtime]") {
  Sampler s(greedy(), 4);
  std::vector<float> a{1.0f, 5.0f, 3.0f, -2.0f};
  CHECK(s.sample(a.data(), 4) == 1);
  std::vector<float> tie{2.0f, 7.0f, 7.0f, 7.0f};
  CHECK(s.sample(tie.data(), 4) == 1);
  std::vector<float> nan_first{kNaN, 1.0f, kNaN, 0.5f};
  CHECK(s.sample(nan_first.data(), 4) == 1);
  std::vector<float> neg{-kInf, -5.0f, -kInf, -7.0f};
  CHECK(s.sample(neg.data(), 4) == 1);
  std::vector<float> all_nan{kNaN, kNaN, -kInf, kNaN};
  CHECK_THROWS_AS(s.sample(all_nan.data(), 4), std::runtime_error);
  std::vector<float> pos_inf{1.0f, kInf, 3.0f, kInf};
  CHECK(s.sample(pos_inf.data(), 4) == 1);
  // Greedy does not depend on the random generator: same answer whatever the uniform.
  CHECK(s.pick(a.data(), 4, 0.0) == 1);
  CHECK(s.pick(a.data(), 4, 0.999) == 1);
}

TEST_CASE("padding rows above the real vocabulary are never sampled", "[runtime]") {
  std::vector<float> l{0.0f, 1.0f, 0.5f, 100.0f, 200.0f, kInf};  // 3 real ids, 3 padding rows
  Sampler g(greedy(), 3);
  CHECK(g.sample(l.data(), 6) == 1);
  Sampler s(seeded(7), 3);
  for (int i = 0; i < 2000; ++i) CHECK(s.sample(l.data(), 6) < 3);
  CHECK_THROWS_AS(s.sample(l.data(), 2), std::invalid_argument);  // fewer rows than real tokens
  CHECK_THROWS_AS(s.sample(nullptr, 6), std::invalid_argument);
}

TEST_CASE("a seed makes draws reproducible; different seeds differ", "[runtime]") {
  std::mt19937_64 gen(1);
  auto l = random_logits(gen, 1000, 1.0f);
  Sampler a(seeded(42), 1000), b(seeded(42), 1000), c(seeded(43), 1000);
  std::vector<int32_t> ra, rb, rc;
  for (int i = 0; i < 200; ++i) {
    ra.push_back(a.sample(l.data(), 1000));
    rb.push_back(b.sample(l.data(), 1000));
    rc.push_back(c.sample(l.data(), 1000));
  }
  CHECK(ra == rb);
  CHECK(ra != rc);
}

TEST_CASE("top_k = 1 and a tiny top_p both equal greedy", "[runtime]") {
  std::mt19937_64 gen(2);
  SamplingParams k1 = seeded(5, 1.5f);
  k1.top_k = 1;
  SamplingParams p0 = seeded(6, 2.0f);
  p0.top_p = 1e-6f;
  Sampler sk(k1, 500), sp(p0, 500);
  for (int round = 0; round < 200; ++round) {
    auto l = random_logits(gen, 512);
    l[size_t(round % 500)] = l[size_t(argmax(l, 500))];  // also exercise ties
    const int32_t want = argmax(l, 500);
    CHECK(sk.sample(l.data(), 512) == want);
    CHECK(sp.sample(l.data(), 512) == want);
  }
}

TEST_CASE("logit_bias: -100 bans, positive bias shifts, bad entries are rejected", "[runtime]") {
  std::vector<float> l{1.0f, 3.0f, 2.0f, 0.0f};
  SamplingParams p = greedy();
  p.logit_bias = {{1, -100.0f}};
  CHECK(Sampler(p, 4).sample(l.data(), 4) == 2);
  p.logit_bias = {{3, 3.5f}};
  CHECK(Sampler(p, 4).sample(l.data(), 4) == 3);
  p.logit_bias = {{3, 1.0f}, {3, 1.5f}};  // summed: 2.5 -> 2.5 < 3: still id 1
  CHECK(Sampler(p, 4).sample(l.data(), 4) == 1);
  p.logit_bias = {{1, -100.0f}, {2, -100.0f}, {0, -100.0f}, {3, -100.0f}};
  CHECK_THROWS_AS(Sampler(p, 4).sample(l.data(), 4), std::runtime_error);

  SamplingParams r = seeded(9);
  r.logit_bias = {{1, -100.0f}};
  Sampler s(r, 4);
  std::vector<float> big{0.0f, 50.0f, 0.0f, 0.0f};  // without the ban id 1 would always win
  for (int i = 0; i < 3000; ++i) CHECK(s.sample(big.data(), 4) != 1);

  p.logit_bias = {{4, 1.0f}};
  CHECK_THROWS_AS(Sampler(p, 4), std::invalid_argument);
  p.logit_bias = {{-1, 1.0f}};
  CHECK_THROWS_AS(Sampler(p, 4), std::invalid_argument);
  p.logit_bias = {{0, 101.0f}};
  CHECK_THROWS_AS(Sampler(p, 4), std::invalid_argument);
  p.logit_bias = {{0, kNaN}};
  CHECK_THROWS_AS(Sampler(p, 4), std::invalid_argument);
}

TEST_CASE("presence, frequency and repetition penalties change the choice as expected", "[runtime]") {
  std::vector<float> l{2.0f, 1.5f, -1.0f, -1.2f};
  SECTION("presence") {
    SamplingParams p = greedy();
    p.presence_penalty = 1.0f;
    Sampler s(p, 4);
    CHECK(s.sample(l.data(), 4) == 0);
    s.accept(0);
    CHECK(s.sample(l.data(), 4) == 1);  // 2.0 - 1.0 < 1.5
    s.clear_history();
    CHECK(s.sample(l.data(), 4) == 0);
  }
  SECTION("frequency counts occurrences") {
    SamplingParams p = greedy();
    p.frequency_penalty = 0.3f;
    Sampler s(p, 4);
    s.accept(0);
    CHECK(s.sample(l.data(), 4) == 0);  // 1.7 > 1.5
    s.accept(0);
    CHECK(s.sample(l.data(), 4) == 1);  // 1.4 < 1.5
  }
  SECTION("repetition divides positive logits and multiplies negative ones") {
    SamplingParams p = greedy();
    p.repetition_penalty = 1.5f;
    Sampler s(p, 4);
    s.accept(0);
    CHECK(s.sample(l.data(), 4) == 1);  // 2.0 / 1.5 < 1.5
    std::vector<float> neg{-5.0f, -5.0f, -1.0f, -1.2f};
    s.accept(2);
    CHECK(s.sample(neg.data(), 4) == 3);  // -1.0 * 1.5 < -1.2
  }
  SECTION("only the last penalty_last_n accepted tokens count; 0 turns penalties off") {
    SamplingParams p = greedy();
    p.presence_penalty = 1.0f;
    p.penalty_last_n = 2;
    Sampler s(p, 4);
    s.accept(0);
    CHECK(s.sample(l.data(), 4) == 1);
    s.accept(3);
    s.accept(3);  // id 0 left the window
    CHECK(s.sample(l.data(), 4) == 0);
    p.penalty_last_n = 0;
    Sampler off(p, 4);
    off.accept(0);
    CHECK(off.sample(l.data(), 4) == 0);
    p.penalty_last_n = -1;  // everything accepted counts
    Sampler all(p, 4);
    all.accept(0);
    for (int i = 0; i < 1000; ++i) all.accept(3);
    CHECK(all.sample(l.data(), 4) == 1);
  }
  SECTION("accept rejects ids outside the vocabulary") {
    Sampler s(greedy(), 4);
    CHECK_THROWS_AS(s.accept(4), std::invalid_argument);
    CHECK_THROWS_AS(s.accept(-1), std::invalid_argument);
  }
}

TEST_CASE("top_k, top_p and min_p keep exactly the documented candidates", "[runtime]") {
  // p = 0.4, 0.3, 0.2, 0.1 at temperature 1.
  std::vector<float> l{std::log(0.1f), std::log(0.4f), std::log(0.2f), std::log(0.3f)};
  SamplingParams base = seeded(1);
  CHECK(Sampler(base, 4).pick(l.data(), 4, 0.999) == 3);  // no truncation: last id in id order
  SamplingParams k = base;
  k.top_k = 2;  // {1, 3}, walked in id order
  CHECK(Sampler(k, 4).pick(l.data(), 4, 0.0) == 1);
  CHECK(Sampler(k, 4).pick(l.data(), 4, 0.999) == 3);
  SamplingParams tp = base;
  tp.top_p = 0.65f;  // 0.4 < 0.65 <= 0.7: {1, 3}; u = 0.5 -> 0.35 of 0.7 falls in id 1
  CHECK(Sampler(tp, 4).pick(l.data(), 4, 0.999) == 3);
  CHECK(Sampler(tp, 4).pick(l.data(), 4, 0.5) == 1);
  tp.top_p = 0.75f;  // 0.9 >= 0.75: {1, 2, 3}; u = 0.5 -> 0.45 of 0.9 falls in id 2
  CHECK(Sampler(tp, 4).pick(l.data(), 4, 0.5) == 2);
  SamplingParams mp = base;
  mp.min_p = 0.3f;  // keep p >= 0.12: {1, 2, 3}, id order
  CHECK(Sampler(mp, 4).pick(l.data(), 4, 0.999) == 3);
  CHECK(Sampler(mp, 4).pick(l.data(), 4, 0.0) == 1);
  mp.min_p = 0.6f;  // keep p >= 0.24: {1, 3}
  Sampler smp(mp, 4);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[smp.sample(l.data(), 4)];
  CHECK(seen.size() == 2);
  CHECK(seen.count(1) == 1);
  CHECK(seen.count(3) == 1);
  mp.min_p = 1.0f;  // only the maximum
  CHECK(Sampler(mp, 4).pick(l.data(), 4, 0.999) == 1);
}

TEST_CASE("the chain matches a full-sort reference on many inputs", "[runtime]") {
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  const int n = 3000;
  struct Case {
    int top_k;
    float top_p, min_p, temp;
  };
  const Case cases[] = {{0, 1.0f, 0.0f, 1.0f},  {20, 1.0f, 0.0f, 0.7f}, {0, 0.95f, 0.0f, 1.0f},
                        {0, 0.5f, 0.05f, 1.3f}, {20, 0.8f, 0.0f, 0.7f}, {0, 1.0f, 0.1f, 0.5f},
                        {400, 0.99f, 0.01f, 1.0f}, {5000, 0.9f, 0.0f, 1.0f}};
  for (const Case& c : cases) {
    SamplingParams p = seeded(3, c.temp);
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    Sampler s(p, n);
    for (int round = 0; round < 8; ++round) {
      auto l = random_logits(gen, n, 2.0f);
      if (round % 2 == 1)  // coarse values: many exact ties, where the id order decides
        for (float& x : l) x = std::round(x * 2.0f) / 2.0f;
      auto ref = reference_chain(l, n, p);
      for (int j = 0; j < 200; ++j) {
        double u = u01(gen);
        INFO("top_k " << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p << " u " << u);
        REQUIRE(s.pick(l.data(), n, u) == reference_pick(ref, u));
      }
    }
  }
}

TEST_CASE("empirical frequencies follow the distribution", "[runtime]") {
  std::vector<float> l{std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  const int draws = 100000;
  auto freq = [&](float temp) {
    Sampler s(seeded(123, temp), 4);
    std::vector<double> f(4, 0.0);
    for (int i = 0; i < draws; ++i) f[size_t(s.sample(l.data(), 4))] += 1.0 / draws;
    return f;
  };
  auto f1 = freq(1.0f);
  const double want1[] = {0.1, 0.2, 0.3, 0.4};
  for (int i = 0; i < 4; ++i) CHECK(f1[size_t(i)] == Approx(want1[i]).margin(0.01));
  auto f05 = freq(0.5f);  // p^2 normalised
  const double want05[] = {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0};
  for (int i = 0; i < 4; ++i) CHECK(f05[size_t(i)] == Approx(want05[i]).margin(0.01));
}

TEST_CASE("allowed-token mask restricts sampling", "[runtime]") {
  std::vector<float> l{5.0f, 4.0f, 1.0f, 0.0f};
  std::vector<bool> only2{false, false, true, false};
  CHECK(Sampler(greedy(), 4).sample(l.data(), 4, &only2) == 2);
  Sampler s(seeded(4), 4);
  std::vector<bool> two_three{false, false, true, true};
  for (int i = 0; i < 500; ++i) {
    int32_t id = s.sample(l.data(), 4, &two_three);
    CHECK((id == 2 || id == 3));
  }
  std::vector<bool> none(4, false);
  CHECK_THROWS_WITH(s.sample(l.data(), 4, &none), Catch::Contains("allows no token"));
  std::vector<bool> small(3, true);
  CHECK_THROWS_AS(s.sample(l.data(), 4, &small), std::invalid_argument);
  std::vector<float> nan_allowed{5.0f, 4.0f, kNaN, 0.0f};
  CHECK_THROWS_AS(s.sample(nan_allowed.data(), 4, &only2), std::runtime_error);
}

TEST_CASE("+inf logits take all of the mass", "[runtime]") {
  std::vector<float> l{1.0f, kInf, 3.0f, kInf};
  Sampler s(seeded(8), 4);
  int ones = 0;
  for (int i = 0; i < 2000; ++i) {
    int32_t id = s.sample(l.data(), 4);
    REQUIRE((id == 1 || id == 3));
    ones += id == 1;
  }
  CHECK(ones > 800);
  CHECK(ones < 1200);
}

TEST_CASE("log-probabilities: log-softmax after bias and penalties, most likely first", "[runtime]") {
  std::vector<float> l{0.0f, std::log(2.0f), std::log(2.0f), std::log(4.0f), 9.0f};  // id 4 is padding
  SamplingParams p = seeded(1);
  p.top_k = 1;  // truncation does not affect log-probabilities
  Sampler s(p, 4);
  auto top = s.top_logprobs(l.data(), 5, 3);
  REQUIRE(top.size() == 3);
  CHECK(top[0].id == 3);
  CHECK(top[0].logprob == Approx(std::log(4.0 / 9.0)));
  CHECK(top[1].id == 1);  // tie with id 2: lower id first
  CHECK(top[2].id == 2);
  CHECK(top[1].logprob == Approx(std::log(2.0 / 9.0)));
  CHECK(s.top_logprobs(l.data(), 5, 100).size() == 4);
  CHECK(s.top_logprobs(l.data(), 5, std::numeric_limits<int32_t>::max()).size() == 4);
  CHECK(s.top_logprobs(l.data(), 5, 0).empty());
  CHECK_THROWS_AS(s.top_logprobs(l.data(), 5, -1), std::invalid_argument);
  CHECK(s.logprob(l.data(), 5, 0) == Approx(std::log(1.0 / 9.0)));
  CHECK_THROWS_AS(s.logprob(l.data(), 5, 4), std::invalid_argument);

  SamplingParams b = seeded(1);
  b.logit_bias = {{3, -100.0f}, {0, std::log(2.0f)}};
  Sampler sb(b, 4);
  CHECK(sb.logprob(l.data(), 5, 3) == -kInf);
  auto tb = sb.top_logprobs(l.data(), 5, 10);
  REQUIRE(tb.size() == 3);
  double total = 0;
  for (auto& t : tb) total += std::exp(double(t.logprob));
  CHECK(total == Approx(1.0));
  CHECK(tb[0].id == 0);  // biased to log 2, tied with 1 and 2; lowest id first
  CHECK(tb[0].logprob == Approx(std::log(1.0 / 3.0)));

  SamplingParams pen = seeded(1);
  pen.presence_penalty = std::log(2.0f);
  Sampler sp(pen, 4);
  sp.accept(3);  // 4 -> 2
  CHECK(sp.logprob(l.data(), 5, 3) == Approx(std::log(2.0 / 7.0)));
}

TEST_CASE("parameters are checked and qwen_defaults match the model card", "[runtime]") {
  auto bad = [](auto edit) {
    SamplingParams p;
    edit(p);
    return p;
  };
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.temperature = -0.1f; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.temperature = kNaN; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.top_k = -1; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.top_p = 0.0f; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.top_p = 1.5f; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.min_p = 2.0f; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.presence_penalty = kInf; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(bad([](SamplingParams& p) { p.penalty_last_n = -2; }), 4), std::invalid_argument);
  CHECK_THROWS_AS(Sampler(SamplingParams{}, 0), std::invalid_argument);
  std::vector<float> l{1.0f, 2.0f};
  CHECK_THROWS_AS(Sampler(SamplingParams{}, 2).pick(l.data(), 2, 1.0), std::invalid_argument);

  auto t = SamplingParams::qwen_defaults(true);
  CHECK(t.temperature == 1.0f);
  CHECK(t.top_p == 0.95f);
  CHECK(t.top_k == 20);
  CHECK(t.presence_penalty == 1.5f);
  auto n = SamplingParams::qwen_defaults(false);
  CHECK(n.temperature == 0.7f);
  CHECK(n.top_p == 0.8f);
  CHECK(n.top_k == 20);
  CHECK(n.presence_penalty == 1.5f);
  CHECK(n.repetition_penalty == 1.0f);
  CHECK(n.min_p == 0.0f);
}

TEST_CASE("one step on a 248320-row vocabulary is cheap (timing printed)", "[runtime]") {
  const int rows = 248320, real = 248077;
  std::mt19937_64 gen(99);
  auto l = random_logits(gen, rows, 2.5f);
  auto time_us = [&](const SamplingParams& p, const char* what) {
    Sampler s(p, real);
    for (int i = 0; i < 200; ++i) s.accept(int32_t(gen() % real));  // some penalty history
    int32_t id = s.sample(l.data(), rows);  // warm-up (scratch allocation)
    REQUIRE(id >= 0);
    REQUIRE(id < real);
    const int reps = 20;
    timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      id = s.sample(l.data(), rows);
      REQUIRE(id < real);
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double cpu_us = ((c1.tv_sec - c0.tv_sec) * 1e6 + (c1.tv_nsec - c0.tv_nsec) * 1e-3) / reps;
    std::printf("sampler timing, 248320 logits, %-48s %7.0f us/token wall, %7.0f us CPU\n", what, us, cpu_us);
    return cpu_us;
  };
  double g = time_us(greedy(), "greedy:");
  SamplingParams q = SamplingParams::qwen_defaults(true);
  q.seed = 1;
  double qt = time_us(q, "qwen thinking (top_k 20, top_p .95, presence):");
  SamplingParams tp = seeded(1);
  tp.top_p = 0.95f;
  double tpt = time_us(tp, "top_p 0.95 without top_k:");
  SamplingParams plain = seeded(1);
  double pt = time_us(plain, "temperature 1 only:");
  // Bounds on CPU time (so a loaded machine does not fail them), generous, and only in optimised builds
  // (sanitizer and debug builds are many times slower). A full sort of the vocabulary alone costs
  // about 25 ms here, so the top_k bound catches a lost partial selection.
#ifdef __OPTIMIZE__
  CHECK(g < 5000);
  CHECK(qt < 10000);
  CHECK(tpt < 50000);
  CHECK(pt < 20000);
#else
  WARN("unoptimised build: sampler timing bounds not checked");
#endif
}

// --- Sampling from the best candidates (the GPU top-k path's host side) ---

namespace {

using qrig::runtime::LogitAdjust;
using qrig::runtime::TopCandidates;

// A random sampler over the parameter space the top-k path takes: greedy or top_k 1..64 with or without
// top_p / min_p, temperatures below and above 1, biases (bans included), presence / frequency penalties of
// either sign, repetition below and above 1, and a history that often hits the best ids.
struct TopCase {
  SamplingParams p;
  std::vector<int32_t> history;
  int32_t k_fetched = 0;
};

TopCase random_top_case(std::mt19937_64& gen, const std::vector<float>& logits, int n_real) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto pick_int = [&](int lo, int hi) { return lo + int(gen() % uint64_t(hi - lo + 1)); };
  TopCase c;
  SamplingParams& p = c.p;
  qrig::runtime::test::random_top_params(gen, p);
  const int32_t last_n[] = {-1, 0, 16, 64};
  p.penalty_last_n = last_n[pick_int(0, 3)];
  // The ids near the top of the raw logits, so that biases and penalties reorder the candidates.
  std::vector<int32_t> best(static_cast<size_t>(n_real));
  for (int i = 0; i < n_real; ++i) best[size_t(i)] = i;
  std::partial_sort(best.begin(), best.begin() + 100, best.end(), [&](int32_t a, int32_t b) {
    const float x = std::isnan(logits[size_t(a)]) ? -kInf : logits[size_t(a)];
    const float y = std::isnan(logits[size_t(b)]) ? -kInf : logits[size_t(b)];
    return x > y || (x == y && a < b);
  });
  auto some_id = [&] { return pick_int(0, 2) ? best[size_t(pick_int(0, 99))] : int32_t(pick_int(0, n_real - 1)); };
  for (int i = pick_int(0, 20); i > 0; --i) {
    const int kind = pick_int(0, 4);
    p.logit_bias.push_back({some_id(), kind == 0 ? -100.0f : kind == 1 ? 100.0f * u(gen) : -100.0f + 200.0f * u(gen)});
  }
  for (int i = pick_int(0, 100); i > 0; --i) c.history.push_back(some_id());
  c.k_fetched = p.temperature == 0.0f ? pick_int(1, 64) : pick_int(p.top_k, 64);
  return c;
}

// Random logits with exact ties (coarse rounding), NaN and -inf sprinkled in, and padding rows above the
// real vocabulary holding large values (never candidates).
std::vector<float> random_top_logits(std::mt19937_64& gen, int rows, int n_real) {
  const float scales[] = {1.0f, 3.0f, 8.0f};
  auto l = random_logits(gen, rows, scales[gen() % 3]);
  if (gen() % 3 == 0)
    for (float& x : l) x = std::round(x * 2.0f) / 2.0f;
  for (int i = int(gen() % 20); i > 0; --i) l[size_t(gen() % uint64_t(n_real))] = (gen() % 2) ? kNaN : -kInf;
  for (int i = n_real; i < rows; ++i) l[size_t(i)] = 1000.0f;
  return l;
}

bool top_is_ordered(const TopCandidates& t) {
  for (size_t i = 1; i < t.top.size(); ++i) {
    const auto& a = t.top[i - 1];
    const auto& b = t.top[i];
    if (!(a.first > b.first || (a.first == b.first && a.second < b.second))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("pick_top on the best candidates equals pick on the full logits", "[runtime]") {
  std::mt19937_64 gen(2024);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  struct Vocab {
    int rows, real, cases, draws;
  };
  for (const Vocab v : {Vocab{5000, 4990, 400, 40}, Vocab{248320, 248077, 10, 8}}) {
    int exercised = 0, fallbacks = 0;
    for (int ci = 0; ci < v.cases; ++ci) {
      const auto l = random_top_logits(gen, v.rows, v.real);
      TopCase c = random_top_case(gen, l, v.real);
      Sampler s(c.p, v.real);
      for (int32_t id : c.history) s.accept(id);
      INFO("vocab " << v.real << " case " << ci << " temp " << c.p.temperature << " top_k " << c.p.top_k << " top_p "
                    << c.p.top_p << " min_p " << c.p.min_p << " K " << c.k_fetched);
      REQUIRE(s.can_pick_from_top(c.k_fetched));
      const TopCandidates t = s.top_candidates(l.data(), v.rows, c.k_fetched);
      CHECK(t.top.size() == size_t(std::min(c.k_fetched, t.n_cand)));
      CHECK(top_is_ordered(t));
      for (const auto& [x, id] : t.top) CHECK(id < v.real);
      if (!s.top_suffices(t)) {
        ++fallbacks;
        CHECK_THROWS_AS(s.pick_top(t, 0.5), std::invalid_argument);
        continue;
      }
      ++exercised;
      for (int j = 0; j < v.draws; ++j) {
        const double uj = j == 0 ? 0.0 : j == 1 ? std::nextafter(1.0, 0.0) : u01(gen);
        REQUIRE(s.pick_top(t, uj) == s.pick(l.data(), v.rows, uj));
      }
      // Log-probabilities from the candidates: the host reference shares the normaliser, so they agree
      // exactly here (a device lse within ~1e-6).
      for (const auto& [x, id] : t.top) CHECK(s.logprob_top(t, id) == s.logprob(l.data(), v.rows, id));
      const int32_t n_lp = std::min<int32_t>(c.k_fetched, 5);
      const auto want = s.top_logprobs(l.data(), v.rows, n_lp);
      const auto got = s.top_logprobs_top(t, n_lp);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].id == want[i].id);
        CHECK(got[i].logprob == Approx(want[i].logprob).margin(1e-5));
      }
      // sample_top draws like sample(): the same seed gives the same tokens.
      Sampler a(c.p, v.real), b(c.p, v.real);
      for (int32_t id : c.history) {
        a.accept(id);
        b.accept(id);
      }
      for (int j = 0; j < 3; ++j) CHECK(a.sample_top(t) == b.sample(l.data(), v.rows));
    }
    INFO("vocab " << v.real << ": " << exercised << " cases on the top path, " << fallbacks << " fallbacks");
    CHECK(exercised >= v.cases * 3 / 4);
  }
}

TEST_CASE("the best candidates refuse rows they cannot decide", "[runtime]") {
  SamplingParams k5 = seeded(1);
  k5.top_k = 5;
  Sampler s(k5, 100);
  CHECK(s.can_pick_from_top(5));
  CHECK(s.can_pick_from_top(64));
  CHECK_FALSE(s.can_pick_from_top(4));
  SamplingParams no_k = seeded(1);
  CHECK_FALSE(Sampler(no_k, 100).can_pick_from_top(64));  // top_k off: the implicit path needs every id
  Sampler g(greedy(), 100);
  CHECK(g.can_pick_from_top(1));
  CHECK_FALSE(g.can_pick_from_top(0));

  std::mt19937_64 gen(5);
  auto l = random_logits(gen, 100);
  SECTION("more candidates than top_k: decided") {
    const TopCandidates t = s.top_candidates(l.data(), 100, 5);
    CHECK(t.n_cand == 100);
    CHECK(s.top_suffices(t));
    CHECK(s.top_suffices(s.top_candidates(l.data(), 100, 64)));
    CHECK_FALSE(s.top_suffices(s.top_candidates(l.data(), 100, 4)));  // fewer than top_k fetched
    CHECK_THROWS_AS(s.logprob_top(t, t.top.size() < 100 ? 1000 : 0), std::invalid_argument);  // out of range
    int32_t missing = 0;
    while (std::any_of(t.top.begin(), t.top.end(), [&](const auto& c) { return c.second == missing; })) ++missing;
    CHECK_THROWS_AS(s.logprob_top(t, missing), std::invalid_argument);  // a candidate not fetched: unknown
    CHECK_THROWS_AS(s.top_logprobs_top(t, 6), std::invalid_argument);
    CHECK(s.top_logprobs_top(t, 5).size() == 5);
    CHECK_THROWS_AS(s.pick_top(t, 1.0), std::invalid_argument);
  }
  SECTION("no more candidates than top_k: the implicit path, so the full logits") {
    for (int i = 0; i < 95; ++i) l[size_t(i)] = i % 2 ? kNaN : -kInf;
    TopCandidates t = s.top_candidates(l.data(), 100, 64);
    CHECK(t.n_cand == 5);
    CHECK(t.top.size() == 5);
    CHECK_FALSE(s.top_suffices(t));
    CHECK(g.top_suffices(g.top_candidates(l.data(), 100, 1)));  // greedy only needs the best
    CHECK(s.logprob_top(t, 0) == -kInf);  // every candidate is listed: id 0 is none
    CHECK(s.logprob_top(t, 99) == s.logprob(l.data(), 100, 99));
    l[0] = 0.0f;
    t = s.top_candidates(l.data(), 100, 64);
    CHECK(t.n_cand == 6);
    CHECK(s.top_suffices(t));
  }
  SECTION("+inf logits and rows without a candidate") {
    l[7] = kInf;
    TopCandidates t = s.top_candidates(l.data(), 100, 64);
    CHECK(t.n_pos_inf == 1);
    CHECK(t.max == kInf);
    CHECK(t.top[0].second == 7);
    CHECK_FALSE(s.top_suffices(t));
    CHECK_FALSE(g.top_suffices(g.top_candidates(l.data(), 100, 1)));
    CHECK(s.logprob_top(t, 7) == 0.0f);
    std::vector<float> none(100, -kInf);
    none[3] = kNaN;
    t = s.top_candidates(none.data(), 100, 64);
    CHECK(t.n_cand == 0);
    CHECK(t.top.empty());
    CHECK(t.max == -kInf);
    CHECK_FALSE(s.top_suffices(t));
    CHECK_FALSE(g.top_suffices(t));
    CHECK_THROWS_AS(g.pick_top(t, 0.0), std::invalid_argument);
    CHECK(s.top_logprobs_top(t, 3).empty());
  }
}

TEST_CASE("adjustments list the biased and penalised ids once, sorted", "[runtime]") {
  SamplingParams p = seeded(1);
  p.logit_bias = {{9, 2.0f}, {3, -100.0f}, {9, 1.5f}, {5, -1.0f}, {3, 4.0f}};
  p.presence_penalty = 0.5f;
  Sampler s(p, 20);
  for (int32_t id : {5, 12, 5, 0, 5}) s.accept(id);
  const std::vector<LogitAdjust> a = s.adjustments();
  REQUIRE(a.size() == 5);
  const int32_t ids[] = {0, 3, 5, 9, 12};
  const float bias[] = {0.0f, -kInf, -1.0f, 3.5f, 0.0f};
  const int32_t counts[] = {1, 0, 3, 0, 1};
  for (size_t i = 0; i < 5; ++i) {
    INFO(i);
    CHECK(a[i].id == ids[i]);
    CHECK(a[i].bias == bias[i]);
    CHECK(a[i].count == counts[i]);
  }
  CHECK(s.penalties_active());
  // Penalties off: the window's ids are not listed (they would change nothing).
  SamplingParams q = seeded(1);
  q.logit_bias = {{4, 1.0f}};
  Sampler t(q, 20);
  t.accept(7);
  CHECK_FALSE(t.penalties_active());
  REQUIRE(t.adjustments().size() == 1);
  CHECK(t.adjustments()[0].id == 4);
}
