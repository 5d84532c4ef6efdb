// Causal gated GQA attention for a few query tokens (decode: T <= N) over the f16 KV cache, split over the
// key range (flash-decoding) so that a long context keeps every SM streaming. CPU reference:
// qrig::cpu::attention_gated with the cache converted to f32.
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
// The 4 warps' states are merged through shared memory at the end. n_split = 1: the CTA writes
// out = (O / l) * sigmoid(gate); otherwise its partial (unnormalised O, max m in log2 units, sum l) goes to
// ws_o [n_split][T][Hq][D] and ws_ml [n_split][T][Hq] for attn_merge. Keys >= pos0 + T are never read.
// Variant: attn_decode_d<D>_g<G>_n<N>_t128. Grid: (n_split, Hkv). Static smem: 4*R*D*4 + 32*R bytes.
// Arguments: q [T][Hq*D] f32, kc, vc (fp16 bits, row stride kv_row elements), kv_row, T, pos0, Hq, qscale
// (scale * log2 e), gate, gate_row, gate_head, out [T][Hq*D], ws_o, ws_ml, keys_per_split (a multiple of
// 32), n_split.
#include "qrig_attention.cuh"

static_assert(QRIG_D == 256, "attn_decode: head dim 256 (8 columns per lane over 32 lanes)");
static_assert(QRIG_G >= 1 && QRIG_N >= 1 && QRIG_G * QRIG_N <= 8, "attn_decode: at most 8 rows (G * N)");
static_assert(QRIG_THREADS == 128, "attn_decode: the layout is for 4 warps");

namespace {
constexpr int D = QRIG_D, G = QRIG_G, N = QRIG_N, R = G * N, NT = QRIG_THREADS, W = NT / 32;
constexpr int D4 = D / 4;
}  // namespace

// A group of 8 keys for one warp: the lane's 8 chunks of key kb+j (chunks qt, qt+4, ..: the 4 quarter lanes of
// a key read 64 contiguous bytes per load) and its 16 bytes of each of the 8 V rows; zeros past ke.
__device__ __forceinline__ void load_group(const unsigned short* __restrict__ kc, const unsigned short* __restrict__ vc,
                                           long long kv_row, size_t head_off, int kb, int ke, int lane,
                                           uint4 (&kr)[8], uint4 (&vr)[8]) {
  const int kp = kb + (lane & 7), qt = lane >> 3;
  const bool kval = kp < ke;
  const uint4* krow = reinterpret_cast<const uint4*>(kc + (size_t)(kval ? kp : 0) * kv_row + head_off);
#pragma unroll
  for (int c = 0; c < 8; ++c) kr[c] = kval ? __ldg(krow + qt + 4 * c) : qrig_zero_u4();
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int kp2 = kb + jj;
    vr[jj] = kp2 < ke ? __ldg(reinterpret_cast<const uint4*>(vc + (size_t)kp2 * kv_row + head_off) + lane)
                      : qrig_zero_u4();
  }
}

// Two CTAs per SM: registers for a group in flight while the previous one is computed.
extern "C" __global__ void __launch_bounds__(QRIG_THREADS, 2)
attn_decode(const float* __restrict__ q, const unsigned short* __restrict__ kc, const unsigned short* __restrict__ vc,
            long long kv_row, int T, int pos0, int Hq, float qscale, const float* __restrict__ gate,
            long long gate_row, long long gate_head, float* __restrict__ out, float* __restrict__ ws_o,
            float2* __restrict__ ws_ml, int keys_per_split, int n_split) {
  __shared__ __align__(16) float sm[W * R * D];  // q rows [R][D] during the loop, then the warps' O [W][R][D]
  __shared__ float wm[W][R], wl[W][R];

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y, split = blockIdx.x;
  const int kv_len = pos0 + T;
  const int ks = split * keys_per_split;
  const int ke = min(kv_len, ks + keys_per_split);
  const size_t head_off = (size_t)kvh * D;

  // The first group's loads fly while q is staged; each later group's during the previous group's math.
  uint4 kr[8], vr[8];
  load_group(kc, vc, kv_row, head_off, ks + 8 * w, ke, lane, kr, vr);

  float4* Q4 = reinterpret_cast<float4*>(sm);
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
    uint4 kn[8], vn[8];
    load_group(kc, vc, kv_row, head_off, kb + 8 * W, ke, lane, kn, vn);

    // Partial dots over this lane's 64 dims, then the 4 quarters added.
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float kf[8];
      qrig_half8_to_float(kr[c], kf);
      const int q4 = 2 * (qt + 4 * c);  // float4 index of the chunk within a q row
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 a = Q4[r * D4 + q4], b = Q4[r * D4 + q4 + 1];
        float x = s[r];
        x = fmaf(a.x, kf[0], x);
        x = fmaf(a.y, kf[1], x);
        x = fmaf(a.z, kf[2], x);
        x = fmaf(a.w, kf[3], x);
        x = fmaf(b.x, kf[4], x);
        x = fmaf(b.y, kf[5], x);
        x = fmaf(b.z, kf[6], x);
        x = fmaf(b.w, kf[7], x);
        s[r] = x;
      }
    }
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
      qrig_half8_to_float(vr[jj], vf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float pj = __shfl_sync(QRIG_FULL_MASK, p[r], jj);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] = fmaf(pj, vf[e], o[r][e]);
      }
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      kr[c] = kn[c];
      vr[c] = vn[c];
    }
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
      const size_t item = ((size_t)split * T + t) * Hq + h;
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
