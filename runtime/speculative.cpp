// Speculative decoding helpers of the engine (speculative.h).
#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace qrig::runtime {

void spec_begin(SpecState& s, const Backend& backend, bool want, const SamplingParams& sampling) {
  s = SpecState{};
  s.enabled = want && backend.draft_tokens() > 0;
  // Reproducible with the request's seed (a stream of its own, so the sampler's draws are not disturbed).
  s.rng.seed(sampling.seed ? *sampling.seed ^ 0x9e3779b97f4a7c15ull : std::random_device{}());
}

std::vector<double> draft_distribution(const float* logits, int32_t n_real, float temperature) {
  std::vector<double> q((size_t)n_real, 0.0);
  int32_t best = 0;
  for (int32_t i = 1; i < n_real; ++i)
    if (logits[i] > logits[best]) best = i;
  if (temperature <= 0.0f || !std::isfinite(logits[best])) {
    q[(size_t)best] = 1.0;
    return q;
  }
  double z = 0;
  for (int32_t i = 0; i < n_real; ++i) {
    const double x = std::isnan(logits[i]) ? 0.0 : std::exp(((double)logits[i] - (double)logits[best]) / temperature);
    q[(size_t)i] = x;
    z += x;
  }
  for (double& x : q) x /= z;
  return q;
}

namespace {

// The id at which the cumulative weight first exceeds u * total (ids in order); -1 when nothing weighs.
int32_t draw(const std::vector<double>& w, double u) {
  double total = 0;
  for (double x : w) total += x;
  if (!(total > 0)) return -1;
  const double target = u * total;
  double acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!(w[i] > 0)) continue;
    acc += w[i];
    last = (int32_t)i;
    if (target < acc) return (int32_t)i;
  }
  return last;
}

}  // namespace

int32_t rejection_pick(const std::vector<double>& p, const std::vector<double>& q, int32_t d, double u_accept,
                       double u_residual, bool& accepted) {
  const double pd = d >= 0 && (size_t)d < p.size() ? p[(size_t)d] : 0.0;
  const double qd = d >= 0 && (size_t)d < q.size() ? q[(size_t)d] : 0.0;
  accepted = qd > 0 && u_accept * qd < pd;  // probability min(1, p(d) / q(d))
  if (accepted) return d;
  std::vector<double> r(p.size());
  for (size_t i = 0; i < p.size(); ++i) r[i] = std::max(0.0, p[i] - (i < q.size() ? q[i] : 0.0));
  int32_t t = draw(r, u_residual);
  if (t < 0) t = draw(p, u_residual);  // p == q where both weigh (rounding): the residual is empty
  return t;
}

int32_t spec_rejection_sample(SpecState& s, Sampler& sampler, const float* logits, int32_t n_rows,
                              const std::vector<bool>* allowed, int64_t row, int32_t d) {
  const std::vector<double> p = sampler.distribution(logits, n_rows, allowed);  // throws without candidates
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double u_accept = u(s.rng), u_residual = u(s.rng);
  bool accepted = false;
  const int32_t t = rejection_pick(p, s.q.at((size_t)row), d, u_accept, u_residual, accepted);
  if (t < 0) throw std::runtime_error("no token can be sampled");
  return t;
}

const std::vector<int32_t>& spec_draft(SpecState& s, Backend& backend, int slot, int32_t next, int64_t room,
                                       const Sampler& sampler) {
  s.drafts.clear();
  s.q.clear();
  const int64_t k = std::min<int64_t>(room, backend.draft_tokens());
  if (!s.enabled || k < 1 || !backend.can_draft(slot)) return s.drafts;
  const float temperature = sampler.params().temperature;
  const int32_t n_real = sampler.n_real_vocab();
  try {
    s.drafts = backend.draft(slot, next, (int)k, [&](const float* logits) {
      std::vector<double> q = draft_distribution(logits, n_real, temperature);
      int32_t d;
      if (temperature <= 0.0f) {
        d = (int32_t)(std::max_element(q.begin(), q.end()) - q.begin());
      } else {
        d = draw(q, std::uniform_real_distribution<double>(0.0, 1.0)(s.rng));
        if (d < 0) d = 0;
      }
      s.q.push_back(std::move(q));
      return d;
    });
  } catch (const std::exception&) {  // drafting is an optimisation: decode plainly from here on
    s.enabled = false;
    s.drafts.clear();
    s.q.clear();
  }
  return s.drafts;
}

VerifyWalk walk_verify(const std::vector<int32_t>& drafts, const std::function<int32_t(int64_t, int32_t)>& sample,
                       const std::function<bool(int32_t, int64_t)>& ends) {
  VerifyWalk w;
  const int64_t k = (int64_t)drafts.size();
  for (int64_t i = 0; i <= k; ++i) {
    const int32_t proposal = i < k ? drafts[(size_t)i] : -1;
    const int32_t t = sample(i, proposal);
    if (t < 0) {
      w.failed = true;
      w.kept_drafts = i;  // rows 0..i-1 all kept their drafts (else the walk had stopped)
      return w;
    }
    w.tokens.push_back(t);
    const bool match = i < k && t == proposal;
    w.accepted += match;
    if (ends(t, (int64_t)w.tokens.size()) || !match) break;
  }
  w.kept_drafts = (int64_t)w.tokens.size() - 1;  // the last token is the sequence's next one, not in its state
  return w;
}

std::vector<int32_t> spec_greedy_step(Backend& backend, int slot, int32_t next, int64_t room, int32_t n_real,
                                      int64_t& drafted, int64_t& accepted) {
  auto argmax = [n_real](const float* row) { return (int32_t)(std::max_element(row, row + n_real) - row); };
  const int64_t k = std::min<int64_t>(room, backend.draft_tokens());
  std::vector<int32_t> drafts;
  if (k > 0 && backend.can_draft(slot)) drafts = backend.draft(slot, next, (int)k, argmax);
  StepInput in{slot, {next}, true, 1};
  in.tokens.insert(in.tokens.end(), drafts.begin(), drafts.end());
  in.logit_rows = (int32_t)in.tokens.size();
  const int64_t start = backend.position(slot);
  const auto out = backend.step({in});
  const int64_t V = backend.vocab_rows();
  auto sample = [&](int64_t row, int32_t) { return argmax(out[0].data() + row * V); };
  const VerifyWalk w = walk_verify(drafts, sample, [](int32_t, int64_t) { return false; });
  if (!drafts.empty()) backend.rollback(slot, start + 1 + w.kept_drafts);
  drafted += (int64_t)drafts.size();
  accepted += w.accepted;
  return w.tokens;
}

}  // namespace qrig::runtime
