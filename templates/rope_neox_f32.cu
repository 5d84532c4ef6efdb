// Partial NeoX RoPE: out [T][H*D] = in with, for i < R/2, the pair (i, i + R/2) of each head is rotated by
// pos[t] * inv_freq[i] (inv_freq = theta^(-2i/R) in double, computed on the host like the CPU op); dims >= R
// copied unchanged (out may equal in). Angles and their sine/cosine in double (positions reach 2^18: an fp32 angle would be off by
// ~1e-2 rad there; a handful of fp64 ops per pair is cheap even on throttled fp64), the rotation in fp32.
// CPU reference: qrig::cpu::rope_neox. One block per token: the R/2 sin/cos pairs in shared memory, then
// every head of the token.
// Variant: rope_neox_f32_d<D>_r<R>_t<T>.  Grid: (T).  Arguments: in, out, pos, heads, inv_freq.
#include "qrig_common.cuh"

static_assert(QRIG_R % 2 == 0 && QRIG_R <= QRIG_D && QRIG_R >= 2, "rope_neox_f32: R must be even, 2..D");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
rope_neox_f32(const float* in, float* out, const int* __restrict__ pos, int heads, const double* __restrict__ inv_freq) {
  qrig_grid_dependency_wait();
  constexpr int D = QRIG_D, HALF = QRIG_R / 2;
  __shared__ float s_cos[HALF], s_sin[HALF];
  const int t = blockIdx.x;
  const double p = (double)pos[t];
  for (int i = threadIdx.x; i < HALF; i += QRIG_THREADS) {
    double s, c;
    sincos(p * inv_freq[i], &s, &c);
    s_cos[i] = (float)c;
    s_sin[i] = (float)s;
  }
  __syncthreads();
  const float* xt = in + (size_t)t * heads * D;
  float* yt = out + (size_t)t * heads * D;
  for (int k = threadIdx.x; k < heads * HALF; k += QRIG_THREADS) {
    const int h = k / HALF, i = k % HALF;
    const float x0 = xt[(size_t)h * D + i], x1 = xt[(size_t)h * D + i + HALF];
    yt[(size_t)h * D + i] = x0 * s_cos[i] - x1 * s_sin[i];
    yt[(size_t)h * D + i + HALF] = x0 * s_sin[i] + x1 * s_cos[i];
  }
  if (QRIG_R < D)  // the dims RoPE leaves alone
    for (int k = threadIdx.x; k < heads * (D - QRIG_R); k += QRIG_THREADS) {
      const int h = k / (D - QRIG_R), i = QRIG_R + k % (D - QRIG_R);
      yt[(size_t)h * D + i] = xt[(size_t)h * D + i];
    }
}
