// Row-wise concatenation of two f32 values: out[t] = [a[t] ; b[t]] for n rows, a rows of wa values then b rows
// of wb values (the MTP draft head's [enorm(embed(token)) ; hnorm(h)], docs/speculative.md). out must not alias
// a or b. CPU reference: qrig::cpu::concat_rows (copies: bit-identical).
// Variant: concat_f32_t<T>.  Grid: ceil(n * (wa + wb) / T), capped by the launcher (grid-stride loop).
// Arguments: a, wa, b, wb, n, out.
#include "qrig_common.cuh"

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
concat_f32(const float* __restrict__ a, int wa, const float* __restrict__ b, int wb, int n, float* __restrict__ out) {
  qrig_grid_dependency_wait();
  const long long w = (long long)wa + wb, total = w * n;
  for (long long i = (long long)blockIdx.x * QRIG_THREADS + threadIdx.x; i < total;
       i += (long long)gridDim.x * QRIG_THREADS) {
    const long long t = i / w, c = i - t * w;
    out[i] = c < wa ? a[t * wa + c] : b[t * wb + (c - wa)];
  }
}
