// cpu::attention_gated_kv with int8_query: the numerics of the GPU's attn_decode_dp4a (the plan's
// query_int8_tokens, docs/kv-cache.md), against a direct implementation of their definition here (double sums over
// the same int8 codes and scales), next to the fp32 query it approximates, and its errors. Fresh random inputs per
// run (the seed is printed on failure).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gguf/gguf.h"
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

// Value i of head h of a key row as the int8 query reads it: the int8 (q8) or int8 level (t4/t3), and its scale
// (q8: the block's fp16 d; t4/t3: the vector's scale times the level scale).
std::pair<int, double> key_int8(KvFormat f, const uint8_t* row, int64_t width, int64_t hd, int64_t h, int64_t i) {
  const int64_t x = h * hd + i;
  if (f == KvFormat::q8) {
    uint16_t d;
    std::memcpy(&d, row + width + (x / 32) * 2, 2);
    return {(int)reinterpret_cast<const int8_t*>(row)[x], gguf::fp16_to_float(d)};
  }
  const int64_t vec = x / 256, j = x % 256, cb = f == KvFormat::t4 ? 128 : 96;
  const uint8_t* codes = row + vec * cb;
  int c;
  if (f == KvFormat::t4) {
    c = (codes[j / 2] >> ((j % 2) * 4)) & 15;
  } else {
    const uint8_t* g = codes + (j / 8) * 3;
    c = (int)((((uint32_t)g[0] | ((uint32_t)g[1] << 8) | ((uint32_t)g[2] << 16)) >> ((j % 8) * 3)) & 7);
  }
  float s;
  std::memcpy(&s, row + (width / 256) * cb + vec * 4, 4);
  return {(int)kernels::kv_key_levels_i8(f)[(size_t)c], (double)s * kernels::kv_key_level_scale(f)};
}

// The definition, directly: the query scaled to log2 units (float, as the kernel), rotated for t4/t3 keys,
// quantized per 32 (d = amax / 127, rint(x / d)); score = sum over blocks of d_q * (sum of q8 * key int8) * the
// key's scale, in double; softmax by exp2 in double; values dequantized; times sigmoid(gate).
std::vector<double> direct(const std::vector<float>& q, const std::vector<uint8_t>& kb, KvFormat kf,
                           const std::vector<float>& vdeq, const std::vector<float>& gate, int64_t T, int64_t pos0,
                           int64_t Hq, int64_t Hkv, int64_t hd, float scale, int64_t layer) {
  const int64_t width = Hkv * hd, krb = kernels::kv_row_bytes(kf, width, true), group = Hq / Hkv;
  const float qscale = (float)((double)scale * 1.4426950408889634);
  std::vector<double> out((size_t)(T * Hq * hd));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / group;
      std::vector<float> x((size_t)hd);
      for (int64_t i = 0; i < hd; ++i) x[(size_t)i] = q[(size_t)((t * Hq + h) * hd + i)] * qscale;
      if (kf != KvFormat::q8)
        for (int64_t j = 0; j < hd / 256; ++j)
          cpu::kv_rotate(x.data() + j * 256, layer, kvh * (hd / 256) + j, x.data() + j * 256);
      std::vector<int> q8((size_t)hd);
      std::vector<double> dq((size_t)(hd / 32));
      for (int64_t b = 0; b < hd / 32; ++b) {
        float amax = 0;
        for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[(size_t)(b * 32 + i)]));
        const float d = amax / 127.0f;
        dq[(size_t)b] = d;
        for (int64_t i = 0; i < 32; ++i)
          q8[(size_t)(b * 32 + i)] = d > 0 ? (int)std::nearbyint(x[(size_t)(b * 32 + i)] / d) : 0;
      }
      const int64_t n = pos0 + t + 1;
      std::vector<double> s((size_t)n);
      double mx = -INFINITY;
      for (int64_t p = 0; p < n; ++p) {
        double acc = 0;
        for (int64_t b = 0; b < hd / 32; ++b) {
          double blk = 0;
          for (int64_t i = 0; i < 32; ++i) {
            const auto [k8, ks] = key_int8(kf, kb.data() + p * krb, width, hd, kvh, b * 32 + i);
            blk += (double)q8[(size_t)(b * 32 + i)] * k8 * ks;
          }
          acc += dq[(size_t)b] * blk;
        }
        s[(size_t)p] = acc;
        mx = std::max(mx, acc);
      }
      double l = 0;
      std::vector<double> o((size_t)hd, 0.0);
      for (int64_t p = 0; p < n; ++p) {
        const double w = std::exp2(s[(size_t)p] - mx);
        l += w;
        for (int64_t i = 0; i < hd; ++i) o[(size_t)i] += w * vdeq[(size_t)(p * width + kvh * hd + i)];
      }
      for (int64_t i = 0; i < hd; ++i) {
        const double g = gate[(size_t)(t * 2 * Hq * hd + h * 2 * hd + hd + i)];
        out[(size_t)((t * Hq + h) * hd + i)] = o[(size_t)i] / l / (1.0 + std::exp(-g));
      }
    }
  return out;
}

}  // namespace

TEST_CASE("attention with an int8 query equals its definition and stays near the fp32 query", "[runtime][kv]") {
  const uint32_t seed = fresh_seed();
  CAPTURE(seed);
  const int64_t Hq = 4, Hkv = 2, layer = 9;
  const float scale = 1.0f / 16.0f;
  struct Case {
    KvFormat k, v;
    int64_t hd, T, pos0;
  };
  for (const Case& c : {Case{KvFormat::q8, KvFormat::t3, 256, 1, 40}, Case{KvFormat::q8, KvFormat::q8, 256, 2, 33},
                        Case{KvFormat::t4, KvFormat::t4, 256, 1, 70}, Case{KvFormat::t3, KvFormat::t3, 256, 4, 9},
                        Case{KvFormat::t3, KvFormat::q8, 512, 1, 20}, Case{KvFormat::q8, KvFormat::f32, 128, 3, 25}}) {
    CAPTURE(kernels::kv_format_name(c.k), kernels::kv_format_name(c.v), c.hd, c.T, c.pos0);
    const int64_t n = c.pos0 + c.T, width = Hkv * c.hd;
    // Keys with outlier channels (the per-block query scale and the rotation must hold them), a peaked query.
    auto kx = randn((size_t)(n * width), seed + 1, 1.5f);
    for (size_t i = 0; i < kx.size(); i += 37) kx[i] *= 6.0f;
    const auto vx = randn((size_t)(n * width), seed + 2);
    const auto q = randn((size_t)(c.T * Hq * c.hd), seed + 3, 1.5f);
    const auto gate = randn((size_t)(c.T * 2 * Hq * c.hd), seed + 4);
    const auto kb = quantize(c.k, kx, width, layer);
    std::vector<uint8_t> vb;
    std::vector<float> vdeq((size_t)(n * width));
    if (c.v == KvFormat::f32) {
      vdeq = vx;
      vb.resize(vx.size() * 4);
      std::memcpy(vb.data(), vx.data(), vb.size());
    } else {
      vb = quantize(c.v, vx, width, layer);
      const int64_t rb = kernels::kv_row_bytes(c.v, width, true);
      for (int64_t p = 0; p < n; ++p)
        cpu::kv_dequantize_row(c.v, vb.data() + p * rb, width, layer, vdeq.data() + p * width);
    }
    const cpu::KvCacheView kview{c.k, kb.data(), kernels::kv_row_bytes(c.k, width, true)};
    const cpu::KvCacheView vview{c.v, vb.data(), c.v == KvFormat::f32 ? width * 4 : kernels::kv_row_bytes(c.v, width, true)};
    auto got = poisoned((size_t)(c.T * Hq * c.hd)), fp32 = poisoned(got.size());
    cpu::attention_gated_kv(q.data(), kview, vview, layer, c.T, c.pos0, Hq, Hkv, c.hd, scale, gate.data() + c.hd,
                            2 * Hq * c.hd, 2 * c.hd, got.data(), true);
    cpu::attention_gated_kv(q.data(), kview, vview, layer, c.T, c.pos0, Hq, Hkv, c.hd, scale, gate.data() + c.hd,
                            2 * Hq * c.hd, 2 * c.hd, fp32.data());
    const auto want = direct(q, kb, c.k, vdeq, gate, c.T, c.pos0, Hq, Hkv, c.hd, scale, layer);
    CHECK(rel_err(got, want) < 2e-6);
    // An int8 query per 32 values moves the scores by ~0.6% of their rms: the outputs by ~1% (0.5-1.8% measured,
    // max |difference| / max |output|): near the fp32 query, not equal to it.
    const double e = rel_err(got, fp32);
    CAPTURE(e);
    CHECK(e > 1e-6);
    CHECK(e < 3e-2);
  }
}

TEST_CASE("attention with an int8 query: f32/f16 keys are refused, a NaN query stays visible", "[runtime][kv]") {
  const int64_t Hq = 2, Hkv = 1, hd = 256, n = 8;
  const auto x = randn((size_t)(n * hd), 5);
  const auto kb = quantize(KvFormat::t3, x, hd, 0);
  std::vector<uint8_t> fb(x.size() * 4);
  std::memcpy(fb.data(), x.data(), fb.size());
  const cpu::KvCacheView t3{KvFormat::t3, kb.data(), kernels::kv_row_bytes(KvFormat::t3, hd, true)};
  const cpu::KvCacheView f32{KvFormat::f32, fb.data(), hd * 4};
  auto q = randn((size_t)(Hq * hd), 6);
  const auto gate = randn((size_t)(2 * Hq * hd), 7);
  auto out = poisoned((size_t)(Hq * hd));
  CHECK_THROWS_AS(cpu::attention_gated_kv(q.data(), f32, t3, 0, 1, n - 1, Hq, Hkv, hd, 0.0625f, gate.data() + hd,
                                          2 * Hq * hd, 2 * hd, out.data(), true),
                  cpu::OpError);
  q[(size_t)(hd + 3)] = NAN;  // head 1
  cpu::attention_gated_kv(q.data(), t3, f32, 0, 1, n - 1, Hq, Hkv, hd, 0.0625f, gate.data() + hd, 2 * Hq * hd, 2 * hd,
                          out.data(), true);
  for (int64_t i = 0; i < hd; ++i) REQUIRE(std::isfinite(out[(size_t)i]));
  for (int64_t i = 0; i < hd; ++i) REQUIRE(std::isnan(out[(size_t)(hd + i)]));
}
