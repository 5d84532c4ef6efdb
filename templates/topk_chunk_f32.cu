// GPU top-k candidate selection, first pass (second: topk_merge_f32.cu; host: runtime/cuda/sampling.h).
// Per (row, chunk of CHUNK = E*T ids of the real vocabulary): the sampler's steps 2-3 applied to the
// chunk's logits in shared memory (the logits in global memory are never written), then the chunk's
// best min(K, candidates) sort keys (qrig_topk.cuh) sorted best first, padded with 0 to QRIG_TOPK_MAX, and
// the chunk's statistics (max, candidate and +inf counts, sum exp(x - max)). CPU reference:
// runtime::Sampler::top_candidates (through the merge).
//
// Steps, per block:
//   1. load the chunk (ids >= vocab_real are not candidates), NaN -> -inf;
//   2. apply the adjustments whose ids fall in the chunk (Sampler::adjusted_logits' float operations,
//      qrig_adjust_logit), one thread per listed id (ids are unique per row);
//   3. per thread E values in registers: stats, then a block max, candidate counts and the exp sum (each
//      thread sums its E exps in float in index order, the block adds the threads' sums in double in a
//      fixed tree);
//   4. radix select of the K-th best element over a 56-bit rank of each candidate,
//        (255 - bucket) << 48 | ordered(x) << 16 | (0xFFFF - index in chunk),
//      where bucket = min(255, floor((max - x) * 4)) is the distance below the chunk max in quarter logit
//      units. The bucket is monotone in x, so the rank orders like the sort key, but its first 8-bit
//      digit spreads the bulk of the logits over many histogram bins (a first digit taken from the float's
//      exponent would put most of them in two or three bins, and shared-memory atomics on one bin
//      serialise). One pass per 8-bit digit, most significant first: a 256-bin shared histogram of the
//      elements that still match the chosen prefix, one warp finds the bin holding the K-th; the passes
//      stop as soon as the chosen bin holds exactly the elements still needed (usually after 2-4 passes:
//      only the few elements in the K-th's bucket take part after the first). Ranks are unique, so the
//      elements with rank >= the threshold are exactly the K best;
//   5. they are compacted to shared memory (in any order) and one warp bitonic-sorts the 64 slots.
// Cost per block: one coalesced read of its CHUNK floats, ~8 + up to 7*3 barriers, E atomics per thread on
// the first radix pass. The variant in use, e8 t256 (runtime/cuda/sampling.cpp), has chunks of 2048 ids:
// 122 blocks per row of a 248320-row vocabulary.
//
// Variant: topk_chunk_f32_e<E>_t<T>.  Grid: (chunks = ceil(vocab_real / CHUNK), rows).
// Arguments: logits [rows][row_stride], row_stride, vocab_real, n_chunks, K (1..64), penalties [rows][3]
// (repetition, frequency, presence), chunk_adj [rows][n_chunks + 1] (the range of adj entries whose ids
// fall in each chunk: row r chunk c uses adj[chunk_adj[r][c] .. chunk_adj[r][c + 1])), adj, chunk_top
// [rows][n_chunks][64] sort keys (out), chunk_stats [rows][n_chunks] (out).
#include "qrig_common.cuh"
#include "qrig_topk.cuh"

#define QRIG_CHUNK (QRIG_ELEMS * QRIG_THREADS)

static_assert(QRIG_THREADS % 32 == 0, "topk_chunk_f32: the block size must be a multiple of 32");
static_assert(QRIG_CHUNK <= 8192, "topk_chunk_f32: a chunk must fit in shared memory (and its indices in 16 bits)");
static_assert(QRIG_CHUNK >= QRIG_TOPK_MAX, "topk_chunk_f32: a chunk must hold at least 64 ids");

extern "C" __global__ void __launch_bounds__(QRIG_THREADS)
topk_chunk_f32(const float* __restrict__ logits, long long row_stride, int vocab_real, int n_chunks, int K,
               const float* __restrict__ penalties, const int* __restrict__ chunk_adj,
               const QrigLogitAdjust* __restrict__ adj, unsigned long long* __restrict__ chunk_top,
               QrigTopkChunkStats* __restrict__ chunk_stats) {
  qrig_grid_dependency_wait();
  __shared__ float s_x[QRIG_CHUNK];
  __shared__ unsigned s_hist[256];
  __shared__ unsigned long long s_sel[QRIG_TOPK_MAX];
  __shared__ float s_redf[QRIG_THREADS / 32];
  __shared__ int s_redi[QRIG_THREADS / 32];
  __shared__ double s_redd[QRIG_THREADS / 32];
  __shared__ unsigned s_digit, s_rem, s_cnt, s_count;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int chunk = blockIdx.x, row = blockIdx.y;
  const int c0 = chunk * QRIG_CHUNK;
  const float* x = logits + (size_t)row * (size_t)row_stride;

  // 1. Load; padding rows and ids past the end are -inf (never candidates).
#pragma unroll
  for (int j = 0; j < QRIG_ELEMS; ++j) {
    const int i = j * QRIG_THREADS + tid;
    const int id = c0 + i;
    float v = id < vocab_real ? x[id] : QRIG_NEG_INF;
    s_x[i] = v != v ? QRIG_NEG_INF : v;
  }
  if (tid == 0) s_count = 0;
  __syncthreads();

  // 2. Bias and penalties of the ids listed in this chunk.
  const int* ca = chunk_adj + (size_t)row * (size_t)(n_chunks + 1) + chunk;
  const int a0 = ca[0], a1 = ca[1];
  if (a1 > a0) {  // uniform over the block
    const float rep = penalties[row * 3 + 0], freq = penalties[row * 3 + 1], pres = penalties[row * 3 + 2];
    for (int a = a0 + tid; a < a1; a += QRIG_THREADS) {
      const QrigLogitAdjust e = adj[a];
      const int i = e.id - c0;
      s_x[i] = qrig_adjust_logit(s_x[i], e.bias, e.count, rep, freq, pres);
    }
    __syncthreads();
  }

  // 3. Statistics; each thread keeps only the order keys of its values (0 = not a candidate).
  unsigned key[QRIG_ELEMS];
  float m = QRIG_NEG_INF;
  int nc = 0, npi = 0;
#pragma unroll
  for (int j = 0; j < QRIG_ELEMS; ++j) {
    const float v = s_x[j * QRIG_THREADS + tid];
    key[j] = v > QRIG_NEG_INF ? qrig_ordered(v) : 0u;
    m = fmaxf(m, v);
    nc += v > QRIG_NEG_INF;
    npi += v == QRIG_POS_INF;
  }
  const float cmax = qrig_block_max<QRIG_THREADS>(m, s_redf);
  const int n_cand = qrig_block_add<QRIG_THREADS, int>(nc, s_redi);
  const int n_pos_inf = qrig_block_add<QRIG_THREADS, int>(npi, s_redi);
  const bool finite_max = cmax > QRIG_NEG_INF && cmax < QRIG_POS_INF;
  float part = 0.0f;
  if (finite_max) {
#pragma unroll
    for (int j = 0; j < QRIG_ELEMS; ++j) part += expf(s_x[j * QRIG_THREADS + tid] - cmax);  // exp(-inf) = 0
  }
  const double sum = qrig_block_add<QRIG_THREADS, double>((double)part, s_redd);

  // 4. The radix select of the threshold rank (ranks are recomputed from the keys in every pass: keeping
  // them would double the registers).
  auto rank = [&](int j) -> unsigned long long {
    if (key[j] == 0u) return 0ull;
    const float v = qrig_unordered(key[j]);
    const unsigned bucket = v == cmax ? 0u : (unsigned)fminf((cmax - v) * 4.0f, 255.0f);
    const unsigned idx = (unsigned)(j * QRIG_THREADS + tid);
    return ((unsigned long long)(255u - bucket) << 48) | ((unsigned long long)key[j] << 16) |
           (unsigned long long)(0xFFFFu - idx);
  };
  const unsigned need = (unsigned)min(K, n_cand);
  unsigned long long threshold = 1ull;  // every candidate (n_cand <= K)
  if ((unsigned)n_cand > need) {
    unsigned long long prefix = 0ull, mask = 0ull;
    unsigned rem = need;
    for (int shift = 48; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += QRIG_THREADS) s_hist[b] = 0u;
      __syncthreads();
#pragma unroll
      for (int j = 0; j < QRIG_ELEMS; ++j) {
        const unsigned long long rj = rank(j);
        if (rj != 0ull && (rj & mask) == prefix) atomicAdd(&s_hist[(unsigned)(rj >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid < 32) {  // lane l scans bins 255 - 8l down to 248 - 8l; the lanes in order cover 255 .. 0
        unsigned cnt[8], s = 0u;
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          cnt[q] = s_hist[255 - 8 * lane - q];
          s += cnt[q];
        }
        unsigned incl = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const unsigned t = __shfl_up_sync(QRIG_FULL_MASK, incl, o);
          if (lane >= o) incl += t;
        }
        const unsigned excl = incl - s;
        if (excl < rem && rem <= incl) {  // exactly one lane: the matching elements number at least rem
          unsigned acc = excl;
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            if (acc < rem && rem <= acc + cnt[q]) {
              s_digit = (unsigned)(255 - 8 * lane - q);
              s_rem = rem - acc;
              s_cnt = cnt[q];
            }
            acc += cnt[q];
          }
        }
      }
      __syncthreads();
      prefix |= (unsigned long long)s_digit << shift;
      mask |= 255ull << shift;
      rem = s_rem;
      if (s_cnt == rem) break;  // every element matching the prefix is needed: uniform over the block
    }
    threshold = prefix;  // ranks >= prefix (lower digits anything): exactly `need` elements
  }

  // 5. Compact the selected as sort keys, then sort the 64 slots.
#pragma unroll
  for (int j = 0; j < QRIG_ELEMS; ++j) {
    const unsigned long long rj = rank(j);
    if (rj >= threshold && rj != 0ull) {
      const unsigned id = (unsigned)(c0 + j * QRIG_THREADS + tid);
      const unsigned pos = atomicAdd(&s_count, 1u);
      if (pos < QRIG_TOPK_MAX) s_sel[pos] = ((unsigned long long)key[j] << 32) | (unsigned long long)(0xFFFFFFFFu - id);
    }
  }
  __syncthreads();
  const unsigned filled = min(s_count, (unsigned)QRIG_TOPK_MAX);
  for (int i = (int)filled + tid; i < QRIG_TOPK_MAX; i += QRIG_THREADS) s_sel[i] = 0ull;
  __syncthreads();
  if (tid < 32) {
    unsigned long long k0 = s_sel[lane], k1 = s_sel[lane + 32];
    qrig_topk_bitonic_sort(k0, k1, lane);
    unsigned long long* out = chunk_top + ((size_t)row * (size_t)n_chunks + (size_t)chunk) * QRIG_TOPK_MAX;
    out[lane] = k0;
    out[lane + 32] = k1;
  }
  if (tid == 0) {
    QrigTopkChunkStats st;
    st.max = cmax;
    st.n_cand = n_cand;
    st.n_pos_inf = n_pos_inf;
    st.pad = 0;
    st.sum = finite_max ? sum : 0.0;
    chunk_stats[(size_t)row * (size_t)n_chunks + (size_t)chunk] = st;
  }
}
