// Activation quantization for the dp4a matmuls: f32 rows -> int8 + one f32 scale per 32 consecutive values
// (the Q8_0 block of the weights they meet): d = amax / 127, q = round(x / d) computed as roundf(x * (1/d)),
// clamped to [-127, 127]; an all-zero block gives d = 0, q = 0; a block holding a NaN or inf gets d = NaN,
// so the matmul output shows it. Host reference (bit-exact): qrig::cuda::quantize_activation_q8.
// One warp per 32-value block; rows are contiguous, so only the total number of blocks matters.
// Variant: quant_act_q8_t<T>.  Grid: ceil(blocks / (T/32)).  Arguments: x, xq, xd, n_blocks.
#include "qrig_common.cuh"

static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "quant_act_q8: bad block size");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
quant_act_q8(const float* __restrict__ x, signed char* __restrict__ xq, float* __restrict__ xd, long long n_blocks) {
  constexpr int WARPS = QRIG_THREADS / 32;
  const long long b = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (b >= n_blocks) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const float v = x[b * 32 + lane];
  const bool bad = __any_sync(QRIG_FULL_MASK, !isfinite(v));
  const float amax = qrig_warp_max(fabsf(v));
  float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int q = bad ? 0 : (int)roundf(v * id);
  q = max(-127, min(127, q));
  if (bad) d = __int_as_float(0x7fc00000);  // NaN
  xq[b * 32 + lane] = (signed char)q;
  if (lane == 0) xd[b] = d;
}
