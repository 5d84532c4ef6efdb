// The quantized KV cache formats' CPU reference (kernels/kv_format.h, runtime/cpu/ops_kv.cpp): the codebooks'
// error on Gaussian vectors against the Lloyd-Max optimum, q8's round-trip bound, the rotation, attention in the
// rotated domain against attention over the dequantized cache, and bad input. Fresh random inputs per run (the
// seed is printed on failure).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kv_format.h"
#include "runtime/cpu/ops.h"
#include "tests/runtime/cpu_test_util.h"

using namespace qrig;
using kernels::KvFormat;
using cpu::test::poisoned;
using cpu::test::randn;
using cpu::test::rel_err;

namespace {

uint32_t fresh_seed() {
  static std::random_device rd;
  return rd();
}

std::vector<uint8_t> quantize(KvFormat f, const std::vector<float>& x, int64_t width, int64_t layer) {
  const int64_t rb = kernels::kv_row_bytes(f, width, true), rows = (int64_t)x.size() / width;
  std::vector<uint8_t> out((size_t)(rows * rb), 0xAB);
  for (int64_t r = 0; r < rows; ++r) cpu::kv_quantize_row(f, x.data() + r * width, width, layer, out.data() + r * rb);
  return out;
}

std::vector<float> dequantize(KvFormat f, const std::vector<uint8_t>& q, int64_t width, int64_t layer) {
  const int64_t rb = kernels::kv_row_bytes(f, width, true), rows = (int64_t)q.size() / rb;
  std::vector<float> out = poisoned((size_t)(rows * width));
  for (int64_t r = 0; r < rows; ++r) cpu::kv_dequantize_row(f, q.data() + r * rb, width, layer, out.data() + r * width);
  return out;
}

}  // namespace

TEST_CASE("kv formats: names, pair spellings and row bytes", "[runtime][kv]") {
  CHECK(kernels::parse_kv_pair("k8v3") == kernels::KvPair{KvFormat::q8, KvFormat::t3});
  CHECK(kernels::parse_kv_pair("k16v16") == kernels::KvPair{KvFormat::f16, KvFormat::f16});
  CHECK(kernels::parse_kv_pair("k32v4") == kernels::KvPair{KvFormat::f32, KvFormat::t4});
  for (const char* bad : {"", "k8", "v8k8", "k7v3", "k8v", "k8v3x", "K8V3"}) CHECK_FALSE(kernels::parse_kv_pair(bad));
  CHECK(kernels::kv_pair_name({KvFormat::t4, KvFormat::t3}) == "k4v3");
  // 9B rows: 4 kv heads x 256.
  CHECK(kernels::kv_row_bytes(KvFormat::f16, 1024, false) == 2048);
  CHECK(kernels::kv_row_bytes(KvFormat::f16, 1024, true) == 4096);
  CHECK(kernels::kv_row_bytes(KvFormat::q8, 1024, false) == 1024 + 64);
  CHECK(kernels::kv_row_bytes(KvFormat::t4, 1024, false) == 512 + 16);
  CHECK(kernels::kv_row_bytes(KvFormat::t3, 1024, false) == 384 + 16);
  CHECK(kernels::kv_row_bytes(KvFormat::t3, 256, true) == 112);  // 100 bytes padded to 16
  CHECK_THROWS(kernels::kv_row_bytes(KvFormat::t3, 128, true));
  CHECK_THROWS(kernels::kv_row_bytes(KvFormat::q8, 48, true));
}

// The codes are the Lloyd-Max quantizer of the rotated coordinates: with the vector's plain norm as its scale
// (overwritten in the row), the error is within 2% of the optimum. The stored least-squares scale (32 more bits
// per 256 values) does better still, and must never do worse.
TEST_CASE("t3 and t4 mean squared error on Gaussian vectors is within 2% of the Lloyd-Max optimum", "[runtime][kv]") {
  const uint32_t seed = fresh_seed();
  CAPTURE(seed);
  const int64_t width = 4 * 256, rows = 4096;  // 4M coordinates
  const float sigma = 3.7f;
  const auto x = randn((size_t)(width * rows), seed, sigma);
  double var = 0;  // the sample's own variance (less noise than sigma^2)
  for (float v : x) var += (double)v * v;
  var /= (double)x.size();
  auto mse_of = [&](const std::vector<float>& y) {
    double se = 0;
    for (size_t i = 0; i < x.size(); ++i) se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    return se / (double)x.size() / var;
  };
  for (KvFormat f : {KvFormat::t3, KvFormat::t4}) {
    CAPTURE(kernels::kv_format_name(f));
    auto q = quantize(f, x, width, 5);
    const double corrected = mse_of(dequantize(f, q, width, 5)), opt = kernels::kv_codebook_mse(f);
    const int64_t rb = kernels::kv_row_bytes(f, width, true), codes = width * (f == KvFormat::t4 ? 4 : 3) / 8;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < width / 256; ++b) {
        double ss = 0;
        for (int64_t i = 0; i < 256; ++i) ss += (double)x[(size_t)(r * width + b * 256 + i)] * x[(size_t)(r * width + b * 256 + i)];
        const float plain = (float)(std::sqrt(ss) / 16.0);  // norm / sqrt(256): the levels are N(0, 1)'s
        std::memcpy(q.data() + r * rb + codes + b * 4, &plain, 4);
      }
    const double plain = mse_of(dequantize(f, q, width, 5));
    CAPTURE(plain, corrected, opt);
    CHECK(std::fabs(plain / opt - 1.0) < 0.02);
    CHECK(corrected <= plain);
    CHECK(corrected < opt * 1.02);
  }
}

TEST_CASE("q8 round trips within half a scale step (amax / 127 rounded up to fp16)", "[runtime][kv]") {
  const uint32_t seed = fresh_seed();
  CAPTURE(seed);
  const int64_t width = 512, rows = 64;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> expo(-6.0f, 6.0f);
  auto x = randn((size_t)(width * rows), seed + 1);
  for (int64_t b = 0; b < width * rows / 32; ++b) {  // a different magnitude per block
    const float s = std::pow(10.0f, expo(rng));
    for (int64_t i = 0; i < 32; ++i) x[(size_t)(b * 32 + i)] *= s;
  }
  const auto y = dequantize(KvFormat::q8, quantize(KvFormat::q8, x, width, 0), width, 0);
  int64_t bad = 0;
  for (int64_t b = 0; b < width * rows / 32; ++b) {
    double amax = 0;
    for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, (double)std::fabs(x[(size_t)(b * 32 + i)]));
    const double bound = amax / 127.0 * (1.0 + 1.0 / 1024.0) / 2.0 * (1.0 + 1e-6) + 6e-8;  // fp16 ulp, subnormals
    for (int64_t i = 0; i < 32; ++i) bad += !(std::fabs((double)x[(size_t)(b * 32 + i)] - y[(size_t)(b * 32 + i)]) <= bound);
  }
  CHECK(bad == 0);
  CHECK(rel_err(y, x) < 1.0 / 127.0);
}

TEST_CASE("the kv rotation is orthogonal, differs per layer and vector, and unrotates", "[runtime][kv]") {
  const uint32_t seed = fresh_seed();
  CAPTURE(seed);
  const auto x = randn(256, seed);
  std::vector<float> y = poisoned(256), z = poisoned(256), w = poisoned(256);
  cpu::kv_rotate(x.data(), 3, 1, y.data());
  cpu::kv_unrotate(y.data(), 3, 1, z.data());
  CHECK(rel_err(z, x) < 1e-6);
  double nx = 0, ny = 0;
  for (int i = 0; i < 256; ++i) nx += (double)x[i] * x[i], ny += (double)y[i] * y[i];
  CHECK(std::fabs(ny / nx - 1) < 1e-5);
  cpu::kv_rotate(x.data(), 7, 1, w.data());
  CHECK(rel_err(w, y) > 0.1);
  cpu::kv_rotate(x.data(), 3, 0, w.data());
  CHECK(rel_err(w, y) > 0.1);
}

TEST_CASE("attention over a quantized cache equals attention over its dequantized rows", "[runtime][kv]") {
  const uint32_t seed = fresh_seed();
  CAPTURE(seed);
  const int64_t Hq = 4, Hkv = 2, hd = 256, width = Hkv * hd, layer = 11;
  const float scale = 1.0f / 16.0f;
  struct Case {
    KvFormat k, v;
    int64_t T, pos0;
  };
  for (const Case& c : {Case{KvFormat::q8, KvFormat::t3, 5, 7}, Case{KvFormat::t4, KvFormat::t4, 1, 30},
                        Case{KvFormat::t3, KvFormat::t3, 6, 0}, Case{KvFormat::t3, KvFormat::q8, 3, 9},
                        Case{KvFormat::f32, KvFormat::t4, 2, 4}, Case{KvFormat::q8, KvFormat::f32, 4, 2}}) {
    CAPTURE(kernels::kv_format_name(c.k), kernels::kv_format_name(c.v), c.T, c.pos0);
    const int64_t n = c.pos0 + c.T;
    const auto q = randn((size_t)(c.T * Hq * hd), seed + 1, 2.0f);
    const auto k = randn((size_t)(n * width), seed + 2, 2.0f), v = randn((size_t)(n * width), seed + 3);
    const auto gate = randn((size_t)(c.T * 2 * Hq * hd), seed + 4);
    auto cache = [&](KvFormat f, const std::vector<float>& x, std::vector<uint8_t>& bytes, std::vector<float>& deq) {
      if (f == KvFormat::f32) {
        deq = x;
        bytes.resize(x.size() * 4);
        std::memcpy(bytes.data(), x.data(), bytes.size());
        return cpu::KvCacheView{f, bytes.data(), width * 4};
      }
      bytes = quantize(f, x, width, layer);
      deq = dequantize(f, bytes, width, layer);
      return cpu::KvCacheView{f, bytes.data(), kernels::kv_row_bytes(f, width, true)};
    };
    std::vector<uint8_t> kb, vb;
    std::vector<float> kd, vd;
    const auto kview = cache(c.k, k, kb, kd), vview = cache(c.v, v, vb, vd);
    auto want = poisoned((size_t)(c.T * Hq * hd)), got = poisoned((size_t)(c.T * Hq * hd));
    cpu::attention_gated(q.data(), kd.data(), vd.data(), c.T, c.pos0, Hq, Hkv, hd, scale, gate.data() + hd, 2 * Hq * hd,
                         2 * hd, want.data());
    cpu::attention_gated_kv(q.data(), kview, vview, layer, c.T, c.pos0, Hq, Hkv, hd, scale, gate.data() + hd,
                            2 * Hq * hd, 2 * hd, got.data());
    CHECK(rel_err(got, want) < 2e-6);
    // The quantization is not a no-op: the exact cache gives something else.
    auto exact = poisoned(want.size());
    cpu::attention_gated(q.data(), k.data(), v.data(), c.T, c.pos0, Hq, Hkv, hd, scale, gate.data() + hd, 2 * Hq * hd,
                         2 * hd, exact.data());
    CHECK(rel_err(got, exact) > 1e-5);
  }
}

TEST_CASE("quantized kv rows: bad widths are refused, non-finite values stay visible", "[runtime][kv]") {
  std::vector<float> x(256, 1.0f), y = poisoned(256);
  std::vector<uint8_t> row(512);
  CHECK_THROWS_AS(cpu::kv_quantize_row(KvFormat::t3, x.data(), 128, 0, row.data()), cpu::OpError);
  CHECK_THROWS_AS(cpu::kv_quantize_row(KvFormat::f16, x.data(), 256, 0, row.data()), cpu::OpError);
  CHECK_THROWS_AS(cpu::kv_dequantize_row(KvFormat::q8, row.data(), 40, 0, y.data()), cpu::OpError);
  for (KvFormat f : {KvFormat::q8, KvFormat::t4, KvFormat::t3}) {
    CAPTURE(kernels::kv_format_name(f));
    x.assign(256, 0.5f);
    x[17] = NAN;
    cpu::kv_quantize_row(f, x.data(), 256, 0, row.data());
    cpu::kv_dequantize_row(f, row.data(), 256, 0, y.data());
    CHECK(std::isnan(y[17]));
    x.assign(256, 0.0f);  // a zero vector comes back as zeros
    cpu::kv_quantize_row(f, x.data(), 256, 0, row.data());
    cpu::kv_dequantize_row(f, row.data(), 256, 0, y.data());
    for (float v : y) REQUIRE(v == 0.0f);
  }
}
