// RMSNorm over rows of f32: out = x * (1 / sqrt(mean(x^2) + eps)) * w (GGUF norm weights already carry
// the +1). CPU reference: qrig::cpu::rmsnorm. One block of QRIG_THREADS threads per row of QRIG_D floats;
// the row is read once with 16-byte loads and kept in registers; the sum of squares is accumulated in fp32
// and reduced in a fixed order (deterministic). out may equal x (in place).
// Fused with the activation quantization of the matmuls the row feeds (QRIG_QUANT = planes, 1 or 2; 0 = none):
// the normalized row is also written as int8 xq + f32 xd per 32 values (+ the second plane xq2), with exactly
// quant_act_q8's formulas on the values written to out, so the result is bit-identical to rmsnorm then
// quant_act_q8 (one launch and one read of the row fewer). A 32-value block is 8 float4 of 8 neighbouring
// lanes: its amax and its non-finite flag are reduced over those lanes with shuffles.
// Variant: rmsnorm_f32_d<D>_q<Q>_t<T>.  Grid: (rows).  Arguments: x, w, out, eps, xq, xd, xq2 (unused for
// Q = 0; xq2 unused unless Q = 2).
#include "qrig_common.cuh"

static_assert(QRIG_D % 4 == 0, "rmsnorm_f32: D must be a multiple of 4");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "rmsnorm_f32: bad block size");
static_assert(QRIG_QUANT >= 0 && QRIG_QUANT <= 2, "rmsnorm_f32: Q is 0 (no quantized output), 1 or 2 planes");
static_assert(QRIG_QUANT == 0 || QRIG_D % 32 == 0, "rmsnorm_f32: a quantized row is whole 32-value blocks");

// The 32-value block of (y, lane's 4 values) quantized like quant_act_q8; every lane of the 8 takes part.
__device__ __forceinline__ void qrig_quant_block4(float4 y, bool active, signed char* xq, float* xd,
                                                  signed char* xq2, size_t elem) {
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
    if (QRIG_QUANT == 2) {
      const float r = fmaf(-(float)q, d, vals[c]);
      const int q2 = bad ? 0 : max(-127, min(127, (int)roundf(r * (id * 254.0f))));
      packed2 |= (q2 & 0xFF) << (8 * c);
    }
  }
  if (bad) d = __int_as_float(0x7fc00000);  // NaN
  *reinterpret_cast<int*>(xq + elem) = packed;
  if (QRIG_QUANT == 2) *reinterpret_cast<int*>(xq2 + elem) = packed2;
  if ((elem & 31) == 0) xd[elem / 32] = d;
}

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
rmsnorm_f32(const float* x, const float* __restrict__ w, float* out, float eps, signed char* __restrict__ xq,
            float* __restrict__ xd, signed char* __restrict__ xq2) {
  constexpr int D = QRIG_D, T = QRIG_THREADS;
  constexpr int V = D / 4;                // float4 per row
  constexpr int PER = (V + T - 1) / T;    // float4 per thread
  __shared__ float scratch[T / 32];
  const size_t row = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + row * D);
  float4 v[PER];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * T;
    if (j < V) {
      v[i] = xr[j];
      ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
  }
  ss = qrig_block_sum<T>(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / (float)D + eps);
  const float4* wr = reinterpret_cast<const float4*>(w);
  float4* o = reinterpret_cast<float4*>(out + row * D);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * T;
    float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (j < V) {
      const float4 g = wr[j];
      y = make_float4(v[i].x * inv * g.x, v[i].y * inv * g.y, v[i].z * inv * g.z, v[i].w * inv * g.w);
      o[j] = y;
    }
    // Groups of 8 lanes are wholly in or out of the row (V is a multiple of 8 when quantizing).
    if (QRIG_QUANT > 0) qrig_quant_block4(y, j < V, xq, xd, xq2, row * D + (size_t)j * 4);
  }
}
