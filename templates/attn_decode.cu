// Causal gated GQA attention for a few query tokens (decode: T <= N) over the KV cache (keys in QRIG_KF, values
// in QRIG_VF: 16 f16, 8 q8, 4 t4, 3 t3; qrig_kv.cuh), split over the key range (flash-decoding) so that a long
// context keeps every SM streaming. CPU reference: qrig::cpu::attention_gated_kv (attention_gated with the cache
// converted to f32 for f16).
//
// One CTA per (KV head, split of keys_per_split keys); its R = G*N rows are the (token, query head) pairs
// of all G query heads of the KV head (row r = token r/G, head r%G; rows of tokens >= T are idle). Each
// of the 4 warps streams its own groups of 8 keys straight from global memory (no shared-memory staging:
// the K and V bytes are used once per CTA; the next group's loads are issued before this group's math)
// with its own online softmax:
//   QK: lane = key j (0..7) x quarter qt (0..3); the lane loads 16-byte chunks qt, qt+4, ... of key j's
//       256 halves (the 4 quarters of a key read 64 contiguous bytes per load) and dots them with the
//       pre-scaled q rows (fp32, from shared memory, broadcast); two shuffles add the quarters.
//   softmax: fp32, row max over the 8 keys by shuffles, scores in log2 units (exp2).
//   PV: lane owns columns 8*lane..8*lane+7 and loads those 16 bytes of each of the 8 V rows; the weights
//       come from the key's lane by shuffle. Products and sums in fp32 (V converted exactly).
// Quantized caches are read as stored, never dequantized to memory: q8 keys are 4 chunks of 16 int8 per lane
// (chunks qt, qt+4, ..; the block's fp16 scale applied to the chunk's partial dot), t4/t3 keys 2 chunks of 32
// codes per lane looked up in a shared codebook, their vector's scale applied to the lane's partial dot; values
// are the 8 codes or int8 of the lane's columns and their scale. t4/t3 keys: each q row is rotated once when
// staged (q'.k' = q.k); t4/t3 values: P V is accumulated in the values' rotated domain and the output rotated
// back once per row (here when n_split = 1, else by attn_merge_rot), all by the warp's Walsh-Hadamard transform.
// The 4 warps' states are merged through shared memory at the end. n_split = 1: the CTA writes
// out = (O / l) * sigmoid(gate); otherwise its partial (unnormalised O, max m in log2 units, sum l) goes to
// ws_o [n_split][T][Hq][D] and ws_ml [n_split][T][Hq] for attn_merge. Keys >= pos0 + T are never read.
// Batched (b1, N = 1): one launch over a decode step's `seqs` sequences, one token each (grid.z = sequence z): q,
// gate and out are row z of their [seqs][...] arrays, the caches those of the sequence's slot (kc_of / vc_of
// [seq_slot[z]]), pos0 = seq_pos[z]; n_split is the split target, from which each sequence takes its own split
// (qrig_decode_splits: the host's attention_split for one token), and the CTAs past its split count leave at once
// (grid.x is the step's largest count). Partials go to ws_o [split][seqs][Hq][D], ws_ml [split][seqs][Hq] for the
// batched attn_merge / attn_merge_rot. A CTA computes exactly what it computes in its sequence's own launch.
// b0: kc_of, vc_of, seq_slot, seq_pos null, seqs 1.
// Variant: attn_decode_d<D>_g<G>_n<N>_k<KF>_v<VF>_b<B>_t128. Grid: (n_split, Hkv) (b1: x seqs). Static smem:
// 4*R*D*4 + 32*R (+ 128) bytes. Arguments: q [T][Hq*D] f32, kc, vc (cache rows, k_row / v_row bytes apart), k_row,
// v_row, T (b1: 1), pos0, Hq, qscale (scale * log2 e), gate, gate_row, gate_head, out [T][Hq*D], ws_o, ws_ml,
// keys_per_split (a multiple of 32; b1: unused), n_split (b1: the split target), layer (the rotation's), kc_of,
// vc_of, seq_slot, seq_pos, seqs.
#include "qrig_kv.cuh"

static_assert(QRIG_D == 256, "attn_decode: head dim 256 (8 columns per lane over 32 lanes)");
static_assert(QRIG_G >= 1 && QRIG_N >= 1 && QRIG_G * QRIG_N <= 8, "attn_decode: at most 8 rows (G * N)");
static_assert(QRIG_THREADS == 128, "attn_decode: the layout is for 4 warps");
static_assert(QRIG_KF == 16 || QRIG_KF == 8 || QRIG_KF == 4 || QRIG_KF == 3, "attn_decode: k is 16, 8, 4 or 3");
static_assert(QRIG_VF == 16 || QRIG_VF == 8 || QRIG_VF == 4 || QRIG_VF == 3, "attn_decode: v is 16, 8, 4 or 3");
static_assert(QRIG_BATCHED == 0 || (QRIG_BATCHED == 1 && QRIG_N == 1), "attn_decode: b is 0, or 1 with n = 1");

namespace {
constexpr int D = QRIG_D, G = QRIG_G, N = QRIG_N, R = G * N, NT = QRIG_THREADS, W = NT / 32;
constexpr int D4 = D / 4;
constexpr int KF = QRIG_KF, VF = QRIG_VF;
constexpr bool KROT = QRIG_KV_ROTATED(KF), VROT = QRIG_KV_ROTATED(VF);
}  // namespace

// A lane's part of one key (lane = key j x quarter qt), as loaded.
struct KeyRegs {
#if QRIG_KF == 16
  uint4 c[8];  // 16-byte chunks qt, qt+4, .. (8 halves each)
#elif QRIG_KF == 8
  uint4 c[4];  // 16-byte chunks qt, qt+4, qt+8, qt+12 (16 int8 each)
  uint4 d;     // the head's 8 fp16 block scales
#elif QRIG_KF == 4
  uint4 c[2];  // 16-byte chunks qt, qt+4 (32 nibbles each)
  float s;
#else
  unsigned c[6];  // 12-byte units qt, qt+4 (32 3-bit codes each)
  float s;
#endif
};

// A group of 8 keys for one warp: the lane's part of key kb+j (the 4 quarter lanes of a key read contiguous bytes
// per load) and its 8 columns of each of the 8 V rows; zeros past ke.
__device__ __forceinline__ void load_group(const unsigned char* __restrict__ kc, const unsigned char* __restrict__ vc,
                                           long long k_row, long long v_row, int kvh, int width, int kb, int ke,
                                           int lane, KeyRegs& kr, QrigKv8 (&vr)[8]) {
  const int kp = kb + (lane & 7), qt = lane >> 3;
  const bool kval = kp < ke;
  const unsigned char* krow = kc + (size_t)(kval ? kp : 0) * (size_t)k_row;
#if QRIG_KF == 16
  const uint4* k4 = reinterpret_cast<const uint4*>(krow + (size_t)kvh * 512);
#pragma unroll
  for (int c = 0; c < 8; ++c) kr.c[c] = kval ? __ldg(k4 + qt + 4 * c) : qrig_zero_u4();
#elif QRIG_KF == 8
  const uint4* k4 = reinterpret_cast<const uint4*>(krow + (size_t)kvh * 256);
#pragma unroll
  for (int c = 0; c < 4; ++c) kr.c[c] = kval ? __ldg(k4 + qt + 4 * c) : qrig_zero_u4();
  kr.d = kval ? __ldg(reinterpret_cast<const uint4*>(krow + width) + kvh) : qrig_zero_u4();
#elif QRIG_KF == 4
  const uint4* k4 = reinterpret_cast<const uint4*>(krow + (size_t)kvh * 128);
#pragma unroll
  for (int c = 0; c < 2; ++c) kr.c[c] = kval ? __ldg(k4 + qt + 4 * c) : qrig_zero_u4();
  kr.s = kval ? __ldg(reinterpret_cast<const float*>(krow + (width / 256) * 128) + kvh) : 0.0f;
#else
  const unsigned* k1 = reinterpret_cast<const unsigned*>(krow + (size_t)kvh * 96);
#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int i = 0; i < 3; ++i) kr.c[3 * c + i] = kval ? __ldg(k1 + 3 * (qt + 4 * c) + i) : 0u;
  kr.s = kval ? __ldg(reinterpret_cast<const float*>(krow + (width / 256) * 96) + kvh) : 0.0f;
#endif
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int kp2 = kb + jj;
    vr[jj] = qrig_kv_load8<VF>(vc + (size_t)(kp2 < ke ? kp2 : 0) * (size_t)v_row, kvh, width, lane, kp2 < ke);
  }
}

// Dot of 8 consecutive values f with the q row's float4s a, b, added to x.
__device__ __forceinline__ float dot8(const float4 a, const float4 b, const float* f, float x) {
  x = fmaf(a.x, f[0], x);
  x = fmaf(a.y, f[1], x);
  x = fmaf(a.z, f[2], x);
  x = fmaf(a.w, f[3], x);
  x = fmaf(b.x, f[4], x);
  x = fmaf(b.y, f[5], x);
  x = fmaf(b.z, f[6], x);
  x = fmaf(b.w, f[7], x);
  return x;
}

// The codes of 8 values (bits per code `bits`) looked up in the shared codebook.
__device__ __forceinline__ void levels8(unsigned w, int bits, const float* cb, float* f) {
  const unsigned mask = (1u << bits) - 1u;
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = cb[(w >> (bits * e)) & mask];
}

// The lane's partial dots of its part of the key with the R (pre-scaled, for t4/t3 rotated) q rows.
__device__ __forceinline__ void key_dots(const KeyRegs& kr, const float4* Q4, int qt, const float* cbk, float (&s)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = 0.0f;
#if QRIG_KF == 16
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    float kf[8];
    qrig_half8_to_float(kr.c[c], kf);
    const int q4 = 2 * (qt + 4 * c);  // float4 index of the chunk within a q row
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = dot8(Q4[r * D4 + q4], Q4[r * D4 + q4 + 1], kf, s[r]);
  }
#elif QRIG_KF == 8
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int chunk = qt + 4 * c, blk = chunk >> 1;
    const unsigned words[4] = {kr.d.x, kr.d.y, kr.d.z, kr.d.w};
    const unsigned w = words[blk >> 1];
    const float d = qrig_half_to_float((unsigned short)((blk & 1) ? (w >> 16) : (w & 0xFFFFu)));
    float kf[16];
    qrig_s8x4_to_float(kr.c[c].x, kf);
    qrig_s8x4_to_float(kr.c[c].y, kf + 4);
    qrig_s8x4_to_float(kr.c[c].z, kf + 8);
    qrig_s8x4_to_float(kr.c[c].w, kf + 12);
    const int q4 = 4 * chunk;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x = dot8(Q4[r * D4 + q4], Q4[r * D4 + q4 + 1], kf, 0.0f);
      x = dot8(Q4[r * D4 + q4 + 2], Q4[r * D4 + q4 + 3], kf + 8, x);
      s[r] = fmaf(d, x, s[r]);
    }
  }
#else
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int q4 = 8 * (qt + 4 * c);  // 32 values: 8 float4 of the q row
#pragma unroll
    for (int g = 0; g < 4; ++g) {  // 8 values each
#if QRIG_KF == 4
      const unsigned words[4] = {kr.c[c].x, kr.c[c].y, kr.c[c].z, kr.c[c].w};
      const unsigned w = words[g];
      float kf[8];
      levels8(w, 4, cbk, kf);
#else
      const unsigned w0 = kr.c[3 * c], w1 = kr.c[3 * c + 1], w2 = kr.c[3 * c + 2];
      const unsigned w = g == 0 ? w0 : g == 1 ? __funnelshift_r(w0, w1, 24) : g == 2 ? __funnelshift_r(w1, w2, 16) : (w2 >> 8);
      float kf[8];
      levels8(w & 0xFFFFFFu, 3, cbk, kf);
#endif
#pragma unroll
      for (int r = 0; r < R; ++r) s[r] = dot8(Q4[r * D4 + q4 + 2 * g], Q4[r * D4 + q4 + 2 * g + 1], kf, s[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] *= kr.s;
#endif
}

// Two CTAs per SM: registers for a group in flight while the previous one is computed.
extern "C" __global__ void __launch_bounds__(QRIG_THREADS, 2)
attn_decode(const float* __restrict__ q, const unsigned char* __restrict__ kc, const unsigned char* __restrict__ vc,
            long long k_row, long long v_row, int T, int pos0, int Hq, float qscale, const float* __restrict__ gate,
            long long gate_row, long long gate_head, float* __restrict__ out, float* __restrict__ ws_o,
            float2* __restrict__ ws_ml, int keys_per_split, int n_split, int layer,
            const unsigned char* const* __restrict__ kc_of, const unsigned char* const* __restrict__ vc_of,
            const int* __restrict__ seq_slot, const int* __restrict__ seq_pos, int seqs) {
  qrig_grid_dependency_wait();
  __shared__ __align__(16) float sm[W * R * D];  // q rows [R][D] during the loop, then the warps' O [W][R][D]
  __shared__ float wm[W][R], wl[W][R];
  __shared__ float cbk[16], cbv[16];  // the key and value codebooks (t4/t3)

#if QRIG_BATCHED
  const int ws_rows = seqs, ws_row0 = (int)blockIdx.z;  // the partials' rows: [split][seqs][Hq]
  {
    const int z = (int)blockIdx.z;
    pos0 = seq_pos[z];
    kc = kc_of[seq_slot[z]];
    vc = vc_of[seq_slot[z]];
    q += (size_t)z * Hq * D;
    gate += (size_t)z * gate_row;
    out += (size_t)z * Hq * D;
    n_split = qrig_decode_splits(pos0 + T, n_split, keys_per_split);
    if ((int)blockIdx.x >= n_split) return;  // past this sequence's keys: the whole CTA leaves
  }
#else
  const int ws_rows = T, ws_row0 = 0;  // [split][T][Hq]
#endif

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y, split = blockIdx.x;
  const int width = (int)gridDim.y * D;
  const int kv_len = pos0 + T;
  const int ks = split * keys_per_split;
  const int ke = min(kv_len, ks + keys_per_split);

  // The first group's loads fly while q is staged; each later group's during the previous group's math.
  KeyRegs kr;
  QrigKv8 vr[8];
  load_group(kc, vc, k_row, v_row, kvh, width, ks + 8 * w, ke, lane, kr, vr);
  qrig_kv_load_codebook(KF, cbk, tid);
  qrig_kv_load_codebook(VF, cbv, tid);

  float4* Q4 = reinterpret_cast<float4*>(sm);
  if (KROT) {  // warp w rotates rows w, w+4: lane l holds coordinates 8l..8l+7
    const unsigned sb = qrig_kv_sign_byte(layer, kvh, lane);
    for (int r = w; r < R; r += W) {
      const int t = r / G;
      float x[8];
      float4 a = qrig_zero4(), b = qrig_zero4();
      if (t < T) {
        const float4* src = reinterpret_cast<const float4*>(q + ((size_t)t * Hq + (size_t)kvh * G + r % G) * D);
        a = src[2 * lane];
        b = src[2 * lane + 1];
      }
      x[0] = a.x * qscale; x[1] = a.y * qscale; x[2] = a.z * qscale; x[3] = a.w * qscale;
      x[4] = b.x * qscale; x[5] = b.y * qscale; x[6] = b.z * qscale; x[7] = b.w * qscale;
      qrig_kv_rotate_warp(x, sb, lane);
      a.x = x[0]; a.y = x[1]; a.z = x[2]; a.w = x[3];
      b.x = x[4]; b.y = x[5]; b.z = x[6]; b.w = x[7];
      Q4[r * D4 + 2 * lane] = a;
      Q4[r * D4 + 2 * lane + 1] = b;
    }
  } else {
    for (int i = tid; i < R * D4; i += NT) {
      const int r = i / D4, c = i % D4, t = r / G;
      float4 v = qrig_zero4();
      if (t < T) {
        v = reinterpret_cast<const float4*>(q + ((size_t)t * Hq + (size_t)kvh * G + r % G) * D)[c];
        v.x *= qscale;
        v.y *= qscale;
        v.z *= qscale;
        v.w *= qscale;
      }
      Q4[i] = v;
    }
  }
  __syncthreads();

  const int j = lane & 7, qt = lane >> 3;
  float m[R], l[R], o[R][8];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = QRIG_NEG_INF;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.0f;
  }

  for (int kb = ks + 8 * w; kb < ke; kb += 8 * W) {
    const int kp = kb + j;
    const bool kval = kp < ke;
    KeyRegs kn;
    QrigKv8 vn[8];
    load_group(kc, vc, k_row, v_row, kvh, width, kb + 8 * W, ke, lane, kn, vn);

    // Partial dots over this lane's 64 dims, then the 4 quarters added.
    float s[R];
    key_dots(kr, Q4, qt, cbk, s);
    float p[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float x = s[r];
      x += __shfl_xor_sync(QRIG_FULL_MASK, x, 8);
      x += __shfl_xor_sync(QRIG_FULL_MASK, x, 16);
      const int t = r / G;
      if (!kval || t >= T || kp > pos0 + t) x = QRIG_NEG_INF;
      float mx = x;
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 4));
      const float m_new = fmaxf(m[r], mx);
      const float m_use = m_new == QRIG_NEG_INF ? 0.0f : m_new;
      const float alpha = qrig_exp2(m[r] - m_use);
      p[r] = qrig_exp2(x - m_use);
      l[r] = l[r] * alpha + p[r];  // this lane's key only; summed over the 8 key lanes at the end
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[r][e] *= alpha;
    }

#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      float vf[8];
      qrig_kv_values8<VF>(vr[jj], cbv, vf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float pj = __shfl_sync(QRIG_FULL_MASK, p[r], jj);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] = fmaf(pj, vf[e], o[r][e]);
      }
    }
    kr = kn;
#pragma unroll
    for (int c = 0; c < 8; ++c) vr[c] = vn[c];
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    l[r] += __shfl_xor_sync(QRIG_FULL_MASK, l[r], 1);
    l[r] += __shfl_xor_sync(QRIG_FULL_MASK, l[r], 2);
    l[r] += __shfl_xor_sync(QRIG_FULL_MASK, l[r], 4);
  }
  __syncthreads();  // q rows no longer read: sm becomes the warps' O
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float4 x0, x1;
    x0.x = o[r][0]; x0.y = o[r][1]; x0.z = o[r][2]; x0.w = o[r][3];
    x1.x = o[r][4]; x1.y = o[r][5]; x1.z = o[r][6]; x1.w = o[r][7];
    float4* dst = reinterpret_cast<float4*>(sm + (w * R + r) * D + 8 * lane);
    dst[0] = x0;
    dst[1] = x1;
    if (lane == 0) {
      wm[w][r] = m[r];
      wl[w][r] = l[r];
    }
  }
  __syncthreads();

  if (VROT && n_split == 1) {  // warp w finishes rows w, w+4 and rotates them back (lane: columns 8l..8l+7)
    const unsigned sb = qrig_kv_sign_byte(layer, kvh, lane);
    for (int r = w; r < R; r += W) {
      const int t = r / G;
      float mx = QRIG_NEG_INF;
#pragma unroll
      for (int ww = 0; ww < W; ++ww) mx = fmaxf(mx, wm[ww][r]);
      const float m_use = mx == QRIG_NEG_INF ? 0.0f : mx;
      float lsum = 0.0f, x[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = 0.0f;
#pragma unroll
      for (int ww = 0; ww < W; ++ww) {
        const float f = qrig_exp2(wm[ww][r] - m_use);
        lsum = fmaf(wl[ww][r], f, lsum);
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(sm[(ww * R + r) * D + 8 * lane + e], f, x[e]);
      }
      qrig_kv_unrotate_warp(x, sb, lane);
      if (t < T) {
        const int h = kvh * G + r % G;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int col = 8 * lane + e;
          out[((size_t)t * Hq + h) * D + col] =
              x[e] / lsum * qrig_sigmoid(gate[(size_t)t * gate_row + (size_t)h * gate_head + col]);
        }
      }
    }
    return;
  }

  for (int idx = tid; idx < R * D; idx += NT) {
    const int r = idx / D, col = idx % D, t = r / G;
    if (t >= T) continue;
    float mx = QRIG_NEG_INF;
#pragma unroll
    for (int ww = 0; ww < W; ++ww) mx = fmaxf(mx, wm[ww][r]);
    const float m_use = mx == QRIG_NEG_INF ? 0.0f : mx;
    float lsum = 0.0f, osum = 0.0f;
#pragma unroll
    for (int ww = 0; ww < W; ++ww) {
      const float f = qrig_exp2(wm[ww][r] - m_use);
      lsum = fmaf(wl[ww][r], f, lsum);
      osum = fmaf(sm[(ww * R + r) * D + col], f, osum);
    }
    const int h = kvh * G + r % G;
    if (n_split == 1) {
      out[((size_t)t * Hq + h) * D + col] =
          osum / lsum * qrig_sigmoid(gate[(size_t)t * gate_row + (size_t)h * gate_head + col]);
    } else {
      const size_t item = ((size_t)split * ws_rows + ws_row0 + t) * Hq + h;
      ws_o[item * D + col] = osum;
      if (col == 0) {
        float2 ml;
        ml.x = mx;
        ml.y = lsum;
        ws_ml[item] = ml;
      }
    }
  }
}
