// Gated DeltaNet chunked prefill, part 1 of 2: everything of a chunk that does not depend on the state
// (QWEN35.md "Chunked prefill"; CPU reference qrig::cpu::gdn_chunked, whose intermediate quantities these
// are). One block per (chunk of C tokens, value head j); the last chunk may be partial (L < C tokens), its
// missing rows come out as zeros. For the chunk's tokens i, m < L, key head j % Hk:
//   q, k L2-normalised (q also * 1/sqrt(DK)), beta_i = sigmoid(b_i), g_i = ssm_a * softplus(a_i + dt_bias),
//   gamma_i = g_0 + ... + g_i (in double: exp(gamma_i - gamma_m) is taken of a difference of sums that reach
//   -1000 for fast-decaying heads, where an fp32 cumsum would lose ~1e-4 of the exponent),
//   D_im = exp(gamma_i - gamma_m) <= 1 (stable: never a ratio of exponentials),
//   A = strict_lower(diag(beta) K K^T * D), P = lower(Q K^T * D) (diagonal included),
//   U = (I + A)^-1 diag(beta) V, W = (I + A)^-1 diag(beta) (K * exp(gamma)),
// solved by blocked forward substitution down the chunk, one column of [W | U] per thread (no barrier inside
// the solve; A is read from shared memory as a broadcast).
// Output, per (value head, chunk), in a block of BLK floats at ws + (j * n_chunks + chunk) * BLK:
//   W [C][DK] | U [C][DV] | P [C][C] | fq [C] = qmul_i exp(gamma_i) | fk [C] = kmul_i exp(gamma_last - gamma_i)
//   | e_last = exp(gamma_last) and 3 floats of padding,
// where qmul/kmul are the L2-normalisation factors: the scan (gdn_chunk_scan) reads the raw q and k from
// `mixed` and applies them, so the workspace holds no copy of Q or K.
// K K^T and Q K^T: a 16 x 16 thread grid, 4 x 4 (C = 64) outputs each with rows ti + 16 r and columns
// tm + 16 s; normalised K in shared memory with a padded row stride (DK + 4: conflict-free 16-byte loads),
// raw Q rows read through the read-only cache (shared by the 16 threads of a half-warp).
// __launch_bounds__(T, 2): at most 128 registers at T = 256, so two blocks share an SM (ptxas' own choice
// varies by arch: 154 registers on sm_75 would leave one).
// Variant: gdn_chunk_prep_dk<DK>_dv<DV>_c<C>_t<T> (T = 256).  Grid: (ceil(n_tokens / C), Hv).
// Arguments: mixed, alpha, beta, ssm_a, dt_bias (as gdn_recurrent), n_tokens, hk, hv, ws (workspace).
#include "qrig_common.cuh"

constexpr int DK = QRIG_DK, DV = QRIG_DV, C = QRIG_CHUNK, T = QRIG_THREADS;
constexpr int WARPS = T / 32;
constexpr int KS = DK + 4;                        // row stride of K in shared memory
constexpr int RT = C / 16;                        // Gram rows (and columns) per thread
constexpr int AS = C + 4;                         // row stride of A^T in shared memory
constexpr int BUF = C * KS > C * AS ? C * KS : C * AS;
constexpr int BLK = C * (DK + DV + C + 4);        // workspace floats per (value head, chunk)

static_assert(T == 256, "gdn_chunk_prep: the Gram tiling is a 16 x 16 thread grid");
static_assert(C % 16 == 0 && C <= 64 && C % WARPS == 0, "gdn_chunk_prep: C in 16, 32, 48, 64");
static_assert(DK % 32 == 0 && DV % 4 == 0, "gdn_chunk_prep: DK a multiple of 32, DV of 4");

__device__ __forceinline__ float gdn_softplus(float x) {
  return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}

extern "C" __global__ void __launch_bounds__(QRIG_THREADS, 2)
gdn_chunk_prep(const float* __restrict__ mixed, const float* __restrict__ alpha, const float* __restrict__ beta,
               const float* __restrict__ ssm_a, const float* __restrict__ dt_bias, int n_tokens, int hk, int hv,
               float* __restrict__ ws) {
  qrig_grid_dependency_wait();
  __shared__ __align__(16) float sbuf[BUF];  // normalised K [C][KS], later A^T [C][AS]
  __shared__ double sgam[C];                 // g, then gamma (cumulative)
  __shared__ float sbeta[C], sqmul[C], skmul[C], seg[C];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ch = blockIdx.x, j = blockIdx.y, kh = j % hk;
  const int t0 = ch * C;
  const int L = min(C, n_tokens - t0);
  const size_t conv = 2 * (size_t)hk * DK + (size_t)hv * DV;
  const float* qbase = mixed + (size_t)t0 * conv + (size_t)kh * DK;
  const float* kbase = mixed + (size_t)t0 * conv + (size_t)(hk + kh) * DK;
  const float* vbase = mixed + (size_t)t0 * conv + 2 * (size_t)hk * DK + (size_t)j * DV;
  float* W = ws + ((size_t)j * gridDim.x + ch) * BLK;
  float* U = W + C * DK;
  float* P = U + C * DV;
  float* fq = P + C * C;
  float* fk = fq + C;
  float* el = fk + C;

  // 1. Per-token gate values; L2 norms of q and k, one warp per token.
  if (tid < C) {
    float b = 0.0f, g = 0.0f;
    if (tid < L) {
      const size_t at = (size_t)(t0 + tid) * hv + j;
      b = 1.0f / (1.0f + expf(-beta[at]));
      g = ssm_a[j] * gdn_softplus(alpha[at] + dt_bias[j]);
    }
    sbeta[tid] = b;
    sgam[tid] = (double)g;
  }
#pragma unroll
  for (int i0 = 0; i0 < C; i0 += WARPS) {  // unrolled: every row's loads are issued before the first sum
    const int i = i0 + warp;
    float qm = 0.0f, km = 0.0f;
    if (i < L) {
      float sq = 0.0f, sk = 0.0f;
#pragma unroll
      for (int a0 = 0; a0 < DK; a0 += 32) {
        const int a = a0 + lane;
        const float q = __ldg(qbase + (size_t)i * conv + a), k = __ldg(kbase + (size_t)i * conv + a);
        sq += q * q;
        sk += k * k;
      }
      sq = qrig_warp_sum(sq);
      sk = qrig_warp_sum(sk);
      qm = 1.0f / sqrtf(sq + 1e-6f) / sqrtf((float)DK);
      km = 1.0f / sqrtf(sk + 1e-6f);
    }
    if (lane == 0) {
      sqmul[i] = qm;
      skmul[i] = km;
    }
  }
  __syncthreads();

  // 2. gamma = cumsum(g) (g = 0 past L, so gamma stays at gamma_last there); normalised K into shared memory.
  if (tid == 0) {
    double c = 0.0;
    for (int i = 0; i < C; ++i) {
      c += sgam[i];
      sgam[i] = c;
    }
  }
  for (int idx = tid; idx < C * (DK / 4); idx += T) {
    const int i = idx / (DK / 4), a4 = idx % (DK / 4);
    float4 k = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < L) {
      k = __ldg(reinterpret_cast<const float4*>(kbase + (size_t)i * conv) + a4);
      const float m = skmul[i];
      k.x *= m;
      k.y *= m;
      k.z *= m;
      k.w *= m;
    }
    *reinterpret_cast<float4*>(&sbuf[i * KS + 4 * a4]) = k;
  }
  __syncthreads();
  if (tid < C) seg[tid] = expf((float)sgam[tid]);  // read after the barriers below

  // 3. K K^T and Q K^T (raw Q: the normalisation factor is applied per row afterwards).
  const int ti = tid >> 4, tm = tid & 15;
  float kk[RT][RT], qk[RT][RT];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int s = 0; s < RT; ++s) kk[r][s] = qk[r][s] = 0.0f;
  const float* qrow[RT];
#pragma unroll
  for (int r = 0; r < RT; ++r) qrow[r] = qbase + (size_t)min(ti + 16 * r, L - 1) * conv;
#pragma unroll 2
  for (int a = 0; a < DK; a += 4) {
    float4 ki[RT], km[RT], qi[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      ki[r] = *reinterpret_cast<const float4*>(&sbuf[(ti + 16 * r) * KS + a]);
      km[r] = *reinterpret_cast<const float4*>(&sbuf[(tm + 16 * r) * KS + a]);
      qi[r] = __ldg(reinterpret_cast<const float4*>(qrow[r] + a));
    }
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int s = 0; s < RT; ++s) {
        kk[r][s] = fmaf(ki[r].x, km[s].x, kk[r][s]);
        kk[r][s] = fmaf(ki[r].y, km[s].y, kk[r][s]);
        kk[r][s] = fmaf(ki[r].z, km[s].z, kk[r][s]);
        kk[r][s] = fmaf(ki[r].w, km[s].w, kk[r][s]);
        qk[r][s] = fmaf(qi[r].x, km[s].x, qk[r][s]);
        qk[r][s] = fmaf(qi[r].y, km[s].y, qk[r][s]);
        qk[r][s] = fmaf(qi[r].z, km[s].z, qk[r][s]);
        qk[r][s] = fmaf(qi[r].w, km[s].w, qk[r][s]);
      }
  }
  // 4. Decays and masks: P to the workspace, A (kept in kk) to shared memory, transposed, once K is no longer
  // read.
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int s = 0; s < RT; ++s) {
      const int i = ti + 16 * r, m = tm + 16 * s;
      float p = 0.0f, a = 0.0f;
      if (i < L && m <= i) {
        const float d = expf((float)(sgam[i] - sgam[m]));
        p = sqmul[i] * qk[r][s] * d;
        if (m < i) a = sbeta[i] * kk[r][s] * d;
      }
      P[i * C + m] = p;
      kk[r][s] = a;
    }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int s = 0; s < RT; ++s) sbuf[(tm + 16 * s) * AS + ti + 16 * r] = kk[r][s];  // At[m][i] = A_im
  __syncthreads();

  // 5. Forward substitution: x_i = rhs_i - sum_{r < i} A_ir x_r, for each column of W (rhs = beta k e^gamma)
  // and of U (rhs = beta v); one column per thread, in blocks of 16 rows (left-looking): a block's rows start
  // from their rhs, subtract the earlier blocks' rows (read back from the workspace, where this thread wrote
  // them: same-thread ordering, plain loads), then solve their 16 x 16 triangle in registers. A is kept
  // transposed (At[r][i] = A_ir) so each earlier row r meets 16 rows of A in four 16-byte broadcasts. Rows past
  // L have rhs 0 and A rows 0, so they come out 0.
  for (int col = tid; col < DK + DV; col += T) {
    const bool isw = col < DK;
    float* dst = isw ? W + col : U + (col - DK);
    const int stride = isw ? DK : DV;
#pragma unroll 1
    for (int b0 = 0; b0 < C; b0 += 16) {
      float x[16];
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        const int i = b0 + q;
        x[q] = 0.0f;
        if (i < L)
          x[q] = isw ? sbeta[i] * seg[i] * skmul[i] * __ldg(kbase + (size_t)i * conv + col)
                     : sbeta[i] * __ldg(vbase + (size_t)i * conv + (col - DK));
      }
#pragma unroll 16
      for (int r = 0; r < b0; ++r) {
        const float xr = dst[r * stride];
        const float4* a = reinterpret_cast<const float4*>(&sbuf[r * AS + b0]);
#pragma unroll
        for (int q4 = 0; q4 < 4; ++q4) {
          const float4 a4 = a[q4];
          x[4 * q4 + 0] = fmaf(-a4.x, xr, x[4 * q4 + 0]);
          x[4 * q4 + 1] = fmaf(-a4.y, xr, x[4 * q4 + 1]);
          x[4 * q4 + 2] = fmaf(-a4.z, xr, x[4 * q4 + 2]);
          x[4 * q4 + 3] = fmaf(-a4.w, xr, x[4 * q4 + 3]);
        }
      }
#pragma unroll
      for (int q = 1; q < 16; ++q)
#pragma unroll
        for (int r = 0; r < q; ++r) x[q] = fmaf(-sbuf[(b0 + r) * AS + b0 + q], x[r], x[q]);
#pragma unroll
      for (int q = 0; q < 16; ++q) dst[(b0 + q) * stride] = x[q];
    }
  }

  // 6. Per-row factors for the scan.
  if (tid < C) {
    const bool in = tid < L;
    fq[tid] = in ? sqmul[tid] * seg[tid] : 0.0f;
    fk[tid] = in ? skmul[tid] * expf((float)(sgam[L - 1] - sgam[tid])) : 0.0f;
  }
  if (tid == 0) {
    el[0] = seg[L - 1];
    el[1] = el[2] = el[3] = 0.0f;
  }
}
