// Helpers shared by the CPU reference op files (not part of the ops API): argument checks that throw
// OpError, the fixed-order dot product and the scalar activation functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "runtime/cpu/ops.h"

namespace qrig::cpu::detail {

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw OpError(std::string(op) + ": " + what);
}

inline void require(bool ok, const char* op, const char* what) {
  if (!ok) fail(op, what);
}

inline void require_ptr(const void* p, const char* op, const char* name) {
  if (!p) fail(op, std::string(name) + " is null");
}

// 4 floats as one value (GCC/Clang vector extension, the native SIMD width of SSE and NEON): lets
// the compiler keep accumulators in registers while the arithmetic order stays the one written here.
typedef float f32x4 __attribute__((vector_size(16)));
inline f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store4(float* p, f32x4 v) { std::memcpy(p, &v, sizeof v); }

// Sum of a[i]*b[i] in fp32: partial sum j (of 16) takes the i = j (mod 16), the partial sums are
// combined pairwise (j with j+8, then j+4, j+2, j+1), the tail is added last. The order depends only
// on n, so every caller gets bit-identical results for the same inputs.
inline float dot(const float* a, const float* b, int64_t n) {
  f32x4 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 += load4(a + i) * load4(b + i);
    s1 += load4(a + i + 4) * load4(b + i + 4);
    s2 += load4(a + i + 8) * load4(b + i + 8);
    s3 += load4(a + i + 12) * load4(b + i + 12);
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  float acc[8];
  store4(acc, s0 + s2);
  store4(acc + 4, s1 + s3);
  for (int w = 4; w > 0; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0] + tail;
}

// y[i] += a * x[i]
inline void axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) store4(y + i, load4(y + i) + a * load4(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}

// y[i] *= a
inline void scale(float a, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) store4(y + i, a * load4(y + i));
  for (; i < n; ++i) y[i] *= a;
}

// Sum of squares in double (used by the norms; cheap next to everything else).
inline double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// log(1 + e^x) without overflow or loss of precision for large |x|.
inline double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

}  // namespace qrig::cpu::detail
