// Tests of the CPU reference ops other than GDN (see test_cpu_gdn.cpp) against straightforward
// double-precision implementations written here from QWEN35.md, plus the error cases and
// bit-identical results for 1, 2 and 3 threads.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "gguf/gguf.h"
#include "runtime/cpu/ops.h"
#include "tests/runtime/cpu_test_util.h"

using namespace qrig;
using namespace qrig::cpu;
using namespace qrig::cpu::test;

namespace {

// A weight stored as `type`, plus the float values it dequantizes to (what the reference uses).
struct Weight {
  gguf::TensorType type;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // [out][in]
  int64_t in, out;
  Matrix matrix() const { return Matrix{type, bytes.data(), in, out}; }
};

Weight make_weight(gguf::TensorType type, int64_t in, int64_t out, uint32_t seed) {
  const std::vector<float> src = randn(static_cast<size_t>(in * out), seed, 0.5f);
  const size_t n = src.size();
  Weight w{type, {}, std::vector<float>(n), in, out};
  switch (type) {
    case gguf::TensorType::F32:
      w.bytes.resize(n * 4);
      std::memcpy(w.bytes.data(), src.data(), n * 4);
      w.values = src;
      break;
    case gguf::TensorType::F16:
      w.bytes.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = gguf::float_to_fp16(src[i]);
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        w.values[i] = gguf::fp16_to_float(h);
      }
      break;
    case gguf::TensorType::BF16:
      w.bytes.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &src[i], 4);
        const uint16_t h = static_cast<uint16_t>(bits >> 16);  // truncation: any bf16 value will do
        std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        w.values[i] = gguf::bf16_to_float(h);
      }
      break;
    case gguf::TensorType::Q8_0:
      w.bytes.resize(n / gguf::kQ8_0Block * gguf::kQ8_0Bytes);
      gguf::quantize_q8_0(src.data(), w.bytes.data(), n);
      gguf::dequantize(type, w.bytes.data(), w.values.data(), n);
      break;
    default: {
      if (!gguf::can_quantize(type)) FAIL("unsupported test weight type");
      const gguf::TypeTraits& tr = *gguf::type_traits(static_cast<uint32_t>(type));
      w.bytes.resize(n / tr.block_elems * tr.block_bytes);
      gguf::quantize(type, src.data(), w.bytes.data(), n);
      gguf::dequantize(type, w.bytes.data(), w.values.data(), n);
    }
  }
  return w;
}

std::vector<double> matmul_ref(const Weight& w, const std::vector<float>& x, int64_t T) {
  std::vector<double> out(static_cast<size_t>(T * w.out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < w.out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < w.in; ++i) acc += static_cast<double>(w.values[o * w.in + i]) * x[t * w.in + i];
      out[t * w.out + o] = acc;
    }
  return out;
}

// RMSNorm of n values read with stride 1 from x, in double.
void rms_ref(const float* x, const float* w, int64_t n, double eps, double* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

// conv over the concatenation [history (K-1 rows) ; x (T rows)] in double.
std::vector<double> conv_ref(const std::vector<float>& x, int64_t T, int64_t C, const std::vector<float>& w,
                             int64_t K, const std::vector<float>& history) {
  std::vector<double> out(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t n = t + k;  // index into the concatenation
        const double v = n < K - 1 ? history[n * C + c] : x[(n - (K - 1)) * C + c];
        acc += w[c * K + k] * v;
      }
      out[t * C + c] = silu_ref(acc);
    }
  return out;
}

std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& kc,
                                  const std::vector<float>& vc, int64_t T, int64_t pos0, int64_t Hq,
                                  int64_t Hkv, int64_t hd, double scale, const float* gate, int64_t grs,
                                  int64_t ghs) {
  std::vector<double> out(static_cast<size_t>(T * Hq * hd));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / (Hq / Hkv), n = pos0 + t + 1;
      std::vector<double> s(static_cast<size_t>(n));
      double m = -INFINITY;
      for (int64_t p = 0; p < n; ++p) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += static_cast<double>(q[(t * Hq + h) * hd + i]) * kc[(p * Hkv + kvh) * hd + i];
        s[p] = d * scale;
        m = std::max(m, s[p]);
      }
      double den = 0;
      for (auto& v : s) den += (v = std::exp(v - m));
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < n; ++p) acc += s[p] * vc[(p * Hkv + kvh) * hd + i];
        out[(t * Hq + h) * hd + i] = acc / den * sigmoid_ref(gate[t * grs + h * ghs + i]);
      }
    }
  return out;
}

}  // namespace

TEST_CASE("matmul matches a double reference for F32, F16, BF16 and Q8_0 weights", "[runtime]") {
  const int64_t in = 320, out = 70;
  for (auto type : {gguf::TensorType::F32, gguf::TensorType::F16, gguf::TensorType::BF16, gguf::TensorType::Q8_0}) {
    const Weight w = make_weight(type, in, out, 11);
    for (int64_t T : {1, 5}) {
      INFO(gguf::tensor_type_name(type) << " T=" << T);
      const auto x = randn(static_cast<size_t>(T * in), 12);
      auto y = poisoned(static_cast<size_t>(T * out));
      matmul(w.matrix(), x.data(), T, y.data());
      CHECK(rel_err(y, matmul_ref(w, x, T)) < 1e-5);
      // Batched and single-token results agree bit for bit (same reduction order per output).
      auto y1 = poisoned(y.size());
      for (int64_t t = 0; t < T; ++t) matmul(w.matrix(), x.data() + t * in, 1, y1.data() + t * out);
      CHECK(bit_equal(y1, y));
    }
  }
}

TEST_CASE("matmul matches a double reference for the block formats, dequantized on the fly", "[runtime]") {
  const int64_t in = 512, out = 37;  // 512: whole K-quant super-blocks
  for (auto type : {gguf::TensorType::Q4_0, gguf::TensorType::Q4_1, gguf::TensorType::Q5_0, gguf::TensorType::Q5_1,
                    gguf::TensorType::Q2_K, gguf::TensorType::Q3_K, gguf::TensorType::Q4_K, gguf::TensorType::Q5_K,
                    gguf::TensorType::Q6_K}) {
    const Weight w = make_weight(type, in, out, 13);
    for (int64_t T : {1, 3}) {
      INFO(gguf::tensor_type_name(type) << " T=" << T);
      const auto x = randn(static_cast<size_t>(T * in), 14);
      auto y = poisoned(static_cast<size_t>(T * out));
      matmul(w.matrix(), x.data(), T, y.data());
      CHECK(rel_err(y, matmul_ref(w, x, T)) < 1e-5);
    }
  }
}

TEST_CASE("matmul and embed reject unsupported or inconsistent weights", "[runtime]") {
  std::vector<uint8_t> bytes(64 * 64 * 4);
  std::vector<float> x(256), y(256);
  CHECK_THROWS_AS(matmul(Matrix{gguf::TensorType::IQ2_XXS, bytes.data(), 256, 4}, x.data(), 1, y.data()), OpError);
  CHECK_THROWS_AS(matmul(Matrix{gguf::TensorType::Q4_K, bytes.data(), 64, 4}, x.data(), 1, y.data()), OpError);
  CHECK_THROWS_AS(matmul(Matrix{gguf::TensorType::Q8_0, bytes.data(), 48, 4}, x.data(), 1, y.data()), OpError);
  CHECK_THROWS_AS(matmul(Matrix{gguf::TensorType::F32, nullptr, 64, 4}, x.data(), 1, y.data()), OpError);
  CHECK_THROWS_AS(matmul(Matrix{gguf::TensorType::F32, bytes.data(), 0, 4}, x.data(), 1, y.data()), OpError);
  const int32_t tok = 0;
  CHECK_THROWS_AS(embed(Matrix{gguf::TensorType::IQ3_S, bytes.data(), 256, 2}, &tok, 1, y.data()), OpError);
}

TEST_CASE("embed copies dequantized rows and rejects out-of-range ids", "[runtime]") {
  const int64_t D = 64, V = 40;
  for (auto type : {gguf::TensorType::F32, gguf::TensorType::Q8_0}) {
    const Weight table = make_weight(type, D, V, 21);
    const std::vector<int32_t> tokens = {3, 0, 39, 3, 17};
    const int64_t T = static_cast<int64_t>(tokens.size());
    auto out = poisoned(static_cast<size_t>(T * D));
    embed(table.matrix(), tokens.data(), T, out.data());
    std::vector<float> expect;
    for (int32_t id : tokens) expect.insert(expect.end(), table.values.begin() + id * D, table.values.begin() + (id + 1) * D);
    CHECK(bit_equal(out, expect));
    for (int32_t bad : {-1, 40, 1 << 30}) {
      const std::vector<int32_t> bad_tokens = {1, bad};
      CHECK_THROWS_AS(embed(table.matrix(), bad_tokens.data(), 2, out.data()), OpError);
    }
  }
}

TEST_CASE("rmsnorm matches a double reference, also in place", "[runtime]") {
  const int64_t T = 6, D = 200;
  const float eps = 1e-6f;
  const auto x = randn(static_cast<size_t>(T * D), 31, 3.0f);
  const auto w = randn(static_cast<size_t>(D), 32);
  std::vector<double> ref(x.size());
  for (int64_t t = 0; t < T; ++t) rms_ref(x.data() + t * D, w.data(), D, eps, ref.data() + t * D);
  auto y = poisoned(x.size());
  rmsnorm(x.data(), w.data(), T, D, eps, y.data());
  CHECK(rel_err(y, ref) < 1e-6);
  auto inplace = x;
  rmsnorm(inplace.data(), w.data(), T, D, eps, inplace.data());
  CHECK(bit_equal(inplace, y));
  CHECK_THROWS_AS(rmsnorm(x.data(), w.data(), T, 0, eps, y.data()), OpError);
}

TEST_CASE("add and swiglu match double references", "[runtime]") {
  const size_t n = 1000;
  const auto a = randn(n, 41, 4.0f), b = randn(n, 42);
  std::vector<double> sum(n), sw(n);
  for (size_t i = 0; i < n; ++i) {
    sum[i] = static_cast<double>(a[i]) + b[i];
    sw[i] = silu_ref(a[i]) * b[i];
  }
  auto y = poisoned(n);
  add(a.data(), b.data(), static_cast<int64_t>(n), y.data());
  CHECK(rel_err(y, sum) < 1e-7);
  y = poisoned(n);
  swiglu(a.data(), b.data(), static_cast<int64_t>(n), y.data());
  CHECK(rel_err(y, sw) < 1e-6);
}

TEST_CASE("conv1d_causal_silu: one call, token-by-token and split calls agree with the reference", "[runtime]") {
  const int64_t T = 13, C = 24, K = 4;
  const auto x = randn(static_cast<size_t>(T * C), 51);
  const auto w = randn(static_cast<size_t>(C * K), 52, 0.5f);
  const auto state0 = randn(static_cast<size_t>((K - 1) * C), 53);
  const auto ref = conv_ref(x, T, C, w, K, state0);
  // The state after all T tokens: the last K-1 inputs.
  const std::vector<float> final_state(x.end() - (K - 1) * C, x.end());

  auto state = state0;
  auto y = poisoned(x.size());
  conv1d_causal_silu(x.data(), T, C, w.data(), K, state.data(), y.data());
  CHECK(rel_err(y, ref) < 1e-6);
  CHECK(bit_equal(state, final_state));

  auto state1 = state0;
  auto y1 = poisoned(x.size());
  for (int64_t t = 0; t < T; ++t)
    conv1d_causal_silu(x.data() + t * C, 1, C, w.data(), K, state1.data(), y1.data() + t * C);
  CHECK(rel_err(y1, y) <= 1e-7);
  CHECK(bit_equal(state1, final_state));

  for (int64_t split : {2, 3, 10}) {  // 2 < K-1: the second call shifts part of the old history
    INFO("split " << split);
    auto state2 = state0;
    auto y2 = poisoned(x.size());
    conv1d_causal_silu(x.data(), split, C, w.data(), K, state2.data(), y2.data());
    conv1d_causal_silu(x.data() + split * C, T - split, C, w.data(), K, state2.data(), y2.data() + split * C);
    CHECK(rel_err(y2, y) <= 1e-7);
    CHECK(bit_equal(state2, final_state));
  }
  // A single short call keeps the older history rows, shifted.
  auto state3 = state0;
  auto y3 = poisoned(static_cast<size_t>(C));
  conv1d_causal_silu(x.data(), 1, C, w.data(), K, state3.data(), y3.data());
  std::vector<float> expect3(state0.begin() + C, state0.end());
  expect3.insert(expect3.end(), x.begin(), x.begin() + C);
  CHECK(bit_equal(state3, expect3));
  CHECK_THROWS_AS(conv1d_causal_silu(x.data(), T, C, w.data(), 0, state.data(), y.data()), OpError);
}

TEST_CASE("gated_rmsnorm matches a double reference", "[runtime]") {
  const int64_t T = 3, H = 4, dv = 128;
  const float eps = 1e-6f;
  const auto o = randn(static_cast<size_t>(T * H * dv), 61, 0.2f);
  const auto z = randn(o.size(), 62, 2.0f);
  const auto w = randn(static_cast<size_t>(dv), 63);
  std::vector<double> ref(o.size());
  for (int64_t r = 0; r < T * H; ++r) {
    rms_ref(o.data() + r * dv, w.data(), dv, eps, ref.data() + r * dv);
    for (int64_t i = 0; i < dv; ++i) ref[r * dv + i] *= silu_ref(z[r * dv + i]);
  }
  auto y = poisoned(o.size());
  gated_rmsnorm(o.data(), z.data(), w.data(), T, H, dv, eps, y.data());
  CHECK(rel_err(y, ref) < 1e-6);
}

TEST_CASE("head_rmsnorm reads strided heads and writes them contiguously", "[runtime]") {
  const int64_t T = 3, H = 4, hd = 64;
  const float eps = 1e-6f;
  // q projection layout: per token, per head [query hd | gate hd].
  const auto x = randn(static_cast<size_t>(T * H * 2 * hd), 71, 2.0f);
  const auto w = randn(static_cast<size_t>(hd), 72);
  for (int64_t offset : {int64_t{0}, hd}) {
    INFO("offset " << offset);
    std::vector<double> ref(static_cast<size_t>(T * H * hd));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        rms_ref(x.data() + t * 2 * H * hd + h * 2 * hd + offset, w.data(), hd, eps, ref.data() + (t * H + h) * hd);
    auto y = poisoned(ref.size());
    head_rmsnorm(x.data(), 2 * H * hd, 2 * hd, offset, w.data(), T, H, hd, eps, y.data());
    CHECK(rel_err(y, ref) < 1e-6);
  }
  // Contiguous k layout.
  std::vector<double> ref(static_cast<size_t>(T * H * hd));
  for (int64_t r = 0; r < T * H; ++r) rms_ref(x.data() + r * hd, w.data(), hd, eps, ref.data() + r * hd);
  auto y = poisoned(ref.size());
  head_rmsnorm(x.data(), H * hd, hd, 0, w.data(), T, H, hd, eps, y.data());
  CHECK(rel_err(y, ref) < 1e-6);
}

TEST_CASE("rope_neox rotates the first rope_dims of each head by the direct formula", "[runtime]") {
  const int64_t T = 4, H = 3, hd = 256, rd = 64;
  const double theta = 1e7;
  const std::vector<int32_t> pos = {0, 1, 4097, 262143};
  const auto x0 = randn(static_cast<size_t>(T * H * hd), 81);
  std::vector<double> ref(x0.begin(), x0.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < rd / 2; ++i) {
        const double a = pos[t] * std::pow(theta, -2.0 * i / rd);
        const size_t p = static_cast<size_t>((t * H + h) * hd + i), p2 = p + rd / 2;
        ref[p] = x0[p] * std::cos(a) - x0[p2] * std::sin(a);
        ref[p2] = x0[p] * std::sin(a) + x0[p2] * std::cos(a);
      }
  auto x = x0;
  rope_neox(x.data(), pos.data(), T, H, hd, rd, static_cast<float>(theta));
  CHECK(rel_err(x, ref) < 1e-6);
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = rd; i < hd; ++i) REQUIRE(x[r * hd + i] == x0[r * hd + i]);  // untouched, bit for bit
  for (int64_t i = 0; i < H * hd; ++i) REQUIRE(x[i] == x0[i]);                      // position 0: identity
  CHECK_THROWS_AS(rope_neox(x.data(), pos.data(), T, H, hd, 63, 1e7f), OpError);
  CHECK_THROWS_AS(rope_neox(x.data(), pos.data(), T, H, hd, 2 * hd, 1e7f), OpError);
}

TEST_CASE("attention_gated matches a naive double implementation (prefill, decode, GQA)", "[runtime]") {
  const int64_t Hq = 8, Hkv = 2, hd = 64;  // GQA 4:1
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  struct Case { int64_t T, pos0; };
  for (Case c : {Case{20, 0}, Case{1, 37}, Case{9, 16}, Case{1, 0}}) {
    INFO("T=" << c.T << " pos0=" << c.pos0);
    const int64_t n_kv = c.pos0 + c.T;
    // q and gate interleaved per head as attn_q produces them: [query hd | gate hd].
    const auto qg = randn(static_cast<size_t>(c.T * Hq * 2 * hd), 91, 1.5f);
    std::vector<float> q(static_cast<size_t>(c.T * Hq * hd));
    for (int64_t r = 0; r < c.T * Hq; ++r)
      std::copy(qg.begin() + r * 2 * hd, qg.begin() + r * 2 * hd + hd, q.begin() + r * hd);
    const auto kc = randn(static_cast<size_t>(n_kv * Hkv * hd), 92, 1.5f);
    const auto vc = randn(kc.size(), 93);
    const float* gate = qg.data() + hd;
    const auto ref = attention_ref(q, kc, vc, c.T, c.pos0, Hq, Hkv, hd, scale, gate, 2 * Hq * hd, 2 * hd);
    auto y = poisoned(q.size());
    attention_gated(q.data(), kc.data(), vc.data(), c.T, c.pos0, Hq, Hkv, hd, static_cast<float>(scale), gate,
                    2 * Hq * hd, 2 * hd, y.data());
    CHECK(rel_err(y, ref) < 1e-5);
    // Token-by-token decode over the same cache gives the same numbers.
    auto y1 = poisoned(q.size());
    for (int64_t t = 0; t < c.T; ++t)
      attention_gated(q.data() + t * Hq * hd, kc.data(), vc.data(), 1, c.pos0 + t, Hq, Hkv, hd,
                      static_cast<float>(scale), gate + t * 2 * Hq * hd, 2 * Hq * hd, 2 * hd, y1.data() + t * Hq * hd);
    CHECK(bit_equal(y1, y));
  }
  std::vector<float> buf(64 * 3 * 64);
  CHECK_THROWS_AS(attention_gated(buf.data(), buf.data(), buf.data(), 1, 0, 3, 2, 64, 0.125f, buf.data(), 0, 0,
                                  buf.data() + 64 * 3),
                  OpError);
}

TEST_CASE("ops give bit-identical results with 1, 2 and 3 threads", "[runtime]") {
  // Sizes are chosen so that every op splits its work over all threads.
  const int64_t T = 200, D = 256, F = 512;
  const Weight wq = make_weight(gguf::TensorType::Q8_0, D, F, 101);
  const auto x = randn(static_cast<size_t>(T * D), 102);
  const auto nw = randn(static_cast<size_t>(D), 103);
  const auto cw = randn(static_cast<size_t>(D * 4), 104);
  const auto st = randn(static_cast<size_t>(3 * D), 105);
  const auto gate = randn(static_cast<size_t>(T * D), 106);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(1000 + 3 * t);
  auto run_all = [&]() {
    std::vector<std::vector<float>> r;
    auto y = poisoned(static_cast<size_t>(T * F));
    matmul(wq.matrix(), x.data(), T, y.data());
    r.push_back(y);
    y = poisoned(x.size());
    rmsnorm(x.data(), nw.data(), T, D, 1e-6f, y.data());
    r.push_back(y);
    y = poisoned(x.size());
    auto s = st;
    conv1d_causal_silu(x.data(), T, D, cw.data(), 4, s.data(), y.data());
    r.push_back(y);
    r.push_back(s);
    y = poisoned(x.size());
    gated_rmsnorm(x.data(), gate.data(), nw.data(), T, 2, 128, 1e-6f, y.data());
    r.push_back(y);
    y = poisoned(x.size());
    head_rmsnorm(x.data(), D, 64, 0, nw.data(), T, 4, 64, 1e-6f, y.data());
    r.push_back(y);
    y = x;
    rope_neox(y.data(), pos.data(), T, 4, 64, 32, 1e7f);
    r.push_back(y);
    y = poisoned(x.size());
    swiglu(x.data(), gate.data(), T * D, y.data());
    r.push_back(y);
    y = poisoned(x.size());
    add(x.data(), gate.data(), T * D, y.data());
    r.push_back(y);
    y = poisoned(x.size());  // attention: Hq = 4, Hkv = 2, hd = 64, the cache = x itself
    attention_gated(x.data(), x.data(), gate.data(), T, 0, 4, 2, 64, 0.125f, gate.data(), D, 64, y.data());
    r.push_back(y);
    return r;
  };
  std::vector<std::vector<float>> one, two, three;
  { ThreadCount tc(1); one = run_all(); }
  { ThreadCount tc(2); two = run_all(); }
  { ThreadCount tc(3); three = run_all(); }
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("result " << i);
    CHECK(bit_equal(one[i], two[i]));
    CHECK(bit_equal(one[i], three[i]));
  }
}
