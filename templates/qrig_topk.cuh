// Device helpers of the GPU top-k candidate selection (topk_chunk_f32.cu, topk_merge_f32.cu; host side
// runtime/cuda/sampling.{h,cpp}, which mirrors the structs below with static_asserts on their layout).
//
// Sort keys. A candidate (adjusted logit x > -inf, not NaN) with id i is the 64-bit key
//   (ordered(x) << 32) | (0xFFFFFFFF - i)
// where ordered() maps floats to unsigned integers in the same order (-0 is first made +0, which compares
// equal). Larger key = better candidate: larger logit first, then lower id, the host's total order
// (runtime/sampler.cpp, Better). Keys of different ids differ, so the K best keys are one well-defined set
// whatever order they are found in, which makes every result deterministic. 0 is the empty slot: a
// candidate's ordered(x) is at least ordered(-FLT_MAX) = 0x00800000.
#pragma once

#include "qrig_common.cuh"

#define QRIG_TOPK_MAX 64  // candidates per list (runtime/cuda/sampling.h: kTopMax)
#define QRIG_NEG_INF (-__int_as_float(0x7f800000))
#define QRIG_POS_INF (__int_as_float(0x7f800000))

// One id whose logit the sampler's steps 2-3 change (runtime::LogitAdjust): summed bias (-inf bans) and
// its count in the penalty window (0 = not penalised).
struct QrigLogitAdjust {
  int id;
  float bias;
  int count;
};

// Per (row, chunk) statistics of the chunk kernel: the largest candidate logit (-inf: none), the
// candidate and +inf counts, and sum exp(x - max) over the chunk's candidates (0 unless max is finite).
struct QrigTopkChunkStats {
  float max;
  int n_cand;
  int n_pos_inf;
  int pad;
  double sum;
};

// The merge kernel's result per row: the best keys (sorted, best first; 0 = empty) and the row's
// statistics; lse = log(sum exp(x)) over the candidates when max is finite, else 0.
struct QrigTopkRowOut {
  unsigned long long top[QRIG_TOPK_MAX];
  double lse;
  float max;
  int n_cand;
  int n_pos_inf;
  int pad;
};

// Sampler::adjusted_logits for one listed id, operation by operation, each rounded to float (no FMA
// contraction: the _rn intrinsics are never fused). x is not NaN (NaN was made -inf before).
__device__ __forceinline__ float qrig_adjust_logit(float x, float bias, int count, float rep, float freq,
                                                   float pres) {
  x = bias == QRIG_NEG_INF ? QRIG_NEG_INF : __fadd_rn(x, bias);
  if (count > 0 && x != QRIG_NEG_INF) {
    if (rep != 1.0f) x = x > 0.0f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
    x = __fsub_rn(x, __fadd_rn(__fmul_rn(__int2float_rn(count), freq), pres));
    if (x != x) x = QRIG_NEG_INF;
  }
  return x;
}

// Monotone float -> uint32 (callers pass candidates only; -0 -> +0 so equal floats get equal keys).
__device__ __forceinline__ unsigned qrig_ordered(float x) {
  const unsigned u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The inverse of qrig_ordered (zeros come back as +0).
__device__ __forceinline__ float qrig_unordered(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

__device__ __forceinline__ unsigned long long qrig_u64_max(unsigned long long a, unsigned long long b) {
  return a > b ? a : b;
}
__device__ __forceinline__ unsigned long long qrig_u64_min(unsigned long long a, unsigned long long b) {
  return a < b ? a : b;
}

// A warp holds a list of 64 keys, two per lane: v0 = element lane, v1 = element lane + 32.
// Bitonic merge of a bitonic sequence of 64 into descending order.
__device__ __forceinline__ void qrig_topk_bitonic_merge(unsigned long long& v0, unsigned long long& v1, int lane) {
  const unsigned long long hi = qrig_u64_max(v0, v1), lo = qrig_u64_min(v0, v1);
  v0 = hi;
  v1 = lo;
#pragma unroll
  for (int stride = 16; stride > 0; stride >>= 1) {
    const unsigned long long p0 = __shfl_xor_sync(QRIG_FULL_MASK, v0, stride);
    const unsigned long long p1 = __shfl_xor_sync(QRIG_FULL_MASK, v1, stride);
    const bool lower = (lane & stride) == 0;  // the lower index of the pair keeps the larger key
    v0 = lower ? qrig_u64_max(v0, p0) : qrig_u64_min(v0, p0);
    v1 = lower ? qrig_u64_max(v1, p1) : qrig_u64_min(v1, p1);
  }
}

// Full bitonic sort of the warp's 64 keys, descending.
__device__ __forceinline__ void qrig_topk_bitonic_sort(unsigned long long& v0, unsigned long long& v1, int lane) {
#pragma unroll
  for (int size = 2; size < 64; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const unsigned long long p0 = __shfl_xor_sync(QRIG_FULL_MASK, v0, stride);
      const unsigned long long p1 = __shfl_xor_sync(QRIG_FULL_MASK, v1, stride);
      const bool lower = (lane & stride) == 0;
      // Blocks of `size` alternate direction: descending where (index & size) == 0. Element lane + 32 has
      // (index & size) == (lane & size) for size < 32 and 32 for size == 32.
      const bool desc0 = (lane & size) == 0;
      const bool desc1 = size == 32 ? false : desc0;
      v0 = (lower == desc0) ? qrig_u64_max(v0, p0) : qrig_u64_min(v0, p0);
      v1 = (lower == desc1) ? qrig_u64_max(v1, p1) : qrig_u64_min(v1, p1);
    }
  }
  qrig_topk_bitonic_merge(v0, v1, lane);  // size 64: the whole list is one descending block
}

// The best 64 of two descending lists a and b (in a's registers), descending: max(a[i], b[63 - i]) is
// bitonic, then one merge.
__device__ __forceinline__ void qrig_topk_merge_lists(unsigned long long& a0, unsigned long long& a1,
                                                      unsigned long long b0, unsigned long long b1, int lane) {
  // b[63 - lane] is b's element (31 - lane) + 32; b[63 - (lane + 32)] is b's element 31 - lane.
  const unsigned long long rb1 = __shfl_sync(QRIG_FULL_MASK, b1, 31 - lane);
  const unsigned long long rb0 = __shfl_sync(QRIG_FULL_MASK, b0, 31 - lane);
  a0 = qrig_u64_max(a0, rb1);
  a1 = qrig_u64_max(a1, rb0);
  qrig_topk_bitonic_merge(a0, a1, lane);
}

// Deterministic block reductions (T threads, a multiple of 32; every thread gets the result): warp
// butterflies, then the warp results combined in warp order. scratch: T/32 entries of shared memory.
template <int T>
__device__ __forceinline__ float qrig_block_max(float v, float* scratch) {
  v = qrig_warp_max(v);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = scratch[0];
#pragma unroll 8  // as qrig_block_add
  for (int w = 1; w < T / 32; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();
  return m;
}

