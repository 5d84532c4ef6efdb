// Dequantization of llama.cpp's block formats other than Q8_0: the legacy 32-value types (Q4_0, Q4_1, Q5_0,
// Q5_1), the 256-value K-quants (Q2_K .. Q6_K) and the non-linear 4-bit types (IQ4_NL, IQ4_XS), written from
// the public description of ggml's block layouts and reference dequantization (ggml-common.h, ggml-quants.c
// dequantize_row_*), and the block check that refuses NaN or infinite fp16 scales (check_blocks).
//
// Bit-exactness: every value is computed with the same fp32 operations, in the same order, as the reference
// (e.g. Q4_K: (d * sc) * q - (dmin * m)); this file is compiled with -ffp-contract=off (CMakeLists.txt) so no
// compiler turns a multiply and an add into one fused operation the reference does not do.
#include <cstring>

#include <fmt/format.h>

#include "gguf/gguf.h"
#include "gguf/quant_blocks.h"

namespace qrig::gguf {

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_float(h);
}

// IQ4_NL / IQ4_XS: the 16 levels a 4-bit index selects (ggml's kvalues_iq4nl).
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) packed in 12 bytes: j < 4 in the low 6 bits of
// bytes j (scale) and j+4 (min); j >= 4 in the nibbles of byte j+4 with their top 2 bits in the top bits of
// bytes j-4 (scale) and j (min).
inline void k4_scale_min(int j, const uint8_t* s, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Q3_K: the 16 signed 6-bit scales (stored + 32) packed in 12 bytes: low nibbles of bytes 0..7 for j < 8, their
// high nibbles for j >= 8; the top 2 bits of scale j at bit 2*(j/4) of byte 8 + j%4.
inline void q3k_scales(const uint8_t* s, int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = (float)((qs[j] & 0xF) - 8) * d;
    y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
  }
}

void deq_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = (float)(qs[j] & 0xF) * d + m;
    y[j + 16] = (float)(qs[j] >> 4) * d + m;
  }
}

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
    y[j] = (float)(((qs[j] & 0xF) | h0) - 16) * d;
    y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
  }
}

void deq_q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
    y[j] = (float)((qs[j] & 0xF) | h0) * d + m;
    y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
  }
}

// Q2_K (84 bytes): scales[16] (low nibble scale, high nibble min), qs[64] (2 bits), d, dmin.
void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const uint8_t* q = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  int is = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part, ++is) {
        const float dl = d * (float)(sc[is] & 0xF), ml = dmin * (float)(sc[is] >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * (float)((q[16 * part + l] >> shift) & 3) - ml;
      }
}

// Q3_K (110 bytes): hmask[32] (the high bit), qs[64] (low 2 bits), scales[12], d.
void deq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  int8_t scales[16];
  q3k_scales(b + 96, scales);
  const float d = half_at(b + 108);
  int is = 0;
  uint8_t m = 1;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1))
      for (int part = 0; part < 2; ++part, ++is) {
        const float dl = d * (float)scales[is];
        for (int l = 0; l < 16; ++l) {
          const int k = 16 * part + l;
          *y++ = dl * (float)(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
        }
      }
}

// Q4_K (144 bytes): d, dmin, scales[12], qs[128].
void deq_q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* q = b + 16;
  for (int c = 0; c < 4; ++c, q += 32) {
    uint8_t sc, m;
    k4_scale_min(2 * c, s, sc, m);
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    k4_scale_min(2 * c + 1, s, sc, m);
    const float d2 = d * (float)sc, m2 = dmin * (float)m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (float)(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (float)(q[l] >> 4) - m2;
  }
}

// Q5_K (176 bytes): d, dmin, scales[12], qh[32] (fifth bits), qs[128].
void deq_q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48;
  for (int c = 0; c < 4; ++c, q += 32) {
    uint8_t sc, m;
    k4_scale_min(2 * c, s, sc, m);
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    k4_scale_min(2 * c + 1, s, sc, m);
    const float d2 = d * (float)sc, m2 = dmin * (float)m;
    const uint8_t u1 = (uint8_t)(1u << (2 * c)), u2 = (uint8_t)(2u << (2 * c));
    for (int l = 0; l < 32; ++l) *y++ = d1 * (float)((q[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (float)((q[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
  }
}

// Q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d.
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * (float)sc[is] * (float)q1;
      y[l + 32] = d * (float)sc[is + 2] * (float)q2;
      y[l + 64] = d * (float)sc[is + 4] * (float)q3;
      y[l + 96] = d * (float)sc[is + 6] * (float)q4;
    }
}

void deq_iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * (float)kIq4Levels[qs[j] & 0xF];
    y[j + 16] = d * (float)kIq4Levels[qs[j] >> 4];
  }
}

// IQ4_XS (136 bytes): d, scales_h (u16: 2 high bits per sub-block), scales_l[4] (4 low bits), qs[128].
void deq_iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint16_t sh;
  std::memcpy(&sh, b + 2, 2);
  const uint8_t* sl = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib, y += 32, qs += 16) {
    const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
    const float dl = d * (float)(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * (float)kIq4Levels[qs[j] & 0xF];
      y[j + 16] = dl * (float)kIq4Levels[qs[j] >> 4];
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

struct BlockType {
  TensorType type;
  BlockFn fn;
  uint32_t elems, bytes;
  uint8_t scale_offsets[2];  // byte offsets of the block's fp16 scales; 255: none
};

constexpr uint8_t kNone = 255;
constexpr BlockType kBlockTypes[] = {
    {TensorType::Q4_0, deq_q4_0, 32, 18, {0, kNone}},     {TensorType::Q4_1, deq_q4_1, 32, 20, {0, 2}},
    {TensorType::Q5_0, deq_q5_0, 32, 22, {0, kNone}},     {TensorType::Q5_1, deq_q5_1, 32, 24, {0, 2}},
    {TensorType::Q8_0, nullptr, 32, 34, {0, kNone}},      {TensorType::Q2_K, deq_q2_k, 256, 84, {80, 82}},
    {TensorType::Q3_K, deq_q3_k, 256, 110, {108, kNone}}, {TensorType::Q4_K, deq_q4_k, 256, 144, {0, 2}},
    {TensorType::Q5_K, deq_q5_k, 256, 176, {0, 2}},       {TensorType::Q6_K, deq_q6_k, 256, 210, {208, kNone}},
    {TensorType::IQ4_NL, deq_iq4_nl, 32, 18, {0, kNone}}, {TensorType::IQ4_XS, deq_iq4_xs, 256, 136, {0, kNone}},
};

const BlockType* block_type(TensorType t) {
  for (const BlockType& b : kBlockTypes)
    if (b.type == t) return &b;
  return nullptr;
}

}  // namespace

bool is_block_type(TensorType t) { return block_type(t) != nullptr; }

void dequantize_blocks(TensorType type, const uint8_t* src, float* dst, size_t n) {
  const BlockType* bt = block_type(type);
  if (!bt || !bt->fn) throw Error(fmt::format("no block dequantization for {}", tensor_type_name(type)));
  if (n % bt->elems)
    throw Error(fmt::format("{} dequantize of {} values (not a multiple of the block size {})", tensor_type_name(type),
                            n, bt->elems));
  for (size_t b = 0; b < n / bt->elems; ++b) bt->fn(src + b * bt->bytes, dst + b * bt->elems);
}

void check_blocks(TensorType type, const uint8_t* src, size_t n, const std::string& what) {
  const BlockType* bt = block_type(type);
  if (!bt) return;  // plain types carry no scales
  if (n % bt->elems)
    throw Error(fmt::format("{}: {} values of {} are not a whole number of {}-value blocks", what, n,
                            tensor_type_name(type), bt->elems));
  for (size_t b = 0; b < n / bt->elems; ++b)
    for (uint8_t off : bt->scale_offsets) {
      if (off == kNone) continue;
      uint16_t h;
      std::memcpy(&h, src + b * bt->bytes + off, 2);
      if ((h & 0x7c00) == 0x7c00)
        throw Error(fmt::format("{}: {} block {} (byte {}) has a {} scale: the file is corrupt", what,
                                tensor_type_name(type), b, b * bt->bytes + off, (h & 0x3ff) ? "NaN" : "infinite"));
    }
}

}  // namespace qrig::gguf
