// Residual add: out = a + b elementwise over n f32 values (n a multiple of 4, 16-byte aligned pointers;
// out may equal a or b). CPU reference: qrig::cpu::add (bit-identical: one fp32 add per value).
// Variant: add_f32_t<T>.  Grid: ceil(n/4 / T), capped by the launcher (grid-stride loop).
// Arguments: a, b, out, n4 (= n / 4).
#include "qrig_common.cuh"

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
add_f32(const float* a, const float* b, float* out, long long n4) {
  qrig_grid_dependency_wait();
  const float4* a4 = reinterpret_cast<const float4*>(a);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float4* o4 = reinterpret_cast<float4*>(out);
  for (long long i = (long long)blockIdx.x * QRIG_THREADS + threadIdx.x; i < n4; i += (long long)gridDim.x * QRIG_THREADS) {
    const float4 x = a4[i], y = b4[i];
    o4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}
