// Gated GQA attention kernel set (attention.h): loads the plan's kernels per range of tokens and launches them
// with the split kernels::attention_split gives for the call's key count (partials in the workspace:
// [n_split][T][Hq][hd] f32 O, then [n_split][T][Hq] (m, l)); and the KV write.
#include "runtime/cuda/attention.h"

#include "runtime/cuda/pointwise.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include <fmt/format.h>

namespace qrig::cuda {

namespace {

constexpr double kLog2e = 1.4426950408889634;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_decode(const LoadedKernel& k) {
  return k.variant.kernel == "attn_decode" || k.variant.kernel == "attn_decode_dp4a";
}

// kernel: the one expected, where "attn_decode" takes either decode kernel (the plan's query precision chose it;
// attn_decode_dp4a needs quantized keys).
void require_variant(const LoadedKernel& k, const char* kernel, int64_t g, kernels::KvPair kv, int64_t batched = 0) {
  const bool merge = k.variant.kernel.rfind("attn_merge", 0) == 0;
  if (std::string(kernel) == "attn_decode" && k.variant.kernel == "attn_decode_dp4a") {
    if (!kernels::attention_int8_query(kv))
      throw KernelError(fmt::format("attention: {} reads q8/t4/t3 keys, not {}", k.variant.name,
                                    kernels::kv_format_name(kv.k)));
    kernel = "attn_decode_dp4a";
  }
  if (k.variant.kernel != "attn_prefill" && k.variant.param("b") != batched)
    throw KernelError(fmt::format("attention: the plan names {} where {} runs", k.variant.name,
                                  batched ? "the batched decode kernels" : "one sequence's kernels"));
  if (k.variant.kernel != kernel || k.variant.param("d") != kernels::kAttentionHeadDim ||
      (!merge && (k.variant.param("g") != g || k.variant.param("k") != kernels::kv_format_param(kv.k) ||
                  k.variant.param("v") != kernels::kv_format_param(kv.v))))
    throw KernelError(fmt::format("attention: the plan names {} for {} with {} heads per KV head over {} caches",
                                  k.variant.name, kernel, g, kernels::kv_pair_name(kv)));
}

}  // namespace

AttentionKernels::AttentionKernels(const KernelLoader& load, const AttentionDims& d, int64_t context,
                                   const kernels::AttentionCtas& ctas, const std::vector<ir::LaunchRange>& ranges,
                                   kernels::KvPair kv, int64_t layer)
    : d_(d), context_(context), ctas_(ctas), kv_(kv), layer_(layer) {
  group_ = kernels::attention_group(d);
  if (layer < 0 || layer > 1000000) throw KernelError(fmt::format("attention: layer {}", layer));
  for (kernels::KvFormat f : {kv.k, kv.v})
    if (!kernels::kv_width_ok(f, d.Hkv * d.hd) || f == kernels::KvFormat::f32)
      throw KernelError(fmt::format("attention: no CUDA kernels for {} caches of {} values per row",
                                    kernels::kv_format_name(f), d.Hkv * d.hd));
  if (context <= 0 || context > INT_MAX / 2) throw KernelError(fmt::format("attention: context {}", context));
  if (ctas.decode1 <= 0 || ctas.decode_n <= 0 || ctas.prefill <= 0)
    throw KernelError("attention: the plan's split CTAs must be positive");
  for (const ir::LaunchRange& lr : ranges) {
    if (lr.parts.size() != 1 || lr.parts[0].size() != 2)
      throw KernelError(fmt::format("attention: rows {}-{} must name a decode or prefill kernel, then attn_merge",
                                    lr.first, lr.last));
    Range r{lr.first, lr.last, load(parse_variant(lr.parts[0][0])), load(parse_variant(lr.parts[0][1]))};
    const bool decode = is_decode(r.main);
    require_variant(r.main, decode ? "attn_decode" : "attn_prefill", group_, kv);
    require_variant(r.merge, kernels::attn_merge_for(kv.v).kernel.c_str(), group_, kv);
    if (decode && (lr.last > r.main.variant.param("n") || lr.last > kernels::attention_decode_max_tokens(group_)))
      throw KernelError(fmt::format("attention: {} cannot run {} tokens", r.main.variant.name, lr.last));
    if (!decode && r.main.kernel.handle()) r.main.kernel.opt_in_shared(kernels::attention_prefill_smem(r.main.variant));
    ranges_.push_back(std::move(r));
  }
  if (ranges_.empty()) throw KernelError("attention: no kernel");
  // The int8 query covers the calls of 1..int8_tokens_ tokens, the decode ranges of attn_decode_dp4a: they must be
  // the first ranges (a call's numerics follow from its token count alone, as on the CPU backend).
  bool fp32_seen = false;
  for (const Range& r : ranges_) {
    const bool q8 = r.main.variant.kernel == "attn_decode_dp4a";
    if (q8 && fp32_seen)
      throw KernelError(fmt::format("attention: {} for {}-{} tokens follows a kernel with the fp32 query",
                                    r.main.variant.name, r.first, r.last));
    fp32_seen |= !q8;
    if (q8) int8_tokens_ = r.last;
  }
}

void AttentionKernels::run(const float* q, const void* kcache, const void* vcache, int64_t T, int64_t pos0,
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
  const bool decode = is_decode(r->main);
  const kernels::AttentionSplit s = kernels::attention_split(d_, ctas_, T, pos0 + T, decode);
  float* ws_o = nullptr;
  float* ws_ml = nullptr;  // float2 pairs (m, l) in the kernel
  if (s.n_split > 1) {
    require_aligned(workspace, 256, "attention", "workspace");
    ws_o = static_cast<float*>(workspace);
    const size_t items = (size_t)s.n_split * (size_t)T * (size_t)d_.Hq;
    ws_ml = reinterpret_cast<float*>(static_cast<char*>(workspace) + (items * (size_t)d_.hd * sizeof(float) + 255) / 256 * 256);
  }
  const auto* kc = static_cast<const unsigned char*>(kcache);
  const auto* vc = static_cast<const unsigned char*>(vcache);
  const long long k_row = kernels::kv_row_bytes(kv_.k, d_.Hkv * d_.hd, false);
  const long long v_row = kernels::kv_row_bytes(kv_.v, d_.Hkv * d_.hd, false);
  const float qscale = (float)(scale * kLog2e);
  const int Ti = (int)T, pos = (int)pos0, Hq = (int)d_.Hq, n_split = (int)s.n_split, layer = (int)layer_;
  const long long grow = gate_row_stride, ghead = gate_head_stride;
  // Grid dimensions: x holds splits (decode) or query blocks x splits (prefill), y the KV heads (<= 65535,
  // attention_group checks); at 262144 keys a decode launch has at most context / 32 splits.
  if (s.decode) {
    const LoadedKernel& k = r->main;
    const int kps = (int)s.keys_per_split;
    if (s.n_split > INT_MAX) throw KernelError(fmt::format("attention: {} decode splits", s.n_split));
    k.kernel.launch(Dim3((unsigned)s.n_split, (unsigned)d_.Hkv), Dim3((unsigned)k.variant.threads()), 0, stream, q,
                    kc, vc, k_row, v_row, Ti, pos, Hq, qscale, gate, grow, ghead, out, ws_o, ws_ml, kps, n_split, layer,
                    static_cast<const unsigned char* const*>(nullptr), static_cast<const unsigned char* const*>(nullptr),
                    static_cast<const int*>(nullptr), static_cast<const int*>(nullptr), 1);
  } else {
    const int64_t blocks = ceil_div(T, kernels::kAttentionPrefillRows / group_) * s.n_split;
    if (blocks > INT_MAX) throw KernelError(fmt::format("attention: {} prefill blocks", blocks));
    r->main.kernel.launch(Dim3((unsigned)blocks, (unsigned)d_.Hkv), Dim3(kernels::kAttentionPrefillThreads),
                          kernels::attention_prefill_smem(r->main.variant), stream, q, kc, vc, k_row, v_row, Ti, pos, Hq,
                          qscale, gate, grow, ghead, out, ws_o, ws_ml, n_split, layer);
  }
  if (s.n_split > 1) {
    if (kernels::kv_format_rotated(kv_.v)) {
      const int64_t per = kernels::kAttentionMergeRotThreads / 32;
      r->merge.kernel.launch(Dim3((unsigned)ceil_div(T * d_.Hq, per)), Dim3(kernels::kAttentionMergeRotThreads), 0,
                             stream, static_cast<const float*>(ws_o), static_cast<const float*>(ws_ml), n_split, Ti, Hq,
                             (int)group_, layer, gate, grow, ghead, out, static_cast<const int*>(nullptr), 0);
    } else {
      r->merge.kernel.launch(Dim3((unsigned)(T * d_.Hq * 4)), Dim3(kernels::kAttentionMergeThreads), 0, stream,
                             static_cast<const float*>(ws_o), static_cast<const float*>(ws_ml), n_split, Ti, Hq, gate,
                             grow, ghead, out, static_cast<const int*>(nullptr), 0);
    }
  }
}

void launch_kv_write(const LoadedKernel& k, const float* kin, const float* vin, void* kcache, void* vcache,
                     int64_t pos0, int64_t T, int64_t W, int64_t layer, kernels::KvPair kv, StreamHandle s) {
  if (k.variant.kernel == "kv_write_f16") {
    if (kv.k != kernels::KvFormat::f16 || kv.v != kernels::KvFormat::f16)
      throw KernelError(fmt::format("{} writes fp16 caches, not {}", k.variant.name, kernels::kv_pair_name(kv)));
    return launch_kv_write_f16(k, kin, vin, static_cast<uint16_t*>(kcache), static_cast<uint16_t*>(vcache), pos0, T, W, s);
  }
  require_kernel(k, "kv_write");
  if (k.variant.param("k") != kernels::kv_format_param(kv.k) || k.variant.param("v") != kernels::kv_format_param(kv.v))
    throw KernelError(fmt::format("{} does not write {} caches", k.variant.name, kernels::kv_pair_name(kv)));
  if (k.variant.param("b") != 0) throw KernelError(fmt::format("{}: a batched variant (launch_kv_write_batched)", k.variant.name));
  require_aligned(kin, 16, k, "k");
  require_aligned(vin, 16, k, "v");
  require_aligned(kcache, 16, k, "kcache");
  require_aligned(vcache, 16, k, "vcache");
  if (W <= 0 || W % kernels::kAttentionHeadDim)
    throw KernelError(fmt::format("{}: rows of {} values are not whole head vectors of 256", k.variant.name, W));
  const int64_t Hkv = W / kernels::kAttentionHeadDim;
  if (T <= 0 || T > INT_MAX || T * Hkv > INT_MAX / 2 || pos0 < 0 || layer < 0 || layer > 1000000)
    throw KernelError(fmt::format("{}: T = {}, Hkv = {}, pos0 = {}, layer = {}", k.variant.name, T, Hkv, pos0, layer));
  const long long kr = kernels::kv_row_bytes(kv.k, W, false), vr = kernels::kv_row_bytes(kv.v, W, false);
  const int64_t per = k.variant.threads() / 32;
  k.kernel.launch(Dim3((unsigned)ceil_div(T * Hkv, per), 2), Dim3((unsigned)k.variant.threads()), 0, s, kin, vin,
                  static_cast<unsigned char*>(kcache), static_cast<unsigned char*>(vcache), kr, vr, (long long)pos0,
                  (int)T, (int)Hkv, (int)layer, static_cast<unsigned char* const*>(nullptr),
                  static_cast<unsigned char* const*>(nullptr), static_cast<const int*>(nullptr),
                  static_cast<const int*>(nullptr));
}

void launch_kv_write_batched(const LoadedKernel& k, const float* kin, const float* vin, void* const* kc_of,
                             void* const* vc_of, const int32_t* seq_slot, const int32_t* seq_pos, int64_t seqs,
                             int64_t W, int64_t layer, kernels::KvPair kv, StreamHandle s) {
  require_kernel(k, "kv_write");
  if (k.variant.param("k") != kernels::kv_format_param(kv.k) || k.variant.param("v") != kernels::kv_format_param(kv.v))
    throw KernelError(fmt::format("{} does not write {} caches", k.variant.name, kernels::kv_pair_name(kv)));
  if (k.variant.param("b") != 1) throw KernelError(fmt::format("{}: not a batched variant (launch_kv_write)", k.variant.name));
  require_aligned(kin, 16, k, "k");
  require_aligned(vin, 16, k, "v");
  require_aligned(kc_of, 8, k, "kc_of");
  require_aligned(vc_of, 8, k, "vc_of");
  require_aligned(seq_slot, 4, k, "seq_slot");
  require_aligned(seq_pos, 4, k, "seq_pos");
  if (W <= 0 || W % kernels::kAttentionHeadDim)
    throw KernelError(fmt::format("{}: rows of {} values are not whole head vectors of 256", k.variant.name, W));
  const int64_t Hkv = W / kernels::kAttentionHeadDim;
  if (seqs <= 0 || seqs * Hkv > INT_MAX / 2 || layer < 0 || layer > 1000000)
    throw KernelError(fmt::format("{}: {} sequences, Hkv = {}, layer = {}", k.variant.name, seqs, Hkv, layer));
  const long long kr = kernels::kv_row_bytes(kv.k, W, false), vr = kernels::kv_row_bytes(kv.v, W, false);
  const int64_t per = k.variant.threads() / 32;
  k.kernel.launch(Dim3((unsigned)ceil_div(seqs * Hkv, per), 2), Dim3((unsigned)k.variant.threads()), 0, s, kin, vin,
                  static_cast<unsigned char*>(nullptr), static_cast<unsigned char*>(nullptr), kr, vr, 0LL, (int)seqs,
                  (int)Hkv, (int)layer, reinterpret_cast<unsigned char* const*>(kc_of),
                  reinterpret_cast<unsigned char* const*>(vc_of), reinterpret_cast<const int*>(seq_slot),
                  reinterpret_cast<const int*>(seq_pos));
}

BatchedDecodeAttention::BatchedDecodeAttention(const KernelLoader& load, const AttentionDims& d, int64_t context,
                                               const kernels::AttentionCtas& ctas, const std::string& decode,
                                               const std::string& merge, kernels::KvPair kv, int64_t layer)
    : d_(d), context_(context), ctas_(ctas), kv_(kv), layer_(layer),
      decode_(load(parse_variant(decode))), merge_(load(parse_variant(merge))) {
  group_ = kernels::attention_group(d);
  if (layer < 0 || layer > 1000000) throw KernelError(fmt::format("attention: layer {}", layer));
  if (context <= 0 || context > INT_MAX / 2) throw KernelError(fmt::format("attention: context {}", context));
  if (ctas.decode1 <= 0) throw KernelError("attention: the plan's split CTAs must be positive");
  require_variant(decode_, "attn_decode", group_, kv, 1);
  require_variant(merge_, kernels::attn_merge_for(kv.v).kernel.c_str(), group_, kv, 1);
  if (decode_.variant.param("n") != 1) throw KernelError(fmt::format("attention: {} is not a one-token kernel", decode));
  target_ = kernels::attention_decode_split_target(d, ctas);
}

void BatchedDecodeAttention::run(const float* q, const void* const* kc_of, const void* const* vc_of,
                                 const int32_t* seq_slot, const int32_t* seq_pos, const std::vector<int64_t>& pos,
                                 float scale, const float* gate, int64_t gate_row_stride, int64_t gate_head_stride,
                                 float* out, void* workspace, StreamHandle stream) const {
  const int64_t seqs = (int64_t)pos.size();
  if (seqs <= 0 || seqs > 65535) throw KernelError(fmt::format("attention: a batched step of {} sequences", seqs));
  if (!std::isfinite(scale)) throw KernelError("attention: the scale is not finite");
  if (gate_row_stride < 0 || gate_head_stride < 0)
    throw KernelError(fmt::format("attention: gate strides {} and {}", gate_row_stride, gate_head_stride));
  require_aligned(q, 16, "attention", "q");
  require_aligned(gate, 4, "attention", "gate");
  require_aligned(out, 16, "attention", "out");
  require_aligned(kc_of, 8, "attention", "kc_of");
  require_aligned(vc_of, 8, "attention", "vc_of");
  require_aligned(seq_slot, 4, "attention", "seq_slot");
  require_aligned(seq_pos, 4, "attention", "seq_pos");
  if (out == q) throw KernelError("attention: out must not alias q");
  if (seqs * d_.Hq * 4 > INT_MAX) throw KernelError(fmt::format("attention: {} sequences x {} heads", seqs, d_.Hq));
  // The grid covers the most splits any sequence has (a count that does not grow with the keys everywhere: at
  // 32 * target keys the split widens and the count drops), the merge runs when one has more than one.
  int64_t most = 1;
  for (int64_t p : pos) {
    if (p < 0 || p + 1 > context_)
      throw KernelError(fmt::format("attention: a token at position {} with a context of {}", p, context_));
    most = std::max(most, kernels::attention_split(d_, ctas_, 1, p + 1, true).n_split);
  }
  float* ws_o = nullptr;
  float* ws_ml = nullptr;
  if (most > 1) {
    require_aligned(workspace, 256, "attention", "workspace");
    ws_o = static_cast<float*>(workspace);
    const size_t items = (size_t)target_ * (size_t)seqs * (size_t)d_.Hq;  // [split][seqs][Hq], as the kernels index
    ws_ml = reinterpret_cast<float*>(static_cast<char*>(workspace) + (items * (size_t)d_.hd * sizeof(float) + 255) / 256 * 256);
  }
  const long long k_row = kernels::kv_row_bytes(kv_.k, d_.Hkv * d_.hd, false);
  const long long v_row = kernels::kv_row_bytes(kv_.v, d_.Hkv * d_.hd, false);
  const float qscale = (float)(scale * kLog2e);
  const int Hq = (int)d_.Hq, layer = (int)layer_, target = (int)target_, n = (int)seqs;
  const long long grow = gate_row_stride, ghead = gate_head_stride;
  const auto* kc = reinterpret_cast<const unsigned char* const*>(kc_of);
  const auto* vc = reinterpret_cast<const unsigned char* const*>(vc_of);
  const int* slot = reinterpret_cast<const int*>(seq_slot);
  const int* at = reinterpret_cast<const int*>(seq_pos);
  decode_.kernel.launch(Dim3((unsigned)most, (unsigned)d_.Hkv, (unsigned)seqs), Dim3((unsigned)decode_.variant.threads()), 0,
                        stream, q, static_cast<const unsigned char*>(nullptr), static_cast<const unsigned char*>(nullptr),
                        k_row, v_row, 1, 0, Hq, qscale, gate, grow, ghead, out, ws_o, ws_ml, 0, target, layer, kc, vc,
                        slot, at, n);
  if (most == 1) return;
  if (kernels::kv_format_rotated(kv_.v)) {
    const int64_t per = kernels::kAttentionMergeRotThreads / 32;
    merge_.kernel.launch(Dim3((unsigned)ceil_div(seqs * d_.Hq, per)), Dim3(kernels::kAttentionMergeRotThreads), 0, stream,
                         static_cast<const float*>(ws_o), static_cast<const float*>(ws_ml), target, n, Hq, (int)group_,
                         layer, gate, grow, ghead, out, at, target);
  } else {
    merge_.kernel.launch(Dim3((unsigned)(seqs * d_.Hq * 4)), Dim3(kernels::kAttentionMergeThreads), 0, stream,
                         static_cast<const float*>(ws_o), static_cast<const float*>(ws_ml), target, n, Hq, gate, grow,
                         ghead, out, at, target);
  }
}

}  // namespace qrig::cuda
