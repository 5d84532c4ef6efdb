// GPU top-k candidate selection, second pass (first: topk_chunk_f32.cu; host: runtime/cuda/sampling.h).
// Per row: the best 64 sort keys (qrig_topk.cuh) of the chunk lists, sorted best first, and the row's
// statistics: max, candidate and +inf counts, lse = max + log(sum over chunks of sum_c * exp(max_c - max))
// (each chunk's term in double, the terms added in a fixed order; 0 unless max is finite). The first K
// keys are the row's K best candidates (each chunk contributed its K best). CPU reference:
// runtime::Sampler::top_candidates.
//
// Each warp keeps a running list of 64 keys in registers (two per lane) and merges the chunk lists
// w, w + W, w + 2W, ... into it (the best 64 of two sorted lists: max(a[i], b[63 - i]) is bitonic, then a
// bitonic merge, 6 shuffle stages); then the W warp lists are merged pairwise in shared memory, log2(W)
// levels. Keys are unique, so the result does not depend on the merge order.
//
// Variant: topk_merge_f32_t<T>.  Grid: (rows).
// Arguments: n_chunks, chunk_top [rows][n_chunks][64], chunk_stats [rows][n_chunks], out [rows] (QrigTopkRowOut).
#include "qrig_common.cuh"
#include "qrig_topk.cuh"

static_assert(QRIG_THREADS % 32 == 0, "topk_merge_f32: the block size must be a multiple of 32");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
topk_merge_f32(int n_chunks, const unsigned long long* __restrict__ chunk_top,
               const QrigTopkChunkStats* __restrict__ chunk_stats, QrigTopkRowOut* __restrict__ out) {
  qrig_grid_dependency_wait();
  constexpr int W = QRIG_THREADS / 32;
  __shared__ unsigned long long s_lists[W][QRIG_TOPK_MAX];
  __shared__ float s_redf[W];
  __shared__ int s_redi[W];
  __shared__ double s_redd[W];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = blockIdx.x;
  const unsigned long long* lists = chunk_top + (size_t)row * (size_t)n_chunks * QRIG_TOPK_MAX;
  const QrigTopkChunkStats* stats = chunk_stats + (size_t)row * (size_t)n_chunks;

  // Per warp: its share of the chunk lists.
  // The next list is loaded before the current one is merged, so the loads overlap the merges.
  unsigned long long a0 = 0ull, a1 = 0ull, b0 = 0ull, b1 = 0ull;
  if (warp < n_chunks) {
    b0 = lists[(size_t)warp * QRIG_TOPK_MAX + lane];
    b1 = lists[(size_t)warp * QRIG_TOPK_MAX + lane + 32];
  }
  for (int c = warp; c < n_chunks; c += W) {
    unsigned long long n0 = 0ull, n1 = 0ull;
    if (c + W < n_chunks) {
      n0 = lists[(size_t)(c + W) * QRIG_TOPK_MAX + lane];
      n1 = lists[(size_t)(c + W) * QRIG_TOPK_MAX + lane + 32];
    }
    qrig_topk_merge_lists(a0, a1, b0, b1, lane);
    b0 = n0;
    b1 = n1;
  }
  s_lists[warp][lane] = a0;
  s_lists[warp][lane + 32] = a1;

  // Statistics (the barriers inside the block reductions also publish s_lists).
  float m = QRIG_NEG_INF;
  int nc = 0, npi = 0;
  for (int c = tid; c < n_chunks; c += QRIG_THREADS) {
    m = fmaxf(m, stats[c].max);
    nc += stats[c].n_cand;
    npi += stats[c].n_pos_inf;
  }
  const float mx = qrig_block_max<QRIG_THREADS>(m, s_redf);
  const int n_cand = qrig_block_add<QRIG_THREADS, int>(nc, s_redi);
  const int n_pos_inf = qrig_block_add<QRIG_THREADS, int>(npi, s_redi);
  const bool finite_max = mx > QRIG_NEG_INF && mx < QRIG_POS_INF;
  double part = 0.0;
  if (finite_max)
    for (int c = tid; c < n_chunks; c += QRIG_THREADS) {
      const QrigTopkChunkStats st = stats[c];
      if (st.max > QRIG_NEG_INF) part += st.sum * exp((double)st.max - (double)mx);
    }
  const double z = qrig_block_add<QRIG_THREADS, double>(part, s_redd);

  // Pairwise merge of the warp lists: at each level warp w (a multiple of 2s) takes in warp w + s's list.
  for (int s = 1; s < W; s <<= 1) {
    if ((warp % (2 * s)) == 0 && warp + s < W) {
      qrig_topk_merge_lists(a0, a1, s_lists[warp + s][lane], s_lists[warp + s][lane + 32], lane);
      s_lists[warp][lane] = a0;
      s_lists[warp][lane + 32] = a1;
    }
    __syncthreads();
  }

  QrigTopkRowOut* o = out + row;
  if (warp == 0) {
    o->top[lane] = a0;
    o->top[lane + 32] = a1;
  }
  if (tid == 0) {
    o->lse = finite_max ? (double)mx + log(z) : 0.0;
    o->max = mx;
    o->n_cand = n_cand;
    o->n_pos_inf = n_pos_inf;
    o->pad = 0;
  }
}
