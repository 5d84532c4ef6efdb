// Causal gated GQA attention over the KV cache on the GPU, keys and values each f16, q8, t4 or t3 (CPU reference
// cpu::attention_gated_kv; for f16 attention_gated with the cache converted to f32): the kernels the plan names
// per range of a sequence's tokens (split-KV decode or tiled prefill, then attn_merge / attn_merge_rot of the
// split partials; kernels/attention.h chooses them and the CTAs a launch aims at), the split of each call over
// the key range (kernels::attention_split) and the checked launches; and the KV write (launch_kv_write).
// kcache/vcache: rows of kernels::kv_row_bytes(format, Hkv*hd, false) bytes [context], positions 0..pos0+T-1
// written; t4/t3 rotations are those of (layer, KV head). q [T][Hq*hd] (normed, roped);
// token t sits at pos0 + t and attends to 0..pos0+t; q head h uses KV head h / (Hq/Hkv). out[t][h*hd+i] =
// (softmax(scale q.K^T) V)[i] * sigmoid(gate[t*gate_row_stride + h*gate_head_stride + i]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ir/kernel_attr.h"
#include "kernels/attention.h"
#include "runtime/cuda/launch.h"

namespace qrig::cuda {

using kernels::AttentionDims;

class AttentionKernels {
 public:
  // ranges: per range of tokens [attn_decode, attn_decode_dp4a (q8/t4/t3 keys, the int8 query) or attn_prefill,
  // then attn_merge(_rot)]; ctas: the plan's split targets.
  // kv: the caches' formats (the variants must name them); layer: the rotation's (t4/t3).
  AttentionKernels(const KernelLoader& load, const AttentionDims& d, int64_t context, const kernels::AttentionCtas& ctas,
                   const std::vector<ir::LaunchRange>& ranges, kernels::KvPair kv = {}, int64_t layer = 0);
  // workspace: kernels::attention_workspace_bytes(d, ctas, context, T) bytes, 256-byte aligned. pos0 + T <= context.
  void run(const float* q, const void* kcache, const void* vcache, int64_t T, int64_t pos0, float scale,
           const float* gate, int64_t gate_row_stride, int64_t gate_head_stride, float* out, void* workspace,
           StreamHandle stream) const;
  kernels::KvPair kv() const { return kv_; }
  // The most tokens of a call whose query the plan's kernels quantize to int8 (its attn_decode_dp4a ranges); 0 for
  // none. The executor checks it against the op's query_int8_tokens (what the CPU backend computes).
  int64_t int8_query_tokens() const { return int8_tokens_; }

 private:
  struct Range {
    int64_t first, last;
    LoadedKernel main, merge;
  };
  AttentionDims d_;
  int64_t context_;
  kernels::AttentionCtas ctas_;
  int64_t group_ = 1;
  kernels::KvPair kv_;
  int64_t layer_ = 0;
  int64_t int8_tokens_ = 0;
  std::vector<Range> ranges_;
};

// A decode step of several sequences, one token each, in one launch of the batched decode kernel and (when a
// sequence's keys are split) one of the batched merge (the plan's decode_kernel attribute names them). Sequence z
// (row z of q, gate and out) attends over its slot's caches, kc_of / vc_of[seq_slot[z]] (device tables of the
// slots' caches of this layer), to position seq_pos[z] (device) = pos[z] (the same, on the host: the grid covers
// the largest split count), cut as kernels::attention_split cuts its own one-token call, so its output is bit for
// bit what AttentionKernels::run gives it alone. workspace: kernels::attention_workspace_bytes(..., decode_seqs)
// for at least pos.size() sequences.
class BatchedDecodeAttention {
 public:
  BatchedDecodeAttention(const KernelLoader& load, const AttentionDims& d, int64_t context,
                         const kernels::AttentionCtas& ctas, const std::string& decode, const std::string& merge,
                         kernels::KvPair kv = {}, int64_t layer = 0);
  void run(const float* q, const void* const* kc_of, const void* const* vc_of, const int32_t* seq_slot,
           const int32_t* seq_pos, const std::vector<int64_t>& pos, float scale, const float* gate,
           int64_t gate_row_stride, int64_t gate_head_stride, float* out, void* workspace, StreamHandle stream) const;
  const Variant& decode_variant() const { return decode_.variant; }
  const Variant& merge_variant() const { return merge_.variant; }

 private:
  AttentionDims d_;
  int64_t context_;
  kernels::AttentionCtas ctas_;
  int64_t group_ = 1;
  kernels::KvPair kv_;
  int64_t layer_ = 0;
  int64_t target_ = 1;  // kernels::attention_decode_split_target
  LoadedKernel decode_, merge_;
};

// Appends T tokens' keys and values (f32 [T][W], W = Hkv*256 for quantized caches) at positions pos0.. of the
// caches with kernel k (kv_write_f16 for k16v16, else kv_write_k<bits>_v<bits>, naming kv's formats).
void launch_kv_write(const LoadedKernel& k, const float* kin, const float* vin, void* kcache, void* vcache,
                     int64_t pos0, int64_t T, int64_t W, int64_t layer, kernels::KvPair kv, StreamHandle s);
// The same for a decode step of `seqs` sequences of one token each in one launch (kv_write b1, any formats, k16v16
// too): row z to position seq_pos[z] of the caches kc_of / vc_of[seq_slot[z]] (device arrays).
void launch_kv_write_batched(const LoadedKernel& k, const float* kin, const float* vin, void* const* kc_of,
                             void* const* vc_of, const int32_t* seq_slot, const int32_t* seq_pos, int64_t seqs,
                             int64_t W, int64_t layer, kernels::KvPair kv, StreamHandle s);

}  // namespace qrig::cuda
