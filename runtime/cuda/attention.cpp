// Gated GQA attention kernel set (attention.h): the templates attn_decode (T <= N tokens, split-KV, memory
// bound), attn_prefill (blocks of query tokens, FFMA for Q.K, FFMA or HFMA2 for P.V, compute bound) and
// attn_merge (log-sum-exp of the split partials + the output gate), and how run() picks splits:
//   decode (T <= 8/G: 1 token at 27B dims, 2 at 9B, 4 for the tiny model): KV heads x splits >= max(2 x SMs,
//            CTAs resident at once), keys per split a multiple of 32;
//   prefill: enough (query block, KV head, split) CTAs for one resident wave, then the split count in
//            [s, 2s] that wastes least of the last wave; each split keeps >= 8 tiles of 32 keys.
// Split partials go to the workspace ([n_split][T][Hq][hd] f32 O, then [n_split][T][Hq] (m, l)).
#include "runtime/cuda/attention.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include <fmt/format.h>

#include "runtime/cuda/variant_parts.h"

namespace qrig::cuda {

namespace {

constexpr int64_t kHeadDim = 256;        // the templates' only head dim
constexpr int64_t kPrefillRows = 32;     // (token, head) rows per prefill CTA
constexpr int64_t kTile = 32;            // keys per prefill tile
constexpr int64_t kMinTilesPerSplit = 8;
constexpr int64_t kDecodeRows = 8;       // most rows (G * N) of a decode CTA
constexpr int64_t kDecodeKeyStep = 32;   // 4 warps x 8 keys
constexpr int kDecodeThreads = 128, kPrefillThreads = 128, kMergeThreads = 256;
constexpr size_t kPrefillSmem = 65536;
// P.V in fp32 by default: on the H200 the HFMA2 family (h1) was only ~14% faster at 32K context (33.2 vs 29.2
// TFLOP/s, T = 512) for ~1000x the error (up to 3.5e-3 vs ~2e-6 relative; tests/gpu/test_gpu_attention.cpp).
// A loader may hand out h1 anyway (a rig whose FP32 FMA is throttled and HFMA2 is not).
constexpr int64_t kPrefillHalf = 0;
constexpr double kLog2e = 1.4426950408889634;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

int64_t group_of(const AttentionDims& d) {
  if (d.Hq <= 0 || d.Hkv <= 0 || d.Hq % d.Hkv != 0)
    throw KernelError(fmt::format("attention: {} query heads are not a positive multiple of {} KV heads", d.Hq, d.Hkv));
  if (d.hd != kHeadDim)
    throw KernelError(fmt::format("attention: head dim {} (the kernels are written for {})", d.hd, kHeadDim));
  const int64_t g = d.Hq / d.Hkv;
  if (g > kDecodeRows)
    throw KernelError(fmt::format("attention: {} query heads per KV head (at most {})", g, kDecodeRows));
  if (d.Hkv > 65535) throw KernelError(fmt::format("attention: {} KV heads (grid.y)", d.Hkv));
  return g;
}

int64_t decode_max_tokens(int64_t g) { return std::max<int64_t>(1, kDecodeRows / g); }

Variant decode_variant(int64_t g, int64_t n) {
  return make_variant("attn_decode", {{"d", kHeadDim}, {"g", g}, {"n", n}, {"t", kDecodeThreads}});
}
Variant prefill_variant(int64_t g, int64_t half) {
  return make_variant("attn_prefill", {{"d", kHeadDim}, {"g", g}, {"h", half}, {"t", kPrefillThreads}});
}
Variant merge_variant() { return make_variant("attn_merge", {{"d", kHeadDim}, {"t", kMergeThreads}}); }

void require_aligned(const void* p, size_t align, const char* what) {
  if (!p) throw KernelError(fmt::format("attention: {} is null", what));
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw KernelError(fmt::format("attention: {} is not {}-byte aligned", what, align));
}

void require_variant(const LoadedKernel& k, const char* kernel, int64_t g) {
  if (k.variant.kernel != kernel || k.variant.param("d") != kHeadDim || k.variant.param("g") != g)
    throw KernelError(fmt::format("attention: the loader returned {} for {} with {} heads per KV head",
                                  k.variant.name, kernel, g));
}

// Blocks of k resident per SM on the current device. A kernel without a cubin (host-only tests of the
// split logic hand those out) counts as `fallback`.
int resident_blocks(const LoadedKernel& k, size_t smem, int fallback) {
  if (!k.kernel.handle()) return fallback;
  int n = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, reinterpret_cast<const void*>(k.kernel.handle()),
                                                      (int)k.variant.threads(), smem),
        fmt::format("occupancy of {}", k.variant.name));
  if (n <= 0) throw KernelError(fmt::format("attention: {} cannot run on this GPU (no resident block)", k.variant.name));
  return n;
}

}  // namespace

std::vector<TemplateInfo> attention_templates() {
  const TemplateParam d = {"d", "QRIG_D", kHeadDim, kHeadDim, kHeadDim, "head dim"};
  return {
      {"attn_decode", "attn_decode.cu",
       {d, {"g", "QRIG_G", 1, 8, 1, "query heads per KV head"},
        {"n", "QRIG_N", 1, 8, 1, "most query tokens (g * n <= 8)"}, threads_param()},
       "gated GQA attention of T <= n tokens, split over the keys (flash-decoding), fp32; grid (splits, KV heads)"},
      {"attn_prefill", "attn_prefill.cu",
       {d, {"g", "QRIG_G", 1, 32, 1, "query heads per KV head"},
        {"h", "QRIG_HALF", 0, 1, 1, "P.V products: 0 fp32 FFMA, 1 HFMA2 summed in fp32 per 32-key tile"},
        threads_param()},
       "gated GQA attention of a block of 32/g query tokens x g heads per CTA, 32-key tiles, Q.K in fp32"},
      {"attn_merge", "attn_merge.cu", {d, threads_param()},
       "log-sum-exp merge of split-KV attention partials, times sigmoid(gate); one CTA per (token, head, 64 columns)"},
  };
}

std::vector<Variant> attention_variants(const AttentionDims& d, int64_t context, int sms) {
  const int64_t g = group_of(d);
  if (context <= 0 || sms <= 0) throw KernelError(fmt::format("attention: context {} on {} SMs", context, sms));
  std::vector<Variant> v = {decode_variant(g, 1)};
  if (decode_max_tokens(g) > 1) v.push_back(decode_variant(g, decode_max_tokens(g)));
  v.push_back(prefill_variant(g, kPrefillHalf));
  v.push_back(merge_variant());
  return v;
}

namespace {
// kernels_ order (attention.h keeps them in one vector).
enum : size_t { kDecode1, kDecodeN, kPrefill, kMerge };
}  // namespace

AttentionKernels::AttentionKernels(const KernelLoader& load, const AttentionDims& d, int64_t context, int sms)
    : d_(d), context_(context), sms_(sms) {
  const int64_t g = group_of(d);
  if (context <= 0 || context > INT_MAX / 2 || sms <= 0)
    throw KernelError(fmt::format("attention: context {} on {} SMs", context, sms));
  const int64_t nmax = decode_max_tokens(g);
  kernels_ = {load(decode_variant(g, 1)), load(decode_variant(g, nmax)), load(prefill_variant(g, kPrefillHalf)),
              load(merge_variant())};
  require_variant(kernels_[kDecode1], "attn_decode", g);
  require_variant(kernels_[kDecodeN], "attn_decode", g);
  require_variant(kernels_[kPrefill], "attn_prefill", g);  // either h: a loader may pick fp32 P.V
  if (kernels_[kDecode1].variant.param("n") != 1 || kernels_[kDecodeN].variant.param("n") != nmax)
    throw KernelError("attention: the loader returned decode kernels for the wrong token counts");
  if (kernels_[kMerge].variant.kernel != "attn_merge" || kernels_[kMerge].variant.param("d") != kHeadDim)
    throw KernelError(fmt::format("attention: the loader returned {} for attn_merge", kernels_[kMerge].variant.name));
  if (kernels_[kPrefill].kernel.handle()) kernels_[kPrefill].kernel.opt_in_shared(kPrefillSmem);
  group_ = g;
  decode_tokens_ = nmax;
  decode_ctas_[0] = std::max<int64_t>(2 * (int64_t)sms, (int64_t)sms * resident_blocks(kernels_[kDecode1], 0, 2));
  decode_ctas_[1] = std::max<int64_t>(2 * (int64_t)sms, (int64_t)sms * resident_blocks(kernels_[kDecodeN], 0, 2));
  prefill_ctas_ = (int64_t)sms * resident_blocks(kernels_[kPrefill], kPrefillSmem, 3);
}

AttentionKernels::Split AttentionKernels::split_for(int64_t T, int64_t kv_len) const {
  Split s;
  if (T <= decode_tokens_) {
    s.decode = true;
    const int64_t splits = ceil_div(decode_ctas_[T == 1 ? 0 : 1], d_.Hkv);
    s.keys_per_split = ceil_div(ceil_div(kv_len, splits), kDecodeKeyStep) * kDecodeKeyStep;
    s.n_split = ceil_div(kv_len, s.keys_per_split);
    return s;
  }
  const int64_t base = ceil_div(T, kPrefillRows / group_) * d_.Hkv;
  const int64_t tiles = ceil_div(kv_len, kTile);
  const int64_t s_max = std::max<int64_t>(1, tiles / kMinTilesPerSplit);
  const int64_t s_min = std::clamp<int64_t>(ceil_div(prefill_ctas_, base), 1, s_max);
  int64_t best = s_min, best_cost = INT64_MAX;
  for (int64_t n = s_min; n <= std::min(2 * s_min, s_max); ++n) {
    const int64_t cost = ceil_div(base * n, prefill_ctas_) * ceil_div(tiles, n);
    if (cost < best_cost) best = n, best_cost = cost;
  }
  s.n_split = best;
  return s;
}

size_t AttentionKernels::workspace_bytes(int64_t max_t) const {
  if (max_t <= 0) throw KernelError(fmt::format("attention: workspace for {} tokens", max_t));
  size_t most = 0;
  for (int64_t T = 1; T <= std::min(max_t, context_); ++T) {
    int64_t n;  // an upper bound of split_for(T, kv_len).n_split over every kv_len <= context
    if (T <= decode_tokens_) {
      n = ceil_div(decode_ctas_[T == 1 ? 0 : 1], d_.Hkv);
    } else {
      const int64_t base = ceil_div(T, kPrefillRows / group_) * d_.Hkv;
      const int64_t s_max = std::max<int64_t>(1, ceil_div(context_, kTile) / kMinTilesPerSplit);
      n = std::min(2 * std::max<int64_t>(1, ceil_div(prefill_ctas_, base)), s_max);
    }
    if (n > 1) most = std::max(most, partial_bytes(T, n));
  }
  return most;
}

size_t AttentionKernels::partial_bytes(int64_t T, int64_t n_split) const {
  const size_t items = (size_t)n_split * (size_t)T * (size_t)d_.Hq;
  return align256(items * (size_t)d_.hd * sizeof(float)) + align256(items * 2 * sizeof(float));
}

void AttentionKernels::run(const float* q, const uint16_t* kcache, const uint16_t* vcache, int64_t T, int64_t pos0,
                           float scale, const float* gate, int64_t gate_row_stride, int64_t gate_head_stride,
                           float* out, void* workspace, cudaStream_t stream) const {
  if (T < 0 || pos0 < 0 || pos0 + T > context_)
    throw KernelError(fmt::format("attention: {} tokens at position {} with a context of {}", T, pos0, context_));
  if (T == 0) return;
  if (!std::isfinite(scale)) throw KernelError("attention: the scale is not finite");
  if (gate_row_stride < 0 || gate_head_stride < 0)
    throw KernelError(fmt::format("attention: gate strides {} and {}", gate_row_stride, gate_head_stride));
  require_aligned(q, 16, "q");
  require_aligned(kcache, 16, "kcache");
  require_aligned(vcache, 16, "vcache");
  require_aligned(gate, 4, "gate");
  require_aligned(out, 16, "out");
  if (out == q) throw KernelError("attention: out must not alias q");
  if (T * d_.Hq * 4 > INT_MAX) throw KernelError(fmt::format("attention: {} tokens x {} heads", T, d_.Hq));

  const Split s = split_for(T, pos0 + T);
  float* ws_o = nullptr;
  float2* ws_ml = nullptr;
  if (s.n_split > 1) {
    require_aligned(workspace, 256, "workspace");
    ws_o = static_cast<float*>(workspace);
    const size_t items = (size_t)s.n_split * (size_t)T * (size_t)d_.Hq;
    ws_ml = reinterpret_cast<float2*>(static_cast<char*>(workspace) + align256(items * (size_t)d_.hd * sizeof(float)));
  }
  const auto* kc = reinterpret_cast<const unsigned short*>(kcache);
  const auto* vc = reinterpret_cast<const unsigned short*>(vcache);
  const long long kv_row = d_.Hkv * d_.hd;
  const float qscale = (float)(scale * kLog2e);
  const int Ti = (int)T, pos = (int)pos0, Hq = (int)d_.Hq, n_split = (int)s.n_split;
  const long long grow = gate_row_stride, ghead = gate_head_stride;
  if (s.decode) {
    const LoadedKernel& k = kernels_[T == 1 ? kDecode1 : kDecodeN];
    const int kps = (int)s.keys_per_split;
    k.kernel.launch(dim3((unsigned)s.n_split, (unsigned)d_.Hkv), dim3(kDecodeThreads), 0, stream, q, kc, vc, kv_row,
                    Ti, pos, Hq, qscale, gate, grow, ghead, out, ws_o, ws_ml, kps, n_split);
  } else {
    const int64_t blocks = ceil_div(T, kPrefillRows / group_) * s.n_split;
    if (blocks > INT_MAX) throw KernelError(fmt::format("attention: {} prefill blocks", blocks));
    kernels_[kPrefill].kernel.launch(dim3((unsigned)blocks, (unsigned)d_.Hkv), dim3(kPrefillThreads), kPrefillSmem,
                                     stream, q, kc, vc, kv_row, Ti, pos, Hq, qscale, gate, grow, ghead, out, ws_o,
                                     ws_ml, n_split);
  }
  if (s.n_split > 1)
    kernels_[kMerge].kernel.launch(dim3((unsigned)(T * d_.Hq * 4)), dim3(kMergeThreads), 0, stream,
                                   static_cast<const float*>(ws_o), static_cast<const float2*>(ws_ml), n_split, Ti,
                                   Hq, gate, grow, ghead, out);
}

}  // namespace qrig::cuda
