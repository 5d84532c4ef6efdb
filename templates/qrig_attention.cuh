// Device helpers shared by the attention templates (attn_decode, attn_prefill, attn_merge): fp16 pairs to
// float, the half2 FMA, exp2 and the sigmoid of the output gate. sm_70 material only (HFMA2 is sm_53+).
#pragma once

#include "qrig_common.cuh"

#define QRIG_NEG_INF (-__int_as_float(0x7f800000))

// 2^x (MUFU.EX2, ~2 ulp); 2^-inf = 0. Scores are kept in log2 units (q is pre-scaled by scale * log2(e)).
__device__ __forceinline__ float qrig_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The two fp16 halves of a 32-bit word (low half first) as floats, exactly.
__device__ __forceinline__ void qrig_half2_to_float2(unsigned w, float& lo, float& hi) {
  unsigned short a, b;
  asm("mov.b32 {%0, %1}, %2;" : "=h"(a), "=h"(b) : "r"(w));
  lo = qrig_half_to_float(a);
  hi = qrig_half_to_float(b);
}

// Eight fp16 values (16 bytes) as floats.
__device__ __forceinline__ void qrig_half8_to_float(uint4 v, float* f) {
  qrig_half2_to_float2(v.x, f[0], f[1]);
  qrig_half2_to_float2(v.y, f[2], f[3]);
  qrig_half2_to_float2(v.z, f[4], f[5]);
  qrig_half2_to_float2(v.w, f[6], f[7]);
}

// A float rounded to fp16 and duplicated into both halves of a word: the broadcast operand of an HFMA2.
__device__ __forceinline__ unsigned qrig_float_to_half2_dup(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  unsigned w;
  asm("mov.b32 %0, {%1, %1};" : "=r"(w) : "h"(h));
  return w;
}

// a * b + c on two fp16 lanes at once (HFMA2, one rounding per lane).
__device__ __forceinline__ unsigned qrig_hfma2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The output gate: sigmoid with the accurate expf (the CPU reference uses std::exp).
__device__ __forceinline__ float qrig_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float4 qrig_zero4() {
  float4 z;
  z.x = z.y = z.z = z.w = 0.0f;
  return z;
}

__device__ __forceinline__ uint4 qrig_zero_u4() {
  uint4 z;
  z.x = z.y = z.z = z.w = 0u;
  return z;
}

// The split of one decode token's kv_len keys over at most `target` CTAs: keys per split a multiple of the decode
// kernel's 32-key step (4 warps x 8 keys), and the split count. kernels::attention_split (T = 1, target =
// ceil(decode1 / Hkv)) on the host, integer for integer: the batched decode and merge kernels (b1) compute each
// sequence's own split with it, so a sequence is cut as its own launch would cut it.
__device__ __forceinline__ int qrig_decode_splits(int kv_len, int target, int& keys_per_split) {
  const int per = (kv_len + target - 1) / target;
  keys_per_split = (per + 31) / 32 * 32;
  return (kv_len + keys_per_split - 1) / keys_per_split;
}
