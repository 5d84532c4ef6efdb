// The small kernels of the default family between the matmuls: residual add (alone, or fused with the next
// quantized RMSNorm), SwiGLU (alone, or fused with its quantization), the GDN input conv,
// per-head RMSNorms (q/k norms, the GDN gated output norm), partial NeoX RoPE, the fp16 KV-cache append and
// greedy argmax. Typed, checked launchers (device pointers only; the variants come from the plan, chosen by
// kernels/pointwise.h); each template's header names its CPU reference op.
#pragma once

#include <cstdint>

#include "runtime/cuda/launch.h"

namespace qrig::cuda {

// out = a + b over n values (n % 4 == 0, 16-byte aligned; out may equal a or b).
void launch_add_f32(const LoadedKernel& k, const float* a, const float* b, float* out, int64_t n, StreamHandle s);
// out = silu(gate) * up over n values (n % 4 == 0, 16-byte aligned; out may equal gate or up).
void launch_swiglu_f32(const LoadedKernel& k, const float* gate, const float* up, float* out, int64_t n,
                       StreamHandle s);
// The residual add fused with the next quantized RMSNorm (add_rmsnorm_q8): sum = a + b over `rows` rows of width
// (= variant.d) floats, and the rows of the sum normalised by w (eps) and quantized for the matmuls into xq/xd (and
// xq2 for p = 2; ignored, and may be null, for p = 1), bit-identical to launch_add_f32 then launch_rmsnorm_quant_f32
// of the sum (whose normalised f32 rows this kernel does not write). sum may equal a or b; 16-byte aligned rows.
void launch_add_rmsnorm_q8(const LoadedKernel& k, const float* a, const float* b, float* sum, const float* w,
                           int64_t rows, int64_t width, float eps, int8_t* xq, float* xd, int8_t* xq2, StreamHandle s);
// SwiGLU fused with the activation quantization (swiglu_q8): silu(gate) * up over n values (n % 32 == 0, 16-byte
// aligned) quantized into xq[n] / xd[n/32] (and xq2[n] for p = 2; ignored, and may be null, for p = 1),
// bit-identical to launch_swiglu_f32 then launch_quant_act_q8 (the f32 product is not written).
void launch_swiglu_q8(const LoadedKernel& k, const float* gate, const float* up, int64_t n, int8_t* xq, float* xd,
                      int8_t* xq2, StreamHandle s);
// cpu::conv1d_causal_silu: x/out [T][C], w [C][K], state [K-1][C] (variant.k == K). A verify step of speculative
// decoding also keeps the window after each of its first `keep` tokens (keep < T) at kept + t * kept_stride floats.
void launch_conv1d_silu_f32(const LoadedKernel& k, const float* x, int64_t T, int64_t C, const float* w,
                            float* state, float* out, StreamHandle s, float* kept = nullptr, int64_t keep = 0,
                            int64_t kept_stride = 0);
// The same for a decode step of `seqs` sequences of one token each in one launch (a b1 variant): x/out [seqs][C],
// sequence z's state at rec_of[seq_slot[z]] + state_offset floats (rec_of: the slots' recurrent-state images,
// seq_slot: the step's slots, both device arrays). Each sequence gets the bits of launch_conv1d_silu_f32 on its own.
void launch_conv1d_silu_batched(const LoadedKernel& k, const float* x, int64_t seqs, int64_t C, const float* w,
                                float* const* rec_of, const int32_t* seq_slot, int64_t state_offset, float* out,
                                StreamHandle s);
// cpu::concat_rows: out [n][wa + wb] = [a [n][wa] ; b [n][wb]] (out aliases neither).
void launch_concat_f32(const LoadedKernel& k, const float* a, int64_t wa, const float* b, int64_t wb, int64_t n,
                       float* out, StreamHandle s);
// cpu::head_rmsnorm (variant.d == head dim).
void launch_head_rmsnorm_f32(const LoadedKernel& k, const float* x, int64_t row_stride, int64_t head_stride,
                             int64_t head_offset, const float* w, int64_t T, int64_t heads, float eps, float* out,
                             StreamHandle s);
// cpu::gated_rmsnorm over T*heads rows of variant.d values.
void launch_gated_rmsnorm_f32(const LoadedKernel& k, const float* o, const float* z, const float* w, int64_t T,
                              int64_t heads, float eps, float* out, StreamHandle s);
// out = cpu::rope_neox applied to a copy of in (out may equal in); pos [T] int32 on the device; inv_freq
// [rope_dims/2] doubles on the device (rope_inv_freq below).
void launch_rope_neox_f32(const LoadedKernel& k, const float* in, float* out, const int32_t* pos, int64_t T,
                          int64_t heads, const double* inv_freq, StreamHandle s);
std::vector<double> rope_inv_freq(int64_t rope_dims, float theta);  // theta^(-2i/rope_dims), i < rope_dims/2
// kcache/vcache rows pos0..pos0+T-1 (of W fp16 values) = k/v [T][W] rounded to fp16. W even.
void launch_kv_write_f16(const LoadedKernel& k, const float* kin, const float* vin, uint16_t* kcache,
                         uint16_t* vcache, int64_t pos0, int64_t T, int64_t W, StreamHandle s);
// out[r] = argmax of logits[r*row_stride .. + n_valid) for `rows` rows.
void launch_argmax_f32(const LoadedKernel& k, const float* logits, int64_t rows, int64_t row_stride, int64_t n_valid,
                       int32_t* out, StreamHandle s);

}  // namespace qrig::cuda
