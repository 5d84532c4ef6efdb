// Causal gated GQA attention over the f16 KV cache on the GPU (CPU reference cpu::attention_gated, with the cache
// converted to f32): the kernels the plan names per range of a sequence's tokens (split-KV decode or tiled
// prefill, then attn_merge of the split partials; kernels/attention.h chooses them and the CTAs a launch aims
// at), the split of each call over the key range (kernels::attention_split) and the checked launches.
// kcache/vcache: fp16 bits [context][Hkv*hd], positions 0..pos0+T-1 written. q [T][Hq*hd] (normed, roped);
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
  AttentionKernels(const KernelLoader& load, const AttentionDims& d, int64_t context, const kernels::AttentionCtas& ctas,
                   const std::vector<ir::LaunchRange>& ranges);
  // workspace: kernels::attention_workspace_bytes(d, ctas, context, T) bytes, 256-byte aligned. pos0 + T <= context.
  void run(const float* q, const uint16_t* kcache, const uint16_t* vcache, int64_t T, int64_t pos0, float scale,
           const float* gate, int64_t gate_row_stride, int64_t gate_head_stride, float* out, void* workspace,
           StreamHandle stream) const;

 private:
  struct Range {
    int64_t first, last;
    LoadedKernel main, merge;
  };
  AttentionDims d_;
  int64_t context_;
  kernels::AttentionCtas ctas_;
  int64_t group_ = 1;
  std::vector<Range> ranges_;
};

}  // namespace qrig::cuda
