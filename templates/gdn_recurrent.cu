// Gated DeltaNet, token-serial recurrence (QWEN35.md GDN steps 3-5) for decode and short steps: per value
// head j (key head j % Hk) and token, q and k L2-normalised (x / sqrt(sum x^2 + 1e-6)), q *= 1/sqrt(DK),
// beta = sigmoid(b), decay = exp(ssm_a * softplus(a + dt_bias)); S = decay S; kv = S^T k;
// delta = beta (v - kv); S += k delta^T; o = S^T q. CPU reference: qrig::cpu::gdn_recurrent.
//
// Parallel over (value head, tile of CW * T/32 value columns); the block's slice of the f32 state
// [Hv][DK][DV] stays in registers for all tokens and is written back once, so a decode step streams the state
// through once (bandwidth-bound). Each warp owns CW columns and every row of them: lane = rg * CQ + cq holds
// 4 columns (one float4) of rows rg, rg + RG, ... (RG = 32 / CQ row groups, CQ = CW / 4), so the sums over
// rows (S^T k, S^T q) are warp butterflies over the rg bits of the lane, in a fixed order (deterministic) and
// without block barriers. Tokens are staged TB at a time in shared memory (raw q, k of the key head, the
// block's v columns; then q and k normalised in place, one warp per vector), so the token loop itself only
// reads shared memory and registers.
// A speculative verify step (docs/speculative.md) also keeps the state after each of its first `keep` tokens:
// after token t < keep the block writes its slice of S to kept + t * kept_stride (same layout as state), so a
// rejection rolls back to any position of the step without a re-run. The token loop is the same with or without
// it (keep = 0 in every other step), so a kept state is bit for bit the one a step ending at that token leaves.
// Batched (b1): one launch over a decode step's B sequences, one token each (grid.z = sequence z): mixed, alpha,
// beta and out are row z of their [B][...] arrays, the state that of the sequence's slot, rec_of[seq_slot[z]] +
// state_offset; each block then runs the b0 code for n_tokens = 1 (keep = 0), so each sequence gets the bits of
// its own launch. b0: rec_of and seq_slot null.
// Variant: gdn_recurrent_dk<DK>_dv<DV>_cw<CW>_b<B>_t<T>.  Grid: (DV / (CW * T/32), Hv) (b1: x B sequences).
// Arguments: mixed [n][2*Hk*DK + Hv*DV], alpha [n][Hv], beta [n][Hv], ssm_a [Hv], dt_bias [Hv], n_tokens (b1: 1),
// hk, hv, state [Hv][DK][DV] (in place; b1: null), out [n][Hv*DV], kept (null when keep = 0), keep (< n_tokens),
// kept_stride (floats between two kept states, a multiple of 4, < 2^31), rec_of, seq_slot, state_offset (floats,
// a multiple of 4). mixed, state, kept and out 16-byte aligned.
#include "qrig_common.cuh"

constexpr int DK = QRIG_DK, DV = QRIG_DV, CW = QRIG_CW, T = QRIG_THREADS;
constexpr int WARPS = T / 32;
constexpr int CQ = CW / 4;     // lanes across a warp's columns, one float4 each
constexpr int RG = 32 / CQ;    // row groups of a warp
constexpr int RPT = DK / RG;   // state rows per thread
constexpr int CT = CW * WARPS; // columns per block
constexpr int TB = 8;          // tokens staged per batch

static_assert(CW % 4 == 0 && (CQ == 1 || CQ == 2 || CQ == 4 || CQ == 8), "gdn_recurrent: CW in 4, 8, 16, 32");
static_assert(DK % 32 == 0 && DK % RG == 0, "gdn_recurrent: DK must be a multiple of 32");
static_assert(DV % CT == 0, "gdn_recurrent: DV must be a multiple of the block's column tile");
static_assert(T % 32 == 0 && T <= 1024, "gdn_recurrent: bad block size");
static_assert(QRIG_BATCHED == 0 || QRIG_BATCHED == 1, "gdn_recurrent: b is 0 or 1");

__device__ __forceinline__ float gdn_softplus(float x) {
  return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}

__device__ __forceinline__ float4 gdn_warp_sum_rows(float4 v) {
#pragma unroll
  for (int m = CQ; m < 32; m <<= 1) {
    v.x += __shfl_xor_sync(QRIG_FULL_MASK, v.x, m);
    v.y += __shfl_xor_sync(QRIG_FULL_MASK, v.y, m);
    v.z += __shfl_xor_sync(QRIG_FULL_MASK, v.z, m);
    v.w += __shfl_xor_sync(QRIG_FULL_MASK, v.w, m);
  }
  return v;
}

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
gdn_recurrent(const float* __restrict__ mixed, const float* __restrict__ alpha, const float* __restrict__ beta,
              const float* __restrict__ ssm_a, const float* __restrict__ dt_bias, int n_tokens, int hk, int hv,
              float* __restrict__ state, float* __restrict__ out, float* __restrict__ kept, int keep,
              int kept_stride, float* const* __restrict__ rec_of, const int* __restrict__ seq_slot,
              long long state_offset) {
  qrig_grid_dependency_wait();
  __shared__ __align__(16) float sq[TB][DK];
  __shared__ __align__(16) float sk[TB][DK];
  __shared__ __align__(16) float sv[TB][CT];
  __shared__ float sbeta[TB], sdecay[TB];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cq = lane % CQ, rg = lane / CQ;
  const int j = blockIdx.y, kh = j % hk;
  const int lcol = warp * CW + cq * 4;          // this thread's first column within the block tile
  const int col = blockIdx.x * CT + lcol;       // ... within the head
  const size_t conv = 2 * (size_t)hk * DK + (size_t)hv * DV;
#if QRIG_BATCHED
  {
    const int z = blockIdx.z;
    mixed += (size_t)z * conv;
    alpha += (size_t)z * hv;
    beta += (size_t)z * hv;
    out += (size_t)z * hv * DV;
    state = rec_of[seq_slot[z]] + state_offset;
  }
#endif
  float* S = state + (size_t)j * DK * DV + col;

  float4 s[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) s[i] = *reinterpret_cast<const float4*>(S + (size_t)(rg + RG * i) * DV);
  const float sa = ssm_a[j], dtb = dt_bias[j];
  if (keep > 0) kept += (size_t)j * DK * DV + col;  // this thread's slice of each kept state

  for (int t0 = 0; t0 < n_tokens; t0 += TB) {
    const int nb = min(TB, n_tokens - t0);
    __syncthreads();  // the previous batch is consumed
    for (int idx = tid; idx < nb * (DK / 4); idx += T) {
      const int b = idx / (DK / 4), a4 = idx % (DK / 4);
      const float* row = mixed + (size_t)(t0 + b) * conv;
      reinterpret_cast<float4*>(sq[b])[a4] = __ldg(reinterpret_cast<const float4*>(row + kh * DK) + a4);
      reinterpret_cast<float4*>(sk[b])[a4] = __ldg(reinterpret_cast<const float4*>(row + (size_t)(hk + kh) * DK) + a4);
    }
    for (int idx = tid; idx < nb * (CT / 4); idx += T) {
      const int b = idx / (CT / 4), c4 = idx % (CT / 4);
      const float* row = mixed + (size_t)(t0 + b) * conv + 2 * (size_t)hk * DK + (size_t)j * DV + blockIdx.x * CT;
      reinterpret_cast<float4*>(sv[b])[c4] = __ldg(reinterpret_cast<const float4*>(row) + c4);
    }
    if (tid < nb) {
      const size_t at = (size_t)(t0 + tid) * hv + j;
      sbeta[tid] = 1.0f / (1.0f + expf(-beta[at]));
      sdecay[tid] = expf(sa * gdn_softplus(alpha[at] + dtb));
    }
    __syncthreads();
    // L2 norms: vector v = 2b (q of token b) or 2b + 1 (k), one warp each.
    for (int v = warp; v < 2 * nb; v += WARPS) {
      float* x = (v & 1) ? sk[v >> 1] : sq[v >> 1];
      float ss = 0.0f;
#pragma unroll
      for (int a = 0; a < DK; a += 32) ss += x[a + lane] * x[a + lane];
      ss = qrig_warp_sum(ss);
      float mul = 1.0f / sqrtf(ss + 1e-6f);
      if (!(v & 1)) mul = mul / sqrtf((float)DK);
#pragma unroll
      for (int a = 0; a < DK; a += 32) x[a + lane] *= mul;
    }
    __syncthreads();

    for (int b = 0; b < nb; ++b) {
      const float decay = sdecay[b], bt = sbeta[b];
      // S = decay S; kv = S^T k
      float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const float ka = sk[b][rg + RG * i];
        s[i].x *= decay;
        s[i].y *= decay;
        s[i].z *= decay;
        s[i].w *= decay;
        kv.x = fmaf(ka, s[i].x, kv.x);
        kv.y = fmaf(ka, s[i].y, kv.y);
        kv.z = fmaf(ka, s[i].z, kv.z);
        kv.w = fmaf(ka, s[i].w, kv.w);
      }
      kv = gdn_warp_sum_rows(kv);
      // delta = beta (v - kv); S += k delta^T; o = S^T q
      const float4 v = *reinterpret_cast<const float4*>(&sv[b][lcol]);
      const float4 d = make_float4(bt * (v.x - kv.x), bt * (v.y - kv.y), bt * (v.z - kv.z), bt * (v.w - kv.w));
      float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const float ka = sk[b][rg + RG * i], qa = sq[b][rg + RG * i];
        s[i].x = fmaf(ka, d.x, s[i].x);
        s[i].y = fmaf(ka, d.y, s[i].y);
        s[i].z = fmaf(ka, d.z, s[i].z);
        s[i].w = fmaf(ka, d.w, s[i].w);
        o.x = fmaf(qa, s[i].x, o.x);
        o.y = fmaf(qa, s[i].y, o.y);
        o.z = fmaf(qa, s[i].z, o.z);
        o.w = fmaf(qa, s[i].w, o.w);
      }
      o = gdn_warp_sum_rows(o);
      if (rg == 0) *reinterpret_cast<float4*>(out + (size_t)(t0 + b) * hv * DV + (size_t)j * DV + col) = o;
      if (t0 + b < keep) {  // a verify step: the state after this token, for a rollback
        float* K = kept + (size_t)(t0 + b) * kept_stride;
#pragma unroll
        for (int i = 0; i < RPT; ++i) *reinterpret_cast<float4*>(K + (size_t)(rg + RG * i) * DV) = s[i];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RPT; ++i) *reinterpret_cast<float4*>(S + (size_t)(rg + RG * i) * DV) = s[i];
}
