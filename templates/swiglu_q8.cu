// SwiGLU fused with the activation quantization of the matmul it feeds (swiglu_quant ops: the FFN's activation,
// read by the down projection alone): silu(gate) * up over n f32 values (n a multiple of 32, 16-byte aligned; rows
// are contiguous, so only the total matters) quantized as quant_act_q8 does into xq/xd (+ the second plane xq2 for
// QRIG_PLANES = 2); the f32 product is never written. Each lane computes 4 neighbouring values from float4 loads of
// gate and up with swiglu_f32's formula, and 8 lanes hold a 32-value block (qrig_quant.cuh qrig_quant_block4), so
// the planes are quant_act_q8's of swiglu_f32's output bit for bit. CPU reference: qrig::cpu::swiglu, then the dp4a
// quantization (the CPU backend's swiglu_quant).
// Variant: swiglu_q8_p<P>_t<T>.  Grid: ceil(n/4 / T), capped by the launcher (a grid-stride loop over whole warps).
// Arguments: gate, up, xq, xd, xq2 (unused unless P = 2), n4 (= n / 4).
#include "qrig_quant.cuh"

static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "swiglu_q8: bad block size");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "swiglu_q8: 1 or 2 planes");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
swiglu_q8(const float* __restrict__ gate, const float* __restrict__ up, signed char* __restrict__ xq,
          float* __restrict__ xd, signed char* __restrict__ xq2, long long n4) {
  qrig_grid_dependency_wait();
  const float4* g4 = reinterpret_cast<const float4*>(gate);
  const float4* u4 = reinterpret_cast<const float4*>(up);
  const int lane = threadIdx.x & 31;
  const long long stride = (long long)gridDim.x * QRIG_THREADS;  // a multiple of 32: warps stay whole
  // The loop condition is the warp's first index (i - lane): uniform over the warp, as the block's shuffles need.
  for (long long i = (long long)blockIdx.x * QRIG_THREADS + threadIdx.x; i - lane < n4; i += stride) {
    const bool active = i < n4;  // n4 is a multiple of 8: groups of 8 lanes are wholly in or out
    float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active) {
      const float4 g = g4[i], u = u4[i];
      y = make_float4(qrig_silu(g.x) * u.x, qrig_silu(g.y) * u.y, qrig_silu(g.z) * u.z, qrig_silu(g.w) * u.w);
    }
    qrig_quant_block4<QRIG_PLANES>(y, active, xq, xd, xq2, (size_t)i * 4);
  }
}
