// Host halves of the GPU int8 layouts: Q8_0 repacking keeps every value (checked against GGUF's own
// dequantization), and the activation quantization reference meets its contract (|q| <= 127, error at most
// half a step, zero and non-finite blocks).
#include <catch2/catch.hpp>

#include <cstring>

#include <cmath>
#include <limits>
#include <random>

#include "gguf/gguf.h"
#include "runtime/cuda/q8_layout.h"
#include "runtime/cuda/variant.h"

using namespace qrig;
using namespace qrig::cuda;

TEST_CASE("repack_q8_0 keeps every value and puts row r, block b at r*cols + 32*b", "[cuda]") {
  const int64_t rows = 7, cols = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w((size_t)(rows * cols));
  for (auto& x : w) x = dist(rng);
  std::vector<uint8_t> q8((size_t)(rows * cols / 32 * 34));
  gguf::quantize_q8_0(w.data(), q8.data(), w.size());
  std::vector<float> ref(w.size());
  gguf::dequantize(gguf::TensorType::Q8_0, q8.data(), ref.data(), ref.size());

  std::vector<int8_t> qs(q8_qs_bytes(rows, cols));
  std::vector<uint16_t> sc(q8_scale_bytes(rows, cols) / 2);
  CHECK(sc.size() == (size_t)(rows * cols / 32));
  repack_q8_0(q8.data(), rows, cols, qs.data(), sc.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = gguf::fp16_to_float(sc[(size_t)(r * (cols / 32) + c / 32)]) * (float)qs[(size_t)(r * cols + c)];
      REQUIRE(v == ref[(size_t)(r * cols + c)]);
    }
  CHECK_THROWS_AS(repack_q8_0(q8.data(), rows, 48, qs.data(), sc.data()), KernelError);
  CHECK_THROWS_AS(repack_q8_0(q8.data(), 0, cols, qs.data(), sc.data()), KernelError);
}

TEST_CASE("quantize_activation_q8: |q| <= 127, error within half a step, zero and non-finite blocks", "[cuda]") {
  const int64_t n = 32 * 64;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x((size_t)n);
  for (auto& v : x) v = dist(rng);
  for (int i = 32; i < 64; ++i) x[(size_t)i] = 0.0f;                             // block 1: zeros
  x[70] = std::numeric_limits<float>::quiet_NaN();                              // block 2: NaN
  x[100] = std::numeric_limits<float>::infinity();                              // block 3: inf
  for (int i = 128; i < 160; ++i) x[(size_t)i] = i == 130 ? -1e-3f : 1e-4f;     // block 4: amax negative
  std::vector<int8_t> q((size_t)n);
  std::vector<float> d((size_t)(n / 32));
  quantize_activation_q8(x.data(), n, q.data(), d.data());
  const auto back = dequantize_activation_q8(q.data(), d.data(), n);
  for (int64_t b = 0; b < n / 32; ++b) {
    INFO("block " << b);
    if (b == 2 || b == 3) {
      CHECK(std::isnan(d[(size_t)b]));
      for (int i = 0; i < 32; ++i) CHECK(q[(size_t)(b * 32 + i)] == 0);
      continue;
    }
    if (b == 1) {
      CHECK(d[1] == 0.0f);
      continue;
    }
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[(size_t)(b * 32 + i)]));
    CHECK(d[(size_t)b] == amax / 127.0f);
    bool hit_extreme = false;
    for (int i = 0; i < 32; ++i) {
      const size_t j = (size_t)(b * 32 + i);
      CHECK(std::abs((int)q[j]) <= 127);
      CHECK(std::fabs(back[j] - x[j]) <= 0.5f * d[(size_t)b] * 1.0001f);
      hit_extreme |= std::abs((int)q[j]) == 127;
    }
    CHECK(hit_extreme);
  }
  CHECK(q[130] == -127);
  CHECK_THROWS_AS(quantize_activation_q8(x.data(), 33, q.data(), d.data()), KernelError);

  // Two planes: the same first plane and scales; the second holds the residual on the step d/254, so the
  // activation comes back within d/508 (plus rounding), ~254x closer; zero, NaN and inf blocks give q2 = 0.
  std::vector<int8_t> q1b((size_t)n), q2((size_t)n, 99);
  std::vector<float> d2((size_t)(n / 32));
  quantize_activation_q8(x.data(), n, q1b.data(), d2.data(), q2.data());
  CHECK(q1b == q);
  CHECK(std::memcmp(d2.data(), d.data(), d.size() * 4) == 0);
  const auto back2 = dequantize_activation_q8(q.data(), d.data(), n, q2.data());
  double worst1 = 0, worst2 = 0;
  for (int64_t b = 0; b < n / 32; ++b)
    for (int i = 0; i < 32; ++i) {
      const size_t j = (size_t)(b * 32 + i);
      CHECK(std::abs((int)q2[j]) <= 127);
      if (b == 1 || b == 2 || b == 3) {
        CHECK(q2[j] == 0);
        continue;
      }
      CHECK(std::fabs(back2[j] - x[j]) <= d[(size_t)b] / 508.0f * 1.01f + 1e-6f * std::fabs(x[j]));
      worst1 = std::max(worst1, (double)std::fabs(back[j] - x[j]) / d[(size_t)b]);
      worst2 = std::max(worst2, (double)std::fabs(back2[j] - x[j]) / d[(size_t)b]);
    }
  CHECK(worst2 * 100 < worst1);
}
