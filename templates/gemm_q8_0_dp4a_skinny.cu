// Few-row GEMM of the default family (batched decode of several sequences, short prefills): the same
// y[t][o] = sum over 32-blocks b of wd[o][b] * xd[t][b] * dot(wq[o][b], xq[t][b]) as gemm_q8_0_dp4a_tiled,
// for up to C activation rows, reading every weight once for all of them. CPU reference: qrig::cpu::matmul
// on the same weights and the dequantized activations.
//
// Each warp computes R consecutive weight rows for all n_tokens (<= C) tokens, its lanes splitting K: lane l
// takes the 16-byte vectors l, l+32, l+64, ... of the rows (half a Q8_0 block each: a warp reads 512
// contiguous bytes per row and instruction; straight from global memory into registers, U vectors of all R
// rows in flight for DRAM bandwidth) and, per token, the matching 16 activation bytes and scale (read through
// L1: every warp reads the same activation rows): 4 dp4a per (row, token), whose sum starts at the magic
// 0x4B400000 so that one fma turns it into round(s * wd) exactly and a second adds it times xd (see
// gemm_q8_0_dp4a_tiled.cu). (Lanes owning whole 32-byte blocks would halve the fmas, but their 16-byte loads
// then span 1 KiB per instruction: twice the L1 wavefronts per byte, measured slower from 8 tokens up.) The
// C x R per-lane sums are reduced by butterflies in a fixed order (deterministic); lane 0 writes. Tokens past
// n_tokens are computed on a clamped token and not written; rows past n_rows likewise (the last warp).
// Two activation planes (P = 2: xq2 holds the residual of xq on the step xd/254, x = xd * (xq + xq2/254)):
// per token the matching 16 bytes of xq2 are read too, 4 more dp4a per (row, token) into a second
// magic-started sum, and the two combine per 16-byte piece as v = fmaf(s2, 1/254, s1) (exact conversions),
// then acc = fmaf(v * wd, xd, acc). With P = 1 nothing of the second plane is compiled in.
// Variant: gemm_q8_0_dp4a_skinny_p<P>_c<C>_r<R>_u<U>_t<T>; C and R powers of two, C*R <= 64.
// Grid: ceil(n_rows / (R * T/32)).
// Arguments: wq, wd, xq, xd, xq2 (P = 2, laid out like xq; else unused), y, k (a multiple of 32), n_rows,
// n_tokens (1 <= n_tokens <= C).
#include "qrig_common.cuh"

static_assert(QRIG_COLS >= 1 && QRIG_COLS <= 16 && (QRIG_COLS & (QRIG_COLS - 1)) == 0,
              "gemm_q8_0_dp4a_skinny: C is a power of two, at most 16");
static_assert(QRIG_ROWS >= 1 && QRIG_ROWS <= 8 && (QRIG_ROWS & (QRIG_ROWS - 1)) == 0,
              "gemm_q8_0_dp4a_skinny: R is a power of two, at most 8");
static_assert(QRIG_COLS * QRIG_ROWS <= 64, "gemm_q8_0_dp4a_skinny: C * R sums per lane at most 64 (registers)");
static_assert(QRIG_UNROLL >= 1 && QRIG_UNROLL <= 8, "gemm_q8_0_dp4a_skinny: U in 1..8");
static_assert(QRIG_THREADS % 32 == 0 && QRIG_THREADS <= 1024, "gemm_q8_0_dp4a_skinny: bad block size");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "gemm_q8_0_dp4a_skinny: 1 or 2 activation planes");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
gemm_q8_0_dp4a_skinny(const signed char* __restrict__ wq, const unsigned short* __restrict__ wd,
                      const signed char* __restrict__ xq, const float* __restrict__ xd,
                      const signed char* __restrict__ xq2, float* __restrict__ y, int k, int n_rows, int n_tokens) {
  qrig_grid_dependency_wait();
  constexpr int C = QRIG_COLS, R = QRIG_ROWS, U = QRIG_UNROLL, T = QRIG_THREADS, P = QRIG_PLANES;
  constexpr int WARPS = T / 32;
  constexpr int V = C * R;  // sums per lane: index c * R + r
  constexpr int MAGIC = 0x4B400000;
  constexpr float MAGIC_F = 12582912.0f;
  constexpr float INV254 = 1.0f / 254.0f;  // the second plane's step, relative to xd
  const int NB = k >> 5;  // Q8_0 blocks per row (k is a multiple of 32: rows are 16-byte aligned)

  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
  if (row0 >= n_rows) return;  // whole warps
  const int4* wrow[R];
  const unsigned short* srow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const size_t row = (size_t)min(row0 + r, n_rows - 1);
    wrow[r] = reinterpret_cast<const int4*>(wq + row * k);
    srow[r] = wd + row * NB;
  }
  const int4* xrow[C];  // token rows (clamped), so the loop only adds the vector index
  const int4* xrow2[P == 2 ? C : 1];
  const float* drow[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const size_t t = (size_t)min(c, n_tokens - 1);
    xrow[c] = reinterpret_cast<const int4*>(xq + t * k);
    if constexpr (P == 2) xrow2[c] = reinterpret_cast<const int4*>(xq2 + t * k);
    drow[c] = xd + t * NB;
  }
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.0f;

  // 16-byte vector v (half a Q8_0 block) of every row against the same vector of every token.
  auto step = [&](const int4 (&w)[R], const unsigned short (&s)[R], int v) {
    float wf[R], bias[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wf[r] = qrig_half_to_float(s[r]);
      bias[r] = -MAGIC_F * wf[r];  // exact: wf is an fp16 value
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int4 a = __ldg(xrow[c] + v);
      const float ad = __ldg(drow[c] + (v >> 1));
      if constexpr (P == 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          int m = qrig_dot4(w[r].x, a.x, MAGIC);
          m = qrig_dot4(w[r].y, a.y, m);
          m = qrig_dot4(w[r].z, a.z, m);
          m = qrig_dot4(w[r].w, a.w, m);
          acc[c * R + r] = fmaf(fmaf(__int_as_float(m), wf[r], bias[r]), ad, acc[c * R + r]);
        }
      } else {
        const int4 a2 = __ldg(xrow2[c] + v);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          int m = qrig_dot4(w[r].x, a.x, MAGIC);
          m = qrig_dot4(w[r].y, a.y, m);
          m = qrig_dot4(w[r].z, a.z, m);
          m = qrig_dot4(w[r].w, a.w, m);
          int m2 = qrig_dot4(w[r].x, a2.x, MAGIC);
          m2 = qrig_dot4(w[r].y, a2.y, m2);
          m2 = qrig_dot4(w[r].z, a2.z, m2);
          m2 = qrig_dot4(w[r].w, a2.w, m2);
          // s1 + s2/254 (the sums exactly as floats: |s| <= 2^18), then the scales as with one plane.
          const float s = fmaf(__int_as_float(m2) - MAGIC_F, INV254, __int_as_float(m) - MAGIC_F);
          acc[c * R + r] = fmaf(s * wf[r], ad, acc[c * R + r]);
        }
      }
    }
  };

  const int VEC = k >> 4;        // 16-byte vectors per row; lane l takes l, l+32, ...
  const int CHUNKS = VEC >> 5;   // whole 512-byte chunks (one vector per lane): a warp-uniform loop
  const int TAIL = VEC & 31;     // vectors of the last, partial chunk
#pragma unroll 1
  for (int c0 = 0; c0 < CHUNKS; c0 += U) {
    int4 w[U][R];
    unsigned short s[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (c0 + u < CHUNKS)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          w[u][r] = __ldg(wrow[r] + (c0 + u) * 32 + lane);
          s[u][r] = __ldg(srow[r] + (c0 + u) * 16 + (lane >> 1));
        }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (c0 + u < CHUNKS) step(w[u], s[u], (c0 + u) * 32 + lane);
  }
  if (lane < TAIL) {
    const int v = CHUNKS * 32 + lane;
    int4 w[R];
    unsigned short s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      w[r] = __ldg(wrow[r] + v);
      s[r] = __ldg(srow[r] + (v >> 1));
    }
    step(w, s, v);
  }

  // Butterfly sums per output (a fixed order: deterministic); lane 0 writes. (Halving exchanges, ~C*R
  // shuffles instead of 5*C*R, measured 1.4-2x slower overall on an H200: the lane-dependent selects cost
  // more in the main loop than the shuffles they save.)
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float v = qrig_warp_sum(acc[i]);
    const int c = i / R, r = i % R;
    if (lane == 0 && c < n_tokens && row0 + r < n_rows) y[(size_t)c * n_rows + row0 + r] = v;
  }
}
