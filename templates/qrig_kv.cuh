// Device helpers for the quantized key and value caches (kernels/kv_format.h is the definition; docs/kv-cache.md
// explains the choices): the rotation's signs (the same splitmix64 as kernels::kv_rotation_signs), the 256-point
// Walsh-Hadamard transform held by one warp (lane l owns coordinates 8l..8l+7: butterflies 1, 2, 4 in registers,
// 8..128 by shuffles, in the CPU reference's stage order so the sums are the same), the codebooks, and the loads
// of one lane's 8 values of a head vector in each format (QRIG_KF / QRIG_VF spell a format by its bits: 16 f16,
// 8 q8, 4 t4, 3 t3). A row (one position, every KV head) is laid out as kernels::kv_row_bytes(f, width, false):
//   f16  width halves;
//   q8   width int8, then width/32 fp16 scales (head h's 8 scales at byte width + 16h);
//   t4   per head 128 bytes of nibbles (value 2i low nibble of byte i), then one fp32 scale per head;
//   t3   per head 96 bytes (8 values per 24-bit little-endian word, value j at bits 3j), then the fp32 scales.
#pragma once

#include "qrig_attention.cuh"

#define QRIG_KV_ROTATED(f) ((f) == 4 || (f) == 3)

// Bytes of a head's codes (t4/t3) and of the values before the scales (the codes of every head / the int8s).
__device__ __forceinline__ int qrig_kv_code_bytes(int f) { return f == 4 ? 128 : 96; }

// kernels::kv_rotation_signs: splitmix64 of (layer << 22) ^ (head << 2) ^ word.
__device__ __forceinline__ unsigned long long qrig_kv_signs(int layer, int head, int word) {
  unsigned long long z = ((unsigned long long)layer << 22) ^ ((unsigned long long)head << 2) ^ (unsigned long long)word;
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Sign bits of coordinates 8*lane..8*lane+7 of (layer, head): bit e set = coordinate 8*lane+e is negated.
__device__ __forceinline__ unsigned qrig_kv_sign_byte(int layer, int head, int lane) {
  return (unsigned)(qrig_kv_signs(layer, head, lane >> 3) >> (8 * (lane & 7))) & 0xFFu;
}

// Unnormalized Walsh-Hadamard transform of the warp's 256 values (x[e] = coordinate 8*lane + e); every lane of
// the warp must call it.
__device__ __forceinline__ void qrig_fwht256_warp(float (&x)[8], int lane) {
#pragma unroll
  for (int h = 1; h < 8; h *= 2)
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (!(i & h)) {
        const float a = x[i], b = x[i + h];
        x[i] = a + b;
        x[i + h] = a - b;
      }
#pragma unroll
  for (int m = 1; m < 32; m *= 2)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float y = __shfl_xor_sync(QRIG_FULL_MASK, x[e], m);
      x[e] = (lane & m) ? y - x[e] : x[e] + y;
    }
}

// R x = H (s * x) / 16 (kv_rotate) and R^T y = s * (H y) / 16 (kv_unrotate), on the warp's vector.
__device__ __forceinline__ void qrig_kv_rotate_warp(float (&x)[8], unsigned sign_byte, int lane) {
#pragma unroll
  for (int e = 0; e < 8; ++e)
    if ((sign_byte >> e) & 1) x[e] = -x[e];
  qrig_fwht256_warp(x, lane);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] *= 0.0625f;
}
__device__ __forceinline__ void qrig_kv_unrotate_warp(float (&x)[8], unsigned sign_byte, int lane) {
  qrig_fwht256_warp(x, lane);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] *= ((sign_byte >> e) & 1) ? -0.0625f : 0.0625f;
}

// The Lloyd-Max codebooks of N(0, 1) (kernels::kv_codebook, the same floats), ascending.
__constant__ float qrig_kv_cb3[8] = {-2.151945705f, -1.343909279f, -0.756005281f, -0.245094179f,
                                     0.245094179f,  0.756005281f,  1.343909279f,  2.151945705f};
__constant__ float qrig_kv_cb4[16] = {-2.732589571f, -2.069017227f, -1.618046386f, -1.256231197f,
                                      -0.942340456f, -0.656759119f, -0.388048299f, -0.128395030f,
                                      0.128395030f,  0.388048299f,  0.656759119f,  0.942340456f,
                                      1.256231197f,  1.618046386f,  2.069017227f,  2.732589571f};

// Copies format f's codebook into a shared table of 16 floats (any 16-entry access pattern is free of bank
// conflicts: distinct entries sit in distinct banks). Call from threads 0..15 (the rest return); sync after.
__device__ __forceinline__ void qrig_kv_load_codebook(int f, float* table, int tid) {
  if (tid < 16) table[tid] = f == 4 ? qrig_kv_cb4[tid] : f == 3 ? qrig_kv_cb3[tid & 7] : 0.0f;
}

// Four int8 values of a word as exact floats (a byte's two's complement offset by 128 into the mantissa of 2^23,
// then 2^23 + 128 subtracted: one PRMT and one FADD per value).
__device__ __forceinline__ void qrig_s8x4_to_float(unsigned w, float* f) {
  const unsigned u = w ^ 0x80808080u;
  f[0] = __int_as_float((int)__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
  f[1] = __int_as_float((int)__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
  f[2] = __int_as_float((int)__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
  f[3] = __int_as_float((int)__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
}

// One lane's 8 values (coordinates 8*lane..8*lane+7 of head `head`) of a cache row, as loaded, and their scale.
struct QrigKv8 {
  uint4 w;      // f16: 16 bytes; q8: w.x, w.y = 8 int8; t4: w.x = 8 nibbles; t3: w.x = 24 bits of codes
  float scale;  // q8: the block's scale; t4/t3: the vector's scale; f16: unused
};

// Loads them; zeros (scale 0) when !valid. width = Hkv * 256 values per row.
template <int F>
__device__ __forceinline__ QrigKv8 qrig_kv_load8(const unsigned char* __restrict__ row, int head, int width, int lane,
                                                 bool valid) {
  QrigKv8 r;
  r.w = qrig_zero_u4();
  r.scale = 0.0f;
  if (!valid) return r;
  if (F == 16) {
    r.w = __ldg(reinterpret_cast<const uint4*>(row + (size_t)head * 512) + lane);
  } else if (F == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + (size_t)head * 256) + lane);
    r.w.x = v.x;
    r.w.y = v.y;
    r.scale = qrig_half_to_float(__ldg(reinterpret_cast<const unsigned short*>(row + width) + head * 8 + (lane >> 2)));
  } else if (F == 4) {
    r.w.x = __ldg(reinterpret_cast<const unsigned*>(row + (size_t)head * 128) + lane);
    r.scale = __ldg(reinterpret_cast<const float*>(row + (width / 256) * 128) + head);
  } else {  // t3: bytes 3*lane..3*lane+2 of the head's 96, from the one or two aligned words holding them
    const unsigned* w = reinterpret_cast<const unsigned*>(row + (size_t)head * 96);
    const int b = 3 * lane, wi = b >> 2, sh = 8 * (b & 3);
    const unsigned lo = __ldg(w + wi);
    const unsigned hi = sh > 8 ? __ldg(w + wi + 1) : 0u;  // word wi + 1 is inside the head's codes when needed
    r.w.x = __funnelshift_r(lo, hi, sh) & 0xFFFFFFu;
    r.scale = __ldg(reinterpret_cast<const float*>(row + (width / 256) * 96) + head);
  }
  return r;
}

// The 8 values as floats: f16 exactly; q8 d * q; t4/t3 scale * level (still in the rotated domain). cb: the
// shared codebook (t4/t3).
template <int F>
__device__ __forceinline__ void qrig_kv_values8(const QrigKv8& r, const float* cb, float* f) {
  if (F == 16) {
    qrig_half8_to_float(r.w, f);
  } else if (F == 8) {
    qrig_s8x4_to_float(r.w.x, f);
    qrig_s8x4_to_float(r.w.y, f + 4);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] *= r.scale;
  } else {
    const int bits = F == 4 ? 4 : 3, mask = F == 4 ? 15 : 7;
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = r.scale * cb[(r.w.x >> (bits * e)) & mask];
  }
}

// ---- int8 keys for dp4a (attn_decode_dp4a: the plan's int8 query) ------------------------------------------------
// The int8 levels of t3 and t4 keys and the float that scales them back to the codebook's
// (kernels::kv_key_levels_i8 / kv_key_level_scale: tests/cuda/test_kv_compile.cpp checks these against them).
#define QRIG_KV_KEY_I8_T3 -88, -55, -31, -10, 10, 31, 55, 88
#define QRIG_KV_KEY_I8_T4 -104, -79, -62, -48, -36, -25, -15, -5, 5, 15, 25, 36, 48, 62, 79, 104
#define QRIG_KV_KEY_SCALE_T3 0.024434783802002077f
#define QRIG_KV_KEY_SCALE_T4 0.026168606450098948f

// PRMT in its default mode (the __byte_perm intrinsic masks its selector first: one more instruction): byte n of
// the result is byte sel[4n+2 : 4n] of {b, a}, or that byte's sign replicated where sel bit 4n+3 is set.
__device__ __forceinline__ unsigned qrig_prmt(unsigned a, unsigned b, unsigned sel) {
  unsigned r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__host__ __device__ constexpr unsigned qrig_pack_s8(int a, int b, int c, int d) {
  return (unsigned)(a & 255) | (unsigned)(b & 255) << 8 | (unsigned)(c & 255) << 16 | (unsigned)(d & 255) << 24;
}

// Eight t4 codes (nibble k of x = value k) as two words of their int8 levels (byte k = value k, then 4 + k): two
// 8-entry lookups by the low 3 bits of each code, then a byte select by its bit 3 (11 instructions).
__device__ __forceinline__ uint2 qrig_t4_codes_to_s8(unsigned x) {
  constexpr int L[16] = {QRIG_KV_KEY_I8_T4};
  constexpr unsigned T0 = qrig_pack_s8(L[0], L[1], L[2], L[3]), T1 = qrig_pack_s8(L[4], L[5], L[6], L[7]);
  constexpr unsigned T2 = qrig_pack_s8(L[8], L[9], L[10], L[11]), T3 = qrig_pack_s8(L[12], L[13], L[14], L[15]);
  const unsigned x7 = x & 0x77777777u, xh = x7 >> 16;
  const unsigned m = ((x >> 1) & 0x44444444u) | 0x32103210u;  // nibble n: n, or 4 + n where code n has bit 3
  uint2 r;
  r.x = qrig_prmt(qrig_prmt(T0, T1, x7), qrig_prmt(T2, T3, x7), m);
  r.y = qrig_prmt(qrig_prmt(T0, T1, xh), qrig_prmt(T2, T3, xh), m >> 16);
  return r;
}

// Eight t3 codes (code k at bits 3k..3k+2 of x; bits 24..31 ignored) as two words of their int8 levels: the codes
// spread into nibbles (three shift-and-merge steps), then one 8-entry lookup per four (10 instructions).
__device__ __forceinline__ uint2 qrig_t3_codes_to_s8(unsigned x) {
  constexpr int L[8] = {QRIG_KV_KEY_I8_T3};
  constexpr unsigned T0 = qrig_pack_s8(L[0], L[1], L[2], L[3]), T1 = qrig_pack_s8(L[4], L[5], L[6], L[7]);
  unsigned y = (x & 0x0000FFFFu) | ((x << 4) & 0xFFFF0000u);  // codes 4..7 to bits 16..27
  y = (y & 0x00FF00FFu) | ((y << 2) & 0xFF00FF00u);           // codes 2, 3 and 6, 7 up by 2
  y = (y & 0x07070707u) | ((y << 1) & 0x70707070u);           // odd codes up by 1: code k in nibble k
  uint2 r;
  r.x = qrig_prmt(T0, T1, y);
  r.y = qrig_prmt(T0, T1, y >> 16);
  return r;
}
