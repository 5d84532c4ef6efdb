// Prefill GEMM of the default family: y[t][o] = sum over 32-blocks b of wd[o][b] * xd[t][b] * dot(wq[o][b],
// xq[t][b]) for T activation rows at once, with repacked Q8_0 weights (runtime/cuda/q8_layout.h: int8 wq [N][K],
// fp16 wd [N][K/32]) and activations quantized by quant_act_q8 (int8 xq [T][K], f32 xd [T][K/32]); f32 y [T][N].
// CPU reference: qrig::cpu::matmul on the same weights and the dequantized activation.
//
// Tiling (KERNELS.md "Q8_0 x int8 GEMM"): a CTA computes BN weight rows x BT tokens; each thread TN rows x TT
// tokens (8 x 8 in the large tile), a warp 8 lanes along rows x 4 lanes along tokens. Per stage the CTA stages
// KB*SK Q8_0 blocks (32 bytes of K each) of its rows and tokens in shared memory, K-interleaved: word [k4][row]
// holds bytes 4*k4..4*k4+3 of a row, so one 16-byte shared load gives one k4 word of 4 rows (or tokens) and
// every 32-bit word feeds one dp4a with no shuffling. Row strides are padded by 4 words (16-byte aligned for
// the vector loads; the transposing stores of a warp then hit 32 distinct banks when a stage is one block,
// two-way otherwise); the loads of a warp are a 128-byte (rows) and a 64-byte (tokens) span, broadcast to the
// other lanes. Double buffering is register-staged (sm_70 material: no cp.async): stage s+1 is loaded from
// global memory into registers before stage s is computed and stored to the other buffer after; one barrier
// per stage. (Storing halfway through the stage made ptxas sink the loads next to the stores: slower.)
//
// Sliced K (SK > 1, for few tokens: more warps per output tile instead of more tiles): SK groups of threads
// each compute the whole tile on KB of the stage's KB*SK blocks; at the end groups 1..SK-1 leave their sums
// in shared memory and group 0 adds them, in group order.
//
// Scales are applied once per 32-block per output: the 8 dp4a of a block accumulate into an int that starts
// at the magic constant 0x4B400000 (1.5 * 2^23 as a float), so its bits are the float 1.5*2^23 + s exactly
// (|s| <= 2^19); fma(bits, wd, -1.5*2^23*wd) is then round(s * wd) exactly (1.5*2^23*wd is exact: wd has 11
// significant bits), and a second fma adds it times xd to the f32 accumulator: 2 FFMA per output per block,
// no int->float conversion instruction. Each output's terms are added in block order (SK = 1: 0..K/32-1; SK >
// 1: per group, then the groups in order): deterministic, and a (row, token)'s result depends on nothing but
// SK and, when SK > 1, KB (which blocks each group takes): identical across the other tile parameters and T.
//
// Two activation planes (P = 2, the precise matmuls: xq2 holds the residual of xq on the step xd/254, so
// x = xd * (xq + xq2/254)): the second plane is staged like the first, in its own pair of K-interleaved token
// tiles, and each k4 word of the weights feeds a second dp4a against it into a second magic-started sum s2;
// per 32-block and output the sums combine as v = fmaf(s2, 1/254, s1) (both converted exactly: subtracting
// the magic constant) and acc = fmaf(v * wd, xd, acc): 5 float instructions per 16 dp4a instead of 2 per 8.
// Shared memory grows by the second plane's tiles (2 * K4 * SB words) and each thread holds TN*TT more ints:
// the tilings that fit 48 KiB and their occupancy differ from P = 1 (gemm.cpp). With P = 1 the code is the
// one-plane kernel: nothing of the second plane is compiled in.
//
// Rows past n_rows and tokens past n_tokens are computed on clamped (valid) rows and not written. y rows
// are written with 16-byte stores when n_rows % 4 == 0 (y 16-byte aligned), else one float at a time.
// Variant: gemm_q8_0_dp4a_tiled_p<P>_bn<BN>_bt<BT>_tn<TN>_tt<TT>_kb<KB>_sk<SK>_t<THREADS>,
// THREADS = SK*(BN/TN)*(BT/TT).  Grid: (ceil(n_tokens / BT), ceil(n_rows / BN)).
// Arguments: wq, wd, xq, xd, xq2 (P = 2, laid out like xq; else unused), y, k (a multiple of 32*KB*SK),
// n_rows, n_tokens.
#include "qrig_common.cuh"

static_assert(QRIG_TN % 4 == 0 && QRIG_TT % 4 == 0, "gemm_q8_0_dp4a_tiled: thread tile sides are multiples of 4");
static_assert(QRIG_BN % (8 * QRIG_TN) == 0 && QRIG_BT % (4 * QRIG_TT) == 0,
              "gemm_q8_0_dp4a_tiled: the CTA tile must be whole warp tiles (8*TN rows x 4*TT tokens)");
static_assert(QRIG_SK * (QRIG_BN / QRIG_TN) * (QRIG_BT / QRIG_TT) == QRIG_THREADS,
              "gemm_q8_0_dp4a_tiled: THREADS must be SK*(BN/TN)*(BT/TT)");
static_assert(QRIG_KB >= 1 && QRIG_KB <= 2 && QRIG_SK >= 1 && QRIG_SK <= 8, "gemm_q8_0_dp4a_tiled: KB in 1..2, SK in 1..8");
static_assert(QRIG_PLANES == 1 || QRIG_PLANES == 2, "gemm_q8_0_dp4a_tiled: 1 or 2 activation planes");

namespace {
constexpr int BN = QRIG_BN, BT = QRIG_BT, TN = QRIG_TN, TT = QRIG_TT, KB = QRIG_KB, SK = QRIG_SK;
constexpr int THREADS = QRIG_THREADS, P = QRIG_PLANES;
constexpr int GROUP = THREADS / SK;       // threads per K slice
constexpr int KBS = KB * SK;              // Q8_0 blocks per stage
constexpr int K4 = KBS * 8;               // 32-bit words of K per stage
constexpr int SA = BN + 4, SB = BT + 4;   // padded strides (words) of the K-interleaved tiles
// Shared memory, in words: two stages of [K4][SA] weights, [K4][SB] tokens (per plane: P = 2 has a second
// [2][K4][SB] at OFF_B2), [KBS][BN] and [KBS][BT] scales; after the main loop the tile area holds the sums of
// groups 1..SK-1.
constexpr int OFF_B = 2 * K4 * SA, OFF_B2 = OFF_B + 2 * K4 * SB, OFF_WD = OFF_B2 + (P - 1) * 2 * K4 * SB;
constexpr int OFF_XD = OFF_WD + 2 * KBS * BN;
constexpr int SMEM_WORDS = OFF_XD + 2 * KBS * BT;
static_assert(SMEM_WORDS * 4 <= 48 * 1024, "gemm_q8_0_dp4a_tiled: two stages must fit 48 KiB of static shared memory");
static_assert((SK - 1) * BN * BT <= OFF_WD, "gemm_q8_0_dp4a_tiled: the slice sums must fit the tile area");
}  // namespace

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
gemm_q8_0_dp4a_tiled(const signed char* __restrict__ wq, const unsigned short* __restrict__ wd,
                     const signed char* __restrict__ xq, const float* __restrict__ xd,
                     const signed char* __restrict__ xq2, float* __restrict__ y, int k, int n_rows, int n_tokens) {
  // No qrig_grid_dependency_wait: launched plainly (docs/gpu.md "launch overlap": placed early beside the
  // kernel before it, its few long CTAs lost 19-25% of a 32-sequence decode step on an H200).
  constexpr int QA = BN * 2 * KBS;        // 16-byte chunks per stage: rows x half-blocks
  constexpr int QB = BT * 2 * KBS;
  constexpr int LA = (QA + THREADS - 1) / THREADS;  // chunks loaded per thread
  constexpr int LB = (QB + THREADS - 1) / THREADS;
  constexpr int LWD = (BN * KBS + THREADS - 1) / THREADS;  // scales loaded per thread
  constexpr int LXD = (BT * KBS + THREADS - 1) / THREADS;
  constexpr int WN = 8 * TN, WT = 4 * TT;  // warp tile
  constexpr int WARPS_N = BN / WN;
  constexpr int MAGIC = 0x4B400000;        // 1.5 * 2^23 as float bits
  constexpr float MAGIC_F = 12582912.0f;
  constexpr float INV254 = 1.0f / 254.0f;  // the second plane's step, relative to xd

  __shared__ __align__(16) int smem[SMEM_WORDS];
  int* const sA = smem;                                       // [2][K4][SA]
  int* const sB = smem + OFF_B;                               // [2][K4][SB]
  int* const sB2 = smem + OFF_B2;                             // [2][K4][SB], P = 2 only
  float* const sWd = reinterpret_cast<float*>(smem + OFF_WD);  // [2][KBS][BN]
  float* const sXd = reinterpret_cast<float*>(smem + OFF_XD);  // [2][KBS][BT]

  const int NB = k >> 5;           // Q8_0 blocks per row
  const int STAGES = NB / KBS;     // the launcher checks NB % KBS == 0
  const int tid = threadIdx.x;
  const int row0 = blockIdx.y * BN;
  const int tok0 = blockIdx.x * BT;

  // Global sources of this thread's chunks and scales (rows / tokens clamped to valid ones).
  const int4* ga[LA];
  const int4* gb[LB];
#if QRIG_PLANES == 2  // (the preprocessor: these exist only with two planes, and the lambdas below use them)
  const int4* gb2[LB];
#endif
  const unsigned short* gwd[LWD];
  const float* gxd[LXD];
#pragma unroll
  for (int i = 0; i < LA; ++i) {
    const int idx = min(tid + i * THREADS, QA - 1);
    const int r = min(row0 + idx / (2 * KBS), n_rows - 1);
    ga[i] = reinterpret_cast<const int4*>(wq + (size_t)r * k) + idx % (2 * KBS);
  }
#pragma unroll
  for (int i = 0; i < LB; ++i) {
    const int idx = min(tid + i * THREADS, QB - 1);
    const int t = min(tok0 + idx / (2 * KBS), n_tokens - 1);
    gb[i] = reinterpret_cast<const int4*>(xq + (size_t)t * k) + idx % (2 * KBS);
#if QRIG_PLANES == 2
    gb2[i] = reinterpret_cast<const int4*>(xq2 + (size_t)t * k) + idx % (2 * KBS);
#endif
  }
#pragma unroll
  for (int i = 0; i < LWD; ++i) {
    const int idx = min(tid + i * THREADS, BN * KBS - 1);
    gwd[i] = wd + (size_t)min(row0 + idx / KBS, n_rows - 1) * NB + idx % KBS;
  }
#pragma unroll
  for (int i = 0; i < LXD; ++i) {
    const int idx = min(tid + i * THREADS, BT * KBS - 1);
    gxd[i] = xd + (size_t)min(tok0 + idx / KBS, n_tokens - 1) * NB + idx % KBS;
  }

  int4 ra[LA], rb[LB];
#if QRIG_PLANES == 2
  int4 rb2[LB];
#endif
  unsigned short rwd[LWD];
  float rxd[LXD];
  auto load_stage = [&](int s) {
#pragma unroll
    for (int i = 0; i < LA; ++i) ra[i] = __ldg(ga[i] + s * 2 * KBS);
#pragma unroll
    for (int i = 0; i < LB; ++i) rb[i] = __ldg(gb[i] + s * 2 * KBS);
#if QRIG_PLANES == 2
#pragma unroll
    for (int i = 0; i < LB; ++i) rb2[i] = __ldg(gb2[i] + s * 2 * KBS);
#endif
#pragma unroll
    for (int i = 0; i < LWD; ++i) rwd[i] = __ldg(gwd[i] + s * KBS);
#pragma unroll
    for (int i = 0; i < LXD; ++i) rxd[i] = __ldg(gxd[i] + s * KBS);
  };
  // Chunk idx = (row, half-block q) -> words [4q .. 4q+3][row] of buffer buf.
  auto store_stage = [&](int buf) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      const int idx = tid + i * THREADS;
      if (QA % THREADS == 0 || idx < QA) {
        int* dst = sA + (buf * K4 + 4 * (idx % (2 * KBS))) * SA + idx / (2 * KBS);
        dst[0] = ra[i].x;
        dst[SA] = ra[i].y;
        dst[2 * SA] = ra[i].z;
        dst[3 * SA] = ra[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      const int idx = tid + i * THREADS;
      if (QB % THREADS == 0 || idx < QB) {
        int* dst = sB + (buf * K4 + 4 * (idx % (2 * KBS))) * SB + idx / (2 * KBS);
        dst[0] = rb[i].x;
        dst[SB] = rb[i].y;
        dst[2 * SB] = rb[i].z;
        dst[3 * SB] = rb[i].w;
#if QRIG_PLANES == 2
        int* dst2 = dst + (OFF_B2 - OFF_B);
        dst2[0] = rb2[i].x;
        dst2[SB] = rb2[i].y;
        dst2[2 * SB] = rb2[i].z;
        dst2[3 * SB] = rb2[i].w;
#endif
      }
    }
#pragma unroll
    for (int i = 0; i < LWD; ++i) {
      const int idx = tid + i * THREADS;
      if ((BN * KBS) % THREADS == 0 || idx < BN * KBS)
        sWd[(buf * KBS + idx % KBS) * BN + idx / KBS] = qrig_half_to_float(rwd[i]);
    }
#pragma unroll
    for (int i = 0; i < LXD; ++i) {
      const int idx = tid + i * THREADS;
      if ((BT * KBS) % THREADS == 0 || idx < BT * KBS) sXd[(buf * KBS + idx % KBS) * BT + idx / KBS] = rxd[i];
    }
  };

  const int group = SK == 1 ? 0 : tid / GROUP, gtid = SK == 1 ? tid : tid % GROUP;
  const int warp = gtid >> 5, lane = tid & 31;
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

#pragma unroll 1
  for (int s = 0; s < STAGES; ++s) {
    const int buf = s & 1;
    if (s + 1 < STAGES) load_stage(s + 1);
#pragma unroll
    for (int b = 0; b < KB; ++b) {
      const int blk = group * KB + b;  // block of the stage this group computes
      int si[TN][TT];
      int si2[P == 2 ? TN : 1][P == 2 ? TT : 1];  // the second plane's sums
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const int k4 = blk * 8 + kk;
        int a[TN], x[TT];
#pragma unroll
        for (int c = 0; c < TN / 4; ++c) {
          const int4 v = *reinterpret_cast<const int4*>(sA + (buf * K4 + k4) * SA + a_off + 32 * c);
          a[4 * c + 0] = v.x;
          a[4 * c + 1] = v.y;
          a[4 * c + 2] = v.z;
          a[4 * c + 3] = v.w;
        }
#pragma unroll
        for (int c = 0; c < TT / 4; ++c) {
          const int4 v = *reinterpret_cast<const int4*>(sB + (buf * K4 + k4) * SB + b_off + 16 * c);
          x[4 * c + 0] = v.x;
          x[4 * c + 1] = v.y;
          x[4 * c + 2] = v.z;
          x[4 * c + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < TN; ++i)
#pragma unroll
          for (int j = 0; j < TT; ++j) si[i][j] = qrig_dot4(a[i], x[j], kk == 0 ? MAGIC : si[i][j]);
        if constexpr (P == 2) {
#pragma unroll
          for (int c = 0; c < TT / 4; ++c) {
            const int4 v = *reinterpret_cast<const int4*>(sB2 + (buf * K4 + k4) * SB + b_off + 16 * c);
            x[4 * c + 0] = v.x;
            x[4 * c + 1] = v.y;
            x[4 * c + 2] = v.z;
            x[4 * c + 3] = v.w;
          }
#pragma unroll
          for (int i = 0; i < TN; ++i)
#pragma unroll
            for (int j = 0; j < TT; ++j) si2[i][j] = qrig_dot4(a[i], x[j], kk == 0 ? MAGIC : si2[i][j]);
        }
      }
      float w[TN], d[TT];
#pragma unroll
      for (int c = 0; c < TN / 4; ++c) {
        const float4 v = *reinterpret_cast<const float4*>(sWd + (buf * KBS + blk) * BN + a_off + 32 * c);
        w[4 * c + 0] = v.x;
        w[4 * c + 1] = v.y;
        w[4 * c + 2] = v.z;
        w[4 * c + 3] = v.w;
      }
#pragma unroll
      for (int c = 0; c < TT / 4; ++c) {
        const float4 v = *reinterpret_cast<const float4*>(sXd + (buf * KBS + blk) * BT + b_off + 16 * c);
        d[4 * c + 0] = v.x;
        d[4 * c + 1] = v.y;
        d[4 * c + 2] = v.z;
        d[4 * c + 3] = v.w;
      }
      if constexpr (P == 1) {
#pragma unroll
        for (int i = 0; i < TN; ++i) {
          const float bias = -MAGIC_F * w[i];  // exact: w is an fp16 value
#pragma unroll
          for (int j = 0; j < TT; ++j)
            acc[i][j] = fmaf(fmaf(__int_as_float(si[i][j]), w[i], bias), d[j], acc[i][j]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < TN; ++i)
#pragma unroll
          for (int j = 0; j < TT; ++j) {
            // s1 + s2/254 (the sums exactly as floats: |s| <= 2^19), then the scales as with one plane.
            const float v = fmaf(__int_as_float(si2[i][j]) - MAGIC_F, INV254, __int_as_float(si[i][j]) - MAGIC_F);
            acc[i][j] = fmaf(v * w[i], d[j], acc[i][j]);
          }
      }
    }
    if (s + 1 < STAGES) store_stage(buf ^ 1);
    __syncthreads();
  }

  if (SK > 1) {  // the tile area is free after the last barrier
    float* red = reinterpret_cast<float*>(smem);  // [SK-1][TN*TT][GROUP]
    if (group > 0)
#pragma unroll
      for (int i = 0; i < TN; ++i)
#pragma unroll
        for (int j = 0; j < TT; ++j) red[((group - 1) * TN * TT + i * TT + j) * GROUP + gtid] = acc[i][j];
    __syncthreads();
    if (group > 0) return;
#pragma unroll
    for (int g = 1; g < SK; ++g)
#pragma unroll
      for (int i = 0; i < TN; ++i)
#pragma unroll
        for (int j = 0; j < TT; ++j) acc[i][j] += red[((g - 1) * TN * TT + i * TT + j) * GROUP + gtid];
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
        *reinterpret_cast<float4*>(yt + r) = make_float4(acc[4 * c][j], acc[4 * c + 1][j], acc[4 * c + 2][j], acc[4 * c + 3][j]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (r + e < n_rows) yt[r + e] = acc[4 * c + e][j];
      }
    }
  }
}
