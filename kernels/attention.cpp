// Gated GQA attention kernels (attention.h): registry entries, variants, the per-plan choice and the split of
// one call:
//   decode (T <= 8/G: 1 token at 27B dims, 2 at 9B, 4 for the tiny model): KV heads x splits >= max(2 x SMs,
//            CTAs resident at once), keys per split a multiple of 32; attn_decode (fp32 query), or over q8/t4/t3
//            keys attn_decode_dp4a (the plan's int8 query; 8 warps per CTA, so the same CTA counts fill an SM);
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
  // Cache formats by their bits (16 f16, 8 q8, 4 t4, 3 t3: kernels/kv_format.h); the templates assert the set.
  const TemplateParam kf = {"k", "QRIG_KF", 3, 16, 1, "key cache format: 16 f16, 8 q8, 4 t4, 3 t3"};
  const TemplateParam vf = {"v", "QRIG_VF", 3, 16, 1, "value cache format: 16 f16, 8 q8, 4 t4, 3 t3"};
  return {
      {"attn_decode", "attn_decode.cu",
       {d, {"g", "QRIG_G", 1, 8, 1, "query heads per KV head"},
        {"n", "QRIG_N", 1, 8, 1, "most query tokens (g * n <= 8)"}, kf, vf, batched_param(), threads_param()},
       "gated GQA attention of T <= n tokens, split over the keys (flash-decoding), fp32; grid (splits, KV heads)"},
      {"attn_decode_dp4a", "attn_decode_dp4a.cu",
       {d, {"g", "QRIG_G", 1, 8, 1, "query heads per KV head"},
        {"n", "QRIG_N", 1, 8, 1, "most query tokens (g * n <= 8)"},
        {"k", "QRIG_KF", 3, 8, 1, "key cache format: 8 q8, 4 t4, 3 t3"}, vf, batched_param(), threads_param()},
       "attn_decode over q8/t4/t3 keys with the query in int8 per 32 values: Q.K by dp4a over the key codes, P.V fp32; "
       "8 warps"},
      {"attn_prefill", "attn_prefill.cu",
       {d, {"g", "QRIG_G", 1, 32, 1, "query heads per KV head"},
        {"h", "QRIG_HALF", 0, 1, 1, "P.V products: 0 fp32 FFMA, 1 HFMA2 summed in fp32 per 32-key tile (f16 values)"},
        kf, vf, threads_param()},
       "gated GQA attention of a block of 32/g query tokens x g heads per CTA, 32-key tiles, Q.K in fp32"},
      {"attn_merge", "attn_merge.cu", {d, batched_param(), threads_param()},
       "log-sum-exp merge of split-KV attention partials, times sigmoid(gate); one CTA per (token, head, 64 columns)"},
      {"attn_merge_rot", "attn_merge_rot.cu", {d, batched_param(), threads_param()},
       "attn_merge for t4/t3 values: the merged output rotated back once, times sigmoid(gate); a warp per (token, head)"},
      {"kv_write", "kv_write.cu", {kf, vf, batched_param(), threads_param()},
       "append keys and values to caches of any format (f16/q8/t4/t3 each): a warp per (token, KV head) vector"},
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

int64_t kv_format_param(KvFormat f) {
  if (f == KvFormat::f32) throw KernelError("kv cache: f32 caches are the CPU reference's (no CUDA kernels)");
  return kv_format_bits(f);
}

namespace {
KvFormat format_of_param(int64_t bits) {
  switch (bits) {
    case 16: return KvFormat::f16;
    case 8: return KvFormat::q8;
    case 4: return KvFormat::t4;
    case 3: return KvFormat::t3;
  }
  throw KernelError(fmt::format("kv cache: no format of {} bits (16, 8, 4 or 3)", bits));
}
}  // namespace

Variant attn_decode_variant(int64_t g, int64_t n, KvPair kv, int64_t batched) {
  if (batched && n != 1) throw KernelError("attention: the batched decode kernel takes one token per sequence");
  return make_variant("attn_decode", {{"d", kAttentionHeadDim}, {"g", g}, {"n", n}, {"k", kv_format_param(kv.k)},
                                      {"v", kv_format_param(kv.v)}, {"b", batched}, {"t", kAttentionDecodeThreads}});
}
bool attention_int8_query(KvPair kv) { return kv.k == KvFormat::q8 || kv_format_rotated(kv.k); }

Variant attn_decode_dp4a_variant(int64_t g, int64_t n, KvPair kv, int64_t batched) {
  if (!attention_int8_query(kv))
    throw KernelError(fmt::format("attention: the int8-query decode kernel reads q8, t4 or t3 keys, not {}",
                                  kv_format_name(kv.k)));
  if (batched && n != 1) throw KernelError("attention: the batched decode kernel takes one token per sequence");
  return make_variant("attn_decode_dp4a", {{"d", kAttentionHeadDim}, {"g", g}, {"n", n}, {"k", kv_format_param(kv.k)},
                                           {"v", kv_format_param(kv.v)}, {"b", batched},
                                           {"t", kAttentionDecodeDp4aThreads}});
}
Variant attn_decode_for(int64_t g, int64_t n, KvPair kv, int64_t batched, bool int8_query) {
  return int8_query && attention_int8_query(kv) ? attn_decode_dp4a_variant(g, n, kv, batched)
                                                : attn_decode_variant(g, n, kv, batched);
}

Variant attn_prefill_variant(int64_t g, int64_t half, KvPair kv) {
  if (half && kv.v != KvFormat::f16) throw KernelError("attention: HFMA2 P.V (h1) reads fp16 values only");
  return make_variant("attn_prefill", {{"d", kAttentionHeadDim}, {"g", g}, {"h", half}, {"k", kv_format_param(kv.k)},
                                       {"v", kv_format_param(kv.v)}, {"t", kAttentionPrefillThreads}});
}
Variant attn_merge_variant(int64_t batched) {
  return make_variant("attn_merge", {{"d", kAttentionHeadDim}, {"b", batched}, {"t", kAttentionMergeThreads}});
}
Variant attn_merge_rot_variant(int64_t batched) {
  return make_variant("attn_merge_rot", {{"d", kAttentionHeadDim}, {"b", batched}, {"t", kAttentionMergeRotThreads}});
}
Variant attn_merge_for(KvFormat v, int64_t batched) {
  return kv_format_rotated(v) ? attn_merge_rot_variant(batched) : attn_merge_variant(batched);
}

Variant kv_write_variant(KvPair kv) {
  if (kv.k == KvFormat::f16 && kv.v == KvFormat::f16) return make_variant("kv_write_f16", {{"t", 256}});
  return make_variant("kv_write", {{"k", kv_format_param(kv.k)}, {"v", kv_format_param(kv.v)}, {"b", 0}, {"t", 128}});
}
Variant kv_write_batched_variant(KvPair kv) {
  return make_variant("kv_write", {{"k", kv_format_param(kv.k)}, {"v", kv_format_param(kv.v)}, {"b", 1}, {"t", 128}});
}

int64_t attention_prefill_smem(const Variant& v) {
  if (v.kernel != "attn_prefill") throw KernelError(fmt::format("{} is not an attn_prefill variant", v.name));
  format_of_param(v.param("k"));
  format_of_param(v.param("v"));
  return kAttentionPrefillSmem;  // q8/t4/t3 values: an fp32 V tile of half the keys in the f16 tile's bytes
}

Variant with_kv_formats(const Variant& v, KvPair kv, bool int8_query) {
  if (v.kernel == "attn_decode" || v.kernel == "attn_decode_dp4a")
    return attn_decode_for(v.param("g"), v.param("n"), kv, v.param("b"), int8_query);
  if (v.kernel == "attn_prefill") return attn_prefill_variant(v.param("g"), v.param("h"), kv);
  if (v.kernel == "attn_merge" || v.kernel == "attn_merge_rot") return attn_merge_for(kv.v, v.param("b"));
  if (v.kernel == "kv_write" && v.param("b") == 1) return kv_write_batched_variant(kv);
  if (v.kernel == "kv_write" || v.kernel == "kv_write_f16") return kv_write_variant(kv);
  return v;
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

int64_t attention_decode_split_target(const AttentionDims& d, const AttentionCtas& c) {
  if (c.decode1 <= 0 || d.Hkv <= 0) throw KernelError("attention: the decode split needs positive CTAs and KV heads");
  return ceil_div(c.decode1, d.Hkv);
}

int64_t attention_workspace_bytes(const AttentionDims& d, const AttentionCtas& c, int64_t context, int64_t max_t,
                                  int64_t decode_seqs) {
  if (max_t <= 0) throw KernelError(fmt::format("attention: workspace for {} tokens", max_t));
  const int64_t g = attention_group(d);
  int64_t most = 0;
  if (decode_seqs >= 2) {  // a batched decode launch: every sequence's partials side by side
    const int64_t n = attention_decode_split_target(d, c);
    if (n > 1) most = attention_partial_bytes(d, decode_seqs, n);
  }
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
                                 const Tuning& t, KvPair kv, bool int8_query) {
  const int64_t g = attention_group(d);
  if (context <= 0 || context > INT_MAX / 2 || sms <= 0 || max_tokens < 1)
    throw KernelError(fmt::format("attention: context {} on {} SMs, {} tokens", context, sms, max_tokens));
  const int64_t nmax = attention_decode_max_tokens(g);
  const Variant d1 = attn_decode_for(g, 1, kv, 0, int8_query), dn = attn_decode_for(g, nmax, kv, 0, int8_query);
  const bool q8 = d1.kernel == "attn_decode_dp4a";
  const std::string query = q8 ? ", the query in int8 (dp4a Q.K over the key codes)" : "";
  const Variant pre = attn_prefill_variant(g, kPrefillHalf, kv), merge = attn_merge_for(kv.v);
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
                      fmt::format("one token: split-KV decode over >= {} CTAs{}, partials merged by log-sum-exp",
                                  c.ctas.decode1, query)});
  if (nmax > 1 && max_tokens >= 2)
    c.ranges.push_back({2, std::min(nmax, max_tokens), {{dn, merge}},
                        fmt::format("up to {} tokens ({} query heads per KV head, 8 rows per CTA): split-KV decode "
                                    "over >= {} CTAs{}",
                                    nmax, g, c.ctas.decode_n, query)});
  if (max_tokens > nmax)
    c.ranges.push_back({nmax + 1, max_tokens, {{pre, merge}},
                        fmt::format("more tokens: tiled prefill (P.V in fp32: the HFMA2 form was ~14% faster at 32K "
                                    "for ~1000x the error), key range split to fill {} resident CTAs",
                                    c.ctas.prefill)});
  return c;
}

std::vector<KernelRange> choose_attention_decode(const AttentionDims& d, int64_t max_seqs, KvPair kv,
                                                bool int8_query) {
  const int64_t g = attention_group(d);
  if (max_seqs < 1) throw KernelError(fmt::format("attention: decode steps of {} sequences", max_seqs));
  std::vector<KernelRange> out = {{1, 1, {{attn_decode_for(g, 1, kv, 0, int8_query), attn_merge_for(kv.v)}},
                                   "one sequence: its one-token split-KV decode and merge"}};
  if (max_seqs >= 2)
    out.push_back({2, max_seqs, {{attn_decode_for(g, 1, kv, 1, int8_query), attn_merge_for(kv.v, 1)}},
                   "a decode step's sequences in one launch each (grid.z over sequences, each its own position, "
                   "caches and split; CTAs past a sequence's split count leave)"});
  return out;
}

std::vector<KernelRange> choose_kv_write_decode(KvPair kv, int64_t max_seqs) {
  if (max_seqs < 1) throw KernelError(fmt::format("kv_write: decode steps of {} sequences", max_seqs));
  std::vector<KernelRange> out = {{1, 1, {{kv_write_variant(kv)}}, "one sequence: its own KV write"}};
  if (max_seqs >= 2)
    out.push_back({2, max_seqs, {{kv_write_batched_variant(kv)}},
                   "a decode step's sequences in one launch, each row to its slot's caches at its position"});
  return out;
}

std::vector<Variant> attention_variants(const AttentionDims& d, int64_t context, int sms, KvPair kv, bool int8_query) {
  std::vector<Variant> out;  // the kernels in range order, then the merge
  for (const auto& r : choose_attention(d, context, 512, sms, default_tuning(90), kv, int8_query).ranges)
    if (std::find(out.begin(), out.end(), r.parts[0][0]) == out.end()) out.push_back(r.parts[0][0]);
  out.push_back(attn_merge_for(kv.v));
  return out;
}

}  // namespace qrig::kernels
