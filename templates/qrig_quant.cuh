// Device helpers of the kernels that make a matmul's activation in registers and quantize it there, before (or
// instead of) writing it: rmsnorm_f32 (q1/q2), add_rmsnorm_q8 and swiglu_q8. The quantization is quant_act_q8's
// (the same formulas, so the same bits: d = amax / 127, q = roundf(x * (1/d)) clamped to [-127, 127], an all-zero
// block d = 0, a block holding a NaN or inf d = NaN and q = q2 = 0, the second plane on the step d/254); the row
// normalisation is rmsnorm_f32's, written once here so that the kernels sharing it make the same bits.
#pragma once

#include "qrig_common.cuh"

// One 32-value block held as a float4 by each of 8 neighbouring lanes (y: this lane's 4 values, at element `elem` of
// the output; elem % 4 == 0) quantized into xq/xd (and xq2 for PLANES == 2). Every lane of the warp must call it
// (the amax and the non-finite flag are reduced over the 8 lanes with shuffles); inactive lanes (active = false,
// whole groups of 8) write nothing. xq and xq2 must be 4-byte aligned.
template <int PLANES>
__device__ __forceinline__ void qrig_quant_block4(float4 y, bool active, signed char* xq, float* xd, signed char* xq2,
                                                  size_t elem) {
  const float vals[4] = {y.x, y.y, y.z, y.w};
  float amax = 0.0f;
  int bad = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    amax = fmaxf(amax, fabsf(vals[c]));
    bad |= !isfinite(vals[c]);
  }
  if (!active) amax = 0.0f, bad = 0;
#pragma unroll
  for (int m = 1; m < 8; m <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(QRIG_FULL_MASK, amax, m));
    bad |= __shfl_xor_sync(QRIG_FULL_MASK, bad, m);
  }
  if (!active) return;
  float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int packed = 0, packed2 = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int q = bad ? 0 : max(-127, min(127, (int)roundf(vals[c] * id)));
    packed |= (q & 0xFF) << (8 * c);
    if (PLANES == 2) {
      const float r = fmaf(-(float)q, d, vals[c]);
      const int q2 = bad ? 0 : max(-127, min(127, (int)roundf(r * (id * 254.0f))));
      packed2 |= (q2 & 0xFF) << (8 * c);
    }
  }
  if (bad) d = __int_as_float(0x7fc00000);  // NaN
  *reinterpret_cast<int*>(xq + elem) = packed;
  if (PLANES == 2) *reinterpret_cast<int*>(xq2 + elem) = packed2;
  if ((elem & 31) == 0) xd[elem / 32] = d;
}

// float4 slices per thread of a row of D floats over a block of T threads: thread t holds slices t, t + T, ...
template <int D, int T>
struct QrigRowSlices {
  static constexpr int V = D / 4;
  static constexpr int PER = (V + T - 1) / T;
};

// RMSNorm of row `row` held in registers (v[i]: slice threadIdx.x + i * T, valid where that is < D/4), called by
// every thread of the block: the sum of squares in fp32 reduced in a fixed order (qrig_block_sum), y = v * inv * w;
// WRITE: y is stored at out + row * D; PLANES > 0: y is also quantized into xq/xd (xq2) (D % 32 == 0). scratch: T/32
// floats of shared memory.
template <int D, int T, int PLANES, bool WRITE>
__device__ __forceinline__ void qrig_rmsnorm_row(const float4 (&v)[QrigRowSlices<D, T>::PER], size_t row,
                                                 const float* __restrict__ w, float eps, float* out,
                                                 signed char* __restrict__ xq, float* __restrict__ xd,
                                                 signed char* __restrict__ xq2, float* scratch) {
  constexpr int V = QrigRowSlices<D, T>::V, PER = QrigRowSlices<D, T>::PER;
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * T;
    if (j < V) ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
  }
  ss = qrig_block_sum<T>(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / (float)D + eps);
  const float4* wr = reinterpret_cast<const float4*>(w);
  float4* o = WRITE ? reinterpret_cast<float4*>(out + row * D) : nullptr;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * T;
    float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (j < V) {
      const float4 g = wr[j];
      y = make_float4(v[i].x * inv * g.x, v[i].y * inv * g.y, v[i].z * inv * g.z, v[i].w * inv * g.w);
      if (WRITE) o[j] = y;
    }
    // Groups of 8 lanes are wholly in or out of the row (V is a multiple of 8 when quantizing).
    if (PLANES > 0) qrig_quant_block4<PLANES>(y, j < V, xq, xd, xq2, row * D + (size_t)j * 4);
  }
}
