// Test helpers: the runtime's kernel sets (matmul, GDN, attention) built the way a plan builds them, from the
// kernel library's choices (what the compiler's kernel pass writes into the plan), for tests and benchmarks
// that drive a kernel area without compiling a whole model.
#pragma once

#include <algorithm>

#include <fmt/format.h>
#include <vector>

#include "ir/kernel_attr.h"
#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/matmul.h"
#include "runtime/cuda/attention.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/gemm.h"

namespace qrig::cuda::test {

inline std::vector<ir::LaunchRange> launch_ranges(const std::vector<kernels::KernelRange>& rs) {
  std::vector<ir::LaunchRange> out;
  for (const auto& r : rs) {
    ir::LaunchRange l{r.first, r.last, {}};
    for (const auto& part : r.parts) {
      std::vector<std::string> names;
      for (const auto& v : part) names.push_back(v.name);
      l.parts.push_back(std::move(names));
    }
    out.push_back(std::move(l));
  }
  return out;
}

// A [k] -> [n] matmul for min_t..max_t rows with `planes` planes on `sms` SMs (default tuning).
inline MatmulKernels matmul_kernels(const KernelLoader& load, int64_t k, int64_t n, int64_t max_t, int sms,
                                    int64_t planes, int64_t min_t = 1) {
  return MatmulKernels(load, launch_ranges(kernels::choose_matmul_q8_0(k, n, min_t, max_t, sms, planes,
                                                                       kernels::default_tuning(90).matmul)));
}

// A [k] -> [n] matmul's kernels for min_t..max_t rows as a plan names them, with its shape (GPU tests and
// benchmarks drive it like the executor drives a matmul op).
class PlanMatmul {
 public:
  PlanMatmul(const KernelLoader& load, int64_t k, int64_t n, int64_t max_t, int sms, int64_t planes, int64_t min_t = 1)
      : k_(k), n_(n), planes_(planes), mm_(matmul_kernels(load, k, n, max_t, sms, planes, min_t)) {}
  void run(const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2, int64_t T, float* y,
           StreamHandle stream) const {
    if (w.cols != k_ || w.rows != n_)
      throw KernelError(fmt::format("matmul [{}] -> [{}] given weights [{}][{}]", k_, n_, w.rows, w.cols));
    mm_.run(w, xq, xd, xq2, T, y, stream);
  }
  const Variant& variant_for(int64_t T) const { return mm_.kernel_for(T).variant; }
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t planes() const { return planes_; }

 private:
  int64_t k_, n_, planes_;
  MatmulKernels mm_;
};

// GDN for up to max_t tokens of a sequence; recurrent_below as the tuning says unless given.
inline GdnKernels gdn_kernels(const KernelLoader& load, const kernels::GdnDims& d, int64_t chunk, int64_t max_t = 65536,
                              int64_t recurrent_below = -1) {
  kernels::Tuning t = kernels::default_tuning(90);
  if (recurrent_below > 0) t.gdn_recurrent_below = recurrent_below;
  return GdnKernels(load, d, chunk, launch_ranges(kernels::choose_gdn(d, chunk, max_t, t)));
}

// Attention for up to `context` keys on `sms` SMs, as choose_attention plans it (the CTA targets too).
inline kernels::AttentionChoice attention_choice(const kernels::AttentionDims& d, int64_t context, int sms,
                                                 int64_t max_t = 4096) {
  return kernels::choose_attention(d, context, std::min(max_t, context), sms, kernels::default_tuning(90));
}
inline AttentionKernels attention_kernels(const KernelLoader& load, const kernels::AttentionDims& d, int64_t context,
                                          int sms, int64_t max_t = 4096) {
  const kernels::AttentionChoice c = attention_choice(d, context, sms, max_t);
  return AttentionKernels(load, d, context, c.ctas, launch_ranges(c.ranges));
}

}  // namespace qrig::cuda::test
