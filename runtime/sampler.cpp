// Token sampling (see sampler.h for the contract and the order of operations). Kept cheap on a full
// 248k vocabulary: a few linear passes and never a sort of the vocabulary. top_k selects with a bounded
// heap (then only k candidates are sorted); top_p without top_k finds its cut with a histogram of the
// probability mass over logit buckets and sorts only the bucket the cut falls in; the draw finds its
// block of ids by block sums.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace qrig::runtime {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
// The passes over the whole vocabulary work in blocks of kLanes values with independent accumulators,
// so they are not one long chain of dependent operations (and the compiler may vectorise them).
constexpr int32_t kLanes = 8;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("sampler: " + what); }

// a * b rounded to float, never fused with the add or subtract that follows (GCC contracts a * b + c into an
// FMA when the target has one): the device applies the penalties with the same separately rounded
// operations (runtime/cuda/sampling.h), and the two must agree bit for bit.
inline float mul_unfused(float a, float b) {
  volatile float p = a * b;
  return p;
}

// Step 3 for one id with count > 0 in the window, x > -inf (see Sampler::adjustments()).
inline float penalised(float x, int32_t count, const SamplingParams& q) {
  if (q.repetition_penalty != 1.0f) x = x > 0 ? x / q.repetition_penalty : mul_unfused(x, q.repetition_penalty);
  x -= mul_unfused(float(count), q.frequency_penalty) + q.presence_penalty;
  return std::isnan(x) ? kNegInf : x;
}

struct Candidate {
  float logit;
  int32_t id;
};

// Per-thread scratch (see sampler.h): adjusted logits, weights, short candidate lists, histogram.
struct Scratch {
  std::vector<float> work, weights;
  std::vector<Candidate> cands;
  std::vector<double> bucket_mass, block_sums;
};
thread_local Scratch scratch;

}  // namespace

SamplingParams SamplingParams::qwen_defaults(bool thinking) {
  SamplingParams p;
  p.temperature = thinking ? 1.0f : 0.7f;
  p.top_p = thinking ? 0.95f : 0.8f;
  p.top_k = 20;
  p.min_p = 0.0f;
  p.presence_penalty = 1.5f;
  p.frequency_penalty = 0.0f;
  p.repetition_penalty = 1.0f;
  p.penalty_last_n = -1;
  return p;
}

Sampler::Sampler(SamplingParams p, int32_t n_real_vocab) : params_(std::move(p)), n_real_vocab_(n_real_vocab) {
  if (n_real_vocab_ <= 0) bad("the vocabulary size must be positive, got " + std::to_string(n_real_vocab_));
  const SamplingParams& q = params_;
  if (!std::isfinite(q.temperature) || q.temperature < 0)
    bad("temperature must be a finite number >= 0, got " + std::to_string(q.temperature));
  if (q.top_k < 0) bad("top_k must be >= 0 (0 = off), got " + std::to_string(q.top_k));
  if (!(q.top_p > 0 && q.top_p <= 1)) bad("top_p must be in (0, 1], got " + std::to_string(q.top_p));
  if (!(q.min_p >= 0 && q.min_p <= 1)) bad("min_p must be in [0, 1], got " + std::to_string(q.min_p));
  if (!(q.typical_p > 0 && q.typical_p <= 1)) bad("typical_p must be in (0, 1], got " + std::to_string(q.typical_p));
  if (!(q.xtc_probability >= 0 && q.xtc_probability <= 1))
    bad("xtc_probability must be in [0, 1], got " + std::to_string(q.xtc_probability));
  if (!(q.xtc_threshold >= 0 && q.xtc_threshold <= 1))
    bad("xtc_threshold must be in [0, 1], got " + std::to_string(q.xtc_threshold));
  if (!std::isfinite(q.presence_penalty)) bad("presence_penalty must be finite");
  if (!std::isfinite(q.frequency_penalty)) bad("frequency_penalty must be finite");
  if (!std::isfinite(q.repetition_penalty) || q.repetition_penalty <= 0)
    bad("repetition_penalty must be a finite number > 0, got " + std::to_string(q.repetition_penalty));
  if (q.penalty_last_n < -1)
    bad("penalty_last_n must be -1 (all), 0 (off) or positive, got " + std::to_string(q.penalty_last_n));
  for (const auto& [id, b] : q.logit_bias) {
    if (id < 0 || id >= n_real_vocab_)
      bad("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
          std::to_string(n_real_vocab_) + ")");
    if (!(b >= -100 && b <= 100))
      bad("logit_bias value for token " + std::to_string(id) + " must be in [-100, 100], got " + std::to_string(b));
    float& slot = bias_[id];  // value-initialised to 0 on first use
    slot = (b <= -100 || slot == kNegInf) ? kNegInf : slot + b;
  }
  if (q.seed) {
    rng_.seed(*q.seed);
  } else {
    std::random_device rd;
    rng_.seed((uint64_t(rd()) << 32) ^ rd());
  }
}

void Sampler::accept(int32_t id) {
  if (id < 0 || id >= n_real_vocab_)
    bad("accepted token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_real_vocab_) + ")");
  if (params_.penalty_last_n == 0) return;
  ++counts_[id];
  if (params_.penalty_last_n < 0) return;  // the whole history counts: no window to slide
  history_.push_back(id);
  if (params_.penalty_last_n > 0 && history_.size() > size_t(params_.penalty_last_n)) {
    int32_t old = history_.front();
    history_.pop_front();
    auto it = counts_.find(old);
    if (--it->second == 0) counts_.erase(it);
  }
}

void Sampler::clear_history() {
  history_.clear();
  counts_.clear();
}

void Sampler::set_suppressed(std::vector<int32_t> ids) {
  for (int32_t id : ids)
    if (id < 0 || id >= n_real_vocab_)
      bad("suppressed token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_real_vocab_) + ")");
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  suppressed_ = std::move(ids);
}

double Sampler::next_uniform() {
  // 53 random bits -> [0, 1); defined by the standard mt19937_64 sequence, so identical everywhere.
  return double(rng_() >> 11) * 0x1.0p-53;
}

double Sampler::next_xtc_uniform() {
  const bool on = params_.xtc_probability > 0.0f && params_.xtc_threshold <= 0.5f && params_.temperature != 0.0f;
  return on ? next_uniform() : 1.0;
}

int32_t Sampler::adjusted_logits(const float* logits, int32_t n_rows, const std::vector<bool>* allowed,
                                 std::vector<float>& out) const {
  if (logits == nullptr) bad("no logits given");
  if (n_rows < n_real_vocab_)
    bad(std::to_string(n_rows) + " logits given but the vocabulary has " + std::to_string(n_real_vocab_) +
        " real tokens");
  if (allowed && allowed->size() < size_t(n_real_vocab_))
    bad("the allowed-token mask has " + std::to_string(allowed->size()) + " entries, fewer than the " +
        std::to_string(n_real_vocab_) + " real tokens");
  const int32_t n = n_real_vocab_;
  out.resize(size_t(n));
  float* w = out.data();
  if (allowed) {
    for (int32_t i = 0; i < n; ++i) w[i] = (std::isnan(logits[i]) || !(*allowed)[size_t(i)]) ? kNegInf : logits[i];
  } else {  // blocks of kLanes so the compiler can vectorise the copy
    int32_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int32_t j = 0; j < kLanes; ++j) w[i + j] = std::isnan(logits[i + j]) ? kNegInf : logits[i + j];
    for (; i < n; ++i) w[i] = std::isnan(logits[i]) ? kNegInf : logits[i];
  }
  for (const auto& [id, b] : bias_) w[id] = (b == kNegInf) ? kNegInf : w[id] + b;
  for (int32_t id : suppressed_) w[id] = kNegInf;
  if (penalties_active())
    for (const auto& [id, count] : counts_)
      if (w[id] != kNegInf) w[id] = penalised(w[id], count, params_);
  return n;
}

bool Sampler::penalties_active() const {
  const SamplingParams& q = params_;
  return q.repetition_penalty != 1.0f || q.presence_penalty != 0.0f || q.frequency_penalty != 0.0f;
}

std::vector<LogitAdjust> Sampler::adjustments() const {
  std::vector<LogitAdjust> out;
  out.reserve(bias_.size() + suppressed_.size() + counts_.size());
  for (const auto& [id, b] : bias_) out.push_back({id, b, 0});
  for (int32_t id : suppressed_) out.push_back({id, kNegInf, 0});
  if (penalties_active())
    for (const auto& [id, count] : counts_) out.push_back({id, 0.0f, count});
  std::sort(out.begin(), out.end(), [](const LogitAdjust& a, const LogitAdjust& b) {
    return a.id < b.id || (a.id == b.id && a.count < b.count);  // a biased id also counted: bias entry first
  });
  size_t m = 0;  // merge the entries of an id that is biased, suppressed and/or counted (a ban wins)
  for (size_t i = 0; i < out.size(); ++i) {
    if (m > 0 && out[m - 1].id == out[i].id) {
      LogitAdjust& e = out[m - 1];
      e.bias = (e.bias == kNegInf || out[i].bias == kNegInf) ? kNegInf : e.bias + out[i].bias;
      e.count = std::max(e.count, out[i].count);
    } else {
      out[m++] = out[i];
    }
  }
  out.resize(m);
  return out;
}

namespace {

[[noreturn]] void no_candidate(const std::vector<bool>* allowed, int32_t n) {
  if (allowed && std::find(allowed->begin(), allowed->begin() + n, true) == allowed->begin() + n)
    throw std::runtime_error("sampler: the allowed-token mask allows no token");
  throw std::runtime_error("sampler: no token can be sampled: every allowed logit is NaN or -inf or banned by logit_bias");
}

// Total order used by every truncation: larger logit first, then lower id.
struct Better {
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

constexpr int32_t kBlock = 1024;  // the draw first finds its block of ids by block sums

struct Stats {
  float max = kNegInf;
  int32_t n_cand = 0, n_pos_inf = 0;
};

Stats stats_of(const float* w, int32_t n) {
  float mx[kLanes];
  int32_t cand[kLanes] = {}, pinf[kLanes] = {};
  std::fill(mx, mx + kLanes, kNegInf);
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t j = 0; j < kLanes; ++j) {
      const float x = w[i + j];
      mx[j] = mx[j] < x ? x : mx[j];
      cand[j] += x > kNegInf;
      pinf[j] += x == kPosInf;
    }
  }
  Stats r;
  for (; i < n; ++i) {
    r.max = std::max(r.max, w[i]);
    r.n_cand += w[i] > kNegInf;
    r.n_pos_inf += w[i] == kPosInf;
  }
  for (int32_t j = 0; j < kLanes; ++j) {
    r.max = std::max(r.max, mx[j]);
    r.n_cand += cand[j];
    r.n_pos_inf += pinf[j];
  }
  return r;
}

double sum_of(const float* v, int32_t n) {
  double acc[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int32_t j = 0; j < kLanes; ++j) acc[j] += v[i + j];
  double s = 0;
  for (; i < n; ++i) s += v[i];
  for (int32_t j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// Draws from weights v[0..n) (>= 0, total > 0) in id order: the first id whose cumulative weight exceeds
// uniform * total. Block sums make it one pass over the blocks and one over a single block.
int32_t draw(const float* v, int32_t n, double uniform, std::vector<double>& block_sums) {
  const int32_t n_blocks = (n + kBlock - 1) / kBlock;
  block_sums.resize(size_t(n_blocks));
  double total = 0;
  for (int32_t b = 0; b < n_blocks; ++b) {
    const int32_t start = b * kBlock;
    block_sums[size_t(b)] = sum_of(v + start, std::min(kBlock, n - start));
    total += block_sums[size_t(b)];
  }
  const double target = uniform * total;
  double cum = 0;
  int32_t last = -1;
  for (int32_t b = 0; b < n_blocks; ++b) {
    const double bs = block_sums[size_t(b)];
    if (bs <= 0) continue;
    if (target < cum + bs || b == n_blocks - 1) {
      const int32_t start = b * kBlock, end = std::min(n, start + kBlock);
      double acc = cum;
      for (int32_t i = start; i < end; ++i) {
        if (v[i] <= 0.0f) continue;
        acc += v[i];
        last = i;
        if (target < acc) return i;
      }
      if (target < cum + bs) return last;  // rounding between the two sums: the block's last id
    }
    cum += bs;
  }
  return last;  // -1 only when every weight is 0
}

// The k best candidates (values > -inf) of w, sorted by Better: a bounded heap whose front is the worst
// one kept, so most ids cost one comparison.
void select_top(const float* w, int32_t n, size_t k, std::vector<Candidate>& c) {
  c.clear();
  k = std::min(k, size_t(n));
  c.reserve(k);
  for (int32_t i = 0; i < n && k > 0; ++i) {
    const float x = w[i];
    if (x == kNegInf) continue;
    if (c.size() < k) {
      c.push_back({x, i});
      std::push_heap(c.begin(), c.end(), Better{});
    } else if (x > c.front().logit) {  // equal logit: the later id is worse, keep the front
      std::pop_heap(c.begin(), c.end(), Better{});
      c.back() = {x, i};
      std::push_heap(c.begin(), c.end(), Better{});
    }
  }
  std::sort(c.begin(), c.end(), Better{});
}

// p >= min_p * p_max  <=>  logit >= max + log(min_p)
float min_p_threshold(const SamplingParams& p, float max_logit) {
  return p.min_p > 0.0f ? max_logit + std::log(p.min_p) : kNegInf;
}

// Temperature-1 probabilities of a candidate list (relative to its first, largest, logit).
std::vector<double> probabilities(const std::vector<Candidate>& c) {
  std::vector<double> pr(c.size());
  double z = 0;
  for (size_t i = 0; i < c.size(); ++i) z += pr[i] = std::exp(double(c[i].logit) - double(c.front().logit));
  for (double& x : pr) x /= z;
  return pr;
}

// Locally typical sampling on c (sorted by Better): keeps the ids whose surprise -log p is closest to the
// entropy, closest first, until their mass exceeds p; c stays sorted by Better.
void typical_filter(std::vector<Candidate>& c, float typical_p) {
  const std::vector<double> pr = probabilities(c);
  double entropy = 0;
  for (double x : pr)
    if (x > 0) entropy -= x * std::log(x);
  std::vector<std::pair<double, size_t>> order(c.size());
  for (size_t i = 0; i < c.size(); ++i)
    order[i] = {pr[i] > 0 ? std::fabs(-std::log(pr[i]) - entropy) : std::numeric_limits<double>::infinity(), i};
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t keep = order.size();
  double cum = 0;
  for (size_t j = 0; j < order.size(); ++j) {
    cum += pr[order[j].second];
    if (cum > double(typical_p)) {
      keep = j + 1;
      break;
    }
  }
  std::vector<Candidate> kept;
  kept.reserve(keep);
  for (size_t j = 0; j < keep; ++j) kept.push_back(c[order[j].second]);
  std::sort(kept.begin(), kept.end(), Better{});
  c = std::move(kept);
}

// XTC on c (sorted by Better): drops every id whose probability reaches the threshold but the last of them.
void xtc_filter(std::vector<Candidate>& c, float threshold) {
  if (threshold > 0.5f || c.size() < 2) return;
  const std::vector<double> pr = probabilities(c);
  size_t above = 0;
  while (above < pr.size() && pr[above] >= double(threshold)) ++above;
  if (above >= 2) c.erase(c.begin(), c.begin() + long(above - 1));
}

// pick()'s explicit path, shared with pick_top(): c is a candidate list sorted by Better (the top_k, every
// candidate when typical_p or XTC is on without top_k, or the +inf ids as logit 0), so c.front() holds the
// maximum. typical_p, top_p within c, min_p relative to the maximum left, XTC (when xtc_uniform <
// xtc_probability), then the draw in id order over exp((x - max) / temperature). Reorders c. -1 when nothing
// weighs.
int32_t draw_explicit(std::vector<Candidate>& c, const SamplingParams& p, double uniform, double xtc_uniform,
                      std::vector<double>* dist = nullptr) {
  if (c.empty()) return -1;
  if (p.typical_p < 1.0f && c.size() > 1) typical_filter(c, p.typical_p);
  float max_logit = c.front().logit;
  const float inv_t = 1.0f / p.temperature;
  if (p.top_p < 1.0f && c.size() > 1) {
    double z = 0;
    for (const Candidate& x : c) z += std::exp(x.logit - max_logit);
    const double target = double(p.top_p) * z;
    double cum = 0;
    size_t cut = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
      cum += std::exp(c[i].logit - max_logit);
      if (cum >= target) {
        cut = i + 1;
        break;
      }
    }
    c.resize(cut);
  }
  const float min_logit = min_p_threshold(p, max_logit);
  std::erase_if(c, [&](const Candidate& x) { return x.logit < min_logit; });
  if (xtc_uniform < double(p.xtc_probability)) {
    xtc_filter(c, p.xtc_threshold);
    max_logit = c.front().logit;
  }
  std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  double total = 0;
  for (const Candidate& x : c) total += std::exp((x.logit - max_logit) * inv_t);
  if (dist) {  // the distribution this draw samples (Sampler::distribution)
    for (const Candidate& x : c) {
      const float wx = std::exp((x.logit - max_logit) * inv_t);
      if (wx > 0.0f) (*dist)[size_t(x.id)] = double(wx) / total;
    }
  }
  const double target = uniform * total;
  double acc = 0;
  int32_t last = -1;
  for (const Candidate& x : c) {
    const float wx = std::exp((x.logit - max_logit) * inv_t);
    if (wx <= 0.0f) continue;
    acc += wx;
    last = x.id;
    if (target < acc) return x.id;
  }
  return last;
}

}  // namespace

int32_t Sampler::pick(const float* logits, int32_t n_rows, double uniform, const std::vector<bool>* allowed,
                      double xtc_uniform) const {
  return pick_impl(logits, n_rows, uniform, allowed, xtc_uniform, nullptr);
}

std::vector<double> Sampler::distribution(const float* logits, int32_t n_rows, const std::vector<bool>* allowed) {
  std::vector<double> dist(size_t(n_real_vocab_), 0.0);
  const double xu = next_xtc_uniform();
  pick_impl(logits, n_rows, 0.0, allowed, xu, &dist);
  return dist;
}

int32_t Sampler::pick_impl(const float* logits, int32_t n_rows, double uniform, const std::vector<bool>* allowed,
                           double xtc_uniform, std::vector<double>* dist) const {
  if (!(uniform >= 0.0 && uniform < 1.0)) bad("the uniform draw must be in [0, 1)");
  const int32_t n = adjusted_logits(logits, n_rows, allowed, scratch.work);
  const float* w = scratch.work.data();

  const Stats st = stats_of(w, n);
  if (st.n_cand == 0) no_candidate(allowed, n);
  if (params_.temperature == 0.0f) {  // greedy: the first (lowest) id holding the maximum
    const int32_t id = int32_t(std::find(w, w + n, st.max) - w);
    if (dist) (*dist)[size_t(id)] = 1.0;
    return id;
  }
  const float max_logit = st.max;
  const int32_t n_cand = st.n_cand, n_pos_inf = st.n_pos_inf;
  const float inv_t = 1.0f / params_.temperature;

  // Explicit path: a sorted candidate list (the +inf ids, the top_k, or all for typical_p / XTC).
  const int32_t k = params_.top_k;
  const bool top_k_cuts = k > 0 && k < n_cand;
  const bool list_filters = params_.typical_p < 1.0f || (params_.xtc_probability > 0.0f && params_.xtc_threshold <= 0.5f);
  if (n_pos_inf > 0 || top_k_cuts || list_filters) {
    std::vector<Candidate>& c = scratch.cands;
    c.clear();
    if (n_pos_inf > 0) {  // +inf dominates everything else: uniform among the +inf ids (as logit 0)
      for (int32_t i = 0; i < n; ++i)
        if (w[i] == kPosInf) c.push_back({0.0f, i});
    } else {
      select_top(w, n, size_t(top_k_cuts ? k : n_cand), c);
    }
    const int32_t id = draw_explicit(c, params_, uniform, xtc_uniform, dist);
    if (id < 0) no_candidate(allowed, n);  // unreachable: the maximum weighs 1
    return id;
  }

  // Implicit path over the whole vocabulary: survivors are the candidates better than (or equal to) the
  // nucleus cut element and not below the min_p threshold; walked in id order.
  float cut_logit = kNegInf;
  int32_t cut_id = n;
  std::vector<float>& weight = scratch.weights;
  weight.resize(size_t(n));
  if (params_.top_p < 1.0f && n_cand > 1) {
    // Temperature-1 probabilities; the nucleus cut is found with a histogram over (max - logit), so only
    // the one bucket the cut falls in is sorted.
    constexpr int kBuckets = 4096;
    constexpr float kRange = 64.0f;  // logit units covered; everything further down shares the last bucket
    std::vector<double>& mass = scratch.bucket_mass;
    mass.assign(kBuckets, 0.0);
    auto bucket = [&](float x) { return std::min(kBuckets - 1, int((max_logit - x) * (kBuckets / kRange))); };
    for (int32_t i = 0; i < n; ++i) {
      const float e = w[i] == kNegInf ? 0.0f : std::exp(w[i] - max_logit);
      weight[size_t(i)] = e;
      if (e > 0.0f) mass[size_t(bucket(w[i]))] += e;
    }
    const double z = sum_of(weight.data(), n);
    const double target = double(params_.top_p) * z;
    double cum = 0;
    int b = 0;
    while (b < kBuckets - 1 && cum + mass[size_t(b)] < target) cum += mass[size_t(b++)];
    std::vector<Candidate>& c = scratch.cands;
    c.clear();
    for (int32_t i = 0; i < n; ++i)
      if (w[i] != kNegInf && bucket(w[i]) == b) c.push_back({w[i], i});
    std::sort(c.begin(), c.end(), Better{});
    for (const Candidate& x : c) {
      cum += weight[size_t(x.id)];
      if (cum >= target) {
        cut_logit = x.logit;
        cut_id = x.id;
        break;
      }
    }
    if (cut_logit == kNegInf && !c.empty()) {  // rounding kept cum just below target: keep everything
      cut_logit = c.back().logit;
      cut_id = n;
    }
  }
  const bool reuse = params_.top_p < 1.0f && n_cand > 1 && params_.temperature == 1.0f;
  const float min_logit = min_p_threshold(params_, max_logit);
  // Branch-free selection: whether an id survives is data-dependent and would mispredict.
  float* wt = weight.data();
  for (int32_t i = 0; i < n; ++i) {
    const float x = w[i];
    const bool keep = (x != kNegInf) & (x >= min_logit) & ((x > cut_logit) | ((x == cut_logit) & (i <= cut_id)));
    const float v = reuse ? wt[i] : std::exp((x - max_logit) * inv_t);  // exp(-inf) = 0
    wt[i] = keep ? v : 0.0f;
  }
  if (dist) {
    double total = 0;
    for (int32_t i = 0; i < n; ++i) total += wt[i];
    for (int32_t i = 0; i < n; ++i)
      if (wt[i] > 0.0f) (*dist)[size_t(i)] = double(wt[i]) / total;
  }
  const int32_t id = draw(weight.data(), n, uniform, scratch.block_sums);
  if (id < 0) no_candidate(allowed, n);  // unreachable: the maximum weighs 1
  return id;
}

int32_t Sampler::sample(const float* logits, int32_t n_rows, const std::vector<bool>* allowed) {
  double u = params_.temperature == 0.0f ? 0.0 : next_uniform();
  double xu = next_xtc_uniform();
  return pick(logits, n_rows, u, allowed, xu);
}

namespace {

// log-sum-exp of the candidates (values > -inf); +inf candidates share all of the mass.
struct LogNorm {
  float max = kNegInf;
  double lse = 0;       // log(sum exp(x)) when max is finite
  int32_t n_pos_inf = 0;
};

LogNorm log_norm(const float* w, int32_t n) {
  const Stats st = stats_of(w, n);
  LogNorm r;
  r.max = st.max;
  r.n_pos_inf = st.n_pos_inf;
  if (r.max == kNegInf || r.max == kPosInf) return r;
  std::vector<float>& e = scratch.weights;
  e.resize(size_t(n));
  for (int32_t i = 0; i < n; ++i) e[size_t(i)] = std::exp(w[i] - r.max);  // exp(-inf) = 0
  r.lse = double(r.max) + std::log(sum_of(e.data(), n));
  return r;
}

float logprob_of(float x, const LogNorm& r) {
  if (x == kNegInf || r.max == kNegInf) return kNegInf;
  if (r.max == kPosInf) return x == kPosInf ? float(-std::log(double(r.n_pos_inf))) : kNegInf;
  return float(double(x) - r.lse);
}

}  // namespace

float Sampler::logprob(const float* logits, int32_t n_rows, int32_t id, const std::vector<bool>* allowed) const {
  if (id < 0 || id >= n_real_vocab_)
    bad("logprob token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_real_vocab_) + ")");
  const int32_t n = adjusted_logits(logits, n_rows, allowed, scratch.work);
  return logprob_of(scratch.work[size_t(id)], log_norm(scratch.work.data(), n));
}

std::vector<Sampler::TopLogprob> Sampler::top_logprobs(const float* logits, int32_t n_rows, int32_t n_top,
                                                       const std::vector<bool>* allowed) const {
  if (n_top < 0) bad("top_logprobs count must be >= 0, got " + std::to_string(n_top));
  const int32_t n = adjusted_logits(logits, n_rows, allowed, scratch.work);
  const float* w = scratch.work.data();
  const LogNorm norm = log_norm(w, n);
  std::vector<TopLogprob> out;
  if (n_top == 0 || norm.max == kNegInf) return out;
  std::vector<Candidate>& c = scratch.cands;
  select_top(w, n, size_t(n_top), c);
  const size_t m = c.size();
  out.reserve(m);
  for (size_t i = 0; i < m; ++i) out.push_back({c[i].id, logprob_of(c[i].logit, norm)});
  return out;
}

bool Sampler::can_pick_from_top(int32_t k_fetched) const {
  if (params_.temperature == 0.0f) return k_fetched >= 1;
  return params_.top_k > 0 && params_.top_k <= k_fetched;
}

bool Sampler::top_suffices(const TopCandidates& c) const {
  if (c.n_cand <= 0 || c.n_pos_inf > 0 || c.top.empty()) return false;
  if (params_.temperature == 0.0f) return true;
  const int32_t k = params_.top_k;
  return k > 0 && k < c.n_cand && c.top.size() >= size_t(k);
}

int32_t Sampler::pick_top(const TopCandidates& t, double uniform, double xtc_uniform) const {
  if (!(uniform >= 0.0 && uniform < 1.0)) bad("the uniform draw must be in [0, 1)");
  if (!top_suffices(t)) bad("the fetched candidates do not decide this draw: sample from the full logits");
  if (params_.temperature == 0.0f) return t.top.front().second;  // the lowest id holding the maximum
  std::vector<Candidate>& c = scratch.cands;
  c.clear();
  for (size_t i = 0; i < size_t(params_.top_k); ++i) c.push_back({t.top[i].first, t.top[i].second});
  const int32_t id = draw_explicit(c, params_, uniform, xtc_uniform);
  if (id < 0) throw std::runtime_error("sampler: no token can be sampled from the fetched candidates");
  return id;
}

int32_t Sampler::sample_top(const TopCandidates& c) {
  double u = params_.temperature == 0.0f ? 0.0 : next_uniform();
  double xu = next_xtc_uniform();
  return pick_top(c, u, xu);
}

float Sampler::logprob_top(const TopCandidates& c, int32_t id) const {
  if (id < 0 || id >= n_real_vocab_)
    bad("logprob token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_real_vocab_) + ")");
  const LogNorm norm{c.max, c.lse, c.n_pos_inf};
  for (const auto& [x, i] : c.top)
    if (i == id) return logprob_of(x, norm);
  if (c.top.size() >= size_t(std::max(c.n_cand, 0))) return kNegInf;  // every candidate is listed
  bad("logprob of token " + std::to_string(id) + ": not among the " + std::to_string(c.top.size()) +
      " fetched candidates");
}

std::vector<Sampler::TopLogprob> Sampler::top_logprobs_top(const TopCandidates& c, int32_t n_top) const {
  if (n_top < 0) bad("top_logprobs count must be >= 0, got " + std::to_string(n_top));
  std::vector<TopLogprob> out;
  if (n_top == 0 || c.max == kNegInf || c.n_cand <= 0) return out;
  const size_t m = size_t(std::min(n_top, c.n_cand));
  if (m > c.top.size())
    bad(std::to_string(n_top) + " top log-probabilities need more than the " + std::to_string(c.top.size()) +
        " fetched candidates");
  const LogNorm norm{c.max, c.lse, c.n_pos_inf};
  out.reserve(m);
  for (size_t i = 0; i < m; ++i) out.push_back({c.top[i].second, logprob_of(c.top[i].first, norm)});
  return out;
}

TopCandidates Sampler::top_candidates(const float* logits, int32_t n_rows, int32_t k) const {
  if (k < 0) bad("the candidate count must be >= 0, got " + std::to_string(k));
  const int32_t n = adjusted_logits(logits, n_rows, nullptr, scratch.work);
  const float* w = scratch.work.data();
  const Stats st = stats_of(w, n);
  const LogNorm norm = log_norm(w, n);
  TopCandidates t;
  t.n_cand = st.n_cand;
  t.n_pos_inf = st.n_pos_inf;
  t.max = norm.max;
  t.lse = norm.lse;
  std::vector<Candidate>& c = scratch.cands;
  select_top(w, n, size_t(k), c);
  t.top.reserve(c.size());
  for (const Candidate& x : c) t.top.emplace_back(x.logit, x.id);
  return t;
}

}  // namespace qrig::runtime
