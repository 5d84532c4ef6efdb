// Float -> llama.cpp block formats, following ggml's reference quantization (the quantize_row_*_ref path
// llama-quantize takes without an importance matrix): Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (Q8_0
// is quantize_q8_0 in quant.cpp). Written from the public description of those algorithms (ggml-quants.c):
// per block a scale (and min) search, K-quants' sub-block scales quantized to 4/6/8 bits against a super-block
// fp16 scale, then every value re-quantized against the scale as stored. The output need not equal
// llama-quantize's byte for byte; it is a valid file of the type, dequantized by dequantize() like any other.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "gguf/gguf.h"

namespace qrig::gguf {

namespace {

// Round to nearest (ties to even) through the float adder, as ggml's nearest_int; |x| < 2^22.
inline int nearest(float x) {
  float v = x + 12582912.0f;
  int i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

inline void put_half(uint8_t* p, float f) {
  const uint16_t h = float_to_fp16(f);
  std::memcpy(p, &h, 2);
}
inline float stored(float f) { return fp16_to_float(float_to_fp16(f)); }

constexpr float kTiny = 1e-15f;  // a group whose largest magnitude is below this is all zero

// Symmetric levels -nmax..nmax-1 for n values, weights x^2, with a small search over the scale: returns the
// scale and writes L[i] + nmax (so 0..2*nmax-1).
float symmetric_levels(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); max = x[i]; }
  if (amax < kTiny) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  auto fit = [&](float iscale, float& sumlx, float& suml2, bool write) {
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
      if (write) L[i] = (int8_t)(l + nmax);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
  };
  float sumlx, suml2;
  fit(-nmax / max, sumlx, suml2, true);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    const float iscale = -(nmax + 0.1f * is) / max;
    fit(iscale, sumlx, suml2, false);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      fit(iscale, sumlx, suml2, true);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's sub-block levels -nmax..nmax-1 with a few rounds of per-value refinement (weights x^2); writes L + nmax.
float q3_levels(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); max = x[i]; }
  if (amax < kTiny) {
    std::fill(L, L + n, 0);
    return 0.0f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)l;
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int round = 0; round < 5; ++round) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx <= 0) continue;
      float sl2 = suml2 - w * L[i] * L[i];
      const int nl = std::clamp(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (nl == L[i]) continue;
      slx += w * x[i] * nl;
      sl2 += w * nl * nl;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = (int8_t)nl;
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (!changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
  return suml2 > 0 ? sumlx / suml2 : 0.0f;
}

// Asymmetric levels 0..nmax with a min <= 0 (value = scale * L - min_out), weighted least squares over a range
// of candidate scales (rmin + rdelta * k, k = 0..nstep); use_mad weighs absolute instead of squared errors.
float scale_min_levels(int n, int nmax, const float* x, const float* w, uint8_t* L, float* min_out, float rmin,
                       float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, 0);
    *min_out = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = (uint8_t)std::clamp(nearest(iscale * (x[i] - min)), 0, nmax);
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best += w[i] * diff;
  }
  uint8_t aux[32];
  for (int k = 0; k <= nstep; ++k) {
    iscale = (rmin + rdelta * k + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * (x[i] - min)), 0, nmax);
      aux[i] = (uint8_t)l;
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      float diff = this_scale * aux[i] + this_min - x[i];
      diff = use_mad ? std::fabs(diff) : diff * diff;
      err += w[i] * diff;
    }
    if (err < best) {
      std::copy(aux, aux + n, L);
      best = err;
      scale = this_scale;
      min = this_min;
    }
  }
  *min_out = -min;
  return scale;
}

// ---- 32-value types ----

void q4_0_block(const float* x, uint8_t* b) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
  const float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
  put_half(b, d);
  for (int j = 0; j < 16; ++j) {
    const int a = std::min(15, (int)(int8_t)(x[j] * id + 8.5f)), c = std::min(15, (int)(int8_t)(x[j + 16] * id + 8.5f));
    b[2 + j] = (uint8_t)(a | (c << 4));
  }
}

void q4_1_block(const float* x, uint8_t* b) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) { min = std::min(min, x[j]); max = std::max(max, x[j]); }
  const float d = (max - min) / 15, id = d != 0 ? 1.0f / d : 0.0f;
  put_half(b, d);
  put_half(b + 2, min);
  for (int j = 0; j < 16; ++j) {
    const int a = std::min(15, (int)(int8_t)((x[j] - min) * id + 0.5f));
    const int c = std::min(15, (int)(int8_t)((x[j + 16] - min) * id + 0.5f));
    b[4 + j] = (uint8_t)(a | (c << 4));
  }
}

void put_q5_bits(const int* q, uint8_t* qh_at, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= (uint32_t)((q[j] >> 4) & 1) << j;
    qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_at, &qh, 4);
}

void q5_0_block(const float* x, uint8_t* b) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
  const float d = max / -16, id = d != 0 ? 1.0f / d : 0.0f;
  put_half(b, d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = std::min(31, (int)(int8_t)(x[j] * id + 16.5f));
  put_q5_bits(q, b + 2, b + 6);
}

void q5_1_block(const float* x, uint8_t* b) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) { min = std::min(min, x[j]); max = std::max(max, x[j]); }
  const float d = (max - min) / 31, id = d != 0 ? 1.0f / d : 0.0f;
  put_half(b, d);
  put_half(b + 2, min);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = std::min(31, (int)(uint8_t)((x[j] - min) * id + 0.5f));
  put_q5_bits(q, b + 4, b + 8);
}

// ---- K-quants (256 values) ----

// Packs 2-bit levels L[256] as Q2_K/Q3_K store them: byte l of each 32-byte half holds values l, l+32, l+64, l+96.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 256; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Q2_K: 16 sub-blocks of 16, 4-bit scale and min each against fp16 d and dmin.
void q2_k_block(const float* x, uint8_t* b) {
  uint8_t L[256];
  float scales[16], mins[16], w[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
    scales[j] = scale_min_levels(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  uint8_t* sc = b;
  std::memset(sc, 0, 16);
  if (max_scale > 0) {
    const float iscale = 15.0f / max_scale;
    for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)nearest(iscale * scales[j]);
    put_half(b + 80, max_scale / 15.0f);
  } else {
    put_half(b + 80, 0.0f);
  }
  if (max_min > 0) {
    const float iscale = 15.0f / max_min;
    for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)(sc[j] | (nearest(iscale * mins[j]) << 4));
    put_half(b + 82, max_min / 15.0f);
  } else {
    put_half(b + 82, 0.0f);
  }
  const float d = fp16_to_float((uint16_t)(b[80] | (b[81] << 8))), dmin = fp16_to_float((uint16_t)(b[82] | (b[83] << 8)));
  for (int j = 0; j < 16; ++j) {
    const float dj = d * (float)(sc[j] & 0xF);
    if (dj == 0) continue;
    const float mj = dmin * (float)(sc[j] >> 4);
    for (int i = 0; i < 16; ++i) L[16 * j + i] = (uint8_t)std::clamp(nearest((x[16 * j + i] + mj) / dj), 0, 3);
  }
  pack_2bit(L, b + 16);
}

// Q3_K: 16 sub-blocks of 16, signed 6-bit scales against fp16 d, 3-bit values (2 low bits + hmask).
void q3_k_block(const float* x, uint8_t* b) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = q3_levels(16, 4, x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > amax) { amax = std::fabs(scales[j]); max_scale = scales[j]; }
  }
  uint8_t* s = b + 96;
  std::memset(s, 0, 12);
  if (max_scale != 0) {
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      const int l = std::clamp((int)(int8_t)nearest(iscale * scales[j]), -32, 31) + 32;
      if (j < 8) s[j] = (uint8_t)(l & 0xF);
      else s[j - 8] = (uint8_t)(s[j - 8] | ((l & 0xF) << 4));
      s[8 + j % 4] = (uint8_t)(s[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
    }
    put_half(b + 108, 1 / iscale);
  } else {
    put_half(b + 108, 0.0f);
  }
  const float d = fp16_to_float((uint16_t)(b[108] | (b[109] << 8)));
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int sc = (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
    const float dj = d * (float)sc;
    if (dj == 0) continue;
    for (int i = 0; i < 16; ++i) L[16 * j + i] = (int8_t)(std::clamp(nearest(x[16 * j + i] / dj), -4, 3) + 4);
  }
  uint8_t* hm = b;
  std::memset(hm, 0, 32);
  uint8_t low[256];
  for (int j = 0; j < 256; ++j) {
    int v = L[j];
    if (v > 3) {
      hm[j % 32] = (uint8_t)(hm[j % 32] | (1 << (j / 32)));
      v -= 4;
    }
    low[j] = (uint8_t)v;
  }
  pack_2bit(low, b + 32);
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins (packed in 12 bytes) against fp16 d and dmin.
void k_scale_min_block(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* d_at, uint8_t* s,
                       uint8_t* L) {
  float scales[8], mins[8], w[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) w[l] = av + std::fabs(x[32 * j + l]);
    scales[j] = scale_min_levels(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], rmin, rdelta, nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f, inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = (uint8_t)std::min(63, nearest(inv_scale * scales[j]));
    lm[j] = (uint8_t)std::min(63, nearest(inv_min * mins[j]));
  }
  for (int j = 0; j < 4; ++j) {
    s[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
    s[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
    s[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
  }
  put_half(d_at, max_scale / 63.0f);
  put_half(d_at + 2, max_min / 63.0f);
  const float d = stored(max_scale / 63.0f), dmin = stored(max_min / 63.0f);
  for (int j = 0; j < 8; ++j) {
    const float dj = d * (float)ls[j];
    if (dj == 0) continue;
    const float mj = dmin * (float)lm[j];
    for (int i = 0; i < 32; ++i) L[32 * j + i] = (uint8_t)std::clamp(nearest((x[32 * j + i] + mj) / dj), 0, nmax);
  }
}

void q4_k_block(const float* x, uint8_t* b) {
  uint8_t L[256];
  k_scale_min_block(x, 15, -1.0f, 0.1f, 20, b, b + 4, L);
  uint8_t* q = b + 16;
  for (int j = 0; j < 256; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

void q5_k_block(const float* x, uint8_t* b) {
  uint8_t L[256];
  k_scale_min_block(x, 31, -0.5f, 0.1f, 15, b, b + 4, L);
  uint8_t* qh = b + 16;
  uint8_t* q = b + 48;
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c, q += 32)
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * c + l], hi = L[64 * c + l + 32];
      q[l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
      qh[l] = (uint8_t)(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}

// Q6_K: 16 sub-blocks of 16 with int8 scales against fp16 d, 6-bit values (4 low bits in ql, 2 high in qh).
void q6_k_block(const float* x, uint8_t* b) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = symmetric_levels(16, 32, x + 16 * j, L + 16 * j);
    if (std::fabs(scales[j]) > amax) { amax = std::fabs(scales[j]); max_scale = scales[j]; }
  }
  if (amax < kTiny) {
    std::memset(b, 0, 210);
    return;
  }
  const float iscale = -128.0f / max_scale;
  put_half(b + 208, 1 / iscale);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int j = 0; j < 16; ++j) sc[j] = (int8_t)std::min(127, nearest(iscale * scales[j]));
  const float d = stored(1 / iscale);
  for (int j = 0; j < 16; ++j) {
    const float dj = d * (float)sc[j];
    if (dj == 0) continue;
    for (int i = 0; i < 16; ++i) L[16 * j + i] = (int8_t)(std::clamp(nearest(x[16 * j + i] / dj), -32, 31) + 32);
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      const int a = L[j + l], c = L[j + l + 32], e = L[j + l + 64], f = L[j + l + 96];
      ql[l] = (uint8_t)((a & 0xF) | ((e & 0xF) << 4));
      ql[l + 32] = (uint8_t)((c & 0xF) | ((f & 0xF) << 4));
      qh[l] = (uint8_t)((a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((f >> 4) << 6));
    }
}

using BlockQuant = void (*)(const float*, uint8_t*);

BlockQuant block_quantizer(TensorType t) {
  switch (t) {
    case TensorType::Q4_0: return q4_0_block;
    case TensorType::Q4_1: return q4_1_block;
    case TensorType::Q5_0: return q5_0_block;
    case TensorType::Q5_1: return q5_1_block;
    case TensorType::Q2_K: return q2_k_block;
    case TensorType::Q3_K: return q3_k_block;
    case TensorType::Q4_K: return q4_k_block;
    case TensorType::Q5_K: return q5_k_block;
    case TensorType::Q6_K: return q6_k_block;
    default: return nullptr;
  }
}

}  // namespace

bool can_quantize(TensorType t) { return t == TensorType::Q8_0 || block_quantizer(t) != nullptr; }

void quantize(TensorType type, const float* src, uint8_t* dst, size_t n) {
  if (type == TensorType::Q8_0) return quantize_q8_0(src, dst, n);
  const BlockQuant q = block_quantizer(type);
  if (!q)
    throw Error(fmt::format("no quantizer for {} (qrig quantizes Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                            "Q5_K, Q6_K)", tensor_type_name(type)));
  const TypeTraits& tr = *type_traits(static_cast<uint32_t>(type));
  if (n % tr.block_elems)
    throw Error(fmt::format("{} quantize of {} values (not a multiple of the block size {})", tr.name, n,
                            tr.block_elems));
  for (size_t b = 0; b < n / tr.block_elems; ++b) q(src + b * tr.block_elems, dst + b * tr.block_bytes);
}

}  // namespace qrig::gguf
