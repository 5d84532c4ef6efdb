// Number conversions of gguf/quant.cpp: fp16 both ways for all 65536 halves (exact, NaNs stay NaN, rounding
// to nearest even at every midpoint), bf16, and the Q8_0 quantize/dequantize error bound.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gguf/gguf.h"

using namespace qrig;
using Catch::Matchers::Contains;

namespace {
bool is_nan_half(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
double hand_fp16(uint16_t h) {
  int exp = (h >> 10) & 31, man = h & 1023;
  double v = exp == 0 ? std::ldexp(man, -24) : exp == 31 ? std::numeric_limits<double>::infinity()
                                                         : std::ldexp(1024 + man, exp - 25);
  return (h >> 15) ? -v : v;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST_CASE("fp16 -> float -> fp16 is exact for all 65536 halves", "[gguf]") {
  size_t nans = 0, mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = gguf::fp16_to_float((uint16_t)h);
    uint16_t back = gguf::float_to_fp16(f);
    if (is_nan_half((uint16_t)h)) {
      ++nans;
      bool ok = std::isnan(f) && is_nan_half(back) && (back >> 15) == (h >> 15);
      if (!ok) ++mismatches;
    } else {
      bool ok = (double)f == hand_fp16((uint16_t)h) && std::signbit(f) == (bool)(h >> 15) && back == h;
      if (!ok) { ++mismatches; UNSCOPED_INFO("half 0x" << std::hex << h); }
    }
  }
  CHECK(nans == 2 * 1023);
  CHECK(mismatches == 0);
}

TEST_CASE("float -> fp16 rounds to nearest even at every midpoint and saturates to inf", "[gguf]") {
  size_t wrong = 0;
  // Positive finite halves h and h+1 (0x7bff is the largest finite); the negative side mirrors via the sign.
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    double lo = hand_fp16(h), hi = hand_fp16(h + 1);
    float mid = (float)((lo + hi) / 2);  // exact: 12 significant bits at most
    REQUIRE((double)mid == (lo + hi) / 2);
    uint16_t even = (h & 1) ? h + 1 : h;
    for (float sign : {1.0f, -1.0f}) {
      uint16_t sbit = sign < 0 ? 0x8000 : 0;
      wrong += gguf::float_to_fp16(sign * mid) != (even | sbit);
      wrong += gguf::float_to_fp16(sign * std::nextafter(mid, 0.0f)) != (h | sbit);
      wrong += gguf::float_to_fp16(sign * std::nextafter(mid, 1e9f)) != ((h + 1) | sbit);
    }
  }
  CHECK(wrong == 0);
  CHECK(gguf::float_to_fp16(65504.0f) == 0x7bff);
  CHECK(gguf::float_to_fp16(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(gguf::float_to_fp16(65520.0f) == 0x7c00);  // the midpoint to "65536" rounds to even: inf
  CHECK(gguf::float_to_fp16(1e10f) == 0x7c00);
  CHECK(gguf::float_to_fp16(-1e10f) == 0xfc00);
  CHECK(gguf::float_to_fp16(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(gguf::float_to_fp16(-0.0f) == 0x8000);
  CHECK(gguf::float_to_fp16(std::ldexp(1.0f, -25)) == 0);  // half the smallest subnormal: tie to even (0)
  CHECK(gguf::float_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 1);
  CHECK(gguf::float_to_fp16(1e-30f) == 0);
  CHECK(gguf::float_to_fp16(std::numeric_limits<float>::denorm_min()) == 0);
  CHECK(is_nan_half(gguf::float_to_fp16(-std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("bf16 -> float is the top half of the float bits", "[gguf]") {
  size_t wrong = 0;
  for (uint32_t h = 0; h < 65536; ++h) wrong += bits(gguf::bf16_to_float((uint16_t)h)) != h << 16;
  CHECK(wrong == 0);
  CHECK(gguf::bf16_to_float(0x3f80) == 1.0f);
  CHECK(gguf::bf16_to_float(0xc000) == -2.0f);
}

TEST_CASE("quantize_q8_0 round trip stays within half a quantization step", "[gguf]") {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n_blocks = 4096;
  std::vector<float> x(n_blocks * 32);
  for (size_t b = 0; b < n_blocks; ++b) {
    float scale = std::ldexp(1.0f, (int)(b % 26) - 20);  // 2^-20 .. 2^5 (fp16 scales stay finite)
    for (size_t k = 0; k < 32; ++k) x[b * 32 + k] = normal(rng) * scale;
    if (b % 7 == 0) x[b * 32 + b % 32] *= 50;  // an outlier sets the block scale
  }
  for (size_t k = 0; k < 32; ++k) x[5 * 32 + k] = 0;  // an all-zero block
  std::vector<uint8_t> q(n_blocks * 34);
  gguf::quantize_q8_0(x.data(), q.data(), x.size());
  std::vector<float> y(x.size());
  gguf::dequantize(gguf::TensorType::Q8_0, q.data(), y.data(), y.size());
  size_t over_general = 0, over_tight = 0;
  double worst_ratio = 0;
  for (size_t b = 0; b < n_blocks; ++b) {
    float amax = 0;
    for (size_t k = 0; k < 32; ++k) amax = std::fmax(amax, std::fabs(x[b * 32 + k]));
    double d = amax / 127.0;
    uint16_t hd;
    std::memcpy(&hd, &q[b * 34], 2);
    double dh = gguf::fp16_to_float(hd);
    for (size_t k = 0; k < 32; ++k) {
      double err = std::fabs((double)x[b * 32 + k] - y[b * 32 + k]);
      // |x - dh q| <= |x - d q| + |d - dh| |q| <= d/2 + 127 |d - dh| (+ float rounding).
      over_general += err > d / 2 + 127 * std::fabs(d - dh) + 1e-6 * amax + 1e-30;
      if (amax > 0.01) {  // the fp16 scale is a normal number: relative error <= 2^-11
        over_tight += err > 0.57 * d;
        worst_ratio = std::fmax(worst_ratio, err / d);
      }
    }
  }
  CHECK(over_general == 0);
  CHECK(over_tight == 0);
  CHECK(worst_ratio > 0.4);  // the bound is not vacuous: errors do reach about half a step
  for (size_t k = 0; k < 32; ++k) CHECK(y[5 * 32 + k] == 0.0f);
}

TEST_CASE("values on the Q8_0 grid quantize to exactly their blocks", "[gguf]") {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> qdist(-127, 127);
  const float d = std::ldexp(1.0f, -7);  // fp16 0x2000
  std::vector<float> x(64);
  std::vector<uint8_t> want(2 * 34);
  for (size_t b = 0; b < 2; ++b) {
    want[b * 34] = 0x00;
    want[b * 34 + 1] = 0x20;
    for (size_t k = 0; k < 32; ++k) {
      int q = k == 3 ? (b ? -127 : 127) : qdist(rng);
      x[b * 32 + k] = d * (float)q;
      want[b * 34 + 2 + k] = (uint8_t)(int8_t)q;
    }
  }
  std::vector<uint8_t> got(2 * 34);
  gguf::quantize_q8_0(x.data(), got.data(), x.size());
  CHECK(got == want);
  CHECK_THROWS_WITH(gguf::quantize_q8_0(x.data(), got.data(), 33), Contains("33"));
}

TEST_CASE("dequantize names the types it does not support", "[gguf]") {
  using gguf::TensorType;
  CHECK(gguf::can_dequantize(TensorType::F32));
  CHECK(gguf::can_dequantize(TensorType::F16));
  CHECK(gguf::can_dequantize(TensorType::BF16));
  CHECK(gguf::can_dequantize(TensorType::Q8_0));
  CHECK(!gguf::can_dequantize(TensorType::IQ2_XXS));  // the block formats: test_gguf_blocks.cpp
  uint8_t src[256] = {};
  float dst[256];
  CHECK_THROWS_WITH(gguf::dequantize(TensorType::IQ2_XXS, src, dst, 256), Contains("IQ2_XXS"));
  // F16 decodes through fp16_to_float.
  uint16_t h[2] = {0x3c00, 0xc000};
  gguf::dequantize(TensorType::F16, reinterpret_cast<const uint8_t*>(h), dst, 2);
  CHECK(dst[0] == 1.0f);
  CHECK(dst[1] == -2.0f);
}
