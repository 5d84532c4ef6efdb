// Gated DeltaNet chunked prefill, part 2 of 2: the state-dependent part, sequential over the chunks and
// parallel over (tile of CT value columns, value head). CPU reference qrig::cpu::gdn_chunked. With S the state
// at the chunk start and W, U, P, fq, fk, e_last from gdn_chunk_prep (same workspace layout and BLK):
//   V' = U - W S                                   [C][CT]
//   O  = fq * (Q_raw S) + P V'                      (fq_i = qmul_i exp(gamma_i), so fq * Q_raw = Q exp(gamma))
//   S  = e_last S + K_raw^T (fk * V')              (fk_i = kmul_i exp(gamma_last - gamma_i))
// Raw q and k rows come from `mixed` (shared by the Hv/Hk value heads of a key head and the DV/CT column
// tiles), so the workspace holds no copy of Q or K.
//
// The chunk's operands W, Q, P, K (state-independent) pass one at a time through one shared-memory tile. Each
// is loaded into registers (every thread a few 16-byte loads, all in flight together) while the previous
// phase computes from the tile, then stored to the tile between two barriers; the next chunk's operands are
// prefetched into L2 a chunk ahead. So the sequential chain per chunk is mostly shared-memory arithmetic.
// Threads: column c = tid % CT, row group grp = tid / CT of G = T/CT groups (CT divides 32, so a group's
// threads share a warp and their tile reads are broadcasts). Each thread owns RS = DK/G rows of the state slice
// in registers (rows grp*RS ..), copied to shared memory for the products over the state's rows, and RP = C/G
// rows of the chunk (grp*RP ..) for V' and O. Every sum runs in a fixed order (deterministic). Rows past the
// chunk's L tokens are zero in W, U, P, fk and in the staged q and k, so they add nothing, and their outputs
// are not written.
// __launch_bounds__(T, 2): two blocks per SM (at T = 256, 128 registers; 9B dims give 256 blocks for 132 SMs
// on an H200; without it ptxas picked 211 registers on sm_75 and 64 with spills for other dims). For the sm_70
// feature set the bound asks for one block: NVRTC 11.8's ptxas then takes 128 registers without spilling (two
// blocks still fit), while at the bound of two it spilled 16 bytes.
// Variant: gdn_chunk_scan_dk<DK>_dv<DV>_c<C>_ct<CT>_t<T>.  Grid: (DV / CT, Hv).
// Arguments: mixed [n][2*Hk*DK + Hv*DV], n_tokens, hk, hv, ws (written by gdn_chunk_prep for the same n),
// state [Hv][DK][DV] (in place), out [n][Hv*DV].
#include "qrig_common.cuh"

constexpr int DK = QRIG_DK, DV = QRIG_DV, C = QRIG_CHUNK, CT = QRIG_CT, T = QRIG_THREADS;
constexpr int G = T / CT;    // row groups
constexpr int RP = C / G;    // chunk rows per thread
constexpr int RS = DK / G;   // state rows per thread
constexpr int BLK = C * (DK + DV + C + 4);
constexpr int KS = DK + 4;   // tile row stride for W, Q, K [C][DK]
constexpr int PS = C + 4;    // tile row stride for P [C][C]
constexpr int TILE = C * KS > C * PS ? C * KS : C * PS;
constexpr int NV = ((DK > C ? C * DK : C * C) / 4 + T - 1) / T;  // float4 per thread to stage an operand

static_assert(CT <= 32 && 32 % CT == 0 && T % CT == 0, "gdn_chunk_scan: CT must divide 32 and T");
static_assert(C % G == 0 && RP % 4 == 0, "gdn_chunk_scan: C / (T/CT) must be a multiple of 4");
static_assert(DK % G == 0 && RS % 4 == 0, "gdn_chunk_scan: DK / (T/CT) must be a multiple of 4");
static_assert(DV % CT == 0 && C % 4 == 0 && DK % 32 == 0 && C <= 64 && T >= C, "gdn_chunk_scan: bad tile");
static_assert((DK * CT + C * CT + C + TILE) * 4 <= 48 * 1024, "gdn_chunk_scan: shared memory over 48 KiB");

__device__ __forceinline__ void gdn_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Rows [0, C) of COLS floats at src + i * stride (rows >= valid read as zeros) into registers.
template <int COLS>
__device__ __forceinline__ void gdn_load_rows(float4 (&v)[NV], const float* src, size_t stride, int valid) {
  constexpr int V4 = COLS / 4;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int idx = threadIdx.x + k * T, i = idx / V4, a4 = idx % V4;
    v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (idx < C * V4 && i < valid) v[k] = __ldg(reinterpret_cast<const float4*>(src + i * stride) + a4);
  }
}

template <int COLS, int STRIDE>
__device__ __forceinline__ void gdn_store_tile(const float4 (&v)[NV], float* tile) {
  constexpr int V4 = COLS / 4;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int idx = threadIdx.x + k * T, i = idx / V4, a4 = idx % V4;
    if (idx < C * V4) *reinterpret_cast<float4*>(&tile[i * STRIDE + 4 * a4]) = v[k];
  }
}

extern "C" __global__ void __launch_bounds__(QRIG_THREADS, QRIG_SM < 75 ? 1 : 2)
gdn_chunk_scan(const float* __restrict__ mixed, int n_tokens, int hk, int hv, const float* __restrict__ ws,
               float* __restrict__ state, float* __restrict__ out) {
  qrig_grid_dependency_wait();
  __shared__ float sS[DK * CT];                // state slice at the chunk start [DK][CT]
  __shared__ float sV[C * CT];                 // V' [C][CT]
  __shared__ float sFk[C];
  __shared__ __align__(16) float tile[TILE];   // W, Q, P or K of the chunk

  const int tid = threadIdx.x, c = tid % CT, grp = tid / CT;
  const int j = blockIdx.y, kh = j % hk;
  const int c0 = blockIdx.x * CT;
  const size_t conv = 2 * (size_t)hk * DK + (size_t)hv * DV;
  const int n_chunks = (n_tokens + C - 1) / C;
  const float* qbase = mixed + (size_t)kh * DK;
  const float* kbase = mixed + (size_t)(hk + kh) * DK;
  float* Sg = state + (size_t)j * DK * DV + c0 + c;
  float* outc = out + (size_t)j * DV + c0 + c;

  float sreg[RS];
#pragma unroll
  for (int q = 0; q < RS; ++q) {
    sreg[q] = Sg[(size_t)(grp * RS + q) * DV];
    sS[(grp * RS + q) * CT + c] = sreg[q];
  }
  float4 buf[NV];
  gdn_load_rows<DK>(buf, ws + (size_t)j * n_chunks * BLK, DK, C);  // W of chunk 0

  for (int ch = 0; ch < n_chunks; ++ch) {
    const int t0 = ch * C;
    const int L = min(C, n_tokens - t0);
    const float* W = ws + ((size_t)j * n_chunks + ch) * BLK;
    const float* U = W + C * DK;
    const float* P = U + C * DV;
    const float* fq = P + C * C;
    const float* fk = fq + C;
    const float* el = fk + C;
    const float* qchunk = qbase + (size_t)t0 * conv;
    const float* kchunk = kbase + (size_t)t0 * conv;

    // Prefetch the next chunk into L2, split over the DV/CT blocks of this head: its workspace block and its
    // q and k rows (DK/32 lines of 128 bytes each per row).
    if (ch + 1 < n_chunks) {
      const int parts = gridDim.x, part = blockIdx.x;
      const char* nb = reinterpret_cast<const char*>(W + BLK);
      for (int l = part + parts * tid; l < BLK / 32; l += parts * T) gdn_prefetch_l2(nb + 128 * (size_t)l);
      const int nL = min(C, n_tokens - t0 - C);
      constexpr int LPR = DK / 32;
      for (int l = part + parts * tid; l < 2 * LPR * nL; l += parts * T) {
        const int row = l / (2 * LPR), x = l % (2 * LPR);
        const float* base = x < LPR ? qchunk : kchunk;
        gdn_prefetch_l2(base + (size_t)(C + row) * conv + 32 * (x % LPR));
      }
    }

    float uval[RP], fqv[RP];
#pragma unroll
    for (int r = 0; r < RP; ++r) {
      const int i = grp * RP + r;
      uval[r] = __ldg(U + i * DV + c0 + c);
      fqv[r] = __ldg(fq + i);
    }
    const float e = __ldg(el);
    const float fkv = tid < C ? __ldg(fk + tid) : 0.0f;

    __syncthreads();  // the previous chunk's phase 3 is done with the tile, sS, sV and sFk
    gdn_store_tile<DK, KS>(buf, tile);  // W
    if (tid < C) sFk[tid] = fkv;
    __syncthreads();
    gdn_load_rows<DK>(buf, qchunk, conv, L);

    // V' = U - W S
    float vacc[RP];
#pragma unroll
    for (int r = 0; r < RP; ++r) vacc[r] = uval[r];
#pragma unroll 4
    for (int a = 0; a < DK; a += 4) {
      const float s0 = sS[(a + 0) * CT + c], s1 = sS[(a + 1) * CT + c];
      const float s2 = sS[(a + 2) * CT + c], s3 = sS[(a + 3) * CT + c];
#pragma unroll
      for (int r = 0; r < RP; ++r) {
        const float4 w = *reinterpret_cast<const float4*>(&tile[(grp * RP + r) * KS + a]);
        vacc[r] = fmaf(-w.x, s0, vacc[r]);
        vacc[r] = fmaf(-w.y, s1, vacc[r]);
        vacc[r] = fmaf(-w.z, s2, vacc[r]);
        vacc[r] = fmaf(-w.w, s3, vacc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < RP; ++r) sV[(grp * RP + r) * CT + c] = vacc[r];
    __syncthreads();
    gdn_store_tile<DK, KS>(buf, tile);  // Q (raw)
    __syncthreads();
    gdn_load_rows<C>(buf, P, C, C);

    // O = fq * (Q_raw S)
    float oacc[RP];
#pragma unroll
    for (int r = 0; r < RP; ++r) oacc[r] = 0.0f;
#pragma unroll 4
    for (int a = 0; a < DK; a += 4) {
      const float s0 = sS[(a + 0) * CT + c], s1 = sS[(a + 1) * CT + c];
      const float s2 = sS[(a + 2) * CT + c], s3 = sS[(a + 3) * CT + c];
#pragma unroll
      for (int r = 0; r < RP; ++r) {
        const float4 q = *reinterpret_cast<const float4*>(&tile[(grp * RP + r) * KS + a]);
        oacc[r] = fmaf(q.x, s0, oacc[r]);
        oacc[r] = fmaf(q.y, s1, oacc[r]);
        oacc[r] = fmaf(q.z, s2, oacc[r]);
        oacc[r] = fmaf(q.w, s3, oacc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < RP; ++r) oacc[r] *= fqv[r];
    __syncthreads();
    gdn_store_tile<C, PS>(buf, tile);  // P
    __syncthreads();
    gdn_load_rows<DK>(buf, kchunk, conv, L);

    // O += P V' (P is zero above the diagonal: rows grp*RP.. need V' rows < grp*RP + RP).
    const int m_end = grp * RP + RP;
    for (int m = 0; m < m_end; m += 4) {
      const float v0 = sV[(m + 0) * CT + c], v1 = sV[(m + 1) * CT + c];
      const float v2 = sV[(m + 2) * CT + c], v3 = sV[(m + 3) * CT + c];
#pragma unroll
      for (int r = 0; r < RP; ++r) {
        const float4 p = *reinterpret_cast<const float4*>(&tile[(grp * RP + r) * PS + m]);
        oacc[r] = fmaf(p.x, v0, oacc[r]);
        oacc[r] = fmaf(p.y, v1, oacc[r]);
        oacc[r] = fmaf(p.z, v2, oacc[r]);
        oacc[r] = fmaf(p.w, v3, oacc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < RP; ++r) {
      const int i = grp * RP + r;
      if (i < L) outc[(size_t)(t0 + i) * hv * DV] = oacc[r];
    }
    __syncthreads();
    gdn_store_tile<DK, KS>(buf, tile);  // K (raw)
    __syncthreads();
    if (ch + 1 < n_chunks) gdn_load_rows<DK>(buf, W + BLK, DK, C);  // W of the next chunk

    // S = e_last S + K_raw^T (fk * V') for this thread's state rows.
#pragma unroll
    for (int q = 0; q < RS; ++q) sreg[q] *= e;
#pragma unroll 4
    for (int i = 0; i < C; ++i) {
      const float v = sV[i * CT + c] * sFk[i];
#pragma unroll
      for (int q4 = 0; q4 < RS / 4; ++q4) {
        const float4 k = *reinterpret_cast<const float4*>(&tile[i * KS + grp * RS + 4 * q4]);
        sreg[4 * q4 + 0] = fmaf(k.x, v, sreg[4 * q4 + 0]);
        sreg[4 * q4 + 1] = fmaf(k.y, v, sreg[4 * q4 + 1]);
        sreg[4 * q4 + 2] = fmaf(k.z, v, sreg[4 * q4 + 2]);
        sreg[4 * q4 + 3] = fmaf(k.w, v, sreg[4 * q4 + 3]);
      }
    }
#pragma unroll
    for (int q = 0; q < RS; ++q) sS[(grp * RS + q) * CT + c] = sreg[q];
  }
#pragma unroll
  for (int q = 0; q < RS; ++q) Sg[(size_t)(grp * RS + q) * DV] = sreg[q];
}
