// Gated DeltaNet reference ops (QWEN35.md steps 3-5): the token-serial recurrence (decode, and the
// ground truth) and the chunked algorithm (prefill, the form GPU kernels implement). Both share the
// per-token preparation of q, k, v, beta and g so they differ only in how the recurrence is evaluated.
// Work is split over value heads; each head's state is owned by one thread.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/ops.h"
#include "runtime/cpu/ops_internal.h"
#include "runtime/cpu/thread_pool.h"

namespace qrig::cpu {

using detail::fail;
using detail::require;
using detail::require_ptr;

namespace {

constexpr double kL2Eps = 1e-6;  // q and k: x / sqrt(sum x^2 + 1e-6)

void check_gdn(const char* op, const GdnShape& s, const float* mixed, const float* alpha,
               const float* beta, const float* ssm_a, const float* dt_bias, int64_t T,
               const float* state, const float* out) {
  if (s.Hk <= 0 || s.Hv <= 0 || s.dk <= 0 || s.dv <= 0)
    fail(op, "shape Hk=" + std::to_string(s.Hk) + " Hv=" + std::to_string(s.Hv) + " dk=" +
                 std::to_string(s.dk) + " dv=" + std::to_string(s.dv) + " must be positive");
  if (s.Hv % s.Hk != 0)
    fail(op, "value heads Hv=" + std::to_string(s.Hv) + " must be a multiple of key heads Hk=" +
                 std::to_string(s.Hk));
  if (T < 0) fail(op, "T is negative (" + std::to_string(T) + ")");
  require_ptr(state, op, "state");
  require_ptr(ssm_a, op, "ssm_a");
  require_ptr(dt_bias, op, "dt_bias");
  if (T == 0) return;
  require_ptr(mixed, op, "mixed");
  require_ptr(alpha, op, "alpha");
  require_ptr(beta, op, "beta");
  require_ptr(out, op, "out");
}

// Token t, value head j: q (L2-normalised, times 1/sqrt(dk)), k (L2-normalised), v, beta = sigmoid(b),
// and g = ssm_a * softplus(a + dt_bias) (kept in double: the chunked form sums it).
struct TokenInputs {
  float* q;
  float* k;
  float* v;
  float beta;
  double g;
};

void prepare_token(const GdnShape& s, const float* mixed, const float* alpha, const float* beta_raw,
                   const float* ssm_a, const float* dt_bias, int64_t t, int64_t j, TokenInputs& in) {
  const int64_t conv_dim = 2 * s.Hk * s.dk + s.Hv * s.dv;
  const int64_t kh = j % s.Hk;  // GGUF head order
  const float* row = mixed + t * conv_dim;
  const float* qs = row + kh * s.dk;
  const float* ks = row + s.Hk * s.dk + kh * s.dk;
  const float* vs = row + 2 * s.Hk * s.dk + j * s.dv;
  const double q_mul = 1.0 / std::sqrt(detail::sum_squares(qs, s.dk) + kL2Eps) /
                       std::sqrt(static_cast<double>(s.dk));
  const double k_mul = 1.0 / std::sqrt(detail::sum_squares(ks, s.dk) + kL2Eps);
  for (int64_t i = 0; i < s.dk; ++i) {
    in.q[i] = static_cast<float>(qs[i] * q_mul);
    in.k[i] = static_cast<float>(ks[i] * k_mul);
  }
  std::copy(vs, vs + s.dv, in.v);
  const double b = beta_raw[t * s.Hv + j];
  in.beta = static_cast<float>(1.0 / (1.0 + std::exp(-b)));
  in.g = static_cast<double>(ssm_a[j]) *
         detail::softplus(static_cast<double>(alpha[t * s.Hv + j]) + static_cast<double>(dt_bias[j]));
}

}  // namespace

void gdn_recurrent(const GdnShape& s, const float* mixed, const float* alpha, const float* beta,
                   const float* ssm_a, const float* dt_bias, int64_t T, float* state, float* out) {
  check_gdn("gdn_recurrent", s, mixed, alpha, beta, ssm_a, dt_bias, T, state, out);
  if (T == 0) return;
  const int64_t dk = s.dk, dv = s.dv;
  parallel_for(s.Hv, [&](int64_t j0, int64_t j1) {
    std::vector<float> q(dk), k(dk), v(dv), kv(dv), delta(dv), o(dv);
    TokenInputs in{q.data(), k.data(), v.data(), 0.0f, 0.0};
    for (int64_t j = j0; j < j1; ++j) {
      float* S = state + j * dk * dv;  // S[a][b], a < dk, b < dv
      for (int64_t t = 0; t < T; ++t) {
        prepare_token(s, mixed, alpha, beta, ssm_a, dt_bias, t, j, in);
        const float decay = static_cast<float>(std::exp(in.g));
        // S = exp(g) S; kv = S^T k
        std::fill(kv.begin(), kv.end(), 0.0f);
        for (int64_t a = 0; a < dk; ++a) {
          float* Sa = S + a * dv;
          detail::scale(decay, Sa, dv);
          detail::axpy(k[a], Sa, kv.data(), dv);
        }
        // delta = beta (v - kv); S += k delta^T; o = S^T q
        for (int64_t b = 0; b < dv; ++b) delta[b] = in.beta * (v[b] - kv[b]);
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t a = 0; a < dk; ++a) {
          float* Sa = S + a * dv;
          detail::axpy(k[a], delta.data(), Sa, dv);
          detail::axpy(q[a], Sa, o.data(), dv);
        }
        std::copy(o.begin(), o.end(), out + t * s.Hv * dv + j * dv);
      }
    }
  });
}

void gdn_chunked(const GdnShape& s, const float* mixed, const float* alpha, const float* beta,
                 const float* ssm_a, const float* dt_bias, int64_t T, float* state, float* out,
                 int64_t chunk) {
  check_gdn("gdn_chunked", s, mixed, alpha, beta, ssm_a, dt_bias, T, state, out);
  if (chunk <= 0) fail("gdn_chunked", "chunk size " + std::to_string(chunk) + " must be positive");
  if (T == 0) return;
  const int64_t dk = s.dk, dv = s.dv;
  const int64_t C = std::min(chunk, T);
  parallel_for(s.Hv, [&](int64_t j0, int64_t j1) {
    // Per-chunk buffers, row i = token c0 + i of the chunk.
    std::vector<float> Q(C * dk), K(C * dk), V(C * dv), W(C * dk), U(C * dv), Vp(C * dv);
    std::vector<float> A(C * C), P(C * C), Tm(C * C), o(dv), kd(C * dk);
    std::vector<float> bet(C);
    std::vector<double> gamma(C);
    for (int64_t j = j0; j < j1; ++j) {
      float* S = state + j * dk * dv;
      for (int64_t c0 = 0; c0 < T; c0 += C) {
        const int64_t L = std::min(C, T - c0);
        double cum = 0.0;
        for (int64_t i = 0; i < L; ++i) {
          TokenInputs in{Q.data() + i * dk, K.data() + i * dk, V.data() + i * dv, 0.0f, 0.0};
          prepare_token(s, mixed, alpha, beta, ssm_a, dt_bias, c0 + i, j, in);
          bet[i] = in.beta;
          cum += in.g;
          gamma[i] = cum;  // gamma_i = sum of g over chunk tokens 0..i
        }
        // A = strict_lower(diag(beta) K K^T * D); P = lower(Q K^T * D), D_ij = exp(gamma_i - gamma_j).
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t m = 0; m <= i; ++m) {
            const double decay = std::exp(gamma[i] - gamma[m]);
            P[i * C + m] = static_cast<float>(detail::dot(Q.data() + i * dk, K.data() + m * dk, dk) * decay);
            if (m < i)
              A[i * C + m] = static_cast<float>(
                  bet[i] * detail::dot(K.data() + i * dk, K.data() + m * dk, dk) * decay);
          }
        }
        // Tm = (I + A)^-1, unit lower triangular, by forward substitution:
        // Tm_ij = -sum_{j <= m < i} A_im Tm_mj.
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t m = 0; m < i; ++m) {
            double acc = 0.0;
            for (int64_t r = m; r < i; ++r) acc += static_cast<double>(A[i * C + r]) * Tm[r * C + m];
            Tm[i * C + m] = static_cast<float>(-acc);
          }
          Tm[i * C + i] = 1.0f;
        }
        // U = Tm diag(beta) V; W = Tm diag(beta) (K * exp(gamma)).
        for (int64_t i = 0; i < L; ++i) {
          float* Ui = U.data() + i * dv;
          float* Wi = W.data() + i * dk;
          std::fill(Ui, Ui + dv, 0.0f);
          std::fill(Wi, Wi + dk, 0.0f);
          for (int64_t m = 0; m <= i; ++m) {
            const float tb = Tm[i * C + m] * bet[m];
            detail::axpy(tb, V.data() + m * dv, Ui, dv);
            detail::axpy(static_cast<float>(tb * std::exp(gamma[m])), K.data() + m * dk, Wi, dk);
          }
        }
        // V' = U - W S (S = state at the chunk start).
        for (int64_t i = 0; i < L; ++i) {
          float* Vi = Vp.data() + i * dv;
          std::copy(U.data() + i * dv, U.data() + (i + 1) * dv, Vi);
          for (int64_t a = 0; a < dk; ++a) detail::axpy(-W[i * dk + a], S + a * dv, Vi, dv);
        }
        // O = (Q * exp(gamma)) S + P V'.
        for (int64_t i = 0; i < L; ++i) {
          std::fill(o.begin(), o.end(), 0.0f);
          const double eg = std::exp(gamma[i]);
          for (int64_t a = 0; a < dk; ++a)
            detail::axpy(static_cast<float>(Q[i * dk + a] * eg), S + a * dv, o.data(), dv);
          for (int64_t m = 0; m <= i; ++m) detail::axpy(P[i * C + m], Vp.data() + m * dv, o.data(), dv);
          std::copy(o.begin(), o.end(), out + (c0 + i) * s.Hv * dv + j * dv);
        }
        // S = exp(gamma_last) S + (K * exp(gamma_last - gamma))^T V'.
        const double g_last = gamma[L - 1];
        for (int64_t i = 0; i < L; ++i) {
          const double e = std::exp(g_last - gamma[i]);
          for (int64_t a = 0; a < dk; ++a) kd[i * dk + a] = static_cast<float>(K[i * dk + a] * e);
        }
        const float e_last = static_cast<float>(std::exp(g_last));
        for (int64_t a = 0; a < dk; ++a) {
          float* Sa = S + a * dv;
          detail::scale(e_last, Sa, dv);
          for (int64_t i = 0; i < L; ++i) detail::axpy(kd[i * dk + a], Vp.data() + i * dv, Sa, dv);
        }
      }
    }
  });
}

}  // namespace qrig::cpu
