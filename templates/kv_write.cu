// Appends T tokens' keys and values to caches of any format (keys in QRIG_KF, values in QRIG_VF: 16 f16, 8 q8,
// 4 t4, 3 t3; qrig_kv.cuh and kernels/kv_format.h give the row layouts). CPU reference: cpu::kv_quantize_row (q8,
// t4, t3) and the fp16 rounding of gguf::float_to_fp16 (f16). One warp per (token, KV head) vector of 256 values,
// lane l holding values 8l..8l+7:
//   f16: rounded to nearest even;
//   q8:  per 32 values (4 lanes) d = amax / 127 rounded up to the next fp16 (NaN: the fp16 NaN; at or above
//        65504: the largest fp16), q = rint(x / d) (IEEE division, ties to even) clamped to +-127, NaN -> 0;
//   t4/t3: the norm |x| (sum of squares in double, as the reference), the vector rotated (signs of (layer,
//        head), the warp's Walsh-Hadamard transform in the reference's stage order, / 16), each coordinate of
//        16 y / |x| coded by the reference's threshold walk (midpoints of neighbouring levels, a value on one
//        takes the upper level), the least-squares scale <y, c> / <c, c> (sums in double); a zero vector gets
//        the codes of level count / 2 and scale 0, a non-finite norm codes 0 and a NaN scale.
// The padding bytes at the end of a row are not written (never read).
// Batched (b1): one launch over a decode step's T sequences, one token each: row t goes to position seq_pos[t] of
// the caches of the sequence's slot, kc_of[seq_slot[t]] / vc_of[seq_slot[t]] (kcache, vcache and pos0 unused);
// the warp's work is the b0 kernel's, so the bytes are those of one launch per sequence (k16v16 writes the bits of
// kv_write_f16: the same rounding). b0: kc_of, vc_of, seq_slot, seq_pos null.
// Variant: kv_write_k<KF>_v<VF>_b<B>_t<THREADS>. Grid: (ceil(T * Hkv / warps per CTA), 2): y = 0 keys, 1 values.
// Arguments: k, v [T][Hkv*256] f32, kcache, vcache (bytes), k_row_bytes, v_row_bytes, pos0, T, Hkv, layer, kc_of,
// vc_of, seq_slot, seq_pos.
#include "qrig_kv.cuh"

static_assert(QRIG_KF == 16 || QRIG_KF == 8 || QRIG_KF == 4 || QRIG_KF == 3, "kv_write: k is 16, 8, 4 or 3");
static_assert(QRIG_VF == 16 || QRIG_VF == 8 || QRIG_VF == 4 || QRIG_VF == 3, "kv_write: v is 16, 8, 4 or 3");
static_assert(QRIG_THREADS % 32 == 0, "kv_write: whole warps");
static_assert(QRIG_BATCHED == 0 || QRIG_BATCHED == 1, "kv_write: b is 0 or 1");

namespace {
constexpr int D = 256;

__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }

template <int F>
__device__ __forceinline__ void write_vector(const float* __restrict__ x, unsigned char* __restrict__ row, int head,
                                             int width, int layer, int lane) {
  float v[8];
  {
    const float4 a = reinterpret_cast<const float4*>(x)[2 * lane], b = reinterpret_cast<const float4*>(x)[2 * lane + 1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
  if (F == 16) {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = (unsigned)qrig_float_to_half(v[2 * i]) | ((unsigned)qrig_float_to_half(v[2 * i + 1]) << 16);
    uint4 o;
    o.x = w[0]; o.y = w[1]; o.z = w[2]; o.w = w[3];
    reinterpret_cast<uint4*>(row + (size_t)head * 512)[lane] = o;
  } else if (F == 8) {
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = nan_max(amax, fabsf(v[e]));
    amax = nan_max(amax, __shfl_xor_sync(QRIG_FULL_MASK, amax, 1));
    amax = nan_max(amax, __shfl_xor_sync(QRIG_FULL_MASK, amax, 2));
    const float dd = __fdiv_rn(amax, 127.0f);
    unsigned short h;
    if (dd != dd) {
      h = 0x7E00;
    } else if (dd >= 65504.0f) {
      h = 0x7BFF;
    } else {
      h = qrig_float_to_half(dd);
      if (qrig_half_to_float(h) < dd) ++h;  // positive finite: the next fp16 up
    }
    const float d = qrig_half_to_float(h);
    unsigned q[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float r = d > 0.0f ? rintf(__fdiv_rn(v[e], d)) : 0.0f;
      r = r != r ? 0.0f : fminf(fmaxf(r, -127.0f), 127.0f);
      q[e >> 2] |= ((unsigned)(int)r & 0xFFu) << (8 * (e & 3));
    }
    uint2 o;
    o.x = q[0];
    o.y = q[1];
    reinterpret_cast<uint2*>(row + (size_t)head * 256)[lane] = o;
    if ((lane & 3) == 0) reinterpret_cast<unsigned short*>(row + width)[head * 8 + (lane >> 2)] = h;
  } else {
    const int levels = F == 4 ? 16 : 8, bits = F == 4 ? 4 : 3;
    const float* cb = F == 4 ? qrig_kv_cb4 : qrig_kv_cb3;
    double ss = 0.0;
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += (double)v[e] * v[e];
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(QRIG_FULL_MASK, ss, m);
    const float norm = (float)sqrt(ss);
    unsigned codes = 0;
    float scale = 0.0f;
    const bool finite = isfinite(norm);
    if (finite && norm > 0.0f) {
      qrig_kv_rotate_warp(v, qrig_kv_sign_byte(layer, head, lane), lane);
      const float to_unit = 16.0f / norm;
      double yc = 0.0, cc = 0.0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float u = v[e] * to_unit;
        int c = 0;
        while (c + 1 < levels && u >= 0.5f * (cb[c] + cb[c + 1])) ++c;
        codes |= (unsigned)c << (bits * e);
        yc += (double)v[e] * cb[c];
        cc += (double)cb[c] * cb[c];
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) {
        yc += __shfl_xor_sync(QRIG_FULL_MASK, yc, m);
        cc += __shfl_xor_sync(QRIG_FULL_MASK, cc, m);
      }
      scale = (float)(yc / cc);
    } else if (finite) {  // a zero vector
#pragma unroll
      for (int e = 0; e < 8; ++e) codes |= (unsigned)(levels / 2) << (bits * e);
    } else {
      scale = __int_as_float(0x7fc00000);
    }
    const int code_bytes = F == 4 ? 128 : 96;
    if (F == 4) {
      reinterpret_cast<unsigned*>(row + (size_t)head * 128)[lane] = codes;
    } else {
      unsigned char* p = row + (size_t)head * 96 + 3 * lane;
      p[0] = (unsigned char)codes;
      p[1] = (unsigned char)(codes >> 8);
      p[2] = (unsigned char)(codes >> 16);
    }
    if (lane == 0) reinterpret_cast<float*>(row + (width / D) * code_bytes)[head] = scale;
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
kv_write(const float* __restrict__ k, const float* __restrict__ v, unsigned char* __restrict__ kcache,
         unsigned char* __restrict__ vcache, long long k_row_bytes, long long v_row_bytes, long long pos0, int T,
         int Hkv, int layer, unsigned char* const* __restrict__ kc_of, unsigned char* const* __restrict__ vc_of,
         const int* __restrict__ seq_slot, const int* __restrict__ seq_pos) {
  qrig_grid_dependency_wait();
  const int lane = threadIdx.x & 31;
  const long long item = (long long)blockIdx.x * (QRIG_THREADS / 32) + (threadIdx.x >> 5);
  if (item >= (long long)T * Hkv) return;  // whole warps leave together
  const int t = (int)(item / Hkv), head = (int)(item % Hkv);
  const int width = Hkv * D;
  const size_t src = ((size_t)t * Hkv + head) * D;
#if QRIG_BATCHED
  const long long pos = seq_pos[t];
  kcache = kc_of[seq_slot[t]];
  vcache = vc_of[seq_slot[t]];
#else
  const long long pos = pos0 + t;
#endif
  if (blockIdx.y == 0)
    write_vector<QRIG_KF>(k + src, kcache + (size_t)pos * (size_t)k_row_bytes, head, width, layer, lane);
  else
    write_vector<QRIG_VF>(v + src, vcache + (size_t)pos * (size_t)v_row_bytes, head, width, layer, lane);
}
