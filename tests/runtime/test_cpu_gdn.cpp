// Tests of the Gated DeltaNet reference ops: the recurrence against a double-precision recurrence
// written here from QWEN35.md, the GGUF head pairing, the chunked algorithm against the recurrence
// (many lengths, chunk sizes, state carried across calls), errors and thread-count independence.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "runtime/cpu/ops.h"
#include "tests/runtime/cpu_test_util.h"

using namespace qrig::cpu;
using namespace qrig::cpu::test;

namespace {

struct GdnInputs {
  GdnShape s;
  int64_t T;
  std::vector<float> mixed, alpha, beta, ssm_a, dt_bias, state0;
  int64_t conv_dim() const { return 2 * s.Hk * s.dk + s.Hv * s.dv; }
  size_t out_size(int64_t n) const { return static_cast<size_t>(n * s.Hv * s.dv); }
};

// Realistic ranges: ssm_a = -exp(U(-3, 1.5)) and dt_bias in [-4, 1] give per-token decays from
// ~0.9999 to ~1e-4; head 0 gets ssm_a = -30 so its cumulative gamma underflows exp() within a chunk
// (a decay computed as exp(gamma_i) / exp(gamma_j) would give 0/0 there).
GdnInputs make_inputs(GdnShape s, int64_t T, uint32_t seed) {
  GdnInputs in{s, T, {}, {}, {}, {}, {}, {}};
  in.mixed = randn(static_cast<size_t>(T * in.conv_dim()), seed);
  in.alpha = randn(static_cast<size_t>(T * s.Hv), seed + 1);
  in.beta = randn(static_cast<size_t>(T * s.Hv), seed + 2, 1.5f);
  in.ssm_a = randu(static_cast<size_t>(s.Hv), seed + 3, -3.0f, 1.5f);
  for (auto& a : in.ssm_a) a = -std::exp(a);
  in.ssm_a[0] = -30.0f;
  in.dt_bias = randu(static_cast<size_t>(s.Hv), seed + 4, -4.0f, 1.0f);
  in.state0 = randn(static_cast<size_t>(s.Hv * s.dk * s.dv), seed + 5, 0.3f);
  return in;
}

// Runs one op on tokens [t0, t0 + n) of the inputs, continuing from `state`.
enum class Algo { recurrent, chunked };
void run(Algo algo, const GdnInputs& in, int64_t t0, int64_t n, std::vector<float>& state, float* out,
         int64_t chunk = 64) {
  const float* mixed = in.mixed.data() + t0 * in.conv_dim();
  const float* alpha = in.alpha.data() + t0 * in.s.Hv;
  const float* beta = in.beta.data() + t0 * in.s.Hv;
  if (algo == Algo::recurrent)
    gdn_recurrent(in.s, mixed, alpha, beta, in.ssm_a.data(), in.dt_bias.data(), n, state.data(), out);
  else
    gdn_chunked(in.s, mixed, alpha, beta, in.ssm_a.data(), in.dt_bias.data(), n, state.data(), out, chunk);
}

// QWEN35.md steps 3-5, token by token, in double.
void gdn_reference(const GdnInputs& in, std::vector<double>& out, std::vector<double>& state) {
  const auto& s = in.s;
  const int64_t cd = in.conv_dim();
  state.assign(in.state0.begin(), in.state0.end());
  out.assign(in.out_size(in.T), 0.0);
  std::vector<double> q(s.dk), k(s.dk), kv(s.dv), delta(s.dv);
  for (int64_t t = 0; t < in.T; ++t)
    for (int64_t j = 0; j < s.Hv; ++j) {
      const int64_t kh = j % s.Hk;
      const float* row = in.mixed.data() + t * cd;
      double qq = 0, kk = 0;
      for (int64_t i = 0; i < s.dk; ++i) {
        q[i] = row[kh * s.dk + i];
        k[i] = row[s.Hk * s.dk + kh * s.dk + i];
        qq += q[i] * q[i];
        kk += k[i] * k[i];
      }
      for (int64_t i = 0; i < s.dk; ++i) {
        q[i] = q[i] / std::sqrt(qq + 1e-6) / std::sqrt(static_cast<double>(s.dk));
        k[i] = k[i] / std::sqrt(kk + 1e-6);
      }
      const float* v = row + 2 * s.Hk * s.dk + j * s.dv;
      const double beta = sigmoid_ref(in.beta[t * s.Hv + j]);
      const double g = in.ssm_a[j] * std::log1p(std::exp(static_cast<double>(in.alpha[t * s.Hv + j]) + in.dt_bias[j]));
      double* S = state.data() + j * s.dk * s.dv;
      for (int64_t a = 0; a < s.dk * s.dv; ++a) S[a] *= std::exp(g);
      for (int64_t b = 0; b < s.dv; ++b) {
        kv[b] = 0;
        for (int64_t a = 0; a < s.dk; ++a) kv[b] += S[a * s.dv + b] * k[a];
        delta[b] = beta * (v[b] - kv[b]);
      }
      for (int64_t a = 0; a < s.dk; ++a)
        for (int64_t b = 0; b < s.dv; ++b) S[a * s.dv + b] += k[a] * delta[b];
      for (int64_t b = 0; b < s.dv; ++b) {
        double o = 0;
        for (int64_t a = 0; a < s.dk; ++a) o += S[a * s.dv + b] * q[a];
        out[(t * s.Hv + j) * s.dv + b] = o;
      }
    }
}

const GdnShape kBig{2, 4, 128, 128};   // the real head size, tiny.gguf's head counts
const GdnShape kSmall{1, 3, 12, 20};   // odd sizes, dk != dv

}  // namespace

TEST_CASE("gdn_recurrent matches a double-precision recurrence", "[runtime]") {
  for (auto [s, T] : {std::pair{kBig, int64_t{40}}, std::pair{kSmall, int64_t{50}},
                      std::pair{GdnShape{2, 6, 16, 8}, int64_t{33}}}) {
    INFO("Hk=" << s.Hk << " Hv=" << s.Hv << " dk=" << s.dk << " dv=" << s.dv << " T=" << T);
    const GdnInputs in = make_inputs(s, T, 1000);
    std::vector<double> ref_out, ref_state;
    gdn_reference(in, ref_out, ref_state);
    auto state = in.state0;
    auto out = poisoned(in.out_size(T));
    run(Algo::recurrent, in, 0, T, state, out.data());
    CHECK(rel_err(out, ref_out) < 2e-6);
    CHECK(rel_err(state, ref_state) < 2e-6);
  }
}

TEST_CASE("gdn value head j reads key head j % Hk and its own value slice", "[runtime]") {
  const GdnShape s{2, 4, 16, 8};
  const int64_t T = 5;
  for (Algo algo : {Algo::recurrent, Algo::chunked}) {
    const GdnInputs base = make_inputs(s, T, 2000);
    auto st = base.state0;
    auto y0 = poisoned(base.out_size(T));
    run(algo, base, 0, T, st, y0.data());
    auto changed_heads = [&](const GdnInputs& in) {
      auto st2 = in.state0;
      auto y = poisoned(in.out_size(T));
      run(algo, in, 0, T, st2, y.data());
      std::vector<bool> changed(s.Hv, false);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < s.Hv; ++j)
          for (int64_t b = 0; b < s.dv; ++b) {
            const size_t p = static_cast<size_t>((t * s.Hv + j) * s.dv + b);
            if (y[p] != y0[p]) changed[j] = true;
          }
      return changed;
    };
    GdnInputs qk = base;  // perturb q and k of key head 1
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < s.dk; ++i) {
        qk.mixed[t * qk.conv_dim() + 1 * s.dk + i] += 0.5f;
        qk.mixed[t * qk.conv_dim() + s.Hk * s.dk + 1 * s.dk + i] -= 0.5f;
      }
    CHECK(changed_heads(qk) == std::vector<bool>{false, true, false, true});
    GdnInputs v = base;  // perturb v of value head 2
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < s.dv; ++i) v.mixed[t * v.conv_dim() + 2 * s.Hk * s.dk + 2 * s.dv + i] += 0.5f;
    CHECK(changed_heads(v) == std::vector<bool>{false, false, true, false});
  }
}

TEST_CASE("gdn_chunked matches gdn_recurrent for many lengths and chunk sizes", "[runtime]") {
  for (GdnShape s : {kBig, kSmall}) {
    for (int64_t T : {1, 7, 64, 65, 130, 300}) {
      const GdnInputs in = make_inputs(s, T, 3000 + static_cast<uint32_t>(T));
      auto ref_state = in.state0;
      auto ref_out = poisoned(in.out_size(T));
      run(Algo::recurrent, in, 0, T, ref_state, ref_out.data());
      for (int64_t chunk : {16, 64}) {
        INFO("Hv=" << s.Hv << " dk=" << s.dk << " T=" << T << " chunk=" << chunk);
        auto state = in.state0;
        auto out = poisoned(in.out_size(T));
        run(Algo::chunked, in, 0, T, state, out.data(), chunk);
        CHECK(rel_err(out, ref_out) < 1e-5);
        CHECK(rel_err(state, ref_state) < 1e-5);
      }
    }
  }
}

TEST_CASE("gdn state carries across calls: prefill in pieces, then decode", "[runtime]") {
  for (GdnShape s : {kBig, kSmall}) {
    const int64_t T = 130;
    const GdnInputs in = make_inputs(s, T, 4000);
    auto ref_state = in.state0;
    auto ref_out = poisoned(in.out_size(T));
    run(Algo::recurrent, in, 0, T, ref_state, ref_out.data());
    for (int64_t prefix : {1, 37, 64, 100}) {
      for (int64_t chunk : {16, 64}) {
        INFO("Hv=" << s.Hv << " prefix=" << prefix << " chunk=" << chunk);
        auto state = in.state0;
        auto out = poisoned(in.out_size(T));
        run(Algo::chunked, in, 0, prefix, state, out.data(), chunk);
        run(Algo::chunked, in, prefix, T - prefix, state, out.data() + in.out_size(prefix), chunk);
        CHECK(rel_err(out, ref_out) < 1e-5);
        CHECK(rel_err(state, ref_state) < 1e-5);
      }
      // The serving pattern: chunked prefill of the prefix, then token-by-token recurrent decode.
      INFO("Hv=" << s.Hv << " prefix=" << prefix << " chunked prefill + recurrent decode");
      auto state = in.state0;
      auto out = poisoned(in.out_size(T));
      run(Algo::chunked, in, 0, prefix, state, out.data());
      for (int64_t t = prefix; t < T; ++t) run(Algo::recurrent, in, t, 1, state, out.data() + in.out_size(t));
      CHECK(rel_err(out, ref_out) < 1e-5);
      CHECK(rel_err(state, ref_state) < 1e-5);
      // Recurrent in two calls is the same computation as one call, bit for bit.
      auto rstate = in.state0;
      auto rout = poisoned(in.out_size(T));
      run(Algo::recurrent, in, 0, prefix, rstate, rout.data());
      run(Algo::recurrent, in, prefix, T - prefix, rstate, rout.data() + in.out_size(prefix));
      CHECK(bit_equal(rout, ref_out));
      CHECK(bit_equal(rstate, ref_state));
    }
  }
}

TEST_CASE("gdn ops reject inconsistent shapes and leave the state alone for T = 0", "[runtime]") {
  const GdnInputs in = make_inputs(kSmall, 4, 5000);
  auto state = in.state0;
  std::vector<float> out(in.out_size(4));
  const GdnShape bad{2, 3, 12, 20};  // Hv % Hk != 0
  CHECK_THROWS_AS(gdn_recurrent(bad, in.mixed.data(), in.alpha.data(), in.beta.data(), in.ssm_a.data(),
                                in.dt_bias.data(), 4, state.data(), out.data()),
                  OpError);
  CHECK_THROWS_AS(gdn_chunked(bad, in.mixed.data(), in.alpha.data(), in.beta.data(), in.ssm_a.data(),
                              in.dt_bias.data(), 4, state.data(), out.data()),
                  OpError);
  CHECK_THROWS_AS(gdn_chunked(kSmall, in.mixed.data(), in.alpha.data(), in.beta.data(), in.ssm_a.data(),
                              in.dt_bias.data(), 4, state.data(), out.data(), 0),
                  OpError);
  CHECK_THROWS_AS(gdn_chunked(GdnShape{1, 3, 0, 20}, in.mixed.data(), in.alpha.data(), in.beta.data(),
                              in.ssm_a.data(), in.dt_bias.data(), 4, state.data(), out.data()),
                  OpError);
  CHECK(bit_equal(state, in.state0));
  run(Algo::recurrent, in, 0, 0, state, out.data());
  run(Algo::chunked, in, 0, 0, state, out.data());
  CHECK(bit_equal(state, in.state0));
}

TEST_CASE("gdn ops give bit-identical results with 1, 2 and 3 threads", "[runtime]") {
  const GdnInputs in = make_inputs(GdnShape{2, 4, 32, 48}, 70, 6000);
  auto run_both = [&]() {
    std::vector<std::vector<float>> r;
    for (Algo algo : {Algo::recurrent, Algo::chunked}) {
      auto state = in.state0;
      auto out = poisoned(in.out_size(in.T));
      run(algo, in, 0, in.T, state, out.data(), 16);
      r.push_back(out);
      r.push_back(state);
    }
    return r;
  };
  std::vector<std::vector<float>> one, two, three;
  { ThreadCount tc(1); one = run_both(); }
  { ThreadCount tc(2); two = run_both(); }
  { ThreadCount tc(3); three = run_both(); }
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("result " << i);
    CHECK(bit_equal(one[i], two[i]));
    CHECK(bit_equal(one[i], three[i]));
  }
}
