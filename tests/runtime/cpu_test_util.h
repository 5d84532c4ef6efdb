// Shared helpers of the CPU reference op tests: seeded random inputs, NaN-poisoned outputs, the
// relative error measure (max|a-b| / max|b|) and a scope that pins the global thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/cpu/thread_pool.h"

namespace qrig::cpu::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> randu(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// An output buffer every element of which the op under test must overwrite.
inline std::vector<float> poisoned(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// max|a-b| / max|b|; infinite when a has a non-finite value, the sizes differ, or b is all zeros
// (so a comparison against nothing can never pass).
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<double>::infinity();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::abs(x - y));
    den = std::max(den, std::abs(y));
  }
  if (den == 0.0) return std::numeric_limits<double>::infinity();
  return num / den;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Sets the global pool size for the lifetime of the scope.
struct ThreadCount {
  int saved;
  explicit ThreadCount(int n) : saved(num_threads()) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved); }
};

inline double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
inline double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace qrig::cpu::test
