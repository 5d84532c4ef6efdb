// Combines the split-KV partials of attn_decode / attn_prefill (log-sum-exp) and applies the output gate:
// for one (token t, query head h), with partials (O_s unnormalised, m_s running max in log2 units, l_s sum)
//   m = max m_s,  l = sum l_s 2^(m_s - m),  out = (sum O_s 2^(m_s - m)) / l * sigmoid(gate).
// A split that saw no key of a row has m_s = -inf, l_s = 0, O_s = 0 and weighs nothing; split 0 always holds
// key 0, so m is finite. CPU reference: qrig::cpu::attention_gated (this is its last step).
// One CTA per (t, h, quarter of the 256 columns) (grid.x = T * Hq * 4, item-major): 16 split groups x 16 lanes
// of 4 columns; group sg folds splits sg, sg+16, ... with its own running max, four splits' loads in flight,
// then the 16 groups are combined through shared memory in group order (deterministic).
// Batched (b1): the partials of a batched attn_decode over T sequences of one token each: sequence t's split count
// is its own (qrig_decode_splits of seq_pos[t] + 1 keys over split_target), n_split unused, and its CTAs leave when
// that count is 1 (the decode kernel wrote its output); the others fold exactly what the sequence's own merge folds.
// b0: seq_pos null.
// Variant: attn_merge_d<D>_b<B>_t256. Arguments: ws_o [n_split][T][Hq][D], ws_ml [n_split][T][Hq] (float2 m, l),
// n_split, T, Hq, gate, gate_row, gate_head, out [T][Hq*D], seq_pos, split_target.
#include "qrig_attention.cuh"

static_assert(QRIG_D == 256, "attn_merge: head dim 256 (4 quarters of 64 columns)");
static_assert(QRIG_THREADS == 256, "attn_merge: 16 split groups x 16 lanes");
static_assert(QRIG_BATCHED == 0 || QRIG_BATCHED == 1, "attn_merge: b is 0 or 1");

namespace {
constexpr int D = QRIG_D, QC = 64, NG = 16, U = 4;
}  // namespace

extern "C" __global__ void __launch_bounds__(QRIG_THREADS, 2)
attn_merge(const float* __restrict__ ws_o, const float2* __restrict__ ws_ml, int n_split, int T, int Hq,
           const float* __restrict__ gate, long long gate_row, long long gate_head, float* __restrict__ out,
           const int* __restrict__ seq_pos, int split_target) {
  qrig_grid_dependency_wait();
  __shared__ __align__(16) float so[NG][QC];
  __shared__ float sm_m[NG], sm_l[NG];
  const int tid = threadIdx.x, sg = tid >> 4, lane = tid & 15;
  const int item = (int)(blockIdx.x >> 2);  // t * Hq + h
  const int col0 = (int)(blockIdx.x & 3) * QC;
  const int t = item / Hq, h = item % Hq;
#if QRIG_BATCHED
  {
    int keys_per_split;
    n_split = qrig_decode_splits(seq_pos[t] + 1, split_target, keys_per_split);
    if (n_split == 1) return;  // the decode kernel wrote this sequence's output
  }
#endif
  const size_t stride = (size_t)T * Hq;  // items per split

  float m = QRIG_NEG_INF, l = 0.0f;
  float4 o = qrig_zero4();
  for (int s0 = sg; s0 < n_split; s0 += NG * U) {
    float2 ml[U];
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * NG;
      if (s < n_split) {
        const size_t it = (size_t)s * stride + item;
        ml[u] = ws_ml[it];
        x[u] = reinterpret_cast<const float4*>(ws_o + it * D + col0)[lane];
      } else {
        ml[u].x = QRIG_NEG_INF;
        ml[u].y = 0.0f;
        x[u] = qrig_zero4();
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float m_new = fmaxf(m, ml[u].x);
      const float m_use = m_new == QRIG_NEG_INF ? 0.0f : m_new;
      const float a = qrig_exp2(m - m_use), b = qrig_exp2(ml[u].x - m_use);
      l = l * a + ml[u].y * b;
      o.x = o.x * a + x[u].x * b;
      o.y = o.y * a + x[u].y * b;
      o.z = o.z * a + x[u].z * b;
      o.w = o.w * a + x[u].w * b;
      m = m_new;
    }
  }
  reinterpret_cast<float4*>(so[sg])[lane] = o;
  if (lane == 0) {
    sm_m[sg] = m;
    sm_l[sg] = l;
  }
  __syncthreads();
  if (tid >= QC) return;

  float mx = QRIG_NEG_INF;
#pragma unroll
  for (int g = 0; g < NG; ++g) mx = fmaxf(mx, sm_m[g]);
  const float m_use = mx == QRIG_NEG_INF ? 0.0f : mx;
  float lsum = 0.0f, osum = 0.0f;
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    const float f = qrig_exp2(sm_m[g] - m_use);
    lsum = fmaf(sm_l[g], f, lsum);
    osum = fmaf(so[g][tid], f, osum);
  }
  const int col = col0 + tid;
  out[(size_t)item * D + col] = osum / lsum * qrig_sigmoid(gate[(size_t)t * gate_row + (size_t)h * gate_head + col]);
}
