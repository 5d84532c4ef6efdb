// Causal gated GQA attention for a few query tokens (decode: T <= N) over quantized keys (QRIG_KF: 8 q8, 4 t4,
// 3 t3) and values of any format (QRIG_VF: 16 f16, 8 q8, 4 t4, 3 t3), with the query quantized to int8 and Q.K
// computed by dp4a over the key codes: the plan's int8 query (the attention op's query_int8_tokens; attn_decode
// keeps the fp32 query). CPU reference: qrig::cpu::attention_gated_kv with int8_query, which computes the same
// integers and the same float steps. Grid, arguments, split partials and merges are attn_decode's.
//
// Why: over q8/t4/t3 caches attn_decode spent more instructions per byte than its f16 path (int8 or codes to float,
// then fp32 FMAs), 8-29% of the copy rate at 256K keys on an H200. Here per (key, KV head) Q.K is 8 warp dp4a
// instructions over int8 words (q8 keys as stored; t4/t3 codes to int8 levels by byte permutes), values are the
// only fp32 FMAs, and an SM holds up to 16 warps with a group of keys in flight each.
//
// One CTA of 8 warps per (KV head, split of keys_per_split keys); its R = G*N rows are the (token, query head)
// pairs of the KV head's G query heads (row r = token r/G, head r%G; rows of tokens >= T idle).
//   staging: warp r scales row r by qscale (scale * log2 e), rotates it for t4/t3 keys (the warp's Walsh-Hadamard
//     transform, the CPU's stage order), and quantizes each block of 32 to int8: d = amax / 127, q = rint(x / d)
//     (IEEE division; a block holding a NaN gets d = NaN); int8 rows and scales in shared memory.
//   groups: each warp streams its own groups of NK keys (8; 16 for 27B's 6 rows): the next group's values are
//     loaded one by one as this group's are used, its keys after this group's P.V.
//   Q.K: lane = key j (0..7) x quarter qt (0..3) holding blocks qt and qt+4 of keys j (and j+8); per row and block
//     an int32 dot by 8 dp4a with the int8 q block (shared memory, one 16-byte load per 4 words), then exactly
//       part = fma(w1, float(i1), w0 * float(i0)), w = d_q (t4/t3) or d_q * d_k (q8, the key block's fp16 scale),
//       score = (part_0 + part_1) + (part_2 + part_3)  [the quarters by two shuffles]  (t4/t3: * (s * key scale))
//     in log2 units (t4/t3 levels: kernels::kv_key_levels_i8 times kv_key_level_scale).
//   softmax: fp32, group max by shuffles, exp2, running max and sums rescaled only when the max grows.
//   P.V: lane owns columns 8*lane..8*lane+7; the key lanes put p (t4/t3 values: p * the vector's scale) in shared
//     memory, each lane reads a key's R probabilities with one 16-byte load, turns its 8 values into floats (f16
//     exact, q8 exact with the block scale on p, t4/t3 codebook levels from a shared table) and adds R x 8 fp32
//     FMAs. t4/t3 values: P V in their rotated domain, rotated back once per row (here for one split, else by
//     attn_merge_rot).
// The 8 warps' states are merged in two rounds through shared memory (warps 4..7 into 0..3, then the four as in
// attn_decode). n_split = 1: the CTA writes out = (O / l) * sigmoid(gate); otherwise its partial (O, m, l) goes to
// ws_o / ws_ml for attn_merge(_rot). Keys >= pos0 + T are never read. Batched (b1) as attn_decode.
// Variant: attn_decode_dp4a_d<D>_g<G>_n<N>_k<KF>_v<VF>_b<B>_t256. Static smem: 16*R*D + 32*R bytes (<= 33 KiB).
#include "qrig_kv.cuh"

static_assert(QRIG_D == 256, "attn_decode_dp4a: head dim 256 (8 columns per lane over 32 lanes)");
static_assert(QRIG_G >= 1 && QRIG_N >= 1 && QRIG_G * QRIG_N <= 8, "attn_decode_dp4a: at most 8 rows (G * N)");
static_assert(QRIG_THREADS == 256, "attn_decode_dp4a: the layout is for 8 warps");
static_assert(QRIG_KF == 8 || QRIG_KF == 4 || QRIG_KF == 3, "attn_decode_dp4a: keys q8, t4 or t3 (f16: attn_decode)");
static_assert(QRIG_VF == 16 || QRIG_VF == 8 || QRIG_VF == 4 || QRIG_VF == 3, "attn_decode_dp4a: v is 16, 8, 4 or 3");
static_assert(QRIG_BATCHED == 0 || (QRIG_BATCHED == 1 && QRIG_N == 1), "attn_decode_dp4a: b is 0, or 1 with n = 1");

namespace {
constexpr int D = QRIG_D, G = QRIG_G, N = QRIG_N, R = G * N, NT = QRIG_THREADS, W = NT / 32;
constexpr int KF = QRIG_KF, VF = QRIG_VF;
constexpr bool KROT = KF != 8, VROT = QRIG_KV_ROTATED(VF);
// Keys per key lane and group: two for 27B's 6 rows (one CTA per SM: registers to spare, and twice the bytes in
// flight per warp), one otherwise (two CTAs of 8 warps per SM fit 128 registers per thread with one).
constexpr int KPL = (R > 4 && R <= 6) ? 2 : 1;
constexpr int NK = 8 * KPL;                  // keys per warp and group
constexpr int R4 = (R + 3) / 4;              // float4s of one key's probabilities
constexpr int PS = 4 * R4;                   // their floats
// Shared memory (floats) during the loop: the int8 q rows [R][64 words] (word c at c ^ 8 from c = 32 on: the
// four quarters' 16-byte loads hit distinct banks), their block scales [R][8], each warp's probabilities
// [W][NK][PS], the value codebook [16], each warp's q8 value block scales [W][NK][8]. After it: [4][R][D].
constexpr int kQd = R * 64, kPs = kQd + R * 8, kCb = kPs + W * NK * PS, kDv = kCb + 16;
constexpr int kLoop = kDv + (VF == 8 ? W * NK * 8 : 0), kMerge = 4 * R * D;
constexpr int kSmem = kLoop > kMerge ? kLoop : kMerge;
// Registers: 16 warps per SM (two CTAs) up to 4 rows of q8/t4/t3 values; f16 values (twice the bytes per key,
// 8 warps keep as many in flight), 27B's 6 rows and the multi-token rows take one CTA.
constexpr int kMinBlocks = (R <= 4 && VF != 16) ? 2 : 1;
}  // namespace

// A key lane's part of its KPL keys (blocks qt and qt+4), as loaded; zeros past the split's end.
struct KeyRegs {
#if QRIG_KF == 8
  uint4 c[KPL][4];  // blocks 2qt (c[0], c[1]) and 2qt+1 (c[2], c[3]): 32 int8 each
  unsigned d[KPL];  // their fp16 scales (low half: block 2qt)
#elif QRIG_KF == 4
  uint4 c[KPL][2];  // blocks 2qt, 2qt+1: 32 nibbles each
  float s[KPL];     // the vector's scale
#else
  uint2 c[KPL][3];  // blocks 2qt, 2qt+1: 12 bytes (32 codes) each
  float s[KPL];
#endif
#if QRIG_VF == 8
  unsigned vd[KPL];  // the fp16 scales of the key's value blocks 2qt, 2qt+1 (to shared memory for P.V)
#elif QRIG_VF == 4 || QRIG_VF == 3
  float vs[KPL];  // the key's value vector scale (folded into its probability)
#endif
};

// A lane's 8 columns of the group's NK value rows, as loaded.
struct ValRegs {
#if QRIG_VF == 16
  uint4 v[NK];
#elif QRIG_VF == 8
  uint2 v[NK];  // (the block scales come through shared memory from the key lanes)
#elif QRIG_VF == 4
  unsigned v[NK];
#else
  unsigned v[NK];  // word min(lane % 4, 2) of the lane's quad's 12 bytes (the lane's 3 bytes with its neighbour's)
#endif
};

__device__ __forceinline__ void load_keys(const unsigned char* __restrict__ kc, const unsigned char* __restrict__ vc,
                                          unsigned k_row, unsigned v_row, int kvh, int width, int kb, int ke,
                                          int lane, KeyRegs& kr) {
  const int j = lane & 7, qt = lane >> 3;
#pragma unroll
  for (int s = 0; s < KPL; ++s) {
    const int kp = kb + 8 * s + j;
    const bool ok = kp < ke;
    const unsigned char* row = kc + (unsigned long long)(unsigned)(ok ? kp : 0) * k_row;
#if QRIG_KF == 8
    const uint4* c = reinterpret_cast<const uint4*>(row + (size_t)kvh * 256) + 4 * qt;
#pragma unroll
    for (int i = 0; i < 4; ++i) kr.c[s][i] = ok ? __ldg(c + i) : qrig_zero_u4();
    kr.d[s] = ok ? __ldg(reinterpret_cast<const unsigned*>(row + width) + kvh * 4 + qt) : 0u;
#elif QRIG_KF == 4
    const uint4* c = reinterpret_cast<const uint4*>(row + (size_t)kvh * 128) + 2 * qt;
    kr.c[s][0] = ok ? __ldg(c) : qrig_zero_u4();
    kr.c[s][1] = ok ? __ldg(c + 1) : qrig_zero_u4();
    kr.s[s] = ok ? __ldg(reinterpret_cast<const float*>(row + (width / 256) * 128) + kvh) : 0.0f;
#else
    const uint2* c = reinterpret_cast<const uint2*>(row + (size_t)kvh * 96) + 3 * qt;
    uint2 z;
    z.x = z.y = 0u;
#pragma unroll
    for (int i = 0; i < 3; ++i) kr.c[s][i] = ok ? __ldg(c + i) : z;
    kr.s[s] = ok ? __ldg(reinterpret_cast<const float*>(row + (width / 256) * 96) + kvh) : 0.0f;
#endif
#if QRIG_VF == 8 || QRIG_VF == 4 || QRIG_VF == 3
    const unsigned char* vrow = vc + (unsigned long long)(unsigned)(ok ? kp : 0) * v_row;
#endif
#if QRIG_VF == 8
    kr.vd[s] = ok ? __ldg(reinterpret_cast<const unsigned*>(vrow + width) + kvh * 4 + qt) : 0u;
#elif QRIG_VF == 4 || QRIG_VF == 3
    kr.vs[s] = ok ? __ldg(reinterpret_cast<const float*>(vrow + (width / 256) * qrig_kv_code_bytes(VF)) + kvh) : 0.0f;
#endif
  }
}

// Value row kk of the group at key kp (zeros when !ok).
__device__ __forceinline__ void load_value(const unsigned char* __restrict__ vc, unsigned v_row, int kvh, int width,
                                           int kp, bool ok, int lane, ValRegs& vr, int kk) {
  const unsigned char* row = vc + (unsigned long long)(unsigned)(ok ? kp : 0) * v_row;
#if QRIG_VF == 16
  vr.v[kk] = ok ? __ldg(reinterpret_cast<const uint4*>(row + (size_t)kvh * 512) + lane) : qrig_zero_u4();
#elif QRIG_VF == 8
  uint2 z;
  z.x = z.y = 0u;
  vr.v[kk] = ok ? __ldg(reinterpret_cast<const uint2*>(row + (size_t)kvh * 256) + lane) : z;
#elif QRIG_VF == 4
  vr.v[kk] = ok ? __ldg(reinterpret_cast<const unsigned*>(row + (size_t)kvh * 128) + lane) : 0u;
#else
  const unsigned* w = reinterpret_cast<const unsigned*>(row + (size_t)kvh * 96) + 3 * (lane >> 2) + min(lane & 3, 2);
  vr.v[kk] = ok ? __ldg(w) : 0u;
#endif
}

// The 8 values of row kk as floats: f16 exactly, q8 the int8 (the scale goes on p), t4/t3 codebook levels (the
// vector's scale is in p). cb: the shared codebook.
__device__ __forceinline__ void value_floats(const ValRegs& vr, int kk, const float* cb, int lane, float* f) {
#if QRIG_VF == 16
  qrig_half8_to_float(vr.v[kk], f);
#elif QRIG_VF == 8
  qrig_s8x4_to_float(vr.v[kk].x, f);
  qrig_s8x4_to_float(vr.v[kk].y, f + 4);
#elif QRIG_VF == 4
  // Byte offsets into the table: byte i of a = 4 * code 2i, of b = 4 * code 2i+1.
  const unsigned a = (vr.v[kk] << 2) & 0x3C3C3C3Cu, b = (vr.v[kk] >> 2) & 0x3C3C3C3Cu;
  const char* t = reinterpret_cast<const char*>(cb);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = *reinterpret_cast<const float*>(t + qrig_prmt(a, 0u, 0x4440u | i));
    f[2 * i + 1] = *reinterpret_cast<const float*>(t + qrig_prmt(b, 0u, 0x4440u | i));
  }
#else
  // Lane 4i+a's codes are bits 24a..24a+23 of its quad's words w0 w1 w2 (lane 4i+a holds w_min(a,2)): lanes 1 and 2
  // take the previous lane's word as the low half. Every lane shuffles (the shuffle is warp-wide).
  const unsigned own = vr.v[kk], prev = __shfl_up_sync(QRIG_FULL_MASK, own, 1);
  const int a = lane & 3;
  const unsigned x = __funnelshift_r((a == 1 || a == 2) ? prev : own, own, (24 * a) & 31) << 2;  // 4 * code e at 3e+2
  const char* t = reinterpret_cast<const char*>(cb);
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = *reinterpret_cast<const float*>(t + ((x >> (3 * e)) & 0x1Cu));
#endif
}

// The int8 words (byte k = value 4i + k of the block) of block hb (0: 2qt, 1: 2qt + 1) of key slot s.
__device__ __forceinline__ void key_words(const KeyRegs& kr, int s, int hb, unsigned (&k)[8]) {
#if QRIG_KF == 8
  const uint4 a = kr.c[s][2 * hb], b = kr.c[s][2 * hb + 1];
  k[0] = a.x; k[1] = a.y; k[2] = a.z; k[3] = a.w;
  k[4] = b.x; k[5] = b.y; k[6] = b.z; k[7] = b.w;
#elif QRIG_KF == 4
  const uint4 a = kr.c[s][hb];
  const unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint2 p = qrig_t4_codes_to_s8(w[i]);
    k[2 * i] = p.x;
    k[2 * i + 1] = p.y;
  }
#else
  const unsigned c6[6] = {kr.c[s][0].x, kr.c[s][0].y, kr.c[s][1].x, kr.c[s][1].y, kr.c[s][2].x, kr.c[s][2].y};
  const unsigned w0 = c6[3 * hb], w1 = c6[3 * hb + 1], w2 = c6[3 * hb + 2];
  const unsigned g[4] = {w0, __funnelshift_r(w0, w1, 24), __funnelshift_r(w1, w2, 16), w2 >> 8};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint2 p = qrig_t3_codes_to_s8(g[i]);
    k[2 * i] = p.x;
    k[2 * i + 1] = p.y;
  }
#endif
}

__device__ __forceinline__ int dot32(const unsigned (&k)[8], const uint4 a, const uint4 b) {
  int s = qrig_dot4((int)k[0], (int)a.x, 0);
  s = qrig_dot4((int)k[1], (int)a.y, s);
  s = qrig_dot4((int)k[2], (int)a.z, s);
  s = qrig_dot4((int)k[3], (int)a.w, s);
  s = qrig_dot4((int)k[4], (int)b.x, s);
  s = qrig_dot4((int)k[5], (int)b.y, s);
  s = qrig_dot4((int)k[6], (int)b.z, s);
  return qrig_dot4((int)k[7], (int)b.w, s);
}

extern "C" __global__ void __launch_bounds__(QRIG_THREADS, kMinBlocks)
attn_decode_dp4a(const float* __restrict__ q, const unsigned char* __restrict__ kc,
                 const unsigned char* __restrict__ vc, long long k_row, long long v_row, int T, int pos0, int Hq,
                 float qscale, const float* __restrict__ gate, long long gate_row, long long gate_head,
                 float* __restrict__ out, float* __restrict__ ws_o, float2* __restrict__ ws_ml, int keys_per_split,
                 int n_split, int layer, const unsigned char* const* __restrict__ kc_of,
                 const unsigned char* const* __restrict__ vc_of, const int* __restrict__ seq_slot,
                 const int* __restrict__ seq_pos, int seqs) {
  qrig_grid_dependency_wait();
  __shared__ __align__(16) float sm[kSmem];
  __shared__ float wm[4][R], wl[4][R];

#if QRIG_BATCHED
  // Sequence z: its position, caches and split; its rows of q, gate and out are offset where they are used, and its
  // split count is computed again after the loop (so that none of them holds a register through the loop).
  {
    const int z = (int)blockIdx.z;
    pos0 = seq_pos[z];
    kc = kc_of[seq_slot[z]];
    vc = vc_of[seq_slot[z]];
    if ((int)blockIdx.x >= qrig_decode_splits(pos0 + T, n_split, keys_per_split))
      return;  // past this sequence's keys: the whole CTA leaves
  }
#define QRIG_SEQ_ROW ((size_t)blockIdx.z)
#else
#define QRIG_SEQ_ROW ((size_t)0)
#endif

  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int kvh = blockIdx.y, split = blockIdx.x;
  const int width = (int)gridDim.y * D;
  const int kv_len = pos0 + T;
  const int ks = split * keys_per_split;
  const int ke = min(kv_len, ks + keys_per_split);
  const int j = lane & 7, qt = lane >> 3;
  const unsigned krb = (unsigned)k_row, vrb = (unsigned)v_row;  // row bytes (a few KiB; 64-bit offsets below)

  // The first group's loads fly while q is staged.
  KeyRegs kr;
  ValRegs vr;
  load_keys(kc, vc, krb, vrb, kvh, width, ks + NK * w, ke, lane, kr);
#pragma unroll
  for (int kk = 0; kk < NK; ++kk) {
    const int kp = ks + NK * w + kk;
    load_value(vc, vrb, kvh, width, kp, kp < ke, lane, vr, kk);
  }

  unsigned* qs = reinterpret_cast<unsigned*>(sm);
  float* qd = sm + kQd;
  float* ps = sm + kPs + w * NK * PS;  // this warp's probabilities
  float* cbv = sm + kCb;
  float* dsv = sm + kDv + w * NK * 8;  // this warp's q8 value block scales
  if (VROT) qrig_kv_load_codebook(VF, cbv, tid);
  if (w < R) {  // warp w: row w (lane l: coordinates 8l..8l+7; block l/4)
    const int t = w / G;
    float x[8];
    float4 a = qrig_zero4(), b = qrig_zero4();
    if (t < T) {
      const float4* src =
          reinterpret_cast<const float4*>(q + (QRIG_SEQ_ROW * Hq + (size_t)t * Hq + (size_t)kvh * G + w % G) * D);
      a = src[2 * lane];
      b = src[2 * lane + 1];
    }
    x[0] = __fmul_rn(a.x, qscale); x[1] = __fmul_rn(a.y, qscale); x[2] = __fmul_rn(a.z, qscale);
    x[3] = __fmul_rn(a.w, qscale); x[4] = __fmul_rn(b.x, qscale); x[5] = __fmul_rn(b.y, qscale);
    x[6] = __fmul_rn(b.z, qscale); x[7] = __fmul_rn(b.w, qscale);
    if (KROT) qrig_kv_rotate_warp(x, qrig_kv_sign_byte(layer, kvh, lane), lane);
    float amax = 0.0f;
    int bad = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      amax = fmaxf(amax, fabsf(x[e]));
      bad |= x[e] != x[e];
    }
    amax = fmaxf(amax, __shfl_xor_sync(QRIG_FULL_MASK, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(QRIG_FULL_MASK, amax, 2));
    bad |= __shfl_xor_sync(QRIG_FULL_MASK, bad, 1);
    bad |= __shfl_xor_sync(QRIG_FULL_MASK, bad, 2);
    const float d = bad ? __int_as_float(0x7fffffff) : __fdiv_rn(amax, 127.0f);
    int qv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) qv[e] = d > 0.0f ? max(-127, min(127, __float2int_rn(__fdiv_rn(x[e], d)))) : 0;
    uint2 pk;
    pk.x = qrig_pack_s8(qv[0], qv[1], qv[2], qv[3]);
    pk.y = qrig_pack_s8(qv[4], qv[5], qv[6], qv[7]);
    reinterpret_cast<uint2*>(qs + w * 64)[lane ^ (lane >= 16 ? 4 : 0)] = pk;
    if ((lane & 3) == 0) qd[w * 8 + (lane >> 2)] = d;
  }
  __syncthreads();

  // Running max (every lane), output accumulators, and the softmax sums of rows qt, qt + 4 (the quarter lanes hold
  // the same probabilities: each keeps the sums of its own rows, lq[r >> 2] for row r).
  float m[R], lq[R4], o[R][8];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = QRIG_NEG_INF;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[r][e] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < R4; ++i) lq[i] = 0.0f;

  for (int kb = ks + NK * w; kb < ke; kb += NK * W) {
    const int kbn = kb + NK * W;  // this warp's next group

    // Q.K: per key slot, row and block the int32 dot, folded with the scales in the CPU reference's order.
    // (q8 keys: rows outer, the words as loaded; t4/t3: blocks outer, each block's codes decoded once.)
    float part[KPL][R], sc[KPL][R];
#if QRIG_KF == 8
    constexpr int kOuter = R, kInner = 2;
#else
    constexpr int kOuter = 2, kInner = R;
#endif
#pragma unroll
    for (int i0 = 0; i0 < kOuter; ++i0) {
      unsigned kw[KPL][8];
      if (KF != 8 || i0 == 0)
#pragma unroll
        for (int s = 0; s < KPL; ++s) key_words(kr, s, KF == 8 ? 0 : i0, kw[s]);
#pragma unroll
      for (int i1 = 0; i1 < kInner; ++i1) {
        const int r = KF == 8 ? i0 : i1, hb = KF == 8 ? i1 : i0;
        if (KF == 8)
#pragma unroll
          for (int s = 0; s < KPL; ++s) key_words(kr, s, hb, kw[s]);
        const int c = 16 * qt + (8 * hb ^ (qt >= 2 ? 8 : 0));  // block 2qt+hb's words, as stored
        const uint4 qa = *reinterpret_cast<const uint4*>(qs + r * 64 + c);
        const uint4 qb = *reinterpret_cast<const uint4*>(qs + r * 64 + (c ^ 4));
        const float dqb = qd[r * 8 + 2 * qt + hb];  // the q block's scale
#pragma unroll
        for (int s = 0; s < KPL; ++s) {
          const float f = qrig_small_int_to_float(dot32(kw[s], qa, qb));
#if QRIG_KF == 8
          const float wk = __fmul_rn(dqb, qrig_half_to_float((unsigned short)(hb ? kr.d[s] >> 16 : kr.d[s] & 0xFFFFu)));
#else
          const float wk = dqb;
#endif
          if (hb == 0) part[s][r] = __fmul_rn(wk, f);
          else part[s][r] = fmaf(wk, f, part[s][r]);
        }
      }
    }
    float kscale[KPL], pvs[KPL];
    unsigned vdw[KPL];
#pragma unroll
    for (int s = 0; s < KPL; ++s) {
#if QRIG_KF == 8
      kscale[s] = 1.0f;
#else
      kscale[s] = __fmul_rn(kr.s[s], KF == 4 ? QRIG_KV_KEY_SCALE_T4 : QRIG_KV_KEY_SCALE_T3);
#endif
#if QRIG_VF == 4 || QRIG_VF == 3
      pvs[s] = kr.vs[s];
#else
      pvs[s] = 1.0f;
#endif
#if QRIG_VF == 8
      vdw[s] = kr.vd[s];
#else
      vdw[s] = 0u;
#endif
    }

#pragma unroll
    for (int s = 0; s < KPL; ++s) {
      const int kp = kb + 8 * s + j;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float x = part[s][r];
        x += __shfl_xor_sync(QRIG_FULL_MASK, x, 8);
        x += __shfl_xor_sync(QRIG_FULL_MASK, x, 16);
        if (KROT) x = __fmul_rn(x, kscale[s]);
        const int t = r / G;
        if (kp >= ke || t >= T || kp > pos0 + t) x = QRIG_NEG_INF;
        sc[s][r] = x;
      }
    }

    // Softmax: the group's max per row (all lanes agree), the running state rescaled only when it grows.
    float mu[R];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float mx = sc[0][r];
#pragma unroll
      for (int s = 1; s < KPL; ++s) mx = fmaxf(mx, sc[s][r]);
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(QRIG_FULL_MASK, mx, 4));
      mu[r] = mx;
      grow |= mx > m[r];
    }
    if (grow) {  // warp-uniform
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (mu[r] > m[r]) {
          const float alpha = qrig_exp2(m[r] - mu[r]);  // 0 while m is -inf
          if ((r & 3) == qt) lq[r >> 2] *= alpha;
#pragma unroll
          for (int e = 0; e < 8; ++e) o[r][e] *= alpha;
          m[r] = mu[r];
        }
    }
    __syncwarp();  // the previous group's probabilities are read
#pragma unroll
    for (int s = 0; s < KPL; ++s)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float p = qrig_exp2(sc[s][r] - (m[r] == QRIG_NEG_INF ? 0.0f : m[r]));
        if ((r & 3) == qt) {  // this lane's keys; the key lanes are summed at the end
          lq[r >> 2] += p;
          ps[(8 * s + j) * PS + r] = (VF == 4 || VF == 3) ? __fmul_rn(p, pvs[s]) : p;
        }
      }
    if (VF == 8)
#pragma unroll
      for (int s = 0; s < KPL; ++s) {
        float2 dv;
        qrig_half2_to_float2(vdw[s], dv.x, dv.y);
        reinterpret_cast<float2*>(dsv + (8 * s + j) * 8)[qt] = dv;
      }
    __syncwarp();

    // P.V, the next group's value rows loaded as these are used.
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
      float pr[PS];
#pragma unroll
      for (int i = 0; i < R4; ++i) {
        const float4 v = reinterpret_cast<const float4*>(ps + kk * PS)[i];
        pr[4 * i] = v.x;
        pr[4 * i + 1] = v.y;
        pr[4 * i + 2] = v.z;
        pr[4 * i + 3] = v.w;
      }
      float vf[8];
      value_floats(vr, kk, cbv, lane, vf);
#if QRIG_VF == 8
      const float dv = dsv[kk * 8 + (lane >> 2)];
#pragma unroll
      for (int r = 0; r < R; ++r) pr[r] = __fmul_rn(pr[r], dv);
#endif
      load_value(vc, vrb, kvh, width, kbn + kk, kbn + kk < ke, lane, vr, kk);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[r][e] = fmaf(pr[r], vf[e], o[r][e]);
    }
    // The next group's keys: issued here, not before P.V (their registers would then be live through it and, with
    // the values', overflow 128); 16 warps per SM cover the wait, and the values (loaded a whole group ahead)
    // carry most of the bytes in flight.
    load_keys(kc, vc, krb, vrb, kvh, width, kbn, ke, lane, kr);
  }

#pragma unroll
  for (int i = 0; i < R4; ++i) {
    lq[i] += __shfl_xor_sync(QRIG_FULL_MASK, lq[i], 1);
    lq[i] += __shfl_xor_sync(QRIG_FULL_MASK, lq[i], 2);
    lq[i] += __shfl_xor_sync(QRIG_FULL_MASK, lq[i], 4);
  }
  // Two rounds: warps 4..7 hand their state to warps 0..3 (slot w - 4), then the four states as in attn_decode.
  float* ob = sm;  // [4][R][D]
  __syncthreads();  // every warp is past its loop: the q rows and probabilities are dead
  if (w >= 4) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float4 x0, x1;
      x0.x = o[r][0]; x0.y = o[r][1]; x0.z = o[r][2]; x0.w = o[r][3];
      x1.x = o[r][4]; x1.y = o[r][5]; x1.z = o[r][6]; x1.w = o[r][7];
      float4* dst = reinterpret_cast<float4*>(ob + ((w - 4) * R + r) * D + 8 * lane);
      dst[0] = x0;
      dst[1] = x1;
      if (lane == 0) wm[w - 4][r] = m[r];
      if (lane == 8 * (r & 3)) wl[w - 4][r] = lq[r >> 2];
    }
  }
  __syncthreads();
  if (w < 4) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float m2 = wm[w][r], mx = fmaxf(m[r], m2), mu = mx == QRIG_NEG_INF ? 0.0f : mx;
      const float f1 = qrig_exp2(m[r] - mu), f2 = qrig_exp2(m2 - mu);
      if ((r & 3) == qt) lq[r >> 2] = fmaf(wl[w][r], f2, lq[r >> 2] * f1);
      const float* src = ob + (w * R + r) * D + 8 * lane;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[r][e] = fmaf(src[e], f2, o[r][e] * f1);
      m[r] = mx;
    }
  }
  __syncthreads();
  if (w < 4) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float4 x0, x1;
      x0.x = o[r][0]; x0.y = o[r][1]; x0.z = o[r][2]; x0.w = o[r][3];
      x1.x = o[r][4]; x1.y = o[r][5]; x1.z = o[r][6]; x1.w = o[r][7];
      float4* dst = reinterpret_cast<float4*>(ob + (w * R + r) * D + 8 * lane);
      dst[0] = x0;
      dst[1] = x1;
      if (lane == 0) wm[w][r] = m[r];
      if (lane == 8 * (r & 3)) wl[w][r] = lq[r >> 2];
    }
  }
  __syncthreads();

  gate += QRIG_SEQ_ROW * gate_row;
  out += QRIG_SEQ_ROW * Hq * D;
#if QRIG_BATCHED
  const int ws_rows = seqs, ws_row0 = (int)blockIdx.z;  // the partials' rows: [split][seqs][Hq]
  {
    int kps;
    n_split = qrig_decode_splits(seq_pos[blockIdx.z] + T, n_split, kps);
  }
#else
  const int ws_rows = T, ws_row0 = 0;  // [split][T][Hq]
#endif
  if (VROT && n_split == 1) {  // warp w finishes row w and rotates it back (lane: columns 8l..8l+7)
    if (w < R) {
      const int r = w, t = r / G;
      const unsigned sb = qrig_kv_sign_byte(layer, kvh, lane);
      float mx = QRIG_NEG_INF;
#pragma unroll
      for (int ww = 0; ww < 4; ++ww) mx = fmaxf(mx, wm[ww][r]);
      const float m_use = mx == QRIG_NEG_INF ? 0.0f : mx;
      float lsum = 0.0f, x[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = 0.0f;
#pragma unroll
      for (int ww = 0; ww < 4; ++ww) {
        const float f = qrig_exp2(wm[ww][r] - m_use);
        lsum = fmaf(wl[ww][r], f, lsum);
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(ob[(ww * R + r) * D + 8 * lane + e], f, x[e]);
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
    for (int ww = 0; ww < 4; ++ww) mx = fmaxf(mx, wm[ww][r]);
    const float m_use = mx == QRIG_NEG_INF ? 0.0f : mx;
    float lsum = 0.0f, osum = 0.0f;
#pragma unroll
    for (int ww = 0; ww < 4; ++ww) {
      const float f = qrig_exp2(wm[ww][r] - m_use);
      lsum = fmaf(wl[ww][r], f, lsum);
      osum = fmaf(ob[(ww * R + r) * D + col], f, osum);
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
