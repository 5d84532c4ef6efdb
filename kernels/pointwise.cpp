// Registry entries and the default family's variants of the pointwise and row kernels (see pointwise.h).
#include "kernels/pointwise.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/matmul.h"
#include "kernels/registry.h"

namespace qrig::kernels {

namespace {

int64_t pow2_at_most(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

std::vector<TemplateInfo> pointwise_templates() {
  return {
      {"rmsnorm_f32", "rmsnorm_f32.cu",
       {{"d", "QRIG_D", 4, 65536, 4, "row length"},
        {"q", "QRIG_QUANT", 0, 2, 1, "also quantize the output for the matmuls it feeds: 0 no, 1 or 2 planes"},
        threads_param()},
       "out = x * rsqrt(mean(x^2) + eps) * w per row of f32 (+ quant_act_q8 of out, fused); one block per row"},
      {"add_rmsnorm_q8", "add_rmsnorm_q8.cu",
       {{"d", "QRIG_D", 32, 65536, 32, "row length"}, planes_param(), threads_param()},
       "sum = a + b per row of f32, and rmsnorm_f32 q<p> of the sum's row quantized (no f32 normed row); one block "
       "per row"},
      {"embed_q8_0", "embed_q8_0.cu",
       {{"d", "QRIG_D", 32, 65536, 32, "row length"}, threads_param()},
       "rows of a repacked Q8_0 table -> f32, one block per token; ids out of range give NaN rows"},
      {"embed_wq", "embed_wq.cu",
       {{"w", "QRIG_WTYPE", 2, 23, 1, "table type (ggml type id, a type gemm_wq_dp4a_skinny decodes)"},
        {"d", "QRIG_D", 32, 65536, 32, "row length"}, threads_param()},
       "rows of a repacked GGUF block-type table (Q4_0 .. Q6_K, IQ4) -> f32 bit for bit as the reference "
       "dequantizes them, one block per token; ids out of range give NaN rows"},
      {"add_f32", "add_f32.cu", {threads_param()}, "residual add of f32 vectors (float4)"},
      {"swiglu_f32", "swiglu_f32.cu", {threads_param()}, "silu(gate) * up of f32 vectors (float4)"},
      {"swiglu_q8", "swiglu_q8.cu", {planes_param(), threads_param()},
       "silu(gate) * up quantized as quant_act_q8 (the f32 product is not written), 8 lanes per 32 values, grid-stride"},
      {"concat_f32", "concat_f32.cu", {threads_param()},
       "rows of two f32 values side by side (the MTP draft head's [enorm(e) ; hnorm(h)]), grid-stride"},
      {"conv1d_silu_f32", "conv1d_silu_f32.cu",
       {{"k", "QRIG_K", 2, 8, 1, "taps"}, batched_param(), threads_param()},
       "causal depthwise conv over time + SiLU with a carried window, one thread per channel (b1: x sequences)"},
      {"head_rmsnorm_f32", "head_rmsnorm_f32.cu",
       {{"d", "QRIG_D", 32, 1024, 32, "head dim"}, threads_param()},
       "RMSNorm per head of strided heads (q/k norms), one warp per token and head"},
      {"gated_rmsnorm_f32", "gated_rmsnorm_f32.cu",
       {{"d", "QRIG_D", 32, 1024, 32, "head dim"}, threads_param()},
       "w * rmsnorm(o) * silu(z) per head (GDN output norm), one warp per token and head"},
      {"rope_neox_f32", "rope_neox_f32.cu",
       {{"d", "QRIG_D", 2, 1024, 2, "head dim"}, {"r", "QRIG_R", 2, 1024, 2, "rotated dims"}, threads_param()},
       "partial NeoX RoPE (out may equal in), fp64 angles, one block per token"},
      {"kv_write_f16", "kv_write_f16.cu", {threads_param()}, "append keys and values to the fp16 KV cache"},
      {"argmax_f32", "argmax_f32.cu", {threads_param()}, "index of the largest logit per row (greedy sampling)"},
  };
}

Variant rmsnorm_f32_variant(int64_t d, int64_t quant_planes) {
  return make_variant("rmsnorm_f32",
                      {{"d", d}, {"q", quant_planes}, {"t", std::clamp<int64_t>(pow2_at_most(d / 4), 32, 256)}});
}
Variant embed_q8_0_variant(int64_t d) {
  return make_variant("embed_q8_0", {{"d", d}, {"t", std::clamp<int64_t>(pow2_at_most(d / 16), 32, 256)}});
}
Variant embed_wq_variant(int64_t ggml_type, int64_t d) {
  if (!wq_dp4a_type(ggml_type)) throw KernelError(fmt::format("embed_wq: table type {} has no dp4a decode", ggml_type));
  if (d % wq_block_values(ggml_type) != 0)
    throw KernelError(fmt::format("embed_wq: rows of {} values are not whole {}-value blocks", d, wq_block_values(ggml_type)));
  return make_variant("embed_wq", {{"w", ggml_type}, {"d", d}, {"t", std::clamp<int64_t>(pow2_at_most(d / 32), 32, 256)}});
}
Variant add_f32_variant() { return make_variant("add_f32", {{"t", 256}}); }
Variant swiglu_f32_variant() { return make_variant("swiglu_f32", {{"t", 256}}); }
Variant add_rmsnorm_q8_variant(int64_t d, int64_t planes) {
  // The block size of rmsnorm_f32 for the row: the same per-thread slices and reduction order, so the same bits.
  return make_variant("add_rmsnorm_q8",
                      {{"d", d}, {"p", planes}, {"t", std::clamp<int64_t>(pow2_at_most(d / 4), 32, 256)}});
}
Variant swiglu_q8_variant(int64_t planes) { return make_variant("swiglu_q8", {{"p", planes}, {"t", 256}}); }
Variant concat_f32_variant() { return make_variant("concat_f32", {{"t", 256}}); }
Variant conv1d_silu_f32_variant(int64_t taps, int64_t batched) {
  return make_variant("conv1d_silu_f32", {{"k", taps}, {"b", batched}, {"t", 128}});
}
std::vector<KernelRange> choose_conv1d_silu_decode(int64_t taps, int64_t max_seqs) {
  if (max_seqs < 1) throw KernelError(fmt::format("conv1d_silu: decode steps of {} sequences", max_seqs));
  std::vector<KernelRange> out = {{1, 1, {{conv1d_silu_f32_variant(taps)}}, "one sequence: its own launch"}};
  if (max_seqs >= 2)
    out.push_back({2, max_seqs, {{conv1d_silu_f32_variant(taps, 1)}},
                   "a decode step's sequences in one launch (grid.y over sequences, each its slot's window)"});
  return out;
}
Variant head_rmsnorm_f32_variant(int64_t hd) { return make_variant("head_rmsnorm_f32", {{"d", hd}, {"t", 128}}); }
Variant gated_rmsnorm_f32_variant(int64_t hd) { return make_variant("gated_rmsnorm_f32", {{"d", hd}, {"t", 128}}); }
Variant rope_neox_f32_variant(int64_t hd, int64_t rd) {
  return make_variant("rope_neox_f32", {{"d", hd}, {"r", rd}, {"t", 128}});
}
Variant kv_write_f16_variant() { return make_variant("kv_write_f16", {{"t", 256}}); }
Variant argmax_f32_variant() { return make_variant("argmax_f32", {{"t", 1024}}); }

}  // namespace qrig::kernels
