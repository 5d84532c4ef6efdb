// Activation quantization for the dp4a matmuls: f32 rows -> int8 + one f32 scale per 32 consecutive values
// (the Q8_0 block of the weights they meet): d = amax / 127, q = round(x / d) computed as roundf(x * (1/d)),
// clamped to [-127, 127]; an all-zero block gives d = 0, q = 0; a block holding a NaN or inf gets d = NaN,
// so the matmul output shows it. With P = 2 planes also the residual's plane for the precise matmuls:
// r = fmaf(-q, d, x) (exact), q2 = clamp(roundf(r * (1/d * 254)), -127, 127), so x = d * (q + q2/254) to
// ~15 bits. Host reference (bit-exact): qrig::cuda::quantize_activation_q8 (cpu::quantize_q8_activation).
// One warp per 32-value block; rows are contiguous, so only the total number of blocks matters.
// Variant: quant_act_q8_p<P>_t<T>.  Grid: ceil(blocks / (T/32)).  Arguments: x, xq, xd, xq2 (P = 2; else
// unused), n_blocks.
#include "qrig_common.cuh"

static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "quant_act_q8: bad block size");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "quant_act_q8: 1 or 2 planes");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
quant_act_q8(const float* __restrict__ x, signed char* __restrict__ xq, float* __restrict__ xd,
             signed char* __restrict__ xq2, long long n_blocks) {
  qrig_grid_dependency_wait();
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
  if (QRIG_PLANES == 2) {
    const float r = fmaf(-(float)q, d, v);  // exact; a bad block's q2 is 0
    const int q2 = bad ? 0 : max(-127, min(127, (int)roundf(r * (id * 254.0f))));
    xq2[b * 32 + lane] = (signed char)q2;
  }
  if (lane == 0) xd[b] = d;
}
