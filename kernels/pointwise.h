// Pointwise and row kernels of the default family (no tensor cores): RMSNorm (with the activation
// quantization fused in, for the matmuls it feeds), the Q8_0 embedding, residual add (alone, or with the next
// quantized RMSNorm fused in), SwiGLU (alone, or quantized for its matmul), the causal
// conv1d + SiLU, per-head and gated norms, the draft head's row concatenation, partial NeoX RoPE, the f16 KV write and the greedy argmax. Each
// builder returns the variant the default family runs for a shape (the block size is chosen here, from the
// row length); the compiler's kernel pass calls them, the runtime only loads what the plan names.
#pragma once

#include <cstdint>

#include <vector>

#include "kernels/choice.h"
#include "kernels/variant.h"

namespace qrig::kernels {

// Rows of d floats; quant_planes > 0: also the output quantized for matmuls (1 or 2 planes, as quant_act_q8).
Variant rmsnorm_f32_variant(int64_t d, int64_t quant_planes = 0);
Variant embed_q8_0_variant(int64_t d);  // Q8_0 rows of d values -> f32
Variant embed_wq_variant(int64_t ggml_type, int64_t d);  // rows of a GGUF block type (kernels/matmul.h wq_*) -> f32
Variant add_f32_variant();
Variant swiglu_f32_variant();
// Fusions into the activation quantization of the matmuls (1 or 2 planes, as quant_act_q8): the residual add and
// rmsnorm_f32 of the sum (rows of d floats; the sum is written too), and swiglu (the f32 product is not written).
Variant add_rmsnorm_q8_variant(int64_t d, int64_t planes);
Variant swiglu_q8_variant(int64_t planes);
Variant concat_f32_variant();  // the MTP draft head's concat (docs/speculative.md)
// batched 1: one launch over a decode step's sequences (templates/conv1d_silu_f32.cu).
Variant conv1d_silu_f32_variant(int64_t taps, int64_t batched = 0);
// Decode steps of 1..max_seqs sequences of one token each (the op's decode_kernel attribute): the b0 conv for one,
// the b1 conv in one launch for 2..max_seqs.
std::vector<KernelRange> choose_conv1d_silu_decode(int64_t taps, int64_t max_seqs);
Variant head_rmsnorm_f32_variant(int64_t head_dim);
Variant gated_rmsnorm_f32_variant(int64_t head_dim);
Variant rope_neox_f32_variant(int64_t head_dim, int64_t rope_dims);
Variant kv_write_f16_variant();
Variant argmax_f32_variant();

}  // namespace qrig::kernels
