// SwiGLU: out = silu(gate) * up elementwise over n f32 values (n a multiple of 4, 16-byte aligned; out may
// equal gate or up), silu(x) = x / (1 + exp(-x)) with the accurate expf. CPU reference: qrig::cpu::swiglu
// (within a few ulp: expf on the GPU vs std::exp).
// Variant: swiglu_f32_t<T>.  Grid: ceil(n/4 / T), capped by the launcher (grid-stride loop).
// Arguments: gate, up, out, n4 (= n / 4).
#include "qrig_common.cuh"

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
swiglu_f32(const float* gate, const float* up, float* out, long long n4) {
  qrig_grid_dependency_wait();
  const float4* g4 = reinterpret_cast<const float4*>(gate);
  const float4* u4 = reinterpret_cast<const float4*>(up);
  float4* o4 = reinterpret_cast<float4*>(out);
  for (long long i = (long long)blockIdx.x * QRIG_THREADS + threadIdx.x; i < n4; i += (long long)gridDim.x * QRIG_THREADS) {
    const float4 g = g4[i], u = u4[i];
    o4[i] = make_float4(qrig_silu(g.x) * u.x, qrig_silu(g.y) * u.y, qrig_silu(g.z) * u.z, qrig_silu(g.w) * u.w);
  }
}
