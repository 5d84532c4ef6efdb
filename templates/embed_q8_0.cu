// Embedding lookup: out[t] = the row tokens[t] of a repacked Q8_0 table (runtime/cuda/q8_layout.h: int8
// wq [V][D], fp16 scales wd [V][D/32]) as f32, value = scale * q (exact in fp32, so bit-identical to the CPU
// reference qrig::cpu::embed). The runtime checks ids on the host; an id outside [0, n_vocab) that gets
// here anyway yields a row of NaN instead of a wild read. One block per token, 16 bytes per thread-step.
// Variant: embed_q8_0_d<D>_t<T>.  Grid: (tokens).  Arguments: wq, wd, tokens, n_vocab, out.
#include "qrig_common.cuh"

static_assert(QRIG_D % 32 == 0, "embed_q8_0: D must be a multiple of 32");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "embed_q8_0: bad block size");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
embed_q8_0(const signed char* __restrict__ wq, const unsigned short* __restrict__ wd,
           const int* __restrict__ tokens, int n_vocab, float* __restrict__ out) {
  qrig_grid_dependency_wait();
  constexpr int D = QRIG_D, T = QRIG_THREADS;
  constexpr int VEC = D / 16;
  const int id = tokens[blockIdx.x];
  const bool ok = id >= 0 && id < n_vocab;
  const size_t row = ok ? (size_t)id : 0;
  const int4* q = reinterpret_cast<const int4*>(wq + row * D);
  const unsigned short* s = wd + row * (D / 32);
  float4* o = reinterpret_cast<float4*>(out + (size_t)blockIdx.x * D);
  for (int i = threadIdx.x; i < VEC; i += T) {
    if (!ok) {
      const float nan = __int_as_float(0x7fc00000);
      for (int j = 0; j < 4; ++j) o[i * 4 + j] = make_float4(nan, nan, nan, nan);
      continue;
    }
    const int4 v = __ldg(q + i);
    const float d = qrig_half_to_float(__ldg(s + (i >> 1)));
    const int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int w = words[j];
      o[i * 4 + j] = make_float4(d * (float)(signed char)(w & 0xff), d * (float)(signed char)((w >> 8) & 0xff),
                                 d * (float)(signed char)((w >> 16) & 0xff), d * (float)(signed char)(w >> 24));
    }
  }
}
