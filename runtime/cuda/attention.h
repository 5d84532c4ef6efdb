// Causal gated GQA attention over the f16 KV cache (CPU reference cpu::attention_gated, with the cache
// converted to f32): FlashAttention-style prefill (one CTA per KV head and block of query tokens, all query
// heads of the group, online softmax in fp32) and split-KV decode (the KV length split across CTAs, partial
// max/sum/O merged by log-sum-exp) so long contexts use the whole GPU. Default family: FP32/HFMA2, no tensor
// cores. kcache/vcache: fp16 bits [context][Hkv*hd] (the plan's kv state f16[2,C,Hkv*hd]: keys then values),
// positions 0..pos0+T-1 written. q [T][Hq*hd] (normed, roped); token t sits at pos0 + t and attends to
// 0..pos0+t; q head h uses KV head h / (Hq/Hkv). out[t][h*hd+i] = (softmax(scale q.K^T) V)[i] *
// sigmoid(gate[t*gate_row_stride + h*gate_head_stride + i]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/cuda/launch.h"

namespace qrig::cuda {

struct AttentionDims {
  int64_t Hq = 0, Hkv = 0, hd = 0;
};

// Every variant run() may launch for these dims, up to `context` positions, on a GPU with `sms` SMs.
std::vector<Variant> attention_variants(const AttentionDims& d, int64_t context, int sms);

class AttentionKernels {
 public:
  AttentionKernels(const KernelLoader& load, const AttentionDims& d, int64_t context, int sms);
  // Device scratch run() needs for up to max_t query tokens (split-KV partials etc.).
  size_t workspace_bytes(int64_t max_t) const;
  // workspace: workspace_bytes(T) bytes, 256-byte aligned. pos0 + T <= context.
  void run(const float* q, const uint16_t* kcache, const uint16_t* vcache, int64_t T, int64_t pos0, float scale,
           const float* gate, int64_t gate_row_stride, int64_t gate_head_stride, float* out, void* workspace,
           cudaStream_t stream) const;

 private:
  // How one call is cut: the decode kernel (T <= decode_tokens_) or the prefill kernel, and the number of
  // key-range splits whose partials attn_merge combines (1: the kernel writes out itself).
  struct Split {
    bool decode = false;
    int64_t n_split = 1;
    int64_t keys_per_split = 0;  // decode only
  };
  Split split_for(int64_t T, int64_t kv_len) const;
  size_t partial_bytes(int64_t T, int64_t n_split) const;

  AttentionDims d_;
  int64_t context_;
  int sms_;
  std::vector<LoadedKernel> kernels_;  // decode (n = 1), decode (n = decode_tokens_), prefill, merge
  int64_t group_ = 1;                  // Hq / Hkv
  int64_t decode_tokens_ = 1;          // the decode kernel takes T <= this
  int64_t decode_ctas_[2] = {0, 0};    // CTAs a decode launch aims at (T = 1, T > 1)
  int64_t prefill_ctas_ = 0;           // prefill CTAs resident at once on the GPU
};

}  // namespace qrig::cuda
