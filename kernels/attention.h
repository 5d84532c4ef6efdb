// Gated GQA attention kernels over the KV cache, keys and values each in f16, q8, t4 or t3 (kernels/kv_format.h;
// CPU reference cpu::attention_gated_kv): attn_decode (T <= N tokens per sequence, split over the keys, memory
// bound; over q8/t4/t3 keys attn_decode_dp4a, whose int8 query is a plan decision: the attention op's
// query_int8_tokens, and the CPU reference's int8_query), attn_prefill (blocks of query tokens, FFMA for Q.K, FFMA or HFMA2 for P.V, compute bound), attn_merge
// (log-sum-exp of the split partials + the output gate) and attn_merge_rot (the same for t4/t3 values, rotating
// the output back). Variants name both cache formats by their bits (k8_v3). Head dim 256 only. The choice (decode or prefill per tokens-per-sequence range, and how many CTAs a
// launch aims at, from the SMs and the kernels' residency in the tuning data) is made once per plan; the split
// of one call over the key range follows from those numbers and the call's key count (attention_split, used by
// the runtime per call and by the memory pass for the workspace bound).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/choice.h"
#include "kernels/kv_format.h"
#include "kernels/tuning.h"
#include "kernels/variant.h"

namespace qrig::kernels {

struct AttentionDims {
  int64_t Hq = 0, Hkv = 0, hd = 0;
};

constexpr int64_t kAttentionHeadDim = 256;     // the templates' only head dim
constexpr int64_t kAttentionPrefillRows = 32;  // (token, head) rows per prefill CTA
constexpr int64_t kAttentionTile = 32;         // keys per prefill tile
constexpr int64_t kAttentionMinTilesPerSplit = 8;
constexpr int64_t kAttentionDecodeRows = 8;     // most rows (G * N) of a decode CTA
constexpr int64_t kAttentionDecodeKeyStep = 32; // 4 warps x 8 keys
constexpr int64_t kAttentionDecodeThreads = 128, kAttentionPrefillThreads = 128, kAttentionMergeThreads = 256;
constexpr int64_t kAttentionDecodeDp4aThreads = 256;  // attn_decode_dp4a: 8 warps (one CTA of it per two of attn_decode)
constexpr int64_t kAttentionPrefillSmem = 65536;  // dynamic shared memory of attn_prefill (every cache format)
constexpr int64_t kAttentionMergeRotThreads = 128; // attn_merge_rot: one warp per (token, head)
// The dynamic shared memory of an attn_prefill variant (the same for every format; checks the variant's formats).
int64_t attention_prefill_smem(const Variant& prefill);
// A format's bits as the variants spell it (16, 8, 4, 3); throws KernelError for f32 (no CUDA kernels).
int64_t kv_format_param(KvFormat f);

// Query heads per KV head; throws KernelError for dims the kernels do not take.
int64_t attention_group(const AttentionDims& d);
// The most query tokens (per sequence) the decode kernel takes: 8 / group.
int64_t attention_decode_max_tokens(int64_t group);

// batched 1 (tokens 1): one launch over a decode step's sequences, each with its own position, caches and split.
Variant attn_decode_variant(int64_t group, int64_t tokens, KvPair kv = {}, int64_t batched = 0);
// The int8-query decode (attn_decode_dp4a; kv.k must be q8, t4 or t3, else KernelError).
Variant attn_decode_dp4a_variant(int64_t group, int64_t tokens, KvPair kv, int64_t batched = 0);
// Whether decode over these keys can take the int8 query (q8, t4 or t3 keys).
bool attention_int8_query(KvPair kv);
// The decode kernel: attn_decode_dp4a where int8_query and the keys are quantized, else attn_decode.
Variant attn_decode_for(int64_t group, int64_t tokens, KvPair kv, int64_t batched, bool int8_query);
Variant attn_prefill_variant(int64_t group, int64_t half, KvPair kv = {});
Variant attn_merge_variant(int64_t batched = 0);
Variant attn_merge_rot_variant(int64_t batched = 0);
// The merge for these values: attn_merge, or attn_merge_rot for t4/t3 (batched 1: of a batched attn_decode).
Variant attn_merge_for(KvFormat v, int64_t batched = 0);
// kv_write_f16 for k16v16, else kv_write_k<bits>_v<bits>_b0.
Variant kv_write_variant(KvPair kv);
// The KV write of a decode step's sequences in one launch: kv_write_k<bits>_v<bits>_b1 (k16v16 too: its f16 path
// rounds as kv_write_f16 does).
Variant kv_write_batched_variant(KvPair kv);
// The same kernel for other cache formats: an attn_decode(_dp4a) / attn_prefill / merge / kv_write variant with
// its formats replaced, batched or not as it was (the KV-format pass settles the formats after the kernel pass
// named them); a decode kernel becomes attn_decode_for(..., int8_query); any other variant unchanged.
Variant with_kv_formats(const Variant& v, KvPair kv, bool int8_query = true);

// How many CTAs the launches of one attention op aim at: decode with 1 token, decode with up to N tokens,
// prefill (the CTAs resident at once).
struct AttentionCtas {
  int64_t decode1 = 0, decode_n = 0, prefill = 0;
};

// How one call is cut: the decode kernel or the prefill kernel, and the number of key-range splits whose
// partials attn_merge combines (1: the kernel writes the output itself).
struct AttentionSplit {
  bool decode = false;
  int64_t n_split = 1;
  int64_t keys_per_split = 0;  // decode only
};
// decode: the call runs the decode kernel (T <= attention_decode_max_tokens), else the prefill kernel.
AttentionSplit attention_split(const AttentionDims& d, const AttentionCtas& c, int64_t T, int64_t kv_len, bool decode);
// Bytes of split partials (O, then (m, l)) for T tokens cut n_split ways, 256-byte aligned parts.
int64_t attention_partial_bytes(const AttentionDims& d, int64_t T, int64_t n_split);
// The most workspace any call of up to max_t tokens over up to `context` keys needs, and with decode_seqs >= 2 any
// batched decode launch over up to decode_seqs sequences (partials [split][seqs][Hq], up to ceil(decode1 / Hkv)
// splits each).
int64_t attention_workspace_bytes(const AttentionDims& d, const AttentionCtas& c, int64_t context, int64_t max_t,
                                  int64_t decode_seqs = 1);
// The split target of a batched decode launch: ceil(decode1 / Hkv), the splits attention_split allows one token;
// each sequence's own split is attention_split(d, c, 1, its keys, true).
int64_t attention_decode_split_target(const AttentionDims& d, const AttentionCtas& c);

struct AttentionChoice {
  std::vector<KernelRange> ranges;  // per tokens-per-sequence range: the kernel, then attn_merge
  AttentionCtas ctas;
};
// Decode (1 token, then up to N) and prefill, P.V in fp32 (the HFMA2 form measured ~14% faster at 32K on the
// H200 for ~1000x the error), CTA targets from `sms` and the tuning's residency. int8_query: decode over q8/t4/t3
// keys runs attn_decode_dp4a (the dp4a family's default; false: attn_decode, the fp32 query).
AttentionChoice choose_attention(const AttentionDims& d, int64_t context, int64_t max_tokens, int sms,
                                 const Tuning& t, KvPair kv = {}, bool int8_query = true);

// Decode steps of 1..max_seqs sequences of one token each (the op's decode_kernel attribute): one sequence runs
// its one-token kernels (choose_attention's first range), 2..max_seqs the batched decode + merge in one launch each.
std::vector<KernelRange> choose_attention_decode(const AttentionDims& d, int64_t max_seqs, KvPair kv = {},
                                                bool int8_query = true);
// The same for the KV write: kv_write_variant, then kv_write_batched_variant from 2 sequences.
std::vector<KernelRange> choose_kv_write_decode(KvPair kv, int64_t max_seqs);

// Every variant choose_attention names for these dims (decode with 1 and N tokens, prefill, merge), for tools and
// tests.
std::vector<Variant> attention_variants(const AttentionDims& d, int64_t context, int sms, KvPair kv = {},
                                       bool int8_query = true);

}  // namespace qrig::kernels
