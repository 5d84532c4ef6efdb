// Causal depthwise conv over time + SiLU with a carried window (the GDN input conv). x [T][C], w [C][K]
// (tap K-1 multiplies the current input), state [K-1][C] = the previous K-1 inputs, oldest first: read, then
// replaced by the last K-1 inputs. out [T][C] must not alias x. CPU reference: qrig::cpu::conv1d_causal_silu
// (same fp32 accumulation order over taps).
// One thread per channel walks the T tokens with the window in registers (coalesced over channels).
// A speculative verify step (docs/speculative.md) also keeps the window after each of its first `keep` tokens
// (keep < T) at kept + t * kept_stride (layout of state), for a rollback; keep = 0 in every other step.
// Batched (b1): one launch over a decode step's B sequences, one token each (grid.y = sequence z): x and out are
// row z of [B][C], the state that of the sequence's slot, rec_of[seq_slot[z]] + state_offset (its recurrent-state
// image and this op's place in it); the per-thread work is the b0 kernel's for T = 1, so every sequence gets the
// bits its own launch would. b0: rec_of and seq_slot null, state the one sequence's.
// Variant: conv1d_silu_f32_k<K>_b<B>_t<T>.  Grid: ceil(C / T) (b1: x B sequences).  Arguments: x, T (b1: 1), C, w,
// state (b1: null), out, kept (null when keep = 0), keep, kept_stride (floats), rec_of, seq_slot, state_offset.
#include "qrig_common.cuh"

static_assert(QRIG_K >= 2 && QRIG_K <= 8, "conv1d_silu_f32: K in 2..8");
static_assert(QRIG_BATCHED == 0 || QRIG_BATCHED == 1, "conv1d_silu_f32: b is 0 or 1");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
conv1d_silu_f32(const float* __restrict__ x, int T, int C, const float* __restrict__ w, float* __restrict__ state,
                float* __restrict__ out, float* __restrict__ kept, int keep, long long kept_stride,
                float* const* __restrict__ rec_of, const int* __restrict__ seq_slot, long long state_offset) {
  qrig_grid_dependency_wait();
  constexpr int K = QRIG_K, H = QRIG_K - 1;
  const int c = blockIdx.x * QRIG_THREADS + threadIdx.x;
  if (c >= C) return;
#if QRIG_BATCHED
  {
    const int z = blockIdx.y;
    x += (size_t)z * C;
    out += (size_t)z * C;
    state = rec_of[seq_slot[z]] + state_offset;
  }
#endif
  float wk[K], win[K];
#pragma unroll
  for (int k = 0; k < K; ++k) wk[k] = w[(size_t)c * K + k];
#pragma unroll
  for (int k = 0; k < H; ++k) win[k] = state[(size_t)k * C + c];
  for (int t = 0; t < T; ++t) {
    win[H] = x[(size_t)t * C + c];
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) acc += wk[k] * win[k];
    out[(size_t)t * C + c] = qrig_silu(acc);
#pragma unroll
    for (int k = 0; k < H; ++k) win[k] = win[k + 1];
    if (t < keep) {
#pragma unroll
      for (int k = 0; k < H; ++k) kept[(size_t)t * (size_t)kept_stride + (size_t)k * C + c] = win[k];
    }
  }
#pragma unroll
  for (int k = 0; k < H; ++k) state[(size_t)k * C + c] = win[k];
}
