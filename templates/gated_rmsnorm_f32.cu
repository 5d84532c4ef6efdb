// Gated RMSNorm per head (the GDN output norm): out[t][h*D+i] = w[i] * o/rms(o) * silu(z), o and z
// [T][H*D] contiguous, w [D] shared by heads, rms over the head's D values. CPU reference:
// qrig::cpu::gated_rmsnorm (sum of squares in double there: a few ulp apart). One warp per (token, head).
// Variant: gated_rmsnorm_f32_d<D>_t<T>.  Grid: ceil(T*H / (T/32)).  Arguments: o, z, w, rows (= T*H), eps, out.
#include "qrig_common.cuh"

static_assert(QRIG_D % 32 == 0 && QRIG_D <= 1024, "gated_rmsnorm_f32: D must be a multiple of 32, at most 1024");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
gated_rmsnorm_f32(const float* __restrict__ o, const float* __restrict__ z, const float* __restrict__ w,
                  long long rows, float eps, float* __restrict__ out) {
  qrig_grid_dependency_wait();
  constexpr int D = QRIG_D, PER = QRIG_D / 32;
  const long long row = (long long)blockIdx.x * (QRIG_THREADS / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* oh = o + row * D;
  const float* zh = z + row * D;
  float v[PER];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    v[j] = oh[lane + 32 * j];
    ss += v[j] * v[j];
  }
  ss = qrig_warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / (float)D + eps);
  float* y = out + row * D;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = lane + 32 * j;
    y[i] = w[i] * (v[j] * inv) * qrig_silu(zh[i]);
  }
}
