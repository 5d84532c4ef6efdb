// Causal gated GQA attention for a block of query tokens over the KV cache (keys in QRIG_KF, values in QRIG_VF:
// 16 f16, 8 q8, 4 t4, 3 t3; qrig_kv.cuh) (prefill, and any T the decode kernel does not take). CPU reference:
// qrig::cpu::attention_gated_kv (attention_gated with the cache converted to f32 for f16).
//
// One CTA per (KV head, block of BQ = 32/G query tokens, split of the key range): its 32 "rows" are the
// (token, query head) pairs of the block for all G query heads of the KV head (row r = token r/G, head r%G;
// rows past G*BQ or past T are idle), so every K/V tile is read once for all of them. Per tile of 32 keys:
//   1. K tile (f16 -> f32) into shared memory;
//   2. S = Q K^T (32 x 32, inner 256) in fp32 FFMA, each thread 2 rows x 4 keys; Q (pre-scaled by
//      scale*log2 e) stays in shared memory for the whole CTA;
//   3. online softmax in fp32 (row max by warp shuffles: a warp holds whole rows), P to shared memory;
//   4. V tile (f16, as stored) into the same shared memory;
//   5. O += P V, each thread 8 rows x 8 columns of the 32 x 256 accumulator. QRIG_HALF = 0: fp32 FFMA
//      (V converted per use). QRIG_HALF = 1: HFMA2 with P rounded to fp16, accumulated in fp16 over the 32
//      keys of the tile, then added to the fp32 accumulator (so rounding grows with 32 terms, not the
//      context length); scores, softmax and the running sums are fp32 in both.
// Shared-memory rows are XOR-swizzled in 16-byte units (bank-conflict-free fragment loads without padding):
// 32 KiB for Q + 32 KiB for the K tile, reused for V and P: 64 KiB dynamic shared memory. Global loads go
// through registers, all 8 of a thread's 16-byte loads issued before the first use; the V tile's before the
// barrier that ends S. Prefetching further (V during S, the next K during P.V) was slower on the H200 (26 vs
// 29 TFLOP/s): the registers it holds are the ones ptxas needs to pipeline the S loop's fragment loads under
// the 3-CTA register cap (3 CTAs x 4 warps hide each other's load latency instead).
// Tiles wholly before the first token's position need no mask; keys at or past pos0+T are never read (zeros).
// Quantized caches: a warp loads a key's row as stored (lane: the 8 values of columns 8l..8l+7: q8 8 int8 and
// the block scale, t4/t3 8 codes and the vector's scale) and expands it once per CTA into the fp32 K tile (t4/t3:
// scale * level, still rotated) or, for q8/t4/t3 values, into an fp32 V tile of 16 keys at a time (the 16 KiB the
// f16 tile takes: P.V runs over the tile's two halves with a barrier between, so every format keeps 64 KiB and fits
// sm_75's 64 KiB per block; P.V in fp32 only). t4/t3 keys: the q rows are rotated
// once as they are staged (q'.k' = q.k); t4/t3 values: the output is rotated back once per row (here when
// n_split = 1, else by attn_merge_rot), by the warp's Walsh-Hadamard transform.
//
// The key range 0..kv_len-1 of a block (kv_len = pos0 + its last token + 1) is cut into n_split parts of
// whole tiles. n_split = 1: the CTA writes out = (O / l) * sigmoid(gate). Otherwise it writes its partial
// (unnormalised O, running max m in log2 units, sum l) to ws_o [n_split][T][Hq][D] and ws_ml
// [n_split][T][Hq] and attn_merge combines them. Blocks are numbered from the last (longest) query block so
// the longest CTAs start first.
// Variant: attn_prefill_d<D>_g<G>_h<HALF>_k<KF>_v<VF>_t128. Grid: (ceil(T/BQ) * n_split, Hkv). Dynamic smem:
// 65536. Arguments: q [T][Hq*D] f32, kc, vc (cache rows, k_row / v_row bytes apart), k_row,
// v_row, T, pos0, Hq, qscale (scale * log2 e), gate, gate_row, gate_head, out [T][Hq*D], ws_o, ws_ml, n_split,
// layer (the rotation's).
#include "qrig_kv.cuh"

static_assert(QRIG_D == 256, "attn_prefill: head dim 256 (8 columns per lane over 32 lanes)");
static_assert(QRIG_G >= 1 && QRIG_G <= 32, "attn_prefill: 1..32 query heads per KV head");
static_assert(QRIG_HALF == 0 || QRIG_HALF == 1, "attn_prefill: h is 0 (fp32 P.V) or 1 (HFMA2 P.V)");
static_assert(QRIG_THREADS == 128, "attn_prefill: the thread layout is for 4 warps");
static_assert(QRIG_KF == 16 || QRIG_KF == 8 || QRIG_KF == 4 || QRIG_KF == 3, "attn_prefill: k is 16, 8, 4 or 3");
static_assert(QRIG_VF == 16 || QRIG_VF == 8 || QRIG_VF == 4 || QRIG_VF == 3, "attn_prefill: v is 16, 8, 4 or 3");
static_assert(QRIG_VF == 16 || QRIG_HALF == 0, "attn_prefill: HFMA2 P.V (h1) reads fp16 values only");

namespace {
constexpr int D = QRIG_D, G = QRIG_G, NT = QRIG_THREADS;
constexpr int M = 32;        // rows per CTA
constexpr int BK = 32;       // keys per tile
constexpr int BQ = M / G;    // query tokens per CTA
constexpr int D4 = D / 4;    // float4 per row
constexpr int D8 = D / 8;    // 16-byte f16 chunks per row
constexpr int PP = 36;       // pitch (4-byte words) of a key's row of P: conflict-free scattered writes
constexpr int KF = QRIG_KF, VF = QRIG_VF;
constexpr bool KROT = QRIG_KV_ROTATED(KF), VROT = QRIG_KV_ROTATED(VF), VQ = VF != 16;
constexpr int Q_BYTES = M * D * 4;
constexpr int V_OFF = 0;                      // in region B: V tile [BK][D] (f16 as stored, or f32 expanded)
constexpr int VK = VQ ? BK / 2 : BK;          // keys of the V tile in shared memory at once (f32: half the tile)
constexpr int P_OFF = BK * D * 2;             // P [BK][PP] (f32, or fp16 pairs when QRIG_HALF)
constexpr int A_OFF = P_OFF + BK * PP * 4;    // per-row rescale factor of the tile [M]
constexpr int ML_OFF = A_OFF + M * 4;         // final m [M], l [M]
constexpr int B_BYTES = BK * D * 4;           // K tile as f32
constexpr int SMEM = Q_BYTES + B_BYTES;
static_assert(VK * D * (VQ ? 4 : 2) <= P_OFF, "attn_prefill: the V tile must end where P begins");
static_assert(ML_OFF + 2 * M * 4 <= B_BYTES, "attn_prefill: V, P and row data must fit in the K tile's space");
static_assert(SMEM == 65536, "attn_prefill: the launcher passes 64 KiB");
}  // namespace

// One K or V tile of 32 keys: warp w loads keys w, w+4, ... (a row's head vector per warp load, lane = the 8
// values of columns 8l..8l+7); keys at or past kv_len are zeros (never read).
template <int F>
__device__ __forceinline__ void load_tile(const unsigned char* __restrict__ cache, int k0, int kv_len,
                                          long long row_bytes, int kvh, int width, int w, int lane, QrigKv8 (&r)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int kp = k0 + i * 4 + w;
    r[i] = qrig_kv_load8<F>(cache + (size_t)(kp < kv_len ? kp : 0) * (size_t)row_bytes, kvh, width, lane, kp < kv_len);
  }
}

// Three CTAs per SM where shared memory allows it (H100/H200: 3 x 64 KiB): registers are capped to fit them
// (168; 2 CTAs with 188 registers and a deeper-unrolled S loop measured 27.6 vs 29.2 TFLOP/s on the H200).
// Where fewer fit (A100: 2; sm_70/75/86/89: 1) the bound asks for those only: under NVRTC 11.8 the sm_70
// code spilled 16 bytes at the 168-register cap that three CTAs would need.
// One key's 8 values of this lane (q8/t4/t3), expanded to fp32 into slot `slot` of the V tile.
template <int F>
__device__ __forceinline__ void store_v4_impl(float4* V4, int slot, const QrigKv8& r, const float* cb, int lane) {
  float f[8];
  qrig_kv_values8<F>(r, cb, f);
  float4 a, b;
  a.x = f[0]; a.y = f[1]; a.z = f[2]; a.w = f[3];
  b.x = f[4]; b.y = f[5]; b.z = f[6]; b.w = f[7];
  V4[slot * D4 + 2 * lane] = a;
  V4[slot * D4 + 2 * lane + 1] = b;
}
__device__ __forceinline__ void store_v4(float4* V4, int slot, const QrigKv8& r, const float* cb, int lane) {
  store_v4_impl<VF>(V4, slot, r, cb, lane);
}

// f16 keys with q8/t4/t3 values (a --kv choice only: keys are kept at least as precise as values) hold the widest
// K registers and the V expansion at once: they spilled under the 3-CTA cap on sm_90 and ask for 2 CTAs.
#define QRIG_PREFILL_CTAS (QRIG_KF == 16 && QRIG_VF != 16 ? 2 : 3)
extern "C" __global__ void __launch_bounds__(QRIG_THREADS, QRIG_CTAS_FITTING(QRIG_PREFILL_CTAS, (SMEM + 1023) / 1024))
attn_prefill(const float* __restrict__ q, const unsigned char* __restrict__ kc, const unsigned char* __restrict__ vc,
             long long k_row, long long v_row, int T, int pos0, int Hq, float qscale, const float* __restrict__ gate,
             long long gate_row, long long gate_head, float* __restrict__ out, float* __restrict__ ws_o,
             float2* __restrict__ ws_ml, int n_split, int layer) {
  qrig_grid_dependency_wait();
  extern __shared__ __align__(16) unsigned char smem[];
  float4* Q4 = reinterpret_cast<float4*>(smem);                // [M][D4], chunk c of row r at c ^ (r & 7)
  unsigned char* B = smem + Q_BYTES;
  float4* K4 = reinterpret_cast<float4*>(B);                   // [BK][D4], chunk c of key j at c ^ (j & 7)
  uint4* V8 = reinterpret_cast<uint4*>(B + V_OFF);             // [BK][D8] (f16 values)
  float4* V4 = reinterpret_cast<float4*>(B + V_OFF);           // [BK/2][D4] (q8/t4/t3 values, expanded)
  float* Ps = reinterpret_cast<float*>(B + P_OFF);
  float* As = reinterpret_cast<float*>(B + A_OFF);
  float* Ms = reinterpret_cast<float*>(B + ML_OFF);
  float* Ls = Ms + M;

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y;
  const int n_qb = (T + BQ - 1) / BQ;
  const int qb = n_qb - 1 - (int)(blockIdx.x / (unsigned)n_split);
  const int split = (int)(blockIdx.x % (unsigned)n_split);
  const int q0 = qb * BQ;
  const int nq = min(BQ, T - q0);
  const int kv_len = pos0 + q0 + nq;
  const int n_tiles = (kv_len + BK - 1) / BK;
  const int tps = (n_tiles + n_split - 1) / n_split;
  const int tile_begin = split * tps;
  const int tile_end = min(n_tiles, tile_begin + tps);
  const int width = (int)gridDim.y * D;
#if QRIG_KF != 16 || QRIG_VF != 16
  __shared__ float cbk[16], cbv[16];  // the key and value codebooks (t4/t3)
  qrig_kv_load_codebook(KF, cbk, tid);
  qrig_kv_load_codebook(VF, cbv, tid);
  __syncthreads();  // the first K tile is expanded before the loop's first barrier
#else
  const float* cbk = nullptr;
  const float* cbv = nullptr;
#endif

  // The first K tile's loads fly while Q is staged.
  QrigKv8 kr[8], vr[8];
  if (tile_begin < tile_end) load_tile<KF>(kc, tile_begin * BK, kv_len, k_row, kvh, width, w, lane, kr);

  // Q rows, pre-scaled (t4/t3 keys: and rotated, warp w rows w, w+4, ..); idle rows are zero.
  if (KROT) {
    const unsigned sb = qrig_kv_sign_byte(layer, kvh, lane);
    for (int r = w; r < M; r += NT / 32) {
      const int tok = r / G;
      float4 a = qrig_zero4(), b = qrig_zero4();
      if (tok < nq) {
        const float4* src = reinterpret_cast<const float4*>(q + ((size_t)(q0 + tok) * Hq + (size_t)kvh * G + r % G) * D);
        a = src[2 * lane];
        b = src[2 * lane + 1];
      }
      float x[8] = {a.x * qscale, a.y * qscale, a.z * qscale, a.w * qscale,
                    b.x * qscale, b.y * qscale, b.z * qscale, b.w * qscale};
      qrig_kv_rotate_warp(x, sb, lane);
      a.x = x[0]; a.y = x[1]; a.z = x[2]; a.w = x[3];
      b.x = x[4]; b.y = x[5]; b.z = x[6]; b.w = x[7];
      Q4[r * D4 + ((2 * lane) ^ (r & 7))] = a;
      Q4[r * D4 + ((2 * lane + 1) ^ (r & 7))] = b;
    }
  } else for (int i = tid; i < M * D4; i += NT) {
    const int r = i / D4, c = i % D4, tok = r / G;
    float4 v = qrig_zero4();
    if (tok < nq) {
      v = reinterpret_cast<const float4*>(q + ((size_t)(q0 + tok) * Hq + (size_t)kvh * G + r % G) * D)[c];
      v.x *= qscale;
      v.y *= qscale;
      v.z *= qscale;
      v.w *= qscale;
    }
    Q4[r * D4 + (c ^ (r & 7))] = v;
  }

  // S layout: row group rg (rows rg, rg+16), key group kg (keys kg + 8j); a warp holds 4 whole row groups.
  const int rg = 4 * w + (lane >> 3), kg = lane & 7;
  float m_run[2], l_run[2];
  int lim[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rg + 16 * i, tok = r / G;
    m_run[i] = QRIG_NEG_INF;
    l_run[i] = 0.0f;
    lim[i] = tok < nq ? pos0 + q0 + tok : kv_len - 1;  // last visible key
  }
  // P.V layout: rows 8w..8w+7, columns 8*lane..8*lane+7.
  float o[8][8];
#pragma unroll
  for (int rr = 0; rr < 8; ++rr)
#pragma unroll
    for (int cc = 0; cc < 8; ++cc) o[rr][cc] = 0.0f;

  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int k0 = tile * BK;
    if (tile != tile_begin) load_tile<KF>(kc, k0, kv_len, k_row, kvh, width, w, lane, kr);
    {  // 1. K tile, converted, stored swizzled. Lanes alternate which half they store first so
       // that each store instruction covers all eight 16-byte bank groups.
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int j = i * 4 + w;
        float f[8];
        qrig_kv_values8<KF>(kr[i], cbk, f);
        float4 a, b;
        a.x = f[0]; a.y = f[1]; a.z = f[2]; a.w = f[3];
        b.x = f[4]; b.y = f[5]; b.z = f[6]; b.w = f[7];
        const bool swap = (lane >> 2) & 1;
        float4* row = K4 + j * D4;
        row[(2 * lane + (swap ? 1 : 0)) ^ (j & 7)] = swap ? b : a;
        row[(2 * lane + (swap ? 0 : 1)) ^ (j & 7)] = swap ? a : b;
      }
    }
    __syncthreads();

    // 2. S = Q K^T for rows rg, rg+16 and keys kg, kg+8, kg+16, kg+24.
    float s[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
    {
      const float4* qa_row0 = Q4 + rg * D4;
      const float4* qa_row1 = Q4 + (rg + 16) * D4;
      const int qsw = rg & 7;  // (rg + 16) & 7 is the same
#pragma unroll 4
      for (int c = 0; c < D4; ++c) {
        const float4 qa0 = qa_row0[c ^ qsw];
        const float4 qa1 = qa_row1[c ^ qsw];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 kb = K4[(kg + 8 * j) * D4 + (c ^ kg)];
          s[0][j] = fmaf(qa0.x, kb.x, s[0][j]);
          s[0][j] = fmaf(qa0.y, kb.y, s[0][j]);
          s[0][j] = fmaf(qa0.z, kb.z, s[0][j]);
          s[0][j] = fmaf(qa0.w, kb.w, s[0][j]);
          s[1][j] = fmaf(qa1.x, kb.x, s[1][j]);
          s[1][j] = fmaf(qa1.y, kb.y, s[1][j]);
          s[1][j] = fmaf(qa1.z, kb.z, s[1][j]);
          s[1][j] = fmaf(qa1.w, kb.w, s[1][j]);
        }
      }
    }

    // 3. Causal mask (only tiles reaching past the first token's position), online softmax.
    const bool need_mask = k0 + BK - 1 > pos0 + q0;
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = QRIG_NEG_INF;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (need_mask && k0 + kg + 8 * j > lim[i]) s[i][j] = QRIG_NEG_INF;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 4));
      const float m_new = fmaxf(m_run[i], mx);
      const float m_use = m_new == QRIG_NEG_INF ? 0.0f : m_new;  // a row with nothing visible yet
      alpha[i] = qrig_exp2(m_run[i] - m_use);
      float ps = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = qrig_exp2(s[i][j] - m_use);
        ps += s[i][j];
      }
      l_run[i] = l_run[i] * alpha[i] + ps;
      m_run[i] = m_new;
    }

    // 4. P and the V tile to shared memory once every warp is done with K (the V loads fly meanwhile).
    load_tile<VF>(vc, k0, kv_len, v_row, kvh, width, w, lane, vr);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float* dst = Ps + (kg + 8 * j) * PP + rg + 16 * i;
#if QRIG_HALF
        *reinterpret_cast<unsigned*>(dst) = qrig_float_to_half2_dup(s[i][j]);
#else
        *dst = s[i][j];
#endif
      }
      if (kg == 0) As[rg + 16 * i] = alpha[i];
    }
#pragma unroll
    for (int i = 0; i < (VQ ? 4 : 8); ++i) {  // q8/t4/t3: the first 16 keys (i < 4 holds keys 4i + w < 16)
      if (VQ) {
        store_v4(V4, i * 4 + w, vr[i], cbv, lane);
      } else {
        V8[(i * 4 + w) * D8 + lane] = vr[i].w;
      }
    }
    __syncthreads();

    // 5. O = O * alpha + P V for rows 8w..8w+7, columns 8*lane..8*lane+7.
    float a[8];
    {
      const float4 a0 = reinterpret_cast<const float4*>(As + 8 * w)[0];
      const float4 a1 = reinterpret_cast<const float4*>(As + 8 * w)[1];
      a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
      a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
    }
#if QRIG_HALF
    unsigned acc[8][4];
#pragma unroll
    for (int rr = 0; rr < 8; ++rr)
#pragma unroll
      for (int c2 = 0; c2 < 4; ++c2) acc[rr][c2] = 0u;
#pragma unroll 2
    for (int j = 0; j < BK; ++j) {
      const uint4 vv = V8[j * D8 + lane];
      const uint4 p0 = reinterpret_cast<const uint4*>(Ps + j * PP + 8 * w)[0];
      const uint4 p1 = reinterpret_cast<const uint4*>(Ps + j * PP + 8 * w)[1];
      const unsigned p[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
      const unsigned v[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
      for (int rr = 0; rr < 8; ++rr)
#pragma unroll
        for (int c2 = 0; c2 < 4; ++c2) acc[rr][c2] = qrig_hfma2(p[rr], v[c2], acc[rr][c2]);
    }
#pragma unroll
    for (int rr = 0; rr < 8; ++rr)
#pragma unroll
      for (int c2 = 0; c2 < 4; ++c2) {
        float lo, hi;
        qrig_half2_to_float2(acc[rr][c2], lo, hi);
        o[rr][2 * c2] = fmaf(o[rr][2 * c2], a[rr], lo);
        o[rr][2 * c2 + 1] = fmaf(o[rr][2 * c2 + 1], a[rr], hi);
      }
#else
#pragma unroll
    for (int rr = 0; rr < 8; ++rr)
#pragma unroll
      for (int cc = 0; cc < 8; ++cc) o[rr][cc] *= a[rr];
#pragma unroll
    for (int hv = 0; hv < BK / VK; ++hv) {
    if (VQ && hv == 1) {  // the second 16 keys into the same 16 KiB once every warp is done with the first
      __syncthreads();
#pragma unroll
      for (int i = 4; i < 8; ++i) store_v4(V4, (i - 4) * 4 + w, vr[i], cbv, lane);
      __syncthreads();
    }
#pragma unroll 4
    for (int jv = 0; jv < VK; ++jv) {
      const int j = hv * VK + jv;  // the key of the tile
      float v[8];
      if (VQ) {
        const float4 va = V4[jv * D4 + 2 * lane], vb = V4[jv * D4 + 2 * lane + 1];
        v[0] = va.x; v[1] = va.y; v[2] = va.z; v[3] = va.w;
        v[4] = vb.x; v[5] = vb.y; v[6] = vb.z; v[7] = vb.w;
      } else {
        qrig_half8_to_float(V8[j * D8 + lane], v);
      }
      const float4 p0 = reinterpret_cast<const float4*>(Ps + j * PP + 8 * w)[0];
      const float4 p1 = reinterpret_cast<const float4*>(Ps + j * PP + 8 * w)[1];
      const float p[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
      for (int rr = 0; rr < 8; ++rr)
#pragma unroll
        for (int cc = 0; cc < 8; ++cc) o[rr][cc] = fmaf(p[rr], v[cc], o[rr][cc]);
    }
    }
#endif
    __syncthreads();  // before the next K tile overwrites V and P
  }

  // Row sums over the 8 key-group lanes; m and l to shared memory for the P.V layout.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(QRIG_FULL_MASK, l, 1);
    l += __shfl_xor_sync(QRIG_FULL_MASK, l, 2);
    l += __shfl_xor_sync(QRIG_FULL_MASK, l, 4);
    if (kg == 0) {
      Ms[rg + 16 * i] = m_run[i];
      Ls[rg + 16 * i] = l;
    }
  }
  __syncthreads();

  const int col = 8 * lane;
  if (VROT && n_split == 1) {  // rows 8w..8w+7, whole in the warp: rotated back, then normalised and gated
    const unsigned sb = qrig_kv_sign_byte(layer, kvh, lane);
#pragma unroll
    for (int rr = 0; rr < 8; ++rr) {
      const int r = 8 * w + rr, tok = r / G;
      qrig_kv_unrotate_warp(o[rr], sb, lane);
      if (tok >= nq) continue;
      const int t = q0 + tok, h = kvh * G + r % G;
      const float inv = 1.0f / Ls[r];
      const float* gp = gate + (size_t)t * gate_row + (size_t)h * gate_head + col;
      float* dst = out + ((size_t)t * Hq + h) * D + col;
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = o[rr][e] * inv * qrig_sigmoid(gp[e]);
    }
    return;
  }
#pragma unroll
  for (int rr = 0; rr < 8; ++rr) {
    const int r = 8 * w + rr, tok = r / G;
    if (tok >= nq) continue;
    const int t = q0 + tok, h = kvh * G + r % G;
    float4 x0, x1;
    if (n_split == 1) {
      const float inv = 1.0f / Ls[r];
      const float* gp = gate + (size_t)t * gate_row + (size_t)h * gate_head + col;
      x0.x = o[rr][0] * inv * qrig_sigmoid(gp[0]);
      x0.y = o[rr][1] * inv * qrig_sigmoid(gp[1]);
      x0.z = o[rr][2] * inv * qrig_sigmoid(gp[2]);
      x0.w = o[rr][3] * inv * qrig_sigmoid(gp[3]);
      x1.x = o[rr][4] * inv * qrig_sigmoid(gp[4]);
      x1.y = o[rr][5] * inv * qrig_sigmoid(gp[5]);
      x1.z = o[rr][6] * inv * qrig_sigmoid(gp[6]);
      x1.w = o[rr][7] * inv * qrig_sigmoid(gp[7]);
      float4* dst = reinterpret_cast<float4*>(out + ((size_t)t * Hq + h) * D + col);
      dst[0] = x0;
      dst[1] = x1;
    } else {
      x0.x = o[rr][0]; x0.y = o[rr][1]; x0.z = o[rr][2]; x0.w = o[rr][3];
      x1.x = o[rr][4]; x1.y = o[rr][5]; x1.z = o[rr][6]; x1.w = o[rr][7];
      const size_t item = ((size_t)split * T + t) * Hq + h;
      float4* dst = reinterpret_cast<float4*>(ws_o + item * D + col);
      dst[0] = x0;
      dst[1] = x1;
      if (lane == 0) {
        float2 ml;
        ml.x = Ms[r];
        ml.y = Ls[r];
        ws_ml[item] = ml;
      }
    }
  }
}
