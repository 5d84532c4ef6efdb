// Greedy sampling on the GPU: out[r] = the index of the largest of n logits of row r (the lowest index among
// equal maxima; NaN never wins), over the first n_valid columns only (padding vocabulary rows are never
// chosen). CPU reference: std::max_element over the same logits. One block per row; each thread scans a
// strided slice, then a deterministic block reduction.
// Variant: argmax_f32_t<T>.  Grid: (rows).  Arguments: logits, row_stride, n_valid, out.
#include "qrig_common.cuh"

static_assert((QRIG_THREADS & (QRIG_THREADS - 1)) == 0, "argmax_f32: the block size must be a power of two");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
argmax_f32(const float* __restrict__ logits, long long row_stride, int n_valid, int* __restrict__ out) {
  qrig_grid_dependency_wait();
  __shared__ float s_v[QRIG_THREADS];
  __shared__ int s_i[QRIG_THREADS];
  const float* l = logits + (size_t)blockIdx.x * row_stride;
  float best = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < n_valid; i += QRIG_THREADS) {
    const float v = l[i];
    if (v > best) {  // ascending i per thread: the first maximum stays
      best = v;
      bi = i;
    }
  }
  s_v[threadIdx.x] = best;
  s_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = QRIG_THREADS / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float v = s_v[threadIdx.x + s];
      const int i = s_i[threadIdx.x + s];
      if (v > s_v[threadIdx.x] || (v == s_v[threadIdx.x] && i < s_i[threadIdx.x])) {
        s_v[threadIdx.x] = v;
        s_i[threadIdx.x] = i;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s_i[0] == 0x7fffffff ? 0 : s_i[0];
}
