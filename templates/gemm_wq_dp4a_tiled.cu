// Prefill GEMM of the GGUF weight types other than Q8_0 on the dp4a path: y[t][o] = sum over the weights'
// 16-value groups g of xd[t][.] * (d[o][g] * dot(q[o][g], xq[t][g]) + m[o][g] * sum(xq[t][g])) for many
// activation rows at once, with the weights repacked at load (runtime/cuda/wq_layout.h: quant bytes A, scale
// bytes B; qrig_wtypes.cuh decodes them) and activations quantized by quant_act_q8 (int8 xq [T][K], f32 xd
// [T][K/32]; P = 2: the second plane xq2 too); f32 y [T][N]. CPU reference: qrig::cpu::matmul on the
// dequantized weights and the dequantized activation: fp32 rounding apart.
//
// The structure is the Q8_0 tiled GEMM's (gemm_q8_0_dp4a_tiled.cu, KERNELS.md "Q8_0 x int8 GEMM"): a CTA
// computes BN weight rows x BT tokens, each thread TN rows x TT tokens (a warp 8 lanes along rows x 4 along
// tokens), from K-interleaved shared tiles (word [k4][row] holds values 4*k4..4*k4+3 of a row, so one 16-byte
// shared load gives one k4 word of 4 rows or tokens and every word feeds one dp4a), row strides padded by 4
// words. What differs is the weight tile: per stage of 128 values of K each thread loads the raw bytes of its
// units (wq_load: 4 units of 32 values per row and stage) and, once the stage before is computed, decodes them
// (wq_unpack) into int8 codes in the tile and the fp32 scale and offset of each 16 values in [8][BN] arrays:
// the decode is done once per tile and reused by all BT tokens. The token tile is staged with xd per 32 values
// and, for types with offsets, zx = xd * (sum of the 16 or 32 activation codes) per group, so the offset term
// is one FFMA per output and group. One buffer, register-staged: the next stage's global loads are issued
// before this stage's dp4a loop, decoded and stored after a barrier (two barriers per 128 values, as many per
// value as the Q8_0 GEMM's one per 64).
//
// Scales are applied once per group of GS values per output (GS = 32 for types with one scale per aligned 32
// values, WQ_SCALE32: the legacy types, Q4_K, Q5_K, IQ4_*; else 16): the group's dp4a accumulate into an int
// that starts at the magic constant 0x4B400000 (1.5 * 2^23 as a float), so its bits are the float 1.5*2^23 + s
// exactly (|s| <= 32 * 127 * 127 < 2^22); fma(bits, d, -1.5*2^23*d) is then round(s * d) exactly (d has at most
// 19 significant bits: -1.5*2^23*d is exact), a second fma adds it times xd to the f32 accumulator and, with
// offsets, a third adds m * zx. Each output's terms are added in K order: deterministic, and independent of the
// other tile parameters and of T.
//
// Two activation planes (P = 2): the second plane is staged like the first and each k4 word of the weights
// feeds a second dp4a into a second magic-started sum; per group they combine as fmaf(s2, 1/254, s1) (both
// converted exactly) before the scales, and zx includes the second plane's codes / 254.
//
// __launch_bounds__(THREADS, 1): with the block size alone ptxas held some tilings to 128 registers (two
// 256-thread CTAs per SM) and spilled; the tuning counts CTAs per SM from the registers it uses instead.
//
// Rows past n_rows and tokens past n_tokens are computed on clamped (valid) rows and not written. y rows are
// written with 16-byte stores when n_rows % 4 == 0 (y 16-byte aligned), else one float at a time.
// Variant: gemm_wq_dp4a_tiled_w<TYPE>_p<P>_bn<BN>_bt<BT>_tn<TN>_tt<TT>_t<THREADS>, THREADS = (BN/TN)*(BT/TT).
// Grid: (ceil(n_tokens / BT), ceil(n_rows / BN)).
// Arguments: wa, wb (the repacked weights; wb 16-byte aligned), xq, xd, xq2 (P = 2, laid out like xq; else
// unused), y, k (a multiple of 128 and of the type's block), n_rows, n_tokens.
#ifndef QRIG_HOST_EMULATION  // tests/cuda/test_wq_emulate.cpp runs this file on host threads with its own helpers
#include "qrig_common.cuh"
#endif
#include "qrig_wtypes.cuh"

static_assert(QRIG_WTYPE == WQ_TYPE_ID, "the weight type (QRIG_WTYPE) selects the decode of qrig_wtypes.cuh");
static_assert(QRIG_TN % 4 == 0 && QRIG_TT % 4 == 0, "gemm_wq_dp4a_tiled: thread tile sides are multiples of 4");
static_assert(QRIG_BN % (8 * QRIG_TN) == 0 && QRIG_BT % (4 * QRIG_TT) == 0,
              "gemm_wq_dp4a_tiled: the CTA tile must be whole warp tiles (8*TN rows x 4*TT tokens)");
static_assert((QRIG_BN / QRIG_TN) * (QRIG_BT / QRIG_TT) == QRIG_THREADS,
              "gemm_wq_dp4a_tiled: THREADS must be (BN/TN)*(BT/TT)");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "gemm_wq_dp4a_tiled: 1 or 2 activation planes");

namespace {
constexpr int BN = QRIG_BN, BT = QRIG_BT, TN = QRIG_TN, TT = QRIG_TT;
constexpr int THREADS = QRIG_THREADS, P = QRIG_PLANES;
constexpr int KS = 128;                 // values of K per stage
constexpr int K4 = KS / 4;              // 32-bit words of K per stage
constexpr int NG = KS / 16;             // 16-value groups per stage
constexpr int SA = BN + 4, SB = BT + 4;  // padded strides (words) of the K-interleaved tiles
constexpr int GS = WQ_SCALE32 ? 32 : 16;  // values per scale group in the dp4a loop
// Shared memory, in words: [K4][SA] weight codes, per plane [K4][SB] tokens, [NG][BN] scales, [NG][BN] offsets
// (types with offsets), [KS/32][BT] activation scales, [NG][BT] zx (types with offsets).
constexpr int OFF_B = K4 * SA, OFF_B2 = OFF_B + K4 * SB, OFF_D = OFF_B2 + (P - 1) * K4 * SB;
constexpr int OFF_M = OFF_D + NG * BN, OFF_XD = OFF_M + WQ_HAS_MIN * NG * BN, OFF_ZX = OFF_XD + (KS / 32) * BT;
constexpr int SMEM_WORDS = OFF_ZX + WQ_HAS_MIN * NG * BT;
static_assert(SMEM_WORDS * 4 <= 48 * 1024, "gemm_wq_dp4a_tiled: the tiles must fit 48 KiB of static shared memory");
}  // namespace

extern "C" __global__ void __launch_bounds__(QRIG_THREADS, 1)
gemm_wq_dp4a_tiled(const unsigned char* __restrict__ wa, const unsigned char* __restrict__ wb,
                   const signed char* __restrict__ xq, const float* __restrict__ xd,
                   const signed char* __restrict__ xq2, float* __restrict__ y, int k, int n_rows, int n_tokens) {
  // No qrig_grid_dependency_wait: launched plainly (docs/gpu.md "launch overlap": placed early beside the
  // kernel before it, its few long CTAs lost 19-25% of a 32-sequence decode step on an H200).
  constexpr int QA = BN * (KS / 32);  // units per stage: rows x 4
  constexpr int QB = BT * (KS / 32);  // activation pieces of 32 values per stage: tokens x 4
  constexpr int LA = (QA + THREADS - 1) / THREADS;
  constexpr int LB = (QB + THREADS - 1) / THREADS;
  constexpr int WN = 8 * TN, WT = 4 * TT;  // warp tile
  constexpr int WARPS_N = BN / WN;
  constexpr int MAGIC = 0x4B400000;  // 1.5 * 2^23 as float bits
  constexpr float MAGIC_F = 12582912.0f;
  constexpr float INV254 = 1.0f / 254.0f;  // the second plane's step, relative to xd

  __shared__ __align__(16) int smem[SMEM_WORDS];
  int* const sA = smem;
  int* const sB = smem + OFF_B;
  float* const sD = reinterpret_cast<float*>(smem + OFF_D);
  float* const sM = reinterpret_cast<float*>(smem + OFF_M);
  float* const sXd = reinterpret_cast<float*>(smem + OFF_XD);
  float* const sZx = reinterpret_cast<float*>(smem + OFF_ZX);

  const int NBLK = k / WQ_BLOCK;  // weight blocks per row
  const int STAGES = k / KS;      // the launcher checks k % 128 == 0
  const int tid = threadIdx.x;
  const int row0 = blockIdx.y * BN;
  const int tok0 = blockIdx.x * BT;

  // This thread's units (idx = row + BN * j: consecutive threads take consecutive rows, so the transposing
  // stores of a warp hit distinct banks) and activation pieces (idx = token + BT * q).
  const unsigned char* ga[LA];
  const unsigned char* gb[LA];
#pragma unroll
  for (int i = 0; i < LA; ++i) {
    const int idx = min(tid + i * THREADS, QA - 1);
    const size_t r = (size_t)min(row0 + idx % BN, n_rows - 1);
    ga[i] = wa + r * (size_t)NBLK * WQ_ABYTES;
    gb[i] = wb + r * (size_t)NBLK * WQ_BBYTES;
  }
  const signed char* gx[LB];
#pragma unroll
  for (int i = 0; i < LB; ++i) {
    const int idx = min(tid + i * THREADS, QB - 1);
    gx[i] = xq + (size_t)min(tok0 + idx % BT, n_tokens - 1) * k + 32 * (idx / BT);
  }

  WqRaw raw[LA];
  int4 rx[LB][2];
  float rd[LB];
#if QRIG_PLANES == 2
  int4 rx2[LB][2];
#endif
  auto load_stage = [&](int s) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      const int idx = tid + i * THREADS;
      if (QA % THREADS == 0 || idx < QA) {
        const int gu = 4 * s + idx / BN;  // the unit's index along the row
        const int blk = gu / WQ_UNITS;
        wq_load(ga[i] + (size_t)blk * WQ_ABYTES, gb[i] + (size_t)blk * WQ_BBYTES, gu % WQ_UNITS, raw[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      const signed char* p = gx[i] + (size_t)s * KS;
      rx[i][0] = __ldg(reinterpret_cast<const int4*>(p));
      rx[i][1] = __ldg(reinterpret_cast<const int4*>(p + 16));
#if QRIG_PLANES == 2
      const signed char* p2 = xq2 + (p - xq);
      rx2[i][0] = __ldg(reinterpret_cast<const int4*>(p2));
      rx2[i][1] = __ldg(reinterpret_cast<const int4*>(p2 + 16));
#endif
      rd[i] = __ldg(xd + ((p - xq) >> 5));
    }
  };
  auto store4 = [](int* dst, int stride, const int* q) {
    dst[0] = q[0];
    dst[stride] = q[1];
    dst[2 * stride] = q[2];
    dst[3 * stride] = q[3];
  };
  auto bytesum = [](const int4 a) {
    const int one = 0x01010101;
    return qrig_small_int_to_float(
        qrig_dot4(one, a.w, qrig_dot4(one, a.z, qrig_dot4(one, a.y, qrig_dot4(one, a.x, 0)))));
  };
  auto store_stage = [&](int s) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      const int idx = tid + i * THREADS;
      if (QA % THREADS == 0 || idx < QA) {
        const int row = idx % BN, gu = 4 * s + idx / BN;
        WqUnit w;
        wq_unpack(raw[i], gu % WQ_UNITS, w);
        const int base = (gu / WQ_UNITS) * WQ_BLOCK - s * KS;  // the block's first value, within the stage
        const int v0 = base + w.o0, v1 = base + w.o1;
        store4(sA + (v0 / 4) * SA + row, SA, w.q);
        store4(sA + (v1 / 4) * SA + row, SA, w.q + 4);
        sD[(v0 / 16) * BN + row] = w.d0;
        sD[(v1 / 16) * BN + row] = w.d1;
        if constexpr (WQ_HAS_MIN) {
          sM[(v0 / 16) * BN + row] = w.m0;
          sM[(v1 / 16) * BN + row] = w.m1;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      const int idx = tid + i * THREADS;
      if (QB % THREADS == 0 || idx < QB) {
        const int tok = idx % BT, q = idx / BT;  // piece q: values 32q .. 32q+31 of the stage
        int* dst = sB + (8 * q) * SB + tok;
        const int a[8] = {rx[i][0].x, rx[i][0].y, rx[i][0].z, rx[i][0].w,
                          rx[i][1].x, rx[i][1].y, rx[i][1].z, rx[i][1].w};
        store4(dst, SB, a);
        store4(dst + 4 * SB, SB, a + 4);
#if QRIG_PLANES == 2
        const int a2[8] = {rx2[i][0].x, rx2[i][0].y, rx2[i][0].z, rx2[i][0].w,
                           rx2[i][1].x, rx2[i][1].y, rx2[i][1].z, rx2[i][1].w};
        store4(dst + (OFF_B2 - OFF_B), SB, a2);
        store4(dst + (OFF_B2 - OFF_B) + 4 * SB, SB, a2 + 4);
#endif
        sXd[q * BT + tok] = rd[i];
        if constexpr (WQ_HAS_MIN) {
          float z0 = bytesum(rx[i][0]), z1 = bytesum(rx[i][1]);
#if QRIG_PLANES == 2
          z0 = fmaf(bytesum(rx2[i][0]), INV254, z0);
          z1 = fmaf(bytesum(rx2[i][1]), INV254, z1);
#endif
          if constexpr (WQ_SCALE32) {
            sZx[(2 * q) * BT + tok] = rd[i] * (z0 + z1);
          } else {
            sZx[(2 * q) * BT + tok] = rd[i] * z0;
            sZx[(2 * q + 1) * BT + tok] = rd[i] * z1;
          }
        }
      }
    }
  };

  const int warp = tid >> 5, lane = tid & 31;
  const int a_off = (warp % WARPS_N) * WN + (lane & 7) * 4;   // + 32*c: rows of chunk c of this thread
  const int b_off = (warp / WARPS_N) * WT + (lane >> 3) * 4;  // + 16*c: tokens of chunk c

  float acc[TN][TT];
#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int j = 0; j < TT; ++j) acc[i][j] = 0.0f;

  load_stage(0);
  store_stage(0);
  __syncthreads();

  auto ld4 = [](int* out, const int* p) {
    const int4 v = *reinterpret_cast<const int4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  };
  auto ld4f = [](float* out, const float* p) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  };

#pragma unroll 1
  for (int s = 0; s < STAGES; ++s) {
    if (s + 1 < STAGES) load_stage(s + 1);
#pragma unroll
    for (int g = 0; g < KS / GS; ++g) {
      int si[TN][TT];
      int si2[P == 2 ? TN : 1][P == 2 ? TT : 1];  // the second plane's sums
#pragma unroll
      for (int kk = 0; kk < GS / 4; ++kk) {
        const int k4 = g * (GS / 4) + kk;
        int a[TN], x[TT];
#pragma unroll
        for (int c = 0; c < TN / 4; ++c) ld4(a + 4 * c, sA + k4 * SA + a_off + 32 * c);
#pragma unroll
        for (int c = 0; c < TT / 4; ++c) ld4(x + 4 * c, sB + k4 * SB + b_off + 16 * c);
#pragma unroll
        for (int i = 0; i < TN; ++i)
#pragma unroll
          for (int j = 0; j < TT; ++j) si[i][j] = qrig_dot4(a[i], x[j], kk == 0 ? MAGIC : si[i][j]);
        if constexpr (P == 2) {
#pragma unroll
          for (int c = 0; c < TT / 4; ++c) ld4(x + 4 * c, sB + (OFF_B2 - OFF_B) + k4 * SB + b_off + 16 * c);
#pragma unroll
          for (int i = 0; i < TN; ++i)
#pragma unroll
            for (int j = 0; j < TT; ++j) si2[i][j] = qrig_dot4(a[i], x[j], kk == 0 ? MAGIC : si2[i][j]);
        }
      }
      const int g16 = g * (GS / 16);  // the group's first 16-value scale entry
      float w[TN], d[TT];
#pragma unroll
      for (int c = 0; c < TN / 4; ++c) ld4f(w + 4 * c, sD + g16 * BN + a_off + 32 * c);
#pragma unroll
      for (int c = 0; c < TT / 4; ++c) ld4f(d + 4 * c, sXd + (g16 / 2) * BT + b_off + 16 * c);
      if constexpr (P == 1) {
#pragma unroll
        for (int i = 0; i < TN; ++i) {
          const float bias = -MAGIC_F * w[i];  // exact: w has at most 19 significant bits
#pragma unroll
          for (int j = 0; j < TT; ++j)
            acc[i][j] = fmaf(fmaf(__int_as_float(si[i][j]), w[i], bias), d[j], acc[i][j]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < TN; ++i)
#pragma unroll
          for (int j = 0; j < TT; ++j) {
            const float v = fmaf(__int_as_float(si2[i][j]) - MAGIC_F, INV254, __int_as_float(si[i][j]) - MAGIC_F);
            acc[i][j] = fmaf(v * w[i], d[j], acc[i][j]);
          }
      }
      if constexpr (WQ_HAS_MIN) {
        float m[TN], z[TT];
#pragma unroll
        for (int c = 0; c < TN / 4; ++c) ld4f(m + 4 * c, sM + g16 * BN + a_off + 32 * c);
#pragma unroll
        for (int c = 0; c < TT / 4; ++c) ld4f(z + 4 * c, sZx + g16 * BT + b_off + 16 * c);
#pragma unroll
        for (int i = 0; i < TN; ++i)
#pragma unroll
          for (int j = 0; j < TT; ++j) acc[i][j] = fmaf(m[i], z[j], acc[i][j]);
      }
    }
    if (s + 1 < STAGES) {
      __syncthreads();  // every thread is done with this stage's tiles
      store_stage(s + 1);
      __syncthreads();
    }
  }

  // Epilogue: token j of this thread, rows 4 at a time.
  const bool vec = (n_rows & 3) == 0;
#pragma unroll
  for (int j = 0; j < TT; ++j) {
    const int t = tok0 + b_off + 16 * (j / 4) + (j % 4);
    if (t >= n_tokens) continue;
    float* yt = y + (size_t)t * n_rows;
#pragma unroll
    for (int c = 0; c < TN / 4; ++c) {
      const int r = row0 + a_off + 32 * c;
      if (vec && r + 3 < n_rows) {
        *reinterpret_cast<float4*>(yt + r) =
            make_float4(acc[4 * c][j], acc[4 * c + 1][j], acc[4 * c + 2][j], acc[4 * c + 3][j]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (r + e < n_rows) yt[r + e] = acc[4 * c + e][j];
      }
    }
  }
}
