// Embedding lookup for the GGUF weight types other than Q8_0: out[t] = row tokens[t] of a repacked table
// (runtime/cuda/wq_layout.h; units as qrig_wtypes.cuh decodes them) as f32, each value fmaf(d, q, m): the
// reference dequantization's value bit for bit (qrig_wtypes.cuh says why), so identical to qrig::cpu::embed.
// The runtime checks ids on the host; an id outside [0, n_vocab) that gets here anyway yields a row of NaN
// instead of a wild read. One block per token, one unit (32 values) per thread-step.
// Variant: embed_wq_w<TYPE>_d<D>_t<T>.  Grid: (tokens).  Arguments: wa, wb, tokens, n_vocab, out.
#include "qrig_common.cuh"
#include "qrig_wtypes.cuh"

static_assert(QRIG_WTYPE == WQ_TYPE_ID, "the weight type (QRIG_WTYPE) selects the decode of qrig_wtypes.cuh");

static_assert(QRIG_D % WQ_BLOCK == 0, "embed_wq: D must be a multiple of the type's block");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "embed_wq: bad block size");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
embed_wq(const unsigned char* __restrict__ wa, const unsigned char* __restrict__ wb, const int* __restrict__ tokens,
         int n_vocab, float* __restrict__ out) {
  qrig_grid_dependency_wait();
  constexpr int D = QRIG_D, T = QRIG_THREADS;
  constexpr int NBLK = D / WQ_BLOCK, NU = NBLK * WQ_UNITS;
  const int id = tokens[blockIdx.x];
  const bool ok = id >= 0 && id < n_vocab;
  const size_t row = ok ? (size_t)id : 0;
  float* o = out + (size_t)blockIdx.x * D;
  for (int g = threadIdx.x; g < NU; g += T) {
    const int blk = g / WQ_UNITS, u = g % WQ_UNITS;
    if (!ok) {
      const float nan = __int_as_float(0x7fc00000);
      for (int i = 0; i < 32; ++i) o[g * 32 + i] = nan;
      continue;
    }
    WqUnit w;
    wq_decode(wa + (row * NBLK + blk) * WQ_ABYTES, wb + (row * NBLK + blk) * WQ_BBYTES, u, w);
    float* o0 = o + blk * WQ_BLOCK + w.o0;
    float* o1 = o + blk * WQ_BLOCK + w.o1;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int q0 = (int)(signed char)((w.q[i / 4] >> (8 * (i % 4))) & 0xff);
      const int q1 = (int)(signed char)((w.q[4 + i / 4] >> (8 * (i % 4))) & 0xff);
      o0[i] = fmaf(w.d0, (float)q0, w.m0);
      o1[i] = fmaf(w.d1, (float)q1, w.m1);
    }
  }
}
