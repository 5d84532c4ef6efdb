// RMSNorm over rows of f32: out = x * (1 / sqrt(mean(x^2) + eps)) * w (GGUF norm weights already carry
// the +1). CPU reference: qrig::cpu::rmsnorm. One block of QRIG_THREADS threads per row of QRIG_D floats;
// the row is read once with 16-byte loads and kept in registers; the sum of squares is accumulated in fp32
// and reduced in a fixed order (deterministic). out may equal x (in place).
// Fused with the activation quantization of the matmuls the row feeds (QRIG_QUANT = planes, 1 or 2; 0 = none):
// the normalized row is also written as int8 xq + f32 xd per 32 values (+ the second plane xq2), with exactly
// quant_act_q8's formulas on the values written to out, so the result is bit-identical to rmsnorm then
// quant_act_q8 (one launch and one read of the row fewer). A 32-value block is 8 float4 of 8 neighbouring
// lanes: its amax and its non-finite flag are reduced over those lanes with shuffles (qrig_quant.cuh, whose
// normalisation add_rmsnorm_q8 shares).
// Variant: rmsnorm_f32_d<D>_q<Q>_t<T>.  Grid: (rows).  Arguments: x, w, out, eps, xq, xd, xq2 (unused for
// Q = 0; xq2 unused unless Q = 2).
#include "qrig_quant.cuh"

static_assert(QRIG_D % 4 == 0, "rmsnorm_f32: D must be a multiple of 4");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "rmsnorm_f32: bad block size");
static_assert(QRIG_QUANT >= 0 && QRIG_QUANT <= 2, "rmsnorm_f32: Q is 0 (no quantized output), 1 or 2 planes");
static_assert(QRIG_QUANT == 0 || QRIG_D % 32 == 0, "rmsnorm_f32: a quantized row is whole 32-value blocks");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
rmsnorm_f32(const float* x, const float* __restrict__ w, float* out, float eps, signed char* __restrict__ xq,
            float* __restrict__ xd, signed char* __restrict__ xq2) {
  qrig_grid_dependency_wait();
  constexpr int D = QRIG_D, T = QRIG_THREADS;
  constexpr int V = QrigRowSlices<D, T>::V, PER = QrigRowSlices<D, T>::PER;
  __shared__ float scratch[T / 32];
  const size_t row = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + row * D);
  float4 v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * T;
    if (j < V) v[i] = xr[j];
  }
  qrig_rmsnorm_row<D, T, QRIG_QUANT, true>(v, row, w, eps, out, xq, xd, xq2, scratch);
}
