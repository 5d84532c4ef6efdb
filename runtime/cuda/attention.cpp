// Gated GQA attention kernel set (attention.h): loads the plan's kernels per range of tokens and launches them
// with the split kernels::attention_split gives for the call's key count (partials in the workspace:
// [n_split][T][Hq][hd] f32 O, then [n_split][T][Hq] (m, l)).
#include "runtime/cuda/attention.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include <fmt/format.h>

namespace qrig::cuda {

namespace {

constexpr double kLog2e = 1.4426950408889634;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void require_variant(const LoadedKernel& k, const char* kernel, int64_t g) {
  if (k.variant.kernel != kernel || k.variant.param("d") != kernels::kAttentionHeadDim ||
      (k.variant.kernel != std::string("attn_merge") && k.variant.param("g") != g))
    throw KernelError(fmt::format("attention: the plan names {} for {} with {} heads per KV head", k.variant.name,
                                  kernel, g));
}

}  // namespace

AttentionKernels::AttentionKernels(const KernelLoader& load, const AttentionDims& d, int64_t context,
                                   const kernels::AttentionCtas& ctas, const std::vector<ir::LaunchRange>& ranges)
    : d_(d), context_(context), ctas_(ctas) {
  group_ = kernels::attention_group(d);
  if (context <= 0 || context > INT_MAX / 2) throw KernelError(fmt::format("attention: context {}", context));
  if (ctas.decode1 <= 0 || ctas.decode_n <= 0 || ctas.prefill <= 0)
    throw KernelError("attention: the plan's split CTAs must be positive");
  for (const ir::LaunchRange& lr : ranges) {
    if (lr.parts.size() != 1 || lr.parts[0].size() != 2)
      throw KernelError(fmt::format("attention: rows {}-{} must name a decode or prefill kernel, then attn_merge",
                                    lr.first, lr.last));
    Range r{lr.first, lr.last, load(parse_variant(lr.parts[0][0])), load(parse_variant(lr.parts[0][1]))};
    const bool decode = r.main.variant.kernel == "attn_decode";
    require_variant(r.main, decode ? "attn_decode" : "attn_prefill", group_);
    require_variant(r.merge, "attn_merge", group_);
    if (decode && (lr.last > r.main.variant.param("n") || lr.last > kernels::attention_decode_max_tokens(group_)))
      throw KernelError(fmt::format("attention: {} cannot run {} tokens", r.main.variant.name, lr.last));
    if (!decode && r.main.kernel.handle()) r.main.kernel.opt_in_shared(kernels::kAttentionPrefillSmem);
    ranges_.push_back(std::move(r));
  }
  if (ranges_.empty()) throw KernelError("attention: no kernel");
}

void AttentionKernels::run(const float* q, const uint16_t* kcache, const uint16_t* vcache, int64_t T, int64_t pos0,
                           float scale, const float* gate, int64_t gate_row_stride, int64_t gate_head_stride,
                           float* out, void* workspace, StreamHandle stream) const {
  if (T < 0 || pos0 < 0 || pos0 + T > context_)
    throw KernelError(fmt::format("attention: {} tokens at position {} with a context of {}", T, pos0, context_));
  if (T == 0) return;
  if (!std::isfinite(scale)) throw KernelError("attention: the scale is not finite");
  if (gate_row_stride < 0 || gate_head_stride < 0)
    throw KernelError(fmt::format("attention: gate strides {} and {}", gate_row_stride, gate_head_stride));
  require_aligned(q, 16, "attention", "q");
  require_aligned(kcache, 16, "attention", "kcache");
  require_aligned(vcache, 16, "attention", "vcache");
  require_aligned(gate, 4, "attention", "gate");
  require_aligned(out, 16, "attention", "out");
  if (out == q) throw KernelError("attention: out must not alias q");
  if (T * d_.Hq * 4 > INT_MAX) throw KernelError(fmt::format("attention: {} tokens x {} heads", T, d_.Hq));

  const Range* r = nullptr;
  for (const Range& x : ranges_)
    if (T >= x.first && T <= x.last) r = &x;
  if (!r) throw KernelError(fmt::format("attention: {} tokens, outside the plan's {}..{}", T, ranges_.front().first,
                                        ranges_.back().last));
  const bool decode = r->main.variant.kernel == "attn_decode";
  const kernels::AttentionSplit s = kernels::attention_split(d_, ctas_, T, pos0 + T, decode);
  float* ws_o = nullptr;
  float* ws_ml = nullptr;  // float2 pairs (m, l) in the kernel
  if (s.n_split > 1) {
    require_aligned(workspace, 256, "attention", "workspace");
    ws_o = static_cast<float*>(workspace);
    const size_t items = (size_t)s.n_split * (size_t)T * (size_t)d_.Hq;
    ws_ml = reinterpret_cast<float*>(static_cast<char*>(workspace) + (items * (size_t)d_.hd * sizeof(float) + 255) / 256 * 256);
  }
  const auto* kc = reinterpret_cast<const unsigned short*>(kcache);
  const auto* vc = reinterpret_cast<const unsigned short*>(vcache);
  const long long kv_row = d_.Hkv * d_.hd;
  const float qscale = (float)(scale * kLog2e);
  const int Ti = (int)T, pos = (int)pos0, Hq = (int)d_.Hq, n_split = (int)s.n_split;
  const long long grow = gate_row_stride, ghead = gate_head_stride;
  if (s.decode) {
    const LoadedKernel& k = r->main;
    const int kps = (int)s.keys_per_split;
    k.kernel.launch(Dim3((unsigned)s.n_split, (unsigned)d_.Hkv), Dim3(kernels::kAttentionDecodeThreads), 0, stream, q, kc, vc, kv_row,
                    Ti, pos, Hq, qscale, gate, grow, ghead, out, ws_o, ws_ml, kps, n_split);
  } else {
    const int64_t blocks = ceil_div(T, kernels::kAttentionPrefillRows / group_) * s.n_split;
    if (blocks > INT_MAX) throw KernelError(fmt::format("attention: {} prefill blocks", blocks));
    r->main.kernel.launch(Dim3((unsigned)blocks, (unsigned)d_.Hkv), Dim3(kernels::kAttentionPrefillThreads), kernels::kAttentionPrefillSmem,
                                     stream, q, kc, vc, kv_row, Ti, pos, Hq, qscale, gate, grow, ghead, out, ws_o,
                                     ws_ml, n_split);
  }
  if (s.n_split > 1)
    r->merge.kernel.launch(Dim3((unsigned)(T * d_.Hq * 4)), Dim3(kernels::kAttentionMergeThreads), 0, stream,
                                   static_cast<const float*>(ws_o), static_cast<const float*>(ws_ml), n_split, Ti,
                                   Hq, gate, grow, ghead, out);
}

}  // namespace qrig::cuda
