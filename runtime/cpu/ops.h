// The fp32 reference ops of the CPU backend: the plain-C++ meaning of every IR op of a Qwen3.5 hybrid
// model (QWEN35.md), which the CPU executor runs and against which every GPU kernel is tested.
// Activations are row-major and token-major ([T][C]); everything is fp32 in and out, reductions
// accumulate in fp32 or double in a fixed order, and work is split over the global thread pool so that
// results are bit-identical for any thread count. Outputs must not alias inputs unless stated.
#pragma once

#include <cstdint>
#include <stdexcept>

#include "gguf/gguf.h"
#include "kernels/kv_format.h"

namespace qrig::cpu {

// Inconsistent shapes, unsupported types or out-of-range ids given to an op.
struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A 2-D GGUF weight: ne = [in, out]; row o (one output) is `in` contiguous values of `type`.
struct Matrix {
  gguf::TensorType type;
  const uint8_t* data;
  int64_t in;
  int64_t out;
};

// out[T][table.in] = the rows of `tokens`; throws OpError naming the id when one is outside [0, out).
void embed(const Matrix& table, const int32_t* tokens, int64_t T, float* out);

// out = x * rsqrt(mean(x^2) + eps) * w per token (GGUF weights already carry the +1). May run in place.
void rmsnorm(const float* x, const float* w, int64_t T, int64_t D, float eps, float* out);

// out[t][o] = sum_i x[t][i] * W[o][i]; W of any type gguf::can_dequantize() accepts (F32, F16, BF16, Q8_0,
// the K-quants, Q4_0..Q5_1, IQ4_NL/XS), each row dequantized once and reused for all T tokens.
void matmul(const Matrix& w, const float* x, int64_t T, float* out);

// The activation quantization of the GPU's dp4a matmuls (templates/quant_act_q8.cu, bit for bit): per 32
// consecutive values d = amax / 127, q = clamp(roundf(x * (1 / d)), -127, 127) in fp32; an all-zero block gives
// d = 0, q = 0; a block holding a NaN or inf gets d = NaN, q = 0. n must be a multiple of 32.
// With q2 (the second plane of the precise matmuls, "p2"): the residual r = fmaf(-q, d, x) (exact) quantized
// on the step d/254: q2 = clamp(roundf(r * (1/d * 254)), -127, 127); the activation is then d * (q + q2/254),
// about 15 bits per value instead of 8. q2 = 0 where q is.
void quantize_q8_activation(const float* x, int64_t n, int8_t* q, float* d, int8_t* q2 = nullptr);

// Elementwise; may run in place.
void add(const float* a, const float* b, int64_t n, float* out);
// out = silu(gate) * up elementwise; may run in place.
void swiglu(const float* gate, const float* up, int64_t n, float* out);
// Rows side by side: out[t] = [a[t] (wa values) ; b[t] (wb values)] for T rows (the MTP draft head's concat op).
// out must not alias a or b.
void concat_rows(const float* a, int64_t wa, const float* b, int64_t wb, int64_t T, float* out);

// Causal depthwise conv over time + SiLU. x[T][C]; w[C][K] (tap index fastest, as GGUF ssm_conv1d
// ne = [K, C]); tap K-1 multiplies the current input. state[K-1][C] holds the previous K-1 inputs
// (oldest first): read, then updated in place to the last K-1 inputs. out must not alias x.
void conv1d_causal_silu(const float* x, int64_t T, int64_t C, const float* w, int64_t K, float* state,
                        float* out);

struct GdnShape {
  int64_t Hk, Hv, dk, dv;  // key heads, value heads, key head dim, value head dim
};

// Gated DeltaNet (QWEN35.md steps 3-5). mixed[T][2*Hk*dk + Hv*dv] = conv output [q | k | v];
// alpha[T][Hv], beta[T][Hv] = raw projections (ssm_alpha, ssm_beta outputs); ssm_a[Hv]
// (= -exp(A_log)), dt_bias[Hv]; state[Hv][dk][dv], read and updated in place; out[T][Hv*dv].
// Value head j uses key head (j % Hk) (GGUF order). q and k are L2-normalised per head
// (x / sqrt(sum x^2 + 1e-6)), q *= 1/sqrt(dk), beta = sigmoid(beta_raw),
// g = ssm_a * softplus(alpha + dt_bias). Token-serial recurrence.
void gdn_recurrent(const GdnShape& s, const float* mixed, const float* alpha, const float* beta,
                   const float* ssm_a, const float* dt_bias, int64_t T, float* state, float* out);

// Same math, QWEN35.md's chunked algorithm (chunks of `chunk` tokens, the last may be partial).
void gdn_chunked(const GdnShape& s, const float* mixed, const float* alpha, const float* beta,
                 const float* ssm_a, const float* dt_bias, int64_t T, float* state, float* out,
                 int64_t chunk = 64);

// Gated RMSNorm per head (QWEN35.md GDN step 7): out = w * o/rms(o) * silu(z); o, z, out [T][H*dv],
// w[dv] shared by heads.
void gated_rmsnorm(const float* o, const float* z, const float* w, int64_t T, int64_t H, int64_t dv,
                   float eps, float* out);

// Per-head RMSNorm reading head h of token t at x[t*row_stride + h*head_stride + head_offset + i],
// i < hd; writes out[T][H*hd] contiguous. (q: row_stride = 2*Hq*hd, head_stride = 2*hd, offset 0;
// k: Hkv*hd, hd, 0.)
void head_rmsnorm(const float* x, int64_t row_stride, int64_t head_stride, int64_t head_offset,
                  const float* w, int64_t T, int64_t H, int64_t hd, float eps, float* out);

// Partial NeoX RoPE in place on x[T][H*hd]: for i < rope_dims/2 rotate the pair (i, i + rope_dims/2)
// of each head by angle pos[t] * theta^(-2i/rope_dims) (angles computed in double); dims >= rope_dims
// untouched.
void rope_neox(float* x, const int32_t* pos, int64_t T, int64_t H, int64_t hd, int64_t rope_dims,
               float theta);

// Causal GQA attention with a sigmoid output gate. q[T][Hq*hd] (normed and roped); kcache/vcache rows
// [n_kv][Hkv*hd] for positions 0..pos0+T-1 (the new tokens already written). Token t sits at position
// pos0+t and attends to positions 0..pos0+t; q head h uses kv head h / (Hq/Hkv).
// out[t][h*hd+i] = (softmax(scale * q.K^T) V)[i] * sigmoid(gate[t*gate_row_stride + h*gate_head_stride + i]).
void attention_gated(const float* q, const float* kcache, const float* vcache, int64_t T, int64_t pos0,
                     int64_t Hq, int64_t Hkv, int64_t hd, float scale, const float* gate,
                     int64_t gate_row_stride, int64_t gate_head_stride, float* out);

// ---- quantized key and value caches (kernels/kv_format.h: formats and row layout; docs/kv-cache.md) --------
// The references for the GPU's KV write and attention kernels over q8, t4 and t3 caches.

// y = R x and x = R^T y for one 256-value vector: the random-sign Walsh-Hadamard rotation of vector `block`
// (the kv head when head_dim is 256) of layer `layer`. y may alias x.
void kv_rotate(const float* x, int64_t layer, int64_t block, float* y);
void kv_unrotate(const float* y, int64_t layer, int64_t block, float* x);

// One cache row of `width` values (one position, all kv heads) into kernels::kv_row_bytes(f, width, true) bytes
// (f = q8, t4 or t3; padding bytes zero), and back. layer: the attention layer (t4/t3 rotation seeds).
// Non-finite inputs give non-finite outputs (a q8 block's or a t vector's scale is NaN), never a crash.
void kv_quantize_row(kernels::KvFormat f, const float* x, int64_t width, int64_t layer, uint8_t* row);
void kv_dequantize_row(kernels::KvFormat f, const uint8_t* row, int64_t width, int64_t layer, float* x);

// A key or value cache as the attention reads it: rows of row_bytes bytes, position p at data + p * row_bytes.
// f32 and f16 caches hold fp32 values (row_bytes = 4 x width).
struct KvCacheView {
  kernels::KvFormat format = kernels::KvFormat::f32;
  const uint8_t* data = nullptr;
  int64_t row_bytes = 0;
};

// attention_gated over caches of any format. t4/t3 keys: the query is rotated once per (token, head) and scored
// against the codebook levels in the rotated domain (q.k = Rq.Rk); t4/t3 values: probabilities times the
// rotated levels are accumulated and the output is rotated back once per (token, head). Rows are expanded (codes
// to levels, int8 to floats) once per call, 512 positions at a time, under an online softmax: the transient
// memory stays small at any context. f32/f16 both: exactly attention_gated.
// int8_query (q8/t4/t3 keys only; the plan's query_int8_tokens, the numerics of attn_decode_dp4a): each (token,
// head)'s query is scaled by float(scale * log2 e), rotated for t4/t3 keys, and quantized per 32 values to int8
// (d = amax / 127, rint(x / d)); scores are int32 dots with the int8 keys (q8 as stored, t4/t3 as
// kernels::kv_key_levels_i8) folded with the block scales in the kernel's order, in log2 units under exp2.
void attention_gated_kv(const float* q, const KvCacheView& k, const KvCacheView& v, int64_t layer, int64_t T,
                        int64_t pos0, int64_t Hq, int64_t Hkv, int64_t hd, float scale, const float* gate,
                        int64_t gate_row_stride, int64_t gate_head_stride, float* out, bool int8_query = false);

}  // namespace qrig::cpu
