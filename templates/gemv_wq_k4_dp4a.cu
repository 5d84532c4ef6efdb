// Decode GEMV of Q4_K and Q5_K weights (the K-quants whose 256-value block holds 8 sub-blocks of 32 values with a
// 6-bit scale and a 6-bit min each) on the dp4a path: y[o] = sum over sub-blocks s of xd[s] * (d * sc_s *
// dot(q_s, xq[s]) - dmin * m_s * sum(xq[s])), every integer sum exact, with the weights repacked at load
// (runtime/cuda/wq_layout.h: quant bytes A, scale bytes B, qrig_wtypes.cuh) and one activation row quantized by
// quant_act_q8 (int8 xq [k], f32 xd [k/32]; P = 2: the second plane xq2, x = xd * (xq + xq2/254)). CPU
// reference: qrig::cpu::matmul on the dequantized weights and the dequantized activation: fp32 rounding apart.
//
// Why a kernel of its own: the generic block-type kernels (gemm_wq_dp4a_skinny.cu, gemv_wq_dp4a.cu) take a unit
// of 32 weights per lane and step, whose two 16-value halves lie in two sub-blocks, so every unit decodes two
// scales and mins (and the branch between the two packings of the 12 scale bytes diverges inside a warp: lanes
// of units 0-3 and 4-7 of a block take different sides), sums the activation per 16 values, and scales per 16.
// Those GEMVs are bound by instructions (bench/RESULTS.md, sessions 8-9: 30-54% of the copy rate). Here a lane
// takes a chunk of 64 values (the 32 quant bytes 32c .. 32c+31 of a block, whose low nibbles are sub-block 2c and
// high nibbles sub-block 2c+1): two 16-byte loads of A, one of B, two scale/min pairs decoded branch-free on 16-bit
// pairs, one exact integer dot of 32 codes per sub-block, and the activation's four 16-byte pieces, two scales and
// two sub-block sums shared by the R rows of the warp: about 2.5x fewer instructions per weight byte than the
// skinny kernel's (counted on the PTX of both for sm_90).
//
// A warp computes R consecutive rows; lane l takes the chunks l, l + 32, ... (a warp's loads of a row's A bytes
// are 1024 contiguous bytes per step for Q4_K) and prefetches into L2 the chunk PD steps ahead. Per-lane sums are
// reduced by a butterfly (deterministic); lane 0 writes. Rows past n_rows are computed on a clamped row and not
// written. Output rows may go to up to four places (one launch for several matmuls on one input, their weights
// stacked in one matrix: kernels/matmul.h check_wq_stack): row r < b1 -> y0[r], r < b2 -> y1[r - b1], r < b3 ->
// y2[r - b2], else y3[r - b3] (a single output: b1 = b2 = b3 = n_rows).
// Variant: gemv_wq_k4_dp4a_w<TYPE>_p<P>_r<R>_t<T> (TYPE 12 Q4_K or 13 Q5_K). Grid: ceil(n_rows / (R * T/32)).
// Arguments: wa, wb (the repacked weights; wb 16-byte aligned), xq, xd, xq2 (P = 2; else unused), y0, y1, y2, y3,
// b1, b2, b3, k (a multiple of 256), n_rows. The same arguments as gemv_wq_dp4a's.
#ifndef QRIG_HOST_EMULATION  // tests/cuda/test_wq_emulate.cpp runs this file on host threads with its own helpers
#include "qrig_common.cuh"
#endif
#include "qrig_wtypes.cuh"

static_assert(QRIG_WTYPE == QRIG_WT_Q4_K || QRIG_WTYPE == QRIG_WT_Q5_K, "gemv_wq_k4_dp4a: Q4_K or Q5_K weights");
static_assert(QRIG_ROWS >= 1 && QRIG_ROWS <= 4, "gemv_wq_k4_dp4a: R in 1..4");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "gemv_wq_k4_dp4a: bad block size");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "gemv_wq_k4_dp4a: 1 or 2 activation planes");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
gemv_wq_k4_dp4a(const unsigned char* __restrict__ wa, const unsigned char* __restrict__ wb,
                const signed char* __restrict__ xq, const float* __restrict__ xd,
                const signed char* __restrict__ xq2, float* y0, float* y1, float* y2, float* y3, int b1, int b2,
                int b3, int k, int n_rows) {
  qrig_grid_dependency_wait();
  constexpr int R = QRIG_ROWS, T = QRIG_THREADS, P = QRIG_PLANES;
  constexpr int WARPS = T / 32;
  constexpr bool Q5 = QRIG_WTYPE == QRIG_WT_Q5_K;
  constexpr int QS = Q5 ? 32 : 0;    // where qs starts in a block's A bytes (Q5_K: after qh[32])
  constexpr float INV254 = 1.0f / 254.0f;  // the second plane's step, relative to xd
  const int NBLK = k / 256;          // weight blocks per row
  const int NC = NBLK * 4;           // 64-value chunks per row

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
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

  const int NIB = 0x0F0F0F0F, ONE = 0x01010101;
  // Exact integer dot of 8 words of codes with 32 activation bytes (two 16-byte pieces).
  auto dot8 = [](const int* q, const int4 a, const int4 b) {
    int s = qrig_dot4(q[3], a.w, qrig_dot4(q[2], a.z, qrig_dot4(q[1], a.y, qrig_dot4(q[0], a.x, 0))));
    return qrig_dot4(q[7], b.w, qrig_dot4(q[6], b.z, qrig_dot4(q[5], b.y, qrig_dot4(q[4], b.x, s))));
  };
  auto bytesum8 = [ONE](const int4 a, const int4 b) {
    int s = qrig_dot4(ONE, a.w, qrig_dot4(ONE, a.z, qrig_dot4(ONE, a.y, qrig_dot4(ONE, a.x, 0))));
    return qrig_dot4(ONE, b.w, qrig_dot4(ONE, b.z, qrig_dot4(ONE, b.y, qrig_dot4(ONE, b.x, s))));
  };

#pragma unroll 1
  for (int g = lane; g < NC; g += 32) {
    constexpr int PD = 4;  // L2 prefetch distance in steps (as gemm_wq_dp4a_skinny.cu: no registers held)
#ifndef QRIG_HOST_EMULATION
    if (g + 32 * PD < NC) {
      const int gp = g + 32 * PD, bp = gp >> 2;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(arow[r] + (size_t)bp * WQ_ABYTES + QS + 32 * (gp & 3)));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(brow[r] + (size_t)bp * WQ_BBYTES));
        if constexpr (Q5) asm volatile("prefetch.global.L2 [%0];" ::"l"(arow[r] + (size_t)bp * WQ_ABYTES));
      }
    }
#endif
    const int blk = g >> 2, c = g & 3;
    // The rows' loads first (all independent), then the activation's.
    int4 qa[R], qb[R], sb[R];
    int4 ha[R], hb[R];  // Q5_K's qh[32]
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const unsigned char* a = arow[r] + (size_t)blk * WQ_ABYTES;
      qa[r] = wq_ld16(a + QS + 32 * c);
      qb[r] = wq_ld16(a + QS + 32 * c + 16);
      sb[r] = wq_ld16(brow[r] + (size_t)blk * WQ_BBYTES);  // d, dmin, scales[12]
      if constexpr (Q5) {
        ha[r] = wq_ld16(a);
        hb[r] = wq_ld16(a + 16);
      }
    }
    const int v = blk * 256 + 64 * c;  // the chunk's first activation value; sub-blocks at v and v + 32
    const int4 x0 = __ldg(reinterpret_cast<const int4*>(xq + v));
    const int4 x1 = __ldg(reinterpret_cast<const int4*>(xq + v + 16));
    const int4 x2 = __ldg(reinterpret_cast<const int4*>(xq + v + 32));
    const int4 x3 = __ldg(reinterpret_cast<const int4*>(xq + v + 48));
    const float xd0 = __ldg(xd + (v >> 5)), xd1 = __ldg(xd + (v >> 5) + 1);
    int4 z0, z1, z2, z3;
    if constexpr (P == 2) {
      z0 = __ldg(reinterpret_cast<const int4*>(xq2 + v));
      z1 = __ldg(reinterpret_cast<const int4*>(xq2 + v + 16));
      z2 = __ldg(reinterpret_cast<const int4*>(xq2 + v + 32));
      z3 = __ldg(reinterpret_cast<const int4*>(xq2 + v + 48));
    }
    // The activation's sums over each sub-block (exact small integers), as floats; the second plane's on its step.
    float sum0 = qrig_small_int_to_float(bytesum8(x0, x1)), sum1 = qrig_small_int_to_float(bytesum8(x2, x3));
    if constexpr (P == 2) {
      sum0 = fmaf(qrig_small_int_to_float(bytesum8(z0, z1)), INV254, sum0);
      sum1 = fmaf(qrig_small_int_to_float(bytesum8(z2, z3)), INV254, sum1);
    }
    const bool high = c >= 2;  // sub-blocks 4..7: the scales' second packing
    const int sh = 16 * (c & 1);  // sub-blocks 2c, 2c+1 are bytes 2c % 4 and 2c % 4 + 1 of the scale words
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int wv[8] = {qa[r].x, qa[r].y, qa[r].z, qa[r].w, qb[r].x, qb[r].y, qb[r].z, qb[r].w};
      int lo[8], hi[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        lo[j] = wv[j] & NIB;
        hi[j] = (wv[j] >> 4) & NIB;
      }
      if constexpr (Q5) {
        // qh byte l: bit 2c is the fifth bit of value 64c + l, bit 2c + 1 that of 64c + 32 + l.
        const int hv[8] = {ha[r].x, ha[r].y, ha[r].z, ha[r].w, hb[r].x, hb[r].y, hb[r].z, hb[r].w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          lo[j] |= ((hv[j] >> (2 * c)) & ONE) << 4;
          hi[j] |= ((hv[j] >> (2 * c + 1)) & ONE) << 4;
        }
      }
      // The two sub-blocks' 6-bit scale and min, both at once in the two low bytes of a word (gguf's
      // k4_scale_min: j < 4: sc = s[j] & 63, m = s[j + 4] & 63; else sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4,
      // m = (s[j + 4] >> 4) | (s[j] >> 6) << 4, s[i] = byte i % 4 of B word 1 + i / 4).
      const unsigned wa1 = ((unsigned)sb[r].y >> sh) & 0xFFFFu, wa2 = ((unsigned)sb[r].z >> sh) & 0xFFFFu,
                     wa3 = ((unsigned)sb[r].w >> sh) & 0xFFFFu;
      const unsigned scp = high ? (wa3 & 0x0F0Fu) | ((wa1 >> 2) & 0x3030u) : wa1 & 0x3F3Fu;
      const unsigned mp = high ? ((wa3 >> 4) & 0x0F0Fu) | ((wa2 >> 2) & 0x3030u) : wa2 & 0x3F3Fu;
      const float d = wq_half_bits((unsigned)sb[r].x), dmin = wq_half_bits((unsigned)sb[r].x >> 16);
      const float d0 = d * (float)(int)(scp & 0xFF), d1 = d * (float)(int)(scp >> 8);
      const float m0 = dmin * (float)(int)(mp & 0xFF), m1 = dmin * (float)(int)(mp >> 8);
      float s0 = qrig_small_int_to_float(dot8(lo, x0, x1)), s1 = qrig_small_int_to_float(dot8(hi, x2, x3));
      if constexpr (P == 2) {
        s0 = fmaf(qrig_small_int_to_float(dot8(lo, z0, z1)), INV254, s0);
        s1 = fmaf(qrig_small_int_to_float(dot8(hi, z2, z3)), INV254, s1);
      }
      const float h0 = fmaf(s0, d0, -(m0 * sum0)), h1 = fmaf(s1, d1, -(m1 * sum1));
      acc[r] = fmaf(h1, xd1, fmaf(h0, xd0, acc[r]));
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = qrig_warp_sum(acc[r]);
    const int row = row0 + r;
    if (lane == 0 && row < n_rows) {
      float* y = row < b1 ? y0 + row : row < b2 ? y1 + (row - b1) : row < b3 ? y2 + (row - b2) : y3 + (row - b3);
      *y = s;
    }
  }
}
