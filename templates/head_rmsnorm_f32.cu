// RMSNorm per attention head (q and k norms): head h of token t is read at
// x[t*row_stride + h*head_stride + head_offset + i], i < D, and written contiguous to out[t][h*D + i] =
// x * rsqrt(mean(x^2) + eps) * w[i] (w shared by heads). CPU reference: qrig::cpu::head_rmsnorm (which sums
// squares in double: a few ulp apart). One warp per (token, head), the head in registers.
// Variant: head_rmsnorm_f32_d<D>_t<T>.  Grid: ceil(T*H / (T/32)).
// Arguments: x, row_stride, head_stride, head_offset, w, n_tokens, heads, eps, out.
#include "qrig_common.cuh"

static_assert(QRIG_D % 32 == 0 && QRIG_D <= 1024, "head_rmsnorm_f32: D must be a multiple of 32, at most 1024");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
head_rmsnorm_f32(const float* __restrict__ x, long long row_stride, long long head_stride, long long head_offset,
                 const float* __restrict__ w, int n_tokens, int heads, float eps, float* __restrict__ out) {
  qrig_grid_dependency_wait();
  constexpr int D = QRIG_D, PER = QRIG_D / 32;
  const long long item = (long long)blockIdx.x * (QRIG_THREADS / 32) + (threadIdx.x >> 5);
  if (item >= (long long)n_tokens * heads) return;
  const int lane = threadIdx.x & 31;
  const long long t = item / heads, h = item % heads;
  const float* xh = x + t * row_stride + h * head_stride + head_offset;
  float v[PER];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    v[j] = xh[lane + 32 * j];
    ss += v[j] * v[j];
  }
  ss = qrig_warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / (float)D + eps);
  float* o = out + item * D;
#pragma unroll
  for (int j = 0; j < PER; ++j) o[lane + 32 * j] = v[j] * inv * w[lane + 32 * j];
}
