// Matmul of the GGUF weight types other than Q8_0 on the dp4a path, for up to C activation rows (C = 1: the
// decode GEMV; more: batched decode and, tile after tile of C rows, prefill): y[t][o] = sum over the weights'
// units (qrig_wtypes.cuh) and their two 16-value halves h of xd[t][.] * (d_h * dot(q_h, xq[t][.]) +
// m_h * sum(xq[t][.])), every integer sum exact, with the weights repacked at load (runtime/cuda/wq_layout.h:
// quant bytes A, scale bytes B) and the activation quantized by quant_act_q8 (int8 xq [T][k], f32 xd
// [T][k/32]). CPU reference: qrig::cpu::matmul on the dequantized weights and the dequantized activation:
// fp32 rounding apart.
//
// Each warp computes R consecutive weight rows for all n_tokens (<= C) tokens; lane l takes the units l,
// l + 32, ... of the rows (a warp's 16-byte loads of a row's A bytes are contiguous: 512 bytes per row and
// step for the 4- and 6-bit types), decodes the unit of every row once, then per token reads the two
// 16-byte pieces of the activation the unit's halves meet (through L1: every warp reads the same activation)
// and their scales: 8 dp4a per (row, token), 8 more for the activation sums of types with offsets (once per
// token, shared by the R rows), and with two activation planes (P = 2: x = xd * (xq + xq2/254)) the same
// again for the second plane. Per-lane sums are reduced by butterflies in a fixed order (deterministic); lane
// 0 writes. Tokens past n_tokens and rows past n_rows are computed on clamped ones and not written.
// Output rows may go to up to four places (one launch for several matmuls that read the same input, their
// weights stacked in one matrix: kernels/matmul.h check_wq_stack): row r < b1 -> y0, r < b2 -> y1, r < b3 -> y2,
// else y3, each output [n_tokens][its rows] (r - its first row); a single output [n_tokens][n_rows]: b1 = b2 =
// b3 = n_rows.
// Variant: gemm_wq_dp4a_skinny_w<TYPE>_p<P>_c<C>_r<R>_t<T> (TYPE: the ggml type id); C and R powers of two.
// Grid: ceil(n_rows / (R * T/32)).
// Arguments: wa, wb (the repacked weights), xq, xd, xq2 (P = 2; else unused), y0, y1, y2, y3, b1, b2, b3, k (a
// multiple of the type's block), n_rows, n_tokens (1 <= n_tokens <= C).
#ifndef QRIG_HOST_EMULATION  // tests/cuda/test_wq_emulate.cpp runs this file on host threads with its own helpers
#include "qrig_common.cuh"
#endif
#include "qrig_wtypes.cuh"

static_assert(QRIG_WTYPE == WQ_TYPE_ID, "the weight type (QRIG_WTYPE) selects the decode of qrig_wtypes.cuh");

static_assert(QRIG_COLS >= 1 && QRIG_COLS <= 16 && (QRIG_COLS & (QRIG_COLS - 1)) == 0,
              "gemm_wq_dp4a_skinny: C is a power of two, at most 16");
static_assert(QRIG_ROWS >= 1 && QRIG_ROWS <= 4 && (QRIG_ROWS & (QRIG_ROWS - 1)) == 0,
              "gemm_wq_dp4a_skinny: R is a power of two, at most 4");
static_assert(QRIG_COLS * QRIG_ROWS <= 32, "gemm_wq_dp4a_skinny: C * R sums per lane at most 32 (registers)");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "gemm_wq_dp4a_skinny: bad block size");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "gemm_wq_dp4a_skinny: 1 or 2 activation planes");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS, 1)
gemm_wq_dp4a_skinny(const unsigned char* __restrict__ wa, const unsigned char* __restrict__ wb,
                    const signed char* __restrict__ xq, const float* __restrict__ xd,
                    const signed char* __restrict__ xq2, float* y0, float* y1, float* y2, float* y3, int b1,
                    int b2, int b3, int k, int n_rows, int n_tokens) {
  qrig_grid_dependency_wait();
  constexpr int C = QRIG_COLS, R = QRIG_ROWS, T = QRIG_THREADS, P = QRIG_PLANES;
  constexpr int WARPS = T / 32;
  constexpr float INV254 = 1.0f / 254.0f;  // the second plane's step, relative to xd
  const int NBLK = k / WQ_BLOCK;           // weight blocks per row
  const int NU = NBLK * WQ_UNITS;          // units per row

  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
  if (row0 >= n_rows) return;  // whole warps
  const unsigned char* arow[R];
  const unsigned char* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t row = (size_t)min(row0 + r, n_rows - 1);
    arow[r] = wa + row * (size_t)NBLK * WQ_ABYTES;
    brow[r] = wb + row * (size_t)NBLK * WQ_BBYTES;
  }
  float acc[C * R];
#pragma unroll
  for (int i = 0; i < C * R; ++i) acc[i] = 0.0f;

  // Exact dot of a unit half's 16 codes with 16 activation bytes, as a float.
  auto dot = [](const int* q, const int4 a) {
    return qrig_small_int_to_float(
        qrig_dot4(q[3], a.w, qrig_dot4(q[2], a.z, qrig_dot4(q[1], a.y, qrig_dot4(q[0], a.x, 0)))));
  };
  auto bytesum = [](const int4 a) {
    const int one = 0x01010101;
    return qrig_small_int_to_float(
        qrig_dot4(one, a.w, qrig_dot4(one, a.z, qrig_dot4(one, a.y, qrig_dot4(one, a.x, 0)))));
  };

#pragma unroll 1
  for (int g = lane; g < NU; g += 32) {
    // L2 prefetch of the rows' bytes PD steps ahead: the loads of a step depend on nothing but g, yet a lane
    // issues one step's loads at a time (the decode needs them all); prefetches hold no registers and keep
    // ~PD x 512 bytes per row and warp on their way from DRAM.
    constexpr int PD = 4;
#ifndef QRIG_HOST_EMULATION
    if (g + 32 * PD < NU) {
      const int gp = g + 32 * PD;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(arow[r] + (size_t)gp * WQ_ABYTES / WQ_UNITS));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(brow[r] + (size_t)(gp / WQ_UNITS) * WQ_BBYTES));
      }
    }
#endif
    const int blk = g / WQ_UNITS, u = g % WQ_UNITS;
    WqUnit w[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wq_decode(arow[r] + (size_t)blk * WQ_ABYTES, brow[r] + (size_t)blk * WQ_BBYTES, u, w[r]);
    const int v0 = blk * WQ_BLOCK + w[0].o0, v1 = blk * WQ_BLOCK + w[0].o1;  // the halves' activation values
#pragma unroll
    for (int c = 0; c < C; ++c) {
      // 32-bit offsets (the launcher bounds n_tokens * k): per-token 64-bit pointers, hoisted out of the
      // loop by the compiler, would hold 4 registers per token and plane.
      const int t = min(c, n_tokens - 1);
      const int e0 = t * k + v0, e1 = t * k + v1;
      const int4 a0 = __ldg(reinterpret_cast<const int4*>(xq + e0));
      const int4 a1 = __ldg(reinterpret_cast<const int4*>(xq + e1));
      const float x0 = __ldg(xd + (e0 >> 5)), x1 = __ldg(xd + (e1 >> 5));
      float z0 = 0.0f, z1 = 0.0f;
      int4 b0, b1;
      if constexpr (P == 2) {
        b0 = __ldg(reinterpret_cast<const int4*>(xq2 + e0));
        b1 = __ldg(reinterpret_cast<const int4*>(xq2 + e1));
      }
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
        acc[c * R + r] = fmaf(h1, x1, fmaf(h0, x0, acc[c * R + r]));
      }
      // A compiler fence every 4 tokens: otherwise every token's activation loads are hoisted to the top
      // (16 tokens x 4 int4 with two planes: spills), while 4 tokens' loads in flight cover the L1 latency.
      if (c % 4 == 3) asm volatile("" ::: "memory");
    }
  }

#pragma unroll
  for (int i = 0; i < C * R; ++i) {
    const float v = qrig_warp_sum(acc[i]);
    const int c = i / R, r = i % R, row = row0 + r;
    if (lane == 0 && c < n_tokens && row < n_rows) {
      float* y = y0;
      int first = 0, n = b1;
      if (row >= b3) y = y3, first = b3, n = n_rows - b3;
      else if (row >= b2) y = y2, first = b2, n = b3 - b2;
      else if (row >= b1) y = y1, first = b1, n = b2 - b1;
      y[(size_t)c * n + (row - first)] = v;
    }
  }
}
