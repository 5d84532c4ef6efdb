// Appends T tokens' keys and values to the fp16 KV cache: kcache[pos0 + t][j] = half(k[t][j]),
// vcache[pos0 + t][j] = half(v[t][j]) (round to nearest even), W = Hkv*hd values per row. CPU reference:
// the CPU backend's kv_write (f32 cache) followed by gguf::float_to_fp16 (bit-identical rounding).
// Variant: kv_write_f16_t<T>.  Grid: ceil(T*W/2 / T), capped (grid-stride).  Arguments: k, v, kcache, vcache, pos0, n2 (= T*W/2), W.
#include "qrig_common.cuh"

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
kv_write_f16(const float* __restrict__ k, const float* __restrict__ v, unsigned short* __restrict__ kcache,
             unsigned short* __restrict__ vcache, long long pos0, long long n2, int W) {
  qrig_grid_dependency_wait();
  const float2* k2 = reinterpret_cast<const float2*>(k);
  const float2* v2 = reinterpret_cast<const float2*>(v);
  unsigned int* kc = reinterpret_cast<unsigned int*>(kcache + pos0 * W);
  unsigned int* vc = reinterpret_cast<unsigned int*>(vcache + pos0 * W);
  for (long long i = (long long)blockIdx.x * QRIG_THREADS + threadIdx.x; i < n2; i += (long long)gridDim.x * QRIG_THREADS) {
    const float2 a = k2[i], b = v2[i];
    kc[i] = (unsigned int)qrig_float_to_half(a.x) | ((unsigned int)qrig_float_to_half(a.y) << 16);
    vc[i] = (unsigned int)qrig_float_to_half(b.x) | ((unsigned int)qrig_float_to_half(b.y) << 16);
  }
}
