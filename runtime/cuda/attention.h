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
#include <vector>

#include "ir/kernel_attr.h"
#include "kernels/attention.h"
#include "runtime/cuda/launch.h"

namespace qrig::cuda {

using kernels::AttentionDims;

class AttentionKernels {
 public:
  // ranges: per range of tokens [attn_decode or attn_prefill, attn_merge]; ctas: the plan's split targets.
  // kv: the caches' formats (the variants must name them); layer: the rotation's (t4/t3).
  AttentionKernels(const KernelLoader& load, const AttentionDims& d, int64_t context, const kernels::AttentionCtas& ctas,
                   const std::vector<ir::LaunchRange>& ranges, kernels::KvPair kv = {}, int64_t layer = 0);
  // workspace: kernels::attention_workspace_bytes(d, ctas, context, T) bytes, 256-byte aligned. pos0 + T <= context.
  void run(const float* q, const void* kcache, const void* vcache, int64_t T, int64_t pos0, float scale,
           const float* gate, int64_t gate_row_stride, int64_t gate_head_stride, float* out, void* workspace,
           StreamHandle stream) const;
  kernels::KvPair kv() const { return kv_; }

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
  std::vector<Range> ranges_;
};

// Appends T tokens' keys and values (f32 [T][W], W = Hkv*256 for quantized caches) at positions pos0.. of the
// caches with kernel k (kv_write_f16 for k16v16, else kv_write_k<bits>_v<bits>, naming kv's formats).
void launch_kv_write(const LoadedKernel& k, const float* kin, const float* vin, void* kcache, void* vcache,
                     int64_t pos0, int64_t T, int64_t W, int64_t layer, kernels::KvPair kv, StreamHandle s);

}  // namespace qrig::cuda
