// Causal GQA softmax attention with Qwen3.5's sigmoid output gate (QWEN35.md, gated full-attention
// layer): the reference for the prefill and decode attention kernels. Work is split over
// (token, query head) items; each item is computed start to finish by one thread.
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

void attention_gated(const float* q, const float* kcache, const float* vcache, int64_t T, int64_t pos0,
                     int64_t Hq, int64_t Hkv, int64_t hd, float scale, const float* gate,
                     int64_t gate_row_stride, int64_t gate_head_stride, float* out) {
  const char* op = "attention_gated";
  if (T < 0 || pos0 < 0) fail(op, "T and pos0 must be non-negative");
  if (Hq <= 0 || Hkv <= 0 || hd <= 0) fail(op, "Hq, Hkv and hd must be positive");
  if (Hq % Hkv != 0)
    fail(op, "query heads Hq=" + std::to_string(Hq) + " must be a multiple of kv heads Hkv=" +
                 std::to_string(Hkv));
  require(std::isfinite(scale), op, "scale must be finite");
  require(gate_row_stride >= 0 && gate_head_stride >= 0, op, "gate strides must be non-negative");
  if (T == 0) return;
  require_ptr(q, op, "q");
  require_ptr(kcache, op, "kcache");
  require_ptr(vcache, op, "vcache");
  require_ptr(gate, op, "gate");
  require_ptr(out, op, "out");
  require(out != q, op, "out must not alias q");
  const int64_t group = Hq / Hkv;
  const int64_t kv_row = Hkv * hd;
  const int64_t n_max = pos0 + T;
  // Item idx -> (t, h) with t alternating from both ends (0, T-1, 1, T-2, ...) so the contiguous
  // ranges of the pool get similar causal work.
  parallel_for(T * Hq, [&](int64_t b, int64_t e) {
    std::vector<float> scores(static_cast<size_t>(n_max)), o(static_cast<size_t>(hd));
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t tp = idx / Hq, h = idx % Hq;
      const int64_t t = (tp % 2 == 0) ? tp / 2 : T - 1 - tp / 2;
      const int64_t n = pos0 + t + 1;  // attended positions 0..pos0+t
      const int64_t kvh = h / group;
      const float* qh = q + t * Hq * hd + h * hd;
      float m = -INFINITY;
      for (int64_t p = 0; p < n; ++p) {
        scores[p] = detail::dot(qh, kcache + p * kv_row + kvh * hd, hd) * scale;
        m = std::max(m, scores[p]);
      }
      double denom = 0.0;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t p = 0; p < n; ++p) {
        const float w = std::exp(scores[p] - m);
        denom += w;
        detail::axpy(w, vcache + p * kv_row + kvh * hd, o.data(), hd);
      }
      const double inv = 1.0 / denom;
      const float* gh = gate + t * gate_row_stride + h * gate_head_stride;
      float* oh = out + t * Hq * hd + h * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] = static_cast<float>(o[i] * inv) * detail::sigmoid(gh[i]);
    }
  }, std::max<int64_t>(1, 65536 / (hd * n_max)));
}

}  // namespace qrig::cpu
