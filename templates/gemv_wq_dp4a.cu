// Decode GEMV of the GGUF weight types other than Q8_0 on the dp4a path: y[o] = sum over the weights' units
// (qrig_wtypes.cuh) and their two 16-value halves h of xd[.] * (d_h * dot(q_h, xq[.]) + m_h * sum(xq[.])),
// every integer sum exact, with the weights repacked at load (runtime/cuda/wq_layout.h: quant bytes A, scale
// bytes B) and one activation row quantized by quant_act_q8 (int8 xq [k], f32 xd [k/32]; P = 2: the second
// plane xq2, x = xd * (xq + xq2/254)). CPU reference: qrig::cpu::matmul on the dequantized weights and the
// dequantized activation: fp32 rounding apart.
//
// A row's units are split over S warps (a 4096-value row of a 4-bit type is 128 units: one per lane of 4
// warps), so a matrix of few rows still puts many warps, and their loads, on every SM (decode is bound by the
// bytes in flight: KERNELS.md, Little's law). A CTA holds T/32 warps: (T/32)/S groups of S warps, each group R
// consecutive rows. Warp p of a group takes the units 32p + lane, 32p + lane + 32S, ... of its rows: the S*32
// lanes of a group read S*512 contiguous bytes of a 4-bit row per step. Per step a lane issues the loads
// (wq_load: 16-byte quant loads, the scale bytes as wide as B's alignment allows) of U units of each of its R
// rows before decoding any (wq_unpack), then per unit reads the two 16-byte pieces of the activation its halves
// meet (through L1: every warp reads the same row) and their scales: 8 dp4a per row, 8 more for the activation
// sums of types with offsets (shared by the R rows), the same again for the second plane. Types whose unit is
// one 32-value block with one scale (WQ_SAME32) read one activation scale and scale once per unit.
// Reduction in a fixed order (deterministic): a butterfly per warp, then the S warps' sums in warp order
// through shared memory. Rows past n_rows are computed on a clamped row and not written.
// Output rows may go to up to four places (one launch for several matmuls that read the same input, their
// weights stacked in one matrix: kernels/matmul.h check_wq_stack): row r < b1 -> y0[r], r < b2 -> y1[r - b1],
// r < b3 -> y2[r - b2], else y3[r - b3] (a single output: b1 = b2 = b3 = n_rows).
// Variant: gemv_wq_dp4a_w<TYPE>_p<P>_r<R>_s<S>_u<U>_t<T>. Grid: ceil(n_rows / (R * (T/32) / S)).
// Arguments: wa, wb (the repacked weights; wb 16-byte aligned), xq, xd, xq2 (P = 2; else unused), y0, y1, y2, y3,
// b1, b2, b3, k (a multiple of the type's block), n_rows.
#ifndef QRIG_HOST_EMULATION  // tests/cuda/test_wq_emulate.cpp runs this file on host threads with its own helpers
#include "qrig_common.cuh"
#endif
#include "qrig_wtypes.cuh"

static_assert(QRIG_WTYPE == WQ_TYPE_ID, "the weight type (QRIG_WTYPE) selects the decode of qrig_wtypes.cuh");
static_assert(QRIG_ROWS >= 1 && QRIG_ROWS <= 4, "gemv_wq_dp4a: R in 1..4");
static_assert(QRIG_SPLIT >= 1 && QRIG_SPLIT <= 8 && (QRIG_SPLIT & (QRIG_SPLIT - 1)) == 0,
              "gemv_wq_dp4a: S (warps per row) is a power of two, at most 8");
static_assert(QRIG_UNROLL >= 1 && QRIG_UNROLL <= 4, "gemv_wq_dp4a: U in 1..4");
static_assert(QRIG_THREADS % (32 * QRIG_SPLIT) == 0 && QRIG_THREADS <= 1024,
              "gemv_wq_dp4a: the block is whole groups of S warps");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "gemv_wq_dp4a: 1 or 2 activation planes");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
gemv_wq_dp4a(const unsigned char* __restrict__ wa, const unsigned char* __restrict__ wb,
             const signed char* __restrict__ xq, const float* __restrict__ xd, const signed char* __restrict__ xq2,
             float* y0, float* y1, float* y2, float* y3, int b1, int b2, int b3, int k, int n_rows) {
  qrig_grid_dependency_wait();
  constexpr int R = QRIG_ROWS, S = QRIG_SPLIT, U = QRIG_UNROLL, T = QRIG_THREADS, P = QRIG_PLANES;
  constexpr int WARPS = T / 32, GROUPS = WARPS / S;
  constexpr float INV254 = 1.0f / 254.0f;  // the second plane's step, relative to xd
  const int NBLK = k / WQ_BLOCK;           // weight blocks per row
  const int NU = NBLK * WQ_UNITS;          // units per row

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = warp / S, part = warp % S;
  const int row0 = (blockIdx.x * GROUPS + group) * R;
  const unsigned char* arow[R];
  const unsigned char* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t row = (size_t)min(row0 + r, n_rows - 1);
    arow[r] = wa + row * (size_t)NBLK * WQ_ABYTES;
    brow[r] = wb + row * (size_t)NBLK * WQ_BBYTES;
  }
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

  // Exact dots of 16 or 32 codes with as many activation bytes, and the activation's byte sums, as floats.
  auto dot = [](const int* q, const int4 a) {
    return qrig_small_int_to_float(
        qrig_dot4(q[3], a.w, qrig_dot4(q[2], a.z, qrig_dot4(q[1], a.y, qrig_dot4(q[0], a.x, 0)))));
  };
  auto dot8 = [](const int* q, const int4 a, const int4 b) {
    int s = qrig_dot4(q[3], a.w, qrig_dot4(q[2], a.z, qrig_dot4(q[1], a.y, qrig_dot4(q[0], a.x, 0))));
    s = qrig_dot4(q[7], b.w, qrig_dot4(q[6], b.z, qrig_dot4(q[5], b.y, qrig_dot4(q[4], b.x, s))));
    return qrig_small_int_to_float(s);
  };
  auto bytesum = [](const int4 a) {
    const int one = 0x01010101;
    return qrig_small_int_to_float(
        qrig_dot4(one, a.w, qrig_dot4(one, a.z, qrig_dot4(one, a.y, qrig_dot4(one, a.x, 0)))));
  };

  constexpr int STRIDE = 32 * S;  // units between a lane's consecutive units
#pragma unroll 1
  for (int g0 = 32 * part + lane; g0 < NU; g0 += STRIDE * U) {
    WqRaw raw[U][R];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int g = g0 + STRIDE * j;
      if (U == 1 || g < NU) {
        const int blk = g / WQ_UNITS, u = g % WQ_UNITS;
#pragma unroll
        for (int r = 0; r < R; ++r)
          wq_load(arow[r] + (size_t)blk * WQ_ABYTES, brow[r] + (size_t)blk * WQ_BBYTES, u, raw[j][r]);
      }
    }
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int g = g0 + STRIDE * j;
      if (U > 1 && g >= NU) break;
      const int blk = g / WQ_UNITS, u = g % WQ_UNITS;
      WqUnit w[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wq_unpack(raw[j][r], u, w[r]);
      const int v0 = blk * WQ_BLOCK + w[0].o0, v1 = blk * WQ_BLOCK + w[0].o1;  // the halves' activation values
      const int4 a0 = __ldg(reinterpret_cast<const int4*>(xq + v0));
      const int4 a1 = __ldg(reinterpret_cast<const int4*>(xq + v1));
      int4 b0, b1;
      if constexpr (P == 2) {
        b0 = __ldg(reinterpret_cast<const int4*>(xq2 + v0));
        b1 = __ldg(reinterpret_cast<const int4*>(xq2 + v1));
      }
      if constexpr (WQ_SAME32) {
        const float x0 = __ldg(xd + (v0 >> 5));
        float z0 = 0.0f;
        if constexpr (WQ_HAS_MIN) {
          z0 = bytesum(a0) + bytesum(a1);  // exact: small integers
          if constexpr (P == 2) z0 = fmaf(bytesum(b0) + bytesum(b1), INV254, z0);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float s0 = dot8(w[r].q, a0, a1);
          if constexpr (P == 2) s0 = fmaf(dot8(w[r].q, b0, b1), INV254, s0);
          float h0 = s0 * w[r].d0;
          if constexpr (WQ_HAS_MIN) h0 = fmaf(z0, w[r].m0, h0);
          acc[r] = fmaf(h0, x0, acc[r]);
        }
      } else {
        const float x0 = __ldg(xd + (v0 >> 5)), x1 = __ldg(xd + (v1 >> 5));
        float z0 = 0.0f, z1 = 0.0f;
        if constexpr (WQ_HAS_MIN) {
          z0 = bytesum(a0);
          z1 = bytesum(a1);
          if constexpr (P == 2) {
            z0 = fmaf(bytesum(b0), INV254, z0);
            z1 = fmaf(bytesum(b1), INV254, z1);
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float s0 = dot(w[r].q, a0), s1 = dot(w[r].q + 4, a1);
          if constexpr (P == 2) {
            s0 = fmaf(dot(w[r].q, b0), INV254, s0);
            s1 = fmaf(dot(w[r].q + 4, b1), INV254, s1);
          }
          float h0 = s0 * w[r].d0, h1 = s1 * w[r].d1;
          if constexpr (WQ_HAS_MIN) {
            h0 = fmaf(z0, w[r].m0, h0);
            h1 = fmaf(z1, w[r].m1, h1);
          }
          acc[r] = fmaf(h1, x1, fmaf(h0, x0, acc[r]));
        }
      }
    }
  }

  __shared__ float part_sum[WARPS][R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = qrig_warp_sum(acc[r]);
    if (lane == 0) part_sum[warp][r] = v;
  }
  if constexpr (S > 1) {
    __syncthreads();
  } else {
    __syncwarp();
  }
  if (part == 0 && lane < R && row0 + lane < n_rows) {
    float s = part_sum[warp][lane];
#pragma unroll
    for (int p = 1; p < S; ++p) s += part_sum[warp + p][lane];
    const int row = row0 + lane;
    float* y = row < b1 ? y0 + row : row < b2 ? y1 + (row - b1) : row < b3 ? y2 + (row - b2) : y3 + (row - b3);
    *y = s;
  }
}
