// The GGUF weight types other than Q8_0 as the dp4a kernels read them (gemm_wq_dp4a_skinny.cu, embed_wq.cu):
// the repacked layout (runtime/cuda/wq_layout.h) and the decode of one "unit" of 32 weights into int8 codes
// and the fp32 scale and offset of each of its two 16-value halves. QRIG_WTYPE is the ggml type id.
//
// Layout. A GGUF block (32 values for Q4_0..Q5_1 and IQ4_NL, 256 for the K-quants and IQ4_XS) is split in two:
// its quant bytes (one contiguous range of the block: qs, plus qh / hmask where they sit next to it) go to
// array A, WQ_ABYTES per block (a multiple of 16, so A is read with aligned 16-byte loads), and its remaining
// bytes (the fp16 scales, the packed sub-block scales, Q5_0/Q5_1's qh) to array B, WQ_BBYTES per block (even).
// Rows are whole blocks; row r's blocks start at r * (k / WQ_BLOCK) blocks in both arrays.
//
// Units. A block is WQ_UNITS units; unit u yields 32 codes q (8 words of 4 int8, value i of the unit in byte
// i % 4 of word i / 4) whose first 16 belong to the block's values o0 .. o0+15 and the last 16 to o1 .. o1+15
// (o0, o1 multiples of 16), and for each half a scale d and an offset m such that the weight is d * q + m,
// with d and m the very fp32 values the CPU's dequantization (gguf/quant_blocks.cpp) computes: e.g. Q4_K's
// d * sc and -(dmin * m). Types whose codes have a fixed offset (Q4_0: nibble - 8) fold it into the code (so
// m = -0: then fmaf(d, q, m) keeps the sign of a zero product as the reference's d * q does; WQ_HAS_MIN says
// whether any m is nonzero). The 16 bytes a unit reads of A are 16-byte aligned.
//
// Exactness: a dequantized weight is fmaf(d, q, m) (embed_wq.cu): the product d * q is exact for every type
// (d has at most 19 significant bits, q at most 8), so the one rounding of the fma is the reference's one
// rounding of its subtraction (IQ4_XS: its one multiplication). A matmul computes per half
// d * sum(q * xq) + m * sum(xq) with exact integer sums: fp32 rounding only against the CPU's sum of
// dequantized weights times the dequantized activation.
// (No include guard: a kernel includes it once; tests/cuda/test_wq_decode.cpp includes it once per type, each in
// its own namespace, to run the decode on the host against gguf::dequantize.)

#ifndef QRIG_WTYPE
#error "QRIG_WTYPE (the ggml type id of the weights) must be defined"
#endif

#define QRIG_WT_Q4_0 2
#define QRIG_WT_Q4_1 3
#define QRIG_WT_Q5_0 6
#define QRIG_WT_Q5_1 7
#define QRIG_WT_Q2_K 10
#define QRIG_WT_Q3_K 11
#define QRIG_WT_Q4_K 12
#define QRIG_WT_Q5_K 13
#define QRIG_WT_Q6_K 14
#define QRIG_WT_IQ4_NL 20
#define QRIG_WT_IQ4_XS 23

#if QRIG_WTYPE == QRIG_WT_Q4_0 || QRIG_WTYPE == QRIG_WT_IQ4_NL
#define WQ_BLOCK 32
#define WQ_ABYTES 16
#define WQ_BBYTES 2
#define WQ_HAS_MIN 0
#elif QRIG_WTYPE == QRIG_WT_Q4_1
#define WQ_BLOCK 32
#define WQ_ABYTES 16
#define WQ_BBYTES 4
#define WQ_HAS_MIN 1
#elif QRIG_WTYPE == QRIG_WT_Q5_0
#define WQ_BLOCK 32
#define WQ_ABYTES 16
#define WQ_BBYTES 6
#define WQ_HAS_MIN 0
#elif QRIG_WTYPE == QRIG_WT_Q5_1
#define WQ_BLOCK 32
#define WQ_ABYTES 16
#define WQ_BBYTES 8
#define WQ_HAS_MIN 1
#elif QRIG_WTYPE == QRIG_WT_Q2_K
#define WQ_BLOCK 256
#define WQ_ABYTES 64
#define WQ_BBYTES 20
#define WQ_HAS_MIN 1
#elif QRIG_WTYPE == QRIG_WT_Q3_K
#define WQ_BLOCK 256
#define WQ_ABYTES 96
#define WQ_BBYTES 14
#define WQ_HAS_MIN 0
#elif QRIG_WTYPE == QRIG_WT_Q4_K
#define WQ_BLOCK 256
#define WQ_ABYTES 128
#define WQ_BBYTES 16
#define WQ_HAS_MIN 1
#elif QRIG_WTYPE == QRIG_WT_Q5_K
#define WQ_BLOCK 256
#define WQ_ABYTES 160
#define WQ_BBYTES 16
#define WQ_HAS_MIN 1
#elif QRIG_WTYPE == QRIG_WT_Q6_K
#define WQ_BLOCK 256
#define WQ_ABYTES 192
#define WQ_BBYTES 18
#define WQ_HAS_MIN 0
#elif QRIG_WTYPE == QRIG_WT_IQ4_XS
#define WQ_BLOCK 256
#define WQ_ABYTES 128
#define WQ_BBYTES 8
#define WQ_HAS_MIN 0
#else
#error "QRIG_WTYPE: no dp4a decode for this weight type"
#endif
#define WQ_UNITS (WQ_BLOCK / 32)
#define WQ_TYPE_ID QRIG_WTYPE

// One unit, decoded.
struct WqUnit {
  int q[8];      // codes: words 0..3 the first half, 4..7 the second
  int o0, o1;    // the halves' first value, within the block
  float d0, d1;  // scales
  float m0, m1;  // offsets (0 for types without WQ_HAS_MIN)
};

// c - off per byte for bytes c with c + 0x80 - off < 256 (no borrows: add, then flip the sign bits).
__device__ __forceinline__ int wq_sub_bytes(int c, int off) {
  return (int)(((unsigned)c + (unsigned)(0x80 - off) * 0x01010101u) ^ 0x80808080u);
}

// Bits b..b+3 of x, one per byte (bit b + i -> byte i, value 0 or 1).
__device__ __forceinline__ int wq_spread4(unsigned x, int b) {
  return (int)((((x >> b) & 0xFu) * 0x00204081u) & 0x01010101u);
}

// B is read as wide as its alignment allows (B bytes per block are even, and a multiple of 4, 8 or 16 for the
// types that read it wider; the B array itself is 16-byte aligned): the scale bytes cost load instructions, which
// bound the GEMV, not DRAM bytes.
__device__ __forceinline__ unsigned wq_u16(const unsigned char* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ unsigned wq_u32(const unsigned char* p) { return __ldg(reinterpret_cast<const unsigned*>(p)); }
__device__ __forceinline__ float wq_half_bits(unsigned h) { return qrig_half_to_float((unsigned short)(h & 0xFFFF)); }
// Byte j (0..3) of word x.
__device__ __forceinline__ int wq_byte(unsigned x, int j) { return (int)(x >> (8 * j)) & 0xFF; }

#if QRIG_WTYPE == QRIG_WT_IQ4_NL || QRIG_WTYPE == QRIG_WT_IQ4_XS
// The IQ4 levels (ggml's kvalues_iq4nl) of 4 nibbles held one per byte: two byte permutations over the
// 8-level halves of the table, chosen per byte by the nibble's top bit.
__device__ __forceinline__ int wq_iq4_lookup(int c) {
  const unsigned t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu, t2 = 0x26190D01u, t3 = 0x71594535u;
  // levels: -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 | 53 69 89 113 (bytes little-endian)
  const unsigned x = (unsigned)c | ((unsigned)c >> 4);
  const unsigned sel = ((x & 0xFFu) | ((x >> 8) & 0xFF00u)) & 0x7777u;
  const unsigned lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
  const unsigned top = (((unsigned)c >> 3) & 0x01010101u) * 0xFFu;
  return (int)((lo & ~top) | (hi & top));
}
#endif

#if QRIG_WTYPE == QRIG_WT_Q4_K || QRIG_WTYPE == QRIG_WT_Q5_K
// The 6-bit scale and min of sub-block j of the 12 packed bytes s (gguf/quant_blocks.cpp's k4_scale_min); s[i]
// is byte 4 + i of B, i.e. byte i % 4 of word 1 + i / 4 of the loaded B words bw. Sub-block j needs byte j % 4 of
// each of words 1..3, read with constant word indices: an index computed at run time into bw (a register array)
// would put it in local memory (that made the Q4_K / Q5_K GEMV 2x slower, session 9's sweep).
__device__ __forceinline__ void wq_k4_scale_min(int j, const unsigned* bw, int& sc, int& m) {
  const int jj = j & 3;
  const int a = wq_byte(bw[1], jj), b = wq_byte(bw[2], jj), c = wq_byte(bw[3], jj);
  if (j < 4) {
    sc = a & 63;
    m = b & 63;
  } else {
    sc = (c & 0xF) | ((a >> 6) << 4);
    m = (c >> 4) | ((b >> 6) << 4);
  }
}
#endif

__device__ __forceinline__ int4 wq_ld16(const unsigned char* p) { return __ldg(reinterpret_cast<const int4*>(p)); }

// What a unit reads of memory, loaded (wq_load) before it is decoded (wq_unpack): kernels issue the loads of
// several units before decoding any of them, so several loads are in flight per thread. v: the unit's 16 quant
// bytes; h: a second 16 bytes of A (Q3_K's hmask, Q5_K's qh, Q6_K's qh); s: the B bytes the unit needs, in
// WQ_BWORDS words (one 16-byte load of Q4_K/Q5_K's d, dmin and scales; a word for Q4_1, two for Q2_K; 8 bytes
// for Q5_1 and IQ4_XS; 16-bit or byte loads where B is only 2-aligned: Q4_0, Q5_0, Q3_K, Q6_K, IQ4_NL).
#if QRIG_WTYPE == QRIG_WT_Q3_K || QRIG_WTYPE == QRIG_WT_Q5_K || QRIG_WTYPE == QRIG_WT_Q6_K
#define WQ_A2 1
#else
#define WQ_A2 0
#endif
#if QRIG_WTYPE == QRIG_WT_Q4_0 || QRIG_WTYPE == QRIG_WT_IQ4_NL || QRIG_WTYPE == QRIG_WT_Q4_1
#define WQ_BWORDS 1
#elif QRIG_WTYPE == QRIG_WT_Q3_K
#define WQ_BWORDS 3
#elif QRIG_WTYPE == QRIG_WT_Q4_K || QRIG_WTYPE == QRIG_WT_Q5_K
#define WQ_BWORDS 4
#else
#define WQ_BWORDS 2
#endif
// Whether the unit's two halves are one 32-value block of the activation (o1 = o0 + 16, o0 % 32 == 0) with
// one scale and offset (d0 == d1, m0 == m1): the legacy types and IQ4_XS. And whether every aligned 32 values
// of a block share one scale and offset (those, and Q4_K / Q5_K's sub-blocks of 32): the tiled GEMM then
// applies scales once per 32 values instead of per 16.
#if QRIG_WTYPE == QRIG_WT_Q2_K || QRIG_WTYPE == QRIG_WT_Q3_K || QRIG_WTYPE == QRIG_WT_Q4_K || \
    QRIG_WTYPE == QRIG_WT_Q5_K || QRIG_WTYPE == QRIG_WT_Q6_K
#define WQ_SAME32 0
#else
#define WQ_SAME32 1
#endif
#if QRIG_WTYPE == QRIG_WT_Q2_K || QRIG_WTYPE == QRIG_WT_Q3_K || QRIG_WTYPE == QRIG_WT_Q6_K
#define WQ_SCALE32 0
#else
#define WQ_SCALE32 1
#endif

struct WqRaw {
  int4 v;
#if WQ_A2
  int4 h;
#endif
  unsigned s[WQ_BWORDS];
};

// Unit u (0 .. WQ_UNITS-1) of the block whose A bytes start at a (16-byte aligned) and B bytes at b: its loads.
__device__ __forceinline__ void wq_load(const unsigned char* __restrict__ a, const unsigned char* __restrict__ b,
                                        int u, WqRaw& r) {
#if QRIG_WTYPE == QRIG_WT_Q4_0 || QRIG_WTYPE == QRIG_WT_IQ4_NL
  (void)u;
  r.v = wq_ld16(a);
  r.s[0] = wq_u16(b);  // d
#elif QRIG_WTYPE == QRIG_WT_Q4_1
  (void)u;
  r.v = wq_ld16(a);
  r.s[0] = wq_u32(b);  // d, m (4-aligned)
#elif QRIG_WTYPE == QRIG_WT_Q5_0
  (void)u;
  r.v = wq_ld16(a);
  r.s[0] = wq_u16(b);                           // d (B: 6 bytes, 2-aligned)
  r.s[1] = wq_u16(b + 2) | (wq_u16(b + 4) << 16);  // qh
#elif QRIG_WTYPE == QRIG_WT_Q5_1
  (void)u;
  r.v = wq_ld16(a);
  const uint2 bv = __ldg(reinterpret_cast<const uint2*>(b));  // d, m, qh (8 bytes, 8-aligned)
  r.s[0] = bv.x;
  r.s[1] = bv.y;
#elif QRIG_WTYPE == QRIG_WT_Q4_K || QRIG_WTYPE == QRIG_WT_Q5_K
  const int c = u >> 1, i = u & 1;
  const int qs = QRIG_WTYPE == QRIG_WT_Q5_K ? 32 : 0;
  r.v = wq_ld16(a + qs + 32 * c + 16 * i);
#if QRIG_WTYPE == QRIG_WT_Q5_K
  r.h = wq_ld16(a + 16 * i);
#endif
  const int4 bv = wq_ld16(b);  // d, dmin, scales[12]: 16 bytes, 16-aligned
  r.s[0] = (unsigned)bv.x;
  r.s[1] = (unsigned)bv.y;
  r.s[2] = (unsigned)bv.z;
  r.s[3] = (unsigned)bv.w;
#elif QRIG_WTYPE == QRIG_WT_Q6_K
  const int hf = u >> 2, rr = u & 3, p = rr >> 1, li = 16 * (rr & 1);
  r.v = wq_ld16(a + 64 * hf + 16 * rr);
  r.h = wq_ld16(a + 128 + 32 * hf + li);
  const int i0 = 8 * hf + 2 * p + (rr & 1);  // the halves' int8 scales: bytes i0 and i0 + 4 (B is 2-aligned)
  r.s[0] = (unsigned)__ldg(b + i0) | ((unsigned)__ldg(b + i0 + 4) << 8);
  r.s[1] = wq_u16(b + 16);  // d
#elif QRIG_WTYPE == QRIG_WT_Q2_K || QRIG_WTYPE == QRIG_WT_Q3_K
  const int hf = u >> 2, pt = (u >> 1) & 1, sp = u & 1;
  const int qs = QRIG_WTYPE == QRIG_WT_Q3_K ? 32 : 0;
  r.v = wq_ld16(a + qs + 32 * hf + 16 * pt);
#if QRIG_WTYPE == QRIG_WT_Q2_K
  // B (20 bytes, 4-aligned): scales[16], then d, dmin. is0 = 8hf + 4sp + pt: is0 % 4 < 2, so is0 and is0 + 2
  // share a word.
  r.s[0] = wq_u32(b + 8 * hf + 4 * sp);
  r.s[1] = wq_u32(b + 16);
#else
  r.h = wq_ld16(a + 16 * pt);
  // B (14 bytes, 2-aligned): scales[12], d. The halves' low 4 bits are bytes 4sp + pt and 4sp + pt + 2 (high
  // nibbles for hf = 1), their high 2 bits in bytes 8 + pt and 10 + pt.
  r.s[0] = wq_u16(b + 4 * sp) | (wq_u16(b + 4 * sp + 2) << 16);
  r.s[1] = wq_u16(b + 8) | (wq_u16(b + 10) << 16);
  r.s[2] = wq_u16(b + 12);  // d
#endif
#elif QRIG_WTYPE == QRIG_WT_IQ4_XS
  r.v = wq_ld16(a + 16 * u);
  const uint2 bv = __ldg(reinterpret_cast<const uint2*>(b));  // d, scales_h, scales_l[4]: 8 bytes, 8-aligned
  r.s[0] = bv.x;
  r.s[1] = bv.y;
#endif
}

// Unit u of the loads r, decoded.
__device__ __forceinline__ void wq_unpack(const WqRaw& r, int u, WqUnit& w) {
  const int NIB = 0x0F0F0F0F;
  (void)NIB;
  const int x[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#if WQ_A2
  const int hx[4] = {r.h.x, r.h.y, r.h.z, r.h.w};
#endif
#if QRIG_WTYPE == QRIG_WT_Q4_0 || QRIG_WTYPE == QRIG_WT_Q4_1 || QRIG_WTYPE == QRIG_WT_Q5_0 || \
    QRIG_WTYPE == QRIG_WT_Q5_1 || QRIG_WTYPE == QRIG_WT_IQ4_NL
  (void)u;
  w.o0 = 0;
  w.o1 = 16;
  w.d0 = w.d1 = wq_half_bits(r.s[0]);
  w.m0 = w.m1 = -0.0f;
#if QRIG_WTYPE == QRIG_WT_Q5_0 || QRIG_WTYPE == QRIG_WT_Q5_1
  const unsigned qh = r.s[1];
#endif
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int lo = x[i] & NIB, hi = (x[i] >> 4) & NIB;
#if QRIG_WTYPE == QRIG_WT_Q4_0
    lo = wq_sub_bytes(lo, 8);
    hi = wq_sub_bytes(hi, 8);
#elif QRIG_WTYPE == QRIG_WT_IQ4_NL
    lo = wq_iq4_lookup(lo);
    hi = wq_iq4_lookup(hi);
#elif QRIG_WTYPE == QRIG_WT_Q5_0 || QRIG_WTYPE == QRIG_WT_Q5_1
    lo |= wq_spread4(qh, 4 * i) << 4;
    hi |= wq_spread4(qh, 16 + 4 * i) << 4;
#if QRIG_WTYPE == QRIG_WT_Q5_0
    lo = wq_sub_bytes(lo, 16);
    hi = wq_sub_bytes(hi, 16);
#endif
#endif
    w.q[i] = lo;
    w.q[4 + i] = hi;
  }
#if QRIG_WTYPE == QRIG_WT_Q4_1 || QRIG_WTYPE == QRIG_WT_Q5_1
  w.m0 = w.m1 = wq_half_bits(r.s[0] >> 16);
#endif

#elif QRIG_WTYPE == QRIG_WT_Q4_K || QRIG_WTYPE == QRIG_WT_Q5_K
  // A: (Q5_K: qh[32],) qs[128]; B: d, dmin, scales[12]. Unit u: chunk c = u/2 of 64 values, its 16 bytes
  // i = u%2: low nibbles are values 64c + 16i.. of sub-block 2c, high nibbles 64c + 32 + 16i.. of 2c + 1.
  const int c = u >> 1, i = u & 1;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int lo = x[j] & NIB, hi = (x[j] >> 4) & NIB;
#if QRIG_WTYPE == QRIG_WT_Q5_K
    lo |= ((hx[j] >> (2 * c)) & 0x01010101) << 4;
    hi |= ((hx[j] >> (2 * c + 1)) & 0x01010101) << 4;
#endif
    w.q[j] = lo;
    w.q[4 + j] = hi;
  }
  w.o0 = 64 * c + 16 * i;
  w.o1 = w.o0 + 32;
  const float d = wq_half_bits(r.s[0]), dmin = wq_half_bits(r.s[0] >> 16);
  int sc, m;
  wq_k4_scale_min(2 * c, r.s, sc, m);
  w.d0 = d * (float)sc;
  w.m0 = -(dmin * (float)m);
  wq_k4_scale_min(2 * c + 1, r.s, sc, m);
  w.d1 = d * (float)sc;
  w.m1 = -(dmin * (float)m);

#elif QRIG_WTYPE == QRIG_WT_Q6_K
  // A: ql[128], qh[64]; B: int8 scales[16], d. Unit u: half hf = u/4 (128 values), r = u%4: the 16 ql bytes
  // 64hf + 16r hold, at l = 16(r%2) .. +15 of the half's groups p = r/2 (low nibbles) and p + 2 (high).
  const int hf = u >> 2, rr = u & 3, p = rr >> 1, li = 16 * (rr & 1);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int lo = (x[j] & NIB) | (((hx[j] >> (2 * p)) & 0x03030303) << 4);
    const int hi = ((x[j] >> 4) & NIB) | (((hx[j] >> (2 * p + 4)) & 0x03030303) << 4);
    w.q[j] = wq_sub_bytes(lo, 32);
    w.q[4 + j] = wq_sub_bytes(hi, 32);
  }
  w.o0 = 128 * hf + 32 * p + li;
  w.o1 = w.o0 + 64;
  const float d = wq_half_bits(r.s[1]);
  w.d0 = d * (float)(signed char)(r.s[0] & 0xFF);
  w.d1 = d * (float)(signed char)((r.s[0] >> 8) & 0xFF);
  w.m0 = w.m1 = -0.0f;

#elif QRIG_WTYPE == QRIG_WT_Q2_K || QRIG_WTYPE == QRIG_WT_Q3_K
  // Q2_K A: qs[64]; B: scales[16] (scale | min << 4), d, dmin. Q3_K A: hmask[32], qs[64]; B: scales[12], d.
  // Unit u: half hf = u/4 (128 values), part pt = (u/2)%2, shift pair sp = u%2: the 16 qs bytes 32hf + 16pt
  // hold, for shift s, values 128hf + 32(s/2) + 16pt .. +15 with scale is = 8hf + 2(s/2) + pt; the unit takes
  // s = 4sp (first half) and 4sp + 2 (second half).
  const int hf = u >> 2, pt = (u >> 1) & 1, sp = u & 1;
#if QRIG_WTYPE == QRIG_WT_Q3_K
  const int b0 = 4 * hf + 2 * sp;  // hmask bit of the first half's shift
#endif
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int c0 = (x[j] >> (4 * sp)) & 0x03030303, c1 = (x[j] >> (4 * sp + 2)) & 0x03030303;
#if QRIG_WTYPE == QRIG_WT_Q3_K
    c0 = wq_sub_bytes(c0 | (((hx[j] >> b0) & 0x01010101) << 2), 4);
    c1 = wq_sub_bytes(c1 | (((hx[j] >> (b0 + 1)) & 0x01010101) << 2), 4);
#endif
    w.q[j] = c0;
    w.q[4 + j] = c1;
  }
  w.o0 = 128 * hf + 64 * sp + 16 * pt;
  w.o1 = w.o0 + 32;
#if QRIG_WTYPE == QRIG_WT_Q2_K
  // Scales is0 = 8hf + 4sp + pt and is0 + 2: bytes pt and pt + 2 of the loaded word.
  const int s0 = wq_byte(r.s[0], pt), s1 = wq_byte(r.s[0], pt + 2);
  const float d = wq_half_bits(r.s[1]), dmin = wq_half_bits(r.s[1] >> 16);
  w.d0 = d * (float)(s0 & 0xF);
  w.m0 = -(dmin * (float)(s0 >> 4));
  w.d1 = d * (float)(s1 & 0xF);
  w.m1 = -(dmin * (float)(s1 >> 4));
#else
  // Scale j = is0 (is1 = is0 + 2): low 4 bits byte j of B for j < 8 (hf = 0), the high nibble of byte j - 8
  // otherwise; high 2 bits at 2 (j / 4) of byte 8 + j % 4 (j % 4 = pt, + 2 for is1; j / 4 = 2hf + sp).
  const float d = wq_half_bits(r.s[2]);
  const int sh = 4 * hf, hs = 2 * (2 * hf + sp);
  const int sc0 = (((wq_byte(r.s[0], pt) >> sh) & 0xF) | (((wq_byte(r.s[1], pt) >> hs) & 3) << 4)) - 32;
  const int sc1 = (((wq_byte(r.s[0], pt + 2) >> sh) & 0xF) | (((wq_byte(r.s[1], pt + 2) >> hs) & 3) << 4)) - 32;
  w.d0 = d * (float)sc0;
  w.d1 = d * (float)sc1;
  w.m0 = w.m1 = -0.0f;
#endif

#elif QRIG_WTYPE == QRIG_WT_IQ4_XS
  // A: qs[128]; B: d, scales_h (u16), scales_l[4]. Unit u = sub-block: values 32u .. 32u+31, one scale.
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w.q[j] = wq_iq4_lookup(x[j] & NIB);
    w.q[4 + j] = wq_iq4_lookup((x[j] >> 4) & NIB);
  }
  w.o0 = 32 * u;
  w.o1 = w.o0 + 16;
  const unsigned sh = r.s[0] >> 16;
  const int ls = ((int)(r.s[1] >> (8 * (u / 2) + 4 * (u % 2))) & 0xF) | (((sh >> (2 * u)) & 3) << 4);
  w.d0 = w.d1 = wq_half_bits(r.s[0]) * (float)(ls - 32);
  w.m0 = w.m1 = -0.0f;
#endif
}

// Unit u of the block at a / b: loaded, then decoded.
__device__ __forceinline__ void wq_decode(const unsigned char* __restrict__ a, const unsigned char* __restrict__ b,
                                          int u, WqUnit& w) {
  WqRaw r;
  wq_load(a, b, u, r);
  wq_unpack(r, u, w);
}

// The layout as constants (for code that is not preprocessor: the host test of this decode).
constexpr int kWqBlock = WQ_BLOCK, kWqUnits = WQ_UNITS, kWqABytes = WQ_ABYTES, kWqBBytes = WQ_BBYTES,
              kWqHasMin = WQ_HAS_MIN, kWqSame32 = WQ_SAME32, kWqScale32 = WQ_SCALE32;
