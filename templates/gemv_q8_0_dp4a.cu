// Decode GEMV of the default family: y[n] = sum over 32-blocks b of wd[n][b] * xd[b] * dot(wq[n][b], xq[b]),
// with repacked Q8_0 weights (runtime/cuda/q8_layout.h: int8 wq [N][K] and fp16 scales wd [N][K/32], so
// weights load with aligned 16-byte loads) and an activation row quantized by quant_act_q8 (int8 xq [K],
// f32 xd [K/32]). CPU reference: qrig::cpu::matmul on the same weights and the dequantized activation.
// With P = 2 activation planes (the precise matmuls: a second int8 plane xq2 holds the residual on the step
// d/254) each 16-byte piece takes 8 dp4a instead of 4 and adds fmaf(s2, 1/254, s1); decode stays bound by
// the weight bytes, so the second plane costs little time.
//
// Each block stages the activation in shared memory, then each warp computes R consecutive rows: per
// 512-byte chunk of a row, lane l loads 16 weight bytes (half a Q8_0 block) and their fp16 scale, 4 dp4a
// against the activation, one exact int->float conversion and one FMA. U chunks of all R rows are loaded
// before any is used (bytes in flight for HBM), the per-lane partial sums are reduced by a butterfly in a
// fixed order (deterministic), lane 0 writes the row. Rows past n_rows (the last warp) are computed on a
// clamped row and not written.
// Output rows may go to up to four places (one launch for several matmuls that read the same input, their
// weights stacked in one matrix): row r < b1 -> y0[r], r < b2 -> y1[r - b1], r < b3 -> y2[r - b2], else
// y3[r - b3] (a single output: b1 = b2 = b3 = n_rows).
// Variant: gemv_q8_0_dp4a_k<K>_p<P>_r<R>_u<U>_t<T>.  Grid: ceil(n_rows / (R * T/32)).
// Arguments: wq, wd, xq, xd, xq2 (P = 2; else unused), y0, y1, y2, y3, b1, b2, b3, n_rows.
#include "qrig_common.cuh"

static_assert(QRIG_K % 32 == 0, "gemv_q8_0_dp4a: K must be a multiple of 32");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "gemv_q8_0_dp4a: 1 or 2 activation planes");
static_assert(QRIG_K * QRIG_PLANES + QRIG_K / 8 <= 40960,
              "gemv_q8_0_dp4a: the activation is staged in 40 KiB of shared memory at most");
static_assert(QRIG_ROWS >= 1 && QRIG_ROWS <= 8, "gemv_q8_0_dp4a: R in 1..8");
static_assert(QRIG_UNROLL >= 1 && QRIG_UNROLL <= 8, "gemv_q8_0_dp4a: U in 1..8");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "gemv_q8_0_dp4a: bad block size");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
gemv_q8_0_dp4a(const signed char* __restrict__ wq, const unsigned short* __restrict__ wd,
               const signed char* __restrict__ xq, const float* __restrict__ xd,
               const signed char* __restrict__ xq2, float* y0, float* y1, float* y2,
               float* y3, int b1, int b2, int b3, int n_rows) {
  qrig_grid_dependency_wait();
  constexpr int K = QRIG_K, R = QRIG_ROWS, U = QRIG_UNROLL, T = QRIG_THREADS, P = QRIG_PLANES;
  constexpr int WARPS = T / 32;
  constexpr int VEC = K / 16;      // 16-byte vectors per row
  constexpr int NB = K / 32;       // Q8_0 blocks per row
  constexpr int CHUNKS = VEC / 32; // full 512-byte chunks (one vector per lane)
  constexpr int TAIL = VEC % 32;   // vectors of the last, partial chunk

  __shared__ int4 s_xq[VEC * P];  // plane 2 after plane 1
  __shared__ float s_xd[NB];
  for (int i = threadIdx.x; i < VEC; i += T) s_xq[i] = reinterpret_cast<const int4*>(xq)[i];
  if (P == 2)
    for (int i = threadIdx.x; i < VEC; i += T) s_xq[VEC + i] = reinterpret_cast<const int4*>(xq2)[i];
  for (int i = threadIdx.x; i < NB; i += T) s_xd[i] = xd[i];
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
  if (row0 >= n_rows) return;
  const int4* wrow[R];
  const unsigned short* srow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t row = (size_t)min(row0 + r, n_rows - 1);
    wrow[r] = reinterpret_cast<const int4*>(wq + row * K);
    srow[r] = wd + row * NB;
  }
  // The integer dot product of 16 weights with the activation's piece v, as a float (both planes).
  auto piece = [&](const int4 w, const int4 a, const int v) {
    const float s1 = qrig_small_int_to_float(qrig_dot16(w, a));
    if (P == 1) return s1;
    return fmaf(qrig_small_int_to_float(qrig_dot16(w, s_xq[VEC + v])), 1.0f / 254.0f, s1);
  };
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

#pragma unroll 1
  for (int c0 = 0; c0 < CHUNKS; c0 += U) {
    int4 w[U][R];
    unsigned short s[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (CHUNKS % U == 0 || c0 + u < CHUNKS) {
          w[u][r] = __ldg(wrow[r] + (c0 + u) * 32 + lane);
          s[u][r] = __ldg(srow[r] + (c0 + u) * 16 + (lane >> 1));
        }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (CHUNKS % U == 0 || c0 + u < CHUNKS) {
        const int4 a = s_xq[(c0 + u) * 32 + lane];
        const float ad = s_xd[(c0 + u) * 16 + (lane >> 1)];
#pragma unroll
        for (int r = 0; r < R; ++r)
          acc[r] += piece(w[u][r], a, (c0 + u) * 32 + lane) * (qrig_half_to_float(s[u][r]) * ad);
      }
  }
  if (TAIL > 0 && lane < TAIL) {
    const int v = CHUNKS * 32 + lane;
    const int4 a = s_xq[v];
    const float ad = s_xd[v >> 1];
#pragma unroll
    for (int r = 0; r < R; ++r)
      acc[r] += piece(__ldg(wrow[r] + v), a, v) * (qrig_half_to_float(__ldg(srow[r] + (v >> 1))) * ad);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = qrig_warp_sum(acc[r]);
    const int row = row0 + r;
    if (lane == 0 && row < n_rows) {
      float* y = row < b1 ? y0 + row : row < b2 ? y1 + (row - b1) : row < b3 ? y2 + (row - b2) : y3 + (row - b3);
      *y = v;
    }
  }
}
