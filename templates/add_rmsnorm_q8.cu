// Residual add fused with the quantized RMSNorm of the sum (add_rmsnorm_quant ops: x = x + y, then the next block's
// norm of x for its matmuls): sum = a + b per row of QRIG_D floats, written (the residual stream goes on from it),
// and the sum's row normalised as rmsnorm_f32 does and quantized for the matmuls (QRIG_PLANES int8 planes into
// xq/xd, xq2), without writing the normalised f32 row. One block of QRIG_THREADS threads per row; each thread reads
// its float4 slices of a and b once, adds them (one fp32 add per value: add_f32's bits) and keeps the sum in
// registers for the norm, which is rmsnorm_f32's code (qrig_quant.cuh qrig_rmsnorm_row): with the block size
// rmsnorm_f32 takes for the row (kernels/pointwise.cpp), the quantized row is rmsnorm_f32 q<P>'s of the sum bit for
// bit. One launch, one write and two reads of the row fewer than add_f32 + rmsnorm_f32. sum may equal a or b.
// CPU reference: qrig::cpu::add, then cpu::rmsnorm and the dp4a quantization (the CPU backend's add_rmsnorm_quant).
// Variant: add_rmsnorm_q8_d<D>_p<P>_t<T>.  Grid: (rows).  Arguments: a, b, sum, w, eps, xq, xd, xq2 (unused unless
// P = 2).
#include "qrig_quant.cuh"

static_assert(QRIG_D % 32 == 0, "add_rmsnorm_q8: a quantized row is whole 32-value blocks");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "add_rmsnorm_q8: bad block size");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "add_rmsnorm_q8: 1 or 2 planes");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
add_rmsnorm_q8(const float* a, const float* b, float* sum, const float* __restrict__ w, float eps,
               signed char* __restrict__ xq, float* __restrict__ xd, signed char* __restrict__ xq2) {
  qrig_grid_dependency_wait();
  constexpr int D = QRIG_D, T = QRIG_THREADS;
  constexpr int V = QrigRowSlices<D, T>::V, PER = QrigRowSlices<D, T>::PER;
  __shared__ float scratch[T / 32];
  const size_t row = blockIdx.x;
  const float4* ar = reinterpret_cast<const float4*>(a + row * D);
  const float4* br = reinterpret_cast<const float4*>(b + row * D);
  float4* sr = reinterpret_cast<float4*>(sum + row * D);
  float4 v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * T;
    if (j < V) {
      const float4 x = ar[j], y = br[j];
      v[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      sr[j] = v[i];
    }
  }
  qrig_rmsnorm_row<D, T, QRIG_PLANES, false>(v, row, w, eps, nullptr, xq, xd, xq2, scratch);
}
