// Combines the split-KV partials of attn_decode / attn_prefill over t4/t3 values (log-sum-exp, as attn_merge),
// rotates the combined output back from the values' rotated domain once (R^T o': the warp's Walsh-Hadamard
// transform, then the signs of (layer, KV head), / 16) and applies the output gate:
//   m = max m_s,  l = sum l_s 2^(m_s - m),  out = R^T (sum O_s 2^(m_s - m)) / l * sigmoid(gate).
// A split that saw no key of a row has m_s = -inf, l_s = 0, O_s = 0 and weighs nothing; split 0 always holds key 0.
// CPU reference: qrig::cpu::attention_gated_kv (its last step). One warp per (token t, query head h) item, lane l
// owning columns 8l..8l+7, four splits' loads in flight; the splits are folded in order (deterministic).
// Batched (b1): the partials of a batched attn_decode over T sequences of one token each, as attn_merge's b1: each
// sequence's own split count from seq_pos[t] + 1 keys over split_target (n_split unused), its warps leaving when it
// is 1. b0: seq_pos null.
// Variant: attn_merge_rot_d<D>_b<B>_t<THREADS>. Grid: ceil(T * Hq / warps per CTA). Arguments: ws_o
// [n_split][T][Hq][D], ws_ml [n_split][T][Hq] (float2 m, l), n_split, T, Hq, G (query heads per KV head), layer,
// gate, gate_row, gate_head, out [T][Hq*D], seq_pos, split_target.
#include "qrig_kv.cuh"

static_assert(QRIG_D == 256, "attn_merge_rot: head dim 256 (8 columns per lane)");
static_assert(QRIG_THREADS % 32 == 0, "attn_merge_rot: whole warps");
static_assert(QRIG_BATCHED == 0 || QRIG_BATCHED == 1, "attn_merge_rot: b is 0 or 1");

namespace {
constexpr int D = QRIG_D, U = 4;
}  // namespace

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
attn_merge_rot(const float* __restrict__ ws_o, const float2* __restrict__ ws_ml, int n_split, int T, int Hq, int G,
               int layer, const float* __restrict__ gate, long long gate_row, long long gate_head,
               float* __restrict__ out, const int* __restrict__ seq_pos, int split_target) {
  qrig_grid_dependency_wait();
  const int lane = threadIdx.x & 31;
  const long long item = (long long)blockIdx.x * (QRIG_THREADS / 32) + (threadIdx.x >> 5);
  if (item >= (long long)T * Hq) return;  // whole warps leave together
  const int t = (int)(item / Hq), h = (int)(item % Hq);
#if QRIG_BATCHED
  {
    int keys_per_split;
    n_split = qrig_decode_splits(seq_pos[t] + 1, split_target, keys_per_split);
    if (n_split == 1) return;  // the decode kernel wrote this sequence's output (the warp leaves whole)
  }
#endif
  const size_t stride = (size_t)T * Hq;  // items per split

  float m = QRIG_NEG_INF, l = 0.0f, x[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = 0.0f;
  for (int s0 = 0; s0 < n_split; s0 += U) {
    float2 ml[U];
    float4 a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u;
      if (s < n_split) {
        const size_t it = (size_t)s * stride + (size_t)item;
        ml[u] = ws_ml[it];
        const float4* src = reinterpret_cast<const float4*>(ws_o + it * D) + 2 * lane;
        a[u] = src[0];
        b[u] = src[1];
      } else {
        ml[u].x = QRIG_NEG_INF;
        ml[u].y = 0.0f;
        a[u] = qrig_zero4();
        b[u] = qrig_zero4();
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float m_new = fmaxf(m, ml[u].x);
      const float m_use = m_new == QRIG_NEG_INF ? 0.0f : m_new;
      const float fa = qrig_exp2(m - m_use), fb = qrig_exp2(ml[u].x - m_use);
      l = l * fa + ml[u].y * fb;
      x[0] = x[0] * fa + a[u].x * fb;
      x[1] = x[1] * fa + a[u].y * fb;
      x[2] = x[2] * fa + a[u].z * fb;
      x[3] = x[3] * fa + a[u].w * fb;
      x[4] = x[4] * fa + b[u].x * fb;
      x[5] = x[5] * fa + b[u].y * fb;
      x[6] = x[6] * fa + b[u].z * fb;
      x[7] = x[7] * fa + b[u].w * fb;
      m = m_new;
    }
  }
  qrig_kv_unrotate_warp(x, qrig_kv_sign_byte(layer, h / G, lane), lane);
  const float* gp = gate + (size_t)t * gate_row + (size_t)h * gate_head + 8 * lane;
  float* dst = out + (size_t)item * D + 8 * lane;
#pragma unroll
  for (int e = 0; e < 8; ++e) dst[e] = x[e] / l * qrig_sigmoid(gp[e]);
}
