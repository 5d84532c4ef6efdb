// RMSNorm over rows of f32: out = x * (1 / sqrt(mean(x^2) + eps)) * w (GGUF norm weights already carry
// the +1). CPU reference: qrig::cpu::rmsnorm. One block of QRIG_THREADS threads per row of QRIG_D floats;
// the row is read once with 16-byte loads and kept in registers; the sum of squares is accumulated in fp32
// and reduced in a fixed order (deterministic). out may equal x (in place).
// Variant: rmsnorm_f32_d<D>_t<T>.  Grid: (rows).  Arguments: x, w, out, eps.
#include "qrig_common.cuh"

static_assert(QRIG_D % 4 == 0, "rmsnorm_f32: D must be a multiple of 4");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "rmsnorm_f32: bad block size");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
rmsnorm_f32(const float* x, const float* __restrict__ w, float* out, float eps) {
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
    if (j < V) {
      const float4 g = wr[j];
      o[j] = make_float4(v[i].x * inv * g.x, v[i].y * inv * g.y, v[i].z * inv * g.z, v[i].w * inv * g.w);
    }
  }
}
