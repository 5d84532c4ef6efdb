// Gated GQA attention kernels (attention.h): registry entries, variants, the per-plan choice and the split of
// one call:
//   decode (T <= 8/G: 1 token at 27B dims, 2 at 9B, 4 for the tiny model): KV heads x splits >= max(2 x SMs,
//            CTAs resident at once), keys per split a multiple of 32;
//   prefill: enough (query block, KV head, split) CTAs for one resident wave, then the split count in
//            [s, 2s] that wastes least of the last wave; each split keeps >= 8 tiles of 32 keys.
// Split partials go to the workspace ([n_split][T][Hq][hd] f32 O, then [n_split][T][Hq] (m, l)).
#include "kernels/attention.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "kernels/registry.h"

namespace qrig::kernels {

namespace {

constexpr int64_t kPrefillHalf = 0;  // P.V in fp32 (see choose_attention)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

}  // namespace

std::vector<TemplateInfo> attention_templates() {
  const TemplateParam d = {"d", "QRIG_D", kAttentionHeadDim, kAttentionHeadDim, kAttentionHeadDim, "head dim"};
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

int64_t attention_group(const AttentionDims& d) {
  if (d.Hq <= 0 || d.Hkv <= 0 || d.Hq % d.Hkv != 0)
    throw KernelError(fmt::format("attention: {} query heads are not a positive multiple of {} KV heads", d.Hq, d.Hkv));
  if (d.hd != kAttentionHeadDim)
    throw KernelError(fmt::format("attention: head dim {} (the kernels are written for {})", d.hd, kAttentionHeadDim));
  const int64_t g = d.Hq / d.Hkv;
  if (g > kAttentionDecodeRows)
    throw KernelError(fmt::format("attention: {} query heads per KV head (at most {})", g, kAttentionDecodeRows));
  if (d.Hkv > 65535) throw KernelError(fmt::format("attention: {} KV heads (grid.y)", d.Hkv));
  return g;
}

int64_t attention_decode_max_tokens(int64_t g) { return std::max<int64_t>(1, kAttentionDecodeRows / g); }

Variant attn_decode_variant(int64_t g, int64_t n) {
  return make_variant("attn_decode", {{"d", kAttentionHeadDim}, {"g", g}, {"n", n}, {"t", kAttentionDecodeThreads}});
}
Variant attn_prefill_variant(int64_t g, int64_t half) {
  return make_variant("attn_prefill",
                      {{"d", kAttentionHeadDim}, {"g", g}, {"h", half}, {"t", kAttentionPrefillThreads}});
}
Variant attn_merge_variant() {
  return make_variant("attn_merge", {{"d", kAttentionHeadDim}, {"t", kAttentionMergeThreads}});
}

AttentionSplit attention_split(const AttentionDims& d, const AttentionCtas& c, int64_t T, int64_t kv_len,
                               bool decode) {
  const int64_t g = attention_group(d);
  if (decode && T > attention_decode_max_tokens(g))
    throw KernelError(fmt::format("attention: the decode kernel takes at most {} tokens, not {}",
                                  attention_decode_max_tokens(g), T));
  AttentionSplit s;
  if (decode) {
    s.decode = true;
    const int64_t splits = ceil_div(T == 1 ? c.decode1 : c.decode_n, d.Hkv);
    s.keys_per_split = ceil_div(ceil_div(kv_len, splits), kAttentionDecodeKeyStep) * kAttentionDecodeKeyStep;
    s.n_split = ceil_div(kv_len, s.keys_per_split);
    return s;
  }
  const int64_t base = ceil_div(T, kAttentionPrefillRows / g) * d.Hkv;
  const int64_t tiles = ceil_div(kv_len, kAttentionTile);
  const int64_t s_max = std::max<int64_t>(1, tiles / kAttentionMinTilesPerSplit);
  const int64_t s_min = std::clamp<int64_t>(ceil_div(c.prefill, base), 1, s_max);
  int64_t best = s_min, best_cost = INT64_MAX;
  for (int64_t n = s_min; n <= std::min(2 * s_min, s_max); ++n) {
    const int64_t cost = ceil_div(base * n, c.prefill) * ceil_div(tiles, n);
    if (cost < best_cost) best = n, best_cost = cost;
  }
  s.n_split = best;
  return s;
}

int64_t attention_partial_bytes(const AttentionDims& d, int64_t T, int64_t n_split) {
  const int64_t items = n_split * T * d.Hq;
  return align256(items * d.hd * 4) + align256(items * 2 * 4);
}

int64_t attention_workspace_bytes(const AttentionDims& d, const AttentionCtas& c, int64_t context, int64_t max_t) {
  if (max_t <= 0) throw KernelError(fmt::format("attention: workspace for {} tokens", max_t));
  const int64_t g = attention_group(d);
  int64_t most = 0;
  for (int64_t T = 1; T <= std::min(max_t, context); ++T) {
    int64_t n;  // an upper bound of attention_split(T, kv_len).n_split over every kv_len <= context
    if (T <= attention_decode_max_tokens(g)) {
      n = ceil_div(T == 1 ? c.decode1 : c.decode_n, d.Hkv);
    } else {
      const int64_t base = ceil_div(T, kAttentionPrefillRows / g) * d.Hkv;
      const int64_t s_max = std::max<int64_t>(1, ceil_div(context, kAttentionTile) / kAttentionMinTilesPerSplit);
      n = std::min(2 * std::max<int64_t>(1, ceil_div(c.prefill, base)), s_max);
    }
    if (n > 1) most = std::max(most, attention_partial_bytes(d, T, n));
  }
  return most;
}

AttentionChoice choose_attention(const AttentionDims& d, int64_t context, int64_t max_tokens, int sms,
                                 const Tuning& t) {
  const int64_t g = attention_group(d);
  if (context <= 0 || context > INT_MAX / 2 || sms <= 0 || max_tokens < 1)
    throw KernelError(fmt::format("attention: context {} on {} SMs, {} tokens", context, sms, max_tokens));
  const int64_t nmax = attention_decode_max_tokens(g);
  const Variant d1 = attn_decode_variant(g, 1), dn = attn_decode_variant(g, nmax);
  const Variant pre = attn_prefill_variant(g, kPrefillHalf), merge = attn_merge_variant();
  auto resident = [&](const Variant& v, bool decode) {
    const std::string key = decode ? fmt::format("decode_g{}_n{}", g, v.param("n"))
                                   : fmt::format("prefill_g{}_h{}", g, v.param("h"));
    return t.attention.resident_of(key, decode);
  };
  AttentionChoice c;
  c.ctas.decode1 = std::max<int64_t>(2 * sms, sms * resident(d1, true));
  c.ctas.decode_n = std::max<int64_t>(2 * sms, sms * resident(dn, true));
  c.ctas.prefill = sms * resident(pre, false);
  c.ranges.push_back({1, 1, {{d1, merge}},
                      fmt::format("one token: split-KV decode over >= {} CTAs, partials merged by log-sum-exp",
                                  c.ctas.decode1)});
  if (nmax > 1 && max_tokens >= 2)
    c.ranges.push_back({2, std::min(nmax, max_tokens), {{dn, merge}},
                        fmt::format("up to {} tokens ({} query heads per KV head, 8 rows per CTA): split-KV decode "
                                    "over >= {} CTAs",
                                    nmax, g, c.ctas.decode_n)});
  if (max_tokens > nmax)
    c.ranges.push_back({nmax + 1, max_tokens, {{pre, merge}},
                        fmt::format("more tokens: tiled prefill (P.V in fp32: the HFMA2 form was ~14% faster at 32K "
                                    "for ~1000x the error), key range split to fill {} resident CTAs",
                                    c.ctas.prefill)});
  return c;
}

std::vector<Variant> attention_variants(const AttentionDims& d, int64_t context, int sms) {
  std::vector<Variant> out;  // the kernels in range order, then the merge
  for (const auto& r : choose_attention(d, context, 512, sms, default_tuning(90)).ranges)
    if (std::find(out.begin(), out.end(), r.parts[0][0]) == out.end()) out.push_back(r.parts[0][0]);
  out.push_back(attn_merge_variant());
  return out;
}

}  // namespace qrig::kernels
