// The rejection rule of speculative decoding for sampled requests (runtime/speculative.h) and the sampler's
// distribution() it relies on, held to the target's distribution by chi-square tests with fixed seeds: the rule
// alone on random p and q (a rule that skips the residual fails the same bound), sample() against distribution()
// under a truncation chain, and the engine drafting with tiny-mtp: the joint distribution of the first two sampled
// tokens (the second from a verify row) against the target model's exact one.
#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "engine_test_util.h"
#include "runtime/speculative.h"

namespace qrig::test {

namespace {

// Pearson's statistic of counts against probabilities (cells expecting fewer than 5 are pooled); dof = cells - 1.
double chi_square(const std::map<int64_t, int64_t>& counts, const std::map<int64_t, double>& p, int64_t n, int& dof) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (const auto& [cell, prob] : p) {
    const double e = prob * (double)n;
    const auto it = counts.find(cell);
    const double o = it == counts.end() ? 0.0 : (double)it->second;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  int64_t outside = 0;  // draws in cells of probability 0: impossible under p
  for (const auto& [cell, c] : counts)
    if (!p.count(cell)) outside += c;
  pooled_o += (double)outside;
  if (pooled_e > 0) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  } else if (pooled_o > 0) {
    stat = INFINITY;
  }
  dof = cells - 1;
  return stat;
}

// A bound the statistic exceeds with probability ~1e-4 under the hypothesis (Wilson-Hilferty, z = 3.72).
double chi_square_bound(int dof) {
  const double k = dof, z = 3.72, t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

std::vector<double> random_simplex(std::mt19937_64& rng, int n, double zero_share) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> v((size_t)n);
  double z = 0;
  for (auto& x : v) z += x = u(rng) < zero_share ? 0.0 : -std::log(u(rng) + 1e-12);
  if (z == 0) v[0] = z = 1;
  for (auto& x : v) x /= z;
  return v;
}

int32_t draw(const std::vector<double>& w, double u) {
  double acc = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if ((acc += w[i]) > u) return (int32_t)i;
  return (int32_t)w.size() - 1;
}

}  // namespace

TEST_CASE("the rejection rule emits tokens distributed as the target, whatever the draft distribution",
          "[runtime][speculative]") {
  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 6; ++trial) {
    INFO("trial " << trial);
    const int V = 12;
    const auto p = random_simplex(rng, V, trial % 2 ? 0.3 : 0.0), q = random_simplex(rng, V, trial % 3 ? 0.2 : 0.0);
    const int64_t N = 100000;
    std::map<int64_t, int64_t> got, wrong;
    int64_t accepted = 0;
    for (int64_t i = 0; i < N; ++i) {
      const int32_t d = draw(q, u(rng));
      bool acc = false;
      const int32_t t = runtime::rejection_pick(p, q, d, u(rng), u(rng), acc);
      CHECK((acc == (t == d)));
      ++got[t];
      accepted += acc;
      ++wrong[d];  // "always accept the draft": the draft's distribution, not the target's
    }
    std::map<int64_t, double> pm;
    double overlap = 0;
    for (int i = 0; i < V; ++i) {
      if (p[(size_t)i] > 0) pm[i] = p[(size_t)i];
      overlap += std::min(p[(size_t)i], q[(size_t)i]);
    }
    int dof = 0;
    const double stat = chi_square(got, pm, N, dof);
    CHECK(stat < chi_square_bound(dof));
    int dof_w = 0;
    const double stat_w = chi_square(wrong, pm, N, dof_w);
    CHECK(stat_w > chi_square_bound(dof_w));  // the test can tell
    // The acceptance rate is sum(min(p, q)) (the rule's known rate), within 5 sigma.
    CHECK(std::fabs((double)accepted / N - overlap) < 5 * std::sqrt(overlap * (1 - overlap) / N) + 1e-9);
  }
}

TEST_CASE("Sampler::distribution is what sample() draws from", "[runtime][speculative]") {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> g(0, 0.8f);  // several ids survive each chain
  const int32_t V = 40;
  std::vector<float> logits((size_t)V);
  for (auto& x : logits) x = g(rng);
  for (int variant = 0; variant < 3; ++variant) {
    INFO("variant " << variant);
    runtime::SamplingParams sp;
    sp.seed = 77;
    sp.temperature = variant == 0 ? 1.0f : 0.7f;
    sp.top_k = variant == 1 ? 8 : 0;
    sp.top_p = variant == 2 ? 0.8f : 1.0f;
    sp.min_p = variant == 1 ? 0.02f : 0.0f;
    sp.penalty_last_n = 0;
    runtime::Sampler s(sp, V);
    const auto p = s.distribution(logits.data(), V);
    double total = 0;
    std::map<int64_t, double> pm;
    for (int32_t i = 0; i < V; ++i) {
      total += p[(size_t)i];
      if (p[(size_t)i] > 0) pm[i] = p[(size_t)i];
    }
    CHECK(total == Approx(1.0).epsilon(1e-9));
    if (variant == 1) CHECK(pm.size() <= 8);
    CHECK(pm.size() >= 3);
    std::map<int64_t, int64_t> got;
    const int64_t N = 60000;
    for (int64_t i = 0; i < N; ++i) ++got[s.sample(logits.data(), V)];
    int dof = 0;
    const double stat = chi_square(got, pm, N, dof);
    CHECK(stat < chi_square_bound(dof));
  }
  runtime::SamplingParams greedy;
  greedy.temperature = 0;
  runtime::Sampler s(greedy, V);
  const auto p = s.distribution(logits.data(), V);
  const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  CHECK(p[(size_t)best] == 1.0);
}

TEST_CASE("sampled generation with drafting: the first two tokens are distributed as the target model's",
          "[runtime][speculative][fixtures]") {
  const std::string model = qrig::fixtures::shared_dir() + "/fixtures/tiny-mtp.gguf";
  gguf::File f = gguf::File::open(model);
  compiler::CompileOptions co;
  co.context_length = 64;
  co.max_sequences = 1;
  co.draft_tokens = 2;
  const ir::Plan plan = compiler::compile(f, compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n", "t"), co);
  REQUIRE(plan.draft_tokens == 2);
  std::mt19937 prng(3);
  const auto prompt = random_prompt(prng, 6);
  runtime::SamplingParams sp;
  sp.temperature = 1.5f;  // a flat target: many cells, and drafts the target often rejects
  sp.top_k = 4;
  sp.penalty_last_n = 0;
  // The target's exact joint distribution of (t1, t2): the executor's logits after the prompt and after each t1.
  std::map<int64_t, double> joint;
  {
    runtime::CpuExecutor ex(plan, runtime::open_plan_model(plan));
    auto s = ex.new_sequence();
    const auto l1 = ex.forward(s, prompt, {(int32_t)prompt.size() - 1});
    runtime::Sampler smp(sp, (int32_t)plan.vocab_real);
    const auto p1 = smp.distribution(l1.data(), (int32_t)ex.vocab_rows());
    for (int32_t a = 0; a < (int32_t)p1.size(); ++a) {
      if (p1[(size_t)a] <= 0) continue;
      auto s2 = ex.new_sequence();
      ex.forward(s2, prompt, {});
      const auto l2 = ex.forward(s2, {a}, {0});
      const auto p2 = smp.distribution(l2.data(), (int32_t)ex.vocab_rows());
      for (int32_t b = 0; b < (int32_t)p2.size(); ++b)
        if (p2[(size_t)b] > 0) joint[(int64_t)a * 100000 + b] = p1[(size_t)a] * p2[(size_t)b];
    }
  }
  REQUIRE(joint.size() == 16);
  runtime::Engine e(runtime::make_backend(plan));
  std::map<int64_t, int64_t> got;
  const int64_t N = 1500;
  int64_t drafted = 0, accepted = 0;
  for (int64_t i = 0; i < N; ++i) {
    runtime::Request r;
    r.prompt = prompt;
    r.sampling = sp;
    r.sampling.seed = (uint64_t)i + 1;
    r.max_tokens = 3;  // the second token comes from a verify row of one draft (room: max_tokens - 2)
    const Result res = submit(e, r).get();
    REQUIRE(res.tokens.size() == 3);
    ++got[(int64_t)res.tokens[0] * 100000 + res.tokens[1]];
    drafted += res.done.drafted;
    accepted += res.done.accepted;
  }
  CHECK(drafted >= N);  // every request verified at least one draft
  INFO("acceptance " << (double)accepted / (double)drafted);
  int dof = 0;
  const double stat = chi_square(got, joint, N, dof);
  INFO("chi-square " << stat << " dof " << dof);
  CHECK(stat < chi_square_bound(dof));
}

}  // namespace qrig::test
