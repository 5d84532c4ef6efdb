// Quantized key and value caches on the CPU: the rotation, quantize / dequantize of a cache row (q8, t4, t3), and
// gated attention over caches of any format, computed the way the GPU kernels are designed to (keys scored and
// values accumulated in the rotated domain, the query rotated once and the output rotated back once), with the
// query in fp32 (attn_decode, attn_prefill) or in int8 (attn_decode_dp4a: the same integers and float steps). The
// formats and their byte layout are kernels/kv_format.h; the choices are explained in docs/kv-cache.md.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cpu/ops.h"
#include "runtime/cpu/ops_internal.h"
#include "runtime/cpu/thread_pool.h"

// GCC (12) warns that the inlined dot/axpy tail loops could overflow for head dims near 2^62 (a false positive:
// head dims are checked and small).
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"

namespace qrig::cpu {

using detail::fail;
using detail::require;
using detail::require_ptr;
using kernels::KvFormat;

namespace {

constexpr int64_t kB = kernels::kKvRotBlock;

// In-place unnormalized Walsh-Hadamard transform of 256 values (Sylvester order), butterflies in a fixed order.
void fwht256(float* x) {
  for (int64_t h = 1; h < kB; h *= 2)
    for (int64_t i = 0; i < kB; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

void signs(int64_t layer, int64_t block, float* s) {
  for (int w = 0; w < kB / 64; ++w) {
    const uint64_t bits = kernels::kv_rotation_signs(layer, block, w);
    for (int i = 0; i < 64; ++i) s[w * 64 + i] = (bits >> i) & 1 ? -1.0f : 1.0f;
  }
}

int code_bits(KvFormat f) { return f == KvFormat::t4 ? 4 : 3; }
int64_t code_bytes(KvFormat f) { return kB * code_bits(f) / 8; }  // per 256-value vector

// Code of value j of a vector's packed codes.
int get_code(KvFormat f, const uint8_t* codes, int64_t j) {
  if (f == KvFormat::t4) return (codes[j / 2] >> ((j % 2) * 4)) & 15;
  const uint8_t* g = codes + (j / 8) * 3;
  const uint32_t word = (uint32_t)g[0] | ((uint32_t)g[1] << 8) | ((uint32_t)g[2] << 16);
  return (int)((word >> ((j % 8) * 3)) & 7);
}

void put_code(KvFormat f, uint8_t* codes, int64_t j, int c) {
  if (f == KvFormat::t4) {
    codes[j / 2] = (uint8_t)(codes[j / 2] | (c << ((j % 2) * 4)));
    return;
  }
  uint8_t* g = codes + (j / 8) * 3;
  uint32_t word = (uint32_t)g[0] | ((uint32_t)g[1] << 8) | ((uint32_t)g[2] << 16);
  word |= (uint32_t)c << ((j % 8) * 3);
  g[0] = (uint8_t)word;
  g[1] = (uint8_t)(word >> 8);
  g[2] = (uint8_t)(word >> 16);
}

float read_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t read_u16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }

// q8 block scale: amax / 127 rounded up to an fp16 (so |x| / d <= 127 and the error is at most d / 2), at most
// fp16's largest finite value (larger values then clamp to +-127 d); NaN stays NaN.
uint16_t q8_scale(float amax) {
  const float d = amax / 127.0f;
  if (std::isnan(d)) return 0x7E00;
  if (d >= 65504.0f) return 0x7BFF;
  uint16_t h = gguf::float_to_fp16(d);
  if (gguf::fp16_to_float(h) < d) ++h;  // positive finite: the next fp16 up
  return h;
}

// The levels of vector `blk` of a t row (codebook entries, without the scale), and its scale.
float t_levels(KvFormat f, const uint8_t* row, int64_t width, int64_t blk, float* lv) {
  const auto& cb = kernels::kv_codebook(f);
  const uint8_t* codes = row + blk * code_bytes(f);
  for (int64_t j = 0; j < kB; ++j) lv[j] = cb[(size_t)get_code(f, codes, j)];
  return read_f32(row + (width / kB) * code_bytes(f) + blk * 4);
}

// Values [off, off + n) of a q8 row, dequantized (off and n multiples of 32).
void q8_values(const uint8_t* row, int64_t width, int64_t off, int64_t n, float* x) {
  const int8_t* q = reinterpret_cast<const int8_t*>(row);
  const uint8_t* sc = row + width;
  for (int64_t b = off / 32; b < (off + n) / 32; ++b) {
    const float d = gguf::fp16_to_float(read_u16(sc + b * 2));
    for (int64_t i = 0; i < 32; ++i) x[b * 32 + i - off] = (float)q[b * 32 + i] * d;
  }
}

// The int8 query of attn_decode_dp4a for one (token, head): x = q * qscale (qscale = float(scale * log2 e)),
// rotated per 256-value vector for t4/t3 keys, then per block of 32: d = amax / 127 (NaN if the block holds a
// NaN), q8 = rint(x / d) clamped to +-127 (0 where d is 0).
void quantize_query(const float* qh, int64_t hd, float qscale, bool rotate, int64_t layer, int64_t kvh, int8_t* q8,
                    float* dq) {
  std::vector<float> x((size_t)hd);
  for (int64_t i = 0; i < hd; ++i) x[(size_t)i] = qh[i] * qscale;
  if (rotate)
    for (int64_t j = 0; j < hd / kB; ++j) kv_rotate(x.data() + j * kB, layer, kvh * (hd / kB) + j, x.data() + j * kB);
  for (int64_t b = 0; b < hd / 32; ++b) {
    float amax = 0.0f;
    bool bad = false;
    for (int64_t i = 0; i < 32; ++i) {
      const float v = x[(size_t)(b * 32 + i)];
      amax = std::fmax(amax, std::fabs(v));
      bad |= std::isnan(v);
    }
    const float d = bad ? NAN : amax / 127.0f;
    dq[b] = d;
    for (int64_t i = 0; i < 32; ++i) {
      const float r = d > 0.0f ? std::nearbyint(x[(size_t)(b * 32 + i)] / d) : 0.0f;  // ties to even
      q8[b * 32 + i] = (int8_t)(std::isnan(r) ? 0 : std::clamp(r, -127.0f, 127.0f));
    }
  }
}

// The log2-unit score of an int8 query against one key head (int8 values k8, per-block weights w = d_q (* d_k
// for q8 keys), t4/t3: the vectors' scales vs): per 256-value vector, lane-like quarters of two blocks each,
//   part_qt = fma(w_{2qt+1}, i_{2qt+1}, w_{2qt} * i_{2qt}),  s = (part_0 + part_1) + (part_2 + part_3),
// t4/t3: s * (vs * level scale); the vectors' sums added in order (a head of 256 is one vector: the kernel's sum).
float int8_score(const int8_t* q8, const float* dq, const int8_t* k8, const float* dk, const float* vs, int64_t hd,
                 float level_scale) {
  const int64_t nb = hd / 32;
  float sum = 0.0f;
  for (int64_t g = 0; g < (hd + kB - 1) / kB; ++g) {
    float part[4];
    for (int qt = 0; qt < 4; ++qt) {
      float f[2] = {0.0f, 0.0f}, w[2] = {0.0f, 0.0f};
      for (int h = 0; h < 2; ++h) {
        const int64_t b = 8 * g + 2 * qt + h;
        if (b >= nb) continue;
        int32_t acc = 0;
        for (int64_t i = 0; i < 32; ++i) acc += (int32_t)q8[b * 32 + i] * (int32_t)k8[b * 32 + i];
        f[h] = (float)acc;  // exact: |acc| < 2^19
        w[h] = dk ? dq[b] * dk[b] : dq[b];
      }
      part[qt] = std::fma(w[1], f[1], w[0] * f[0]);
    }
    float sg = (part[0] + part[1]) + (part[2] + part[3]);
    if (vs) sg = sg * (vs[g] * level_scale);
    sum = g == 0 ? sg : sum + sg;
  }
  return sum;
}

}  // namespace

void kv_rotate(const float* x, int64_t layer, int64_t block, float* y) {
  float s[kB];
  signs(layer, block, s);
  for (int64_t i = 0; i < kB; ++i) y[i] = s[i] * x[i];
  fwht256(y);
  for (int64_t i = 0; i < kB; ++i) y[i] *= 0.0625f;  // 1 / sqrt(256), exact
}

void kv_unrotate(const float* y, int64_t layer, int64_t block, float* x) {
  float s[kB];
  signs(layer, block, s);
  if (x != y) std::copy(y, y + kB, x);
  fwht256(x);
  for (int64_t i = 0; i < kB; ++i) x[i] *= 0.0625f * s[i];
}

void kv_quantize_row(KvFormat f, const float* x, int64_t width, int64_t layer, uint8_t* row) {
  const char* op = "kv_quantize_row";
  require(f == KvFormat::q8 || kernels::kv_format_rotated(f), op, "the format must be q8, t4 or t3");
  require(kernels::kv_width_ok(f, width), op, "the row width does not fit the format (q8: 32s, t4/t3: 256s)");
  require_ptr(x, op, "x");
  require_ptr(row, op, "row");
  std::memset(row, 0, (size_t)kernels::kv_row_bytes(f, width, true));
  if (f == KvFormat::q8) {
    int8_t* q = reinterpret_cast<int8_t*>(row);
    uint8_t* sc = row + width;
    for (int64_t b = 0; b < width / 32; ++b) {
      float amax = 0.0f;
      for (int64_t i = 0; i < 32; ++i) amax = std::isnan(x[b * 32 + i]) ? NAN : std::max(amax, std::fabs(x[b * 32 + i]));
      const uint16_t h = q8_scale(amax);
      sc[b * 2] = (uint8_t)h;
      sc[b * 2 + 1] = (uint8_t)(h >> 8);
      const float d = gguf::fp16_to_float(h);
      for (int64_t i = 0; i < 32; ++i) {
        const float r = d > 0 ? std::nearbyint(x[b * 32 + i] / d) : 0.0f;  // ties to even
        q[b * 32 + i] = (int8_t)(std::isnan(r) ? 0 : std::clamp(r, -127.0f, 127.0f));
      }
    }
    return;
  }
  const auto& cb = kernels::kv_codebook(f);
  const int levels = (int)cb.size();
  float y[kB];
  for (int64_t blk = 0; blk < width / kB; ++blk) {
    const float* xb = x + blk * kB;
    uint8_t* codes = row + blk * code_bytes(f);
    const float norm = (float)std::sqrt(detail::sum_squares(xb, kB));
    float scale = 0.0f;
    if (!std::isfinite(norm)) {
      scale = NAN;
    } else if (norm > 0) {
      kv_rotate(xb, layer, blk, y);
      const float to_unit = 16.0f / norm;  // the rotated unit vector times sqrt(256): coordinates ~ N(0, 1)
      double yc = 0, cc = 0;
      for (int64_t j = 0; j < kB; ++j) {
        const float u = y[j] * to_unit;
        int c = 0;  // levels below u: thresholds are midpoints, a value on one takes the upper level
        while (c + 1 < levels && u >= 0.5f * (cb[(size_t)c] + cb[(size_t)c + 1])) ++c;
        put_code(f, codes, j, c);
        yc += (double)y[j] * cb[(size_t)c];
        cc += (double)cb[(size_t)c] * cb[(size_t)c];
      }
      // The least-squares scale of the levels against the rotated vector: the norm, corrected for the levels'
      // own length and direction (minimizes |x - scale R^T levels|^2).
      scale = (float)(yc / cc);
    } else {
      for (int64_t j = 0; j < kB; ++j) put_code(f, codes, j, levels / 2);
    }
    std::memcpy(row + (width / kB) * code_bytes(f) + blk * 4, &scale, 4);
  }
}

void kv_dequantize_row(KvFormat f, const uint8_t* row, int64_t width, int64_t layer, float* x) {
  const char* op = "kv_dequantize_row";
  require(f == KvFormat::q8 || kernels::kv_format_rotated(f), op, "the format must be q8, t4 or t3");
  require(kernels::kv_width_ok(f, width), op, "the row width does not fit the format (q8: 32s, t4/t3: 256s)");
  require_ptr(x, op, "x");
  require_ptr(row, op, "row");
  if (f == KvFormat::q8) return q8_values(row, width, 0, width, x);
  float lv[kB];
  for (int64_t blk = 0; blk < width / kB; ++blk) {
    const float s = t_levels(f, row, width, blk, lv);
    for (int64_t j = 0; j < kB; ++j) lv[j] *= s;
    kv_unrotate(lv, layer, blk, x + blk * kB);
  }
}

void attention_gated_kv(const float* q, const KvCacheView& k, const KvCacheView& v, int64_t layer, int64_t T,
                        int64_t pos0, int64_t Hq, int64_t Hkv, int64_t hd, float scale, const float* gate,
                        int64_t gate_row_stride, int64_t gate_head_stride, float* out, bool int8_query) {
  const char* op = "attention_gated_kv";
  auto plain = [](KvFormat f) { return f == KvFormat::f32 || f == KvFormat::f16; };
  if (int8_query && plain(k.format)) fail(op, "an int8 query reads quantized (q8, t4, t3) keys");
  if (plain(k.format) && plain(v.format))
    return attention_gated(q, reinterpret_cast<const float*>(k.data), reinterpret_cast<const float*>(v.data), T,
                           pos0, Hq, Hkv, hd, scale, gate, gate_row_stride, gate_head_stride, out);
  if (T < 0 || pos0 < 0) fail(op, "T and pos0 must be non-negative");
  if (Hq <= 0 || Hkv <= 0 || hd <= 0) fail(op, "Hq, Hkv and hd must be positive");
  if (Hq % Hkv != 0) fail(op, "query heads must be a multiple of kv heads");
  require(std::isfinite(scale), op, "scale must be finite");
  const int64_t width = Hkv * hd;
  for (const KvCacheView* c : {&k, &v}) {
    if (kernels::kv_format_rotated(c->format) && hd % kB != 0)
      fail(op, std::string(kernels::kv_format_name(c->format)) + " caches need a head_dim that is a multiple of 256, not " +
                   std::to_string(hd));
    if (c->format == KvFormat::q8 && hd % 32 != 0) fail(op, "q8 caches need a head_dim that is a multiple of 32");
    if (c->row_bytes != kernels::kv_row_bytes(c->format, width, true)) fail(op, "a cache's row_bytes do not match its format");
  }
  if (T == 0) return;
  for (const void* p : {(const void*)q, (const void*)k.data, (const void*)v.data, (const void*)gate, (const void*)out})
    require_ptr(p, op, "an argument");
  const int64_t group = Hq / Hkv, n_max = pos0 + T, nb = hd / kB, items = T * Hq, row_blocks = width / kB;
  const bool k_rot = kernels::kv_format_rotated(k.format), v_rot = kernels::kv_format_rotated(v.format);

  // Per (token, head) item: the query (rotated once into the keys' domain for t4/t3 keys; with int8_query scaled
  // to log2 units and quantized), the running max and sum of the softmax, and the output accumulator (in the
  // values' rotated domain for t4/t3 values). Scores are in natural units (times scale) with the fp32 query, in
  // log2 units with the int8 one (exp2: the kernels' units).
  std::vector<float> qr(int8_query ? 0 : (size_t)(items * hd)), o((size_t)(items * hd), 0.0f), m((size_t)items, -INFINITY);
  std::vector<int8_t> q8(int8_query ? (size_t)(items * hd) : 0);
  std::vector<float> dq(int8_query ? (size_t)(items * hd / 32) : 0);
  std::vector<double> denom((size_t)items, 0.0);
  const float qscale = (float)((double)scale * 1.4426950408889634);  // what the CUDA runtime passes the kernels
  parallel_for(items, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t t = idx / Hq, h = idx % Hq, kvh = h / group;
      const float* qh = q + t * Hq * hd + h * hd;
      if (int8_query) {
        quantize_query(qh, hd, qscale, k_rot, layer, kvh, q8.data() + idx * hd, dq.data() + idx * (hd / 32));
        continue;
      }
      float* dst = qr.data() + idx * hd;
      if (k_rot)
        for (int64_t j = 0; j < nb; ++j) kv_rotate(qh + j * kB, layer, kvh * nb + j, dst + j * kB);
      else
        std::copy(qh, qh + hd, dst);
    }
  });

  // Keys and values are read a chunk of positions at a time, each row's codes expanded once per call (not once per
  // query): codebook levels and a scale per 256-value vector for t4/t3 (still rotated), values for q8/f32/f16.
  // The softmax is the online one (running max, rescaled sums) over the chunks.
  // With int8_query the keys expand to int8 (q8 as stored, t4/t3 as kv_key_levels_i8) with a scale per block of
  // 32 (q8) or per vector (t4/t3).
  constexpr int64_t kChunk = 512;
  std::vector<float> kbuf(int8_query ? 0 : (size_t)(kChunk * width)), vbuf((size_t)(kChunk * width));
  std::vector<float> kscale((size_t)(kChunk * row_blocks), 1.0f), vscale((size_t)(kChunk * row_blocks), 1.0f);
  std::vector<int8_t> kbuf8(int8_query ? (size_t)(kChunk * width) : 0);
  std::vector<float> kd8(int8_query && !k_rot ? (size_t)(kChunk * width / 32) : 0);
  const float level_scale = kernels::kv_key_level_scale(k.format);
  auto expand_keys8 = [&](int64_t p0, int64_t p1) {
    parallel_for(p1 - p0, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint8_t* row = k.data + (p0 + i) * k.row_bytes;
        int8_t* x = kbuf8.data() + i * width;
        if (!k_rot) {
          std::memcpy(x, row, (size_t)width);
          for (int64_t blk = 0; blk < width / 32; ++blk)
            kd8[(size_t)(i * (width / 32) + blk)] = gguf::fp16_to_float(read_u16(row + width + blk * 2));
          continue;
        }
        const auto& lv = kernels::kv_key_levels_i8(k.format);
        for (int64_t blk = 0; blk < row_blocks; ++blk) {
          const uint8_t* codes = row + blk * code_bytes(k.format);
          for (int64_t j = 0; j < kB; ++j) x[blk * kB + j] = lv[(size_t)get_code(k.format, codes, j)];
          kscale[(size_t)(i * row_blocks + blk)] = read_f32(row + row_blocks * code_bytes(k.format) + blk * 4);
        }
      }
    }, 16);
  };
  auto expand = [&](const KvCacheView& c, int64_t p0, int64_t p1, std::vector<float>& buf, std::vector<float>& sc) {
    parallel_for(p1 - p0, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint8_t* row = c.data + (p0 + i) * c.row_bytes;
        float* x = buf.data() + i * width;
        if (kernels::kv_format_rotated(c.format))
          for (int64_t blk = 0; blk < row_blocks; ++blk)
            sc[(size_t)(i * row_blocks + blk)] = t_levels(c.format, row, width, blk, x + blk * kB);
        else if (c.format == KvFormat::q8)
          q8_values(row, width, 0, width, x);
        else
          std::memcpy(x, row, (size_t)width * 4);
      }
    }, 16);
  };
  for (int64_t c0 = 0; c0 < n_max; c0 += kChunk) {
    const int64_t c1 = std::min(n_max, c0 + kChunk);
    if (int8_query)
      expand_keys8(c0, c1);
    else
      expand(k, c0, c1, kbuf, kscale);
    expand(v, c0, c1, vbuf, vscale);
    parallel_for(items, [&](int64_t b, int64_t e) {
      std::vector<float> scores((size_t)kChunk);
      for (int64_t idx = b; idx < e; ++idx) {
        const int64_t t = idx / Hq, h = idx % Hq, kvh = h / group;
        const int64_t end = std::min(c1, pos0 + t + 1);  // attended positions 0..pos0+t
        if (end <= c0) continue;
        float* oh = o.data() + idx * hd;
        float mc = -INFINITY;
        for (int64_t p = c0; p < end; ++p) {
          float sc = 0.0f;
          if (int8_query) {
            const int64_t kb8 = (p - c0) * width + kvh * hd;
            sc = int8_score(q8.data() + idx * hd, dq.data() + idx * (hd / 32), kbuf8.data() + kb8,
                            k_rot ? nullptr : kd8.data() + kb8 / 32,
                            k_rot ? kscale.data() + (p - c0) * row_blocks + kvh * nb : nullptr, hd, level_scale);
          } else {
            const float* qh = qr.data() + idx * hd;
            const float* kr = kbuf.data() + (p - c0) * width + kvh * hd;
            if (k_rot)
              for (int64_t j = 0; j < nb; ++j)
                sc += kscale[(size_t)((p - c0) * row_blocks + kvh * nb + j)] * detail::dot(qh + j * kB, kr + j * kB, kB);
            else
              sc = detail::dot(qh, kr, hd);
            sc *= scale;
          }
          scores[(size_t)(p - c0)] = sc;
          mc = std::max(mc, sc);
        }
        auto expf_ = [&](float x) { return int8_query ? std::exp2(x) : std::exp(x); };
        const float mn = std::max(m[(size_t)idx], mc);
        if (m[(size_t)idx] != mn && m[(size_t)idx] != -INFINITY) {  // rescale what earlier chunks summed
          const float f = expf_(m[(size_t)idx] - mn);
          denom[(size_t)idx] *= f;
          detail::scale(f, oh, hd);
        }
        m[(size_t)idx] = mn;
        for (int64_t p = c0; p < end; ++p) {
          const float w = expf_(scores[(size_t)(p - c0)] - mn);
          denom[(size_t)idx] += w;
          const float* vr = vbuf.data() + (p - c0) * width + kvh * hd;
          if (v_rot)
            for (int64_t j = 0; j < nb; ++j)
              detail::axpy(w * vscale[(size_t)((p - c0) * row_blocks + kvh * nb + j)], vr + j * kB, oh + j * kB, kB);
          else
            detail::axpy(w, vr, oh, hd);
        }
      }
    });
  }

  parallel_for(items, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t t = idx / Hq, h = idx % Hq, kvh = h / group;
      float* oh = o.data() + idx * hd;
      if (v_rot)  // once per (token, head): back from the values' rotated domain
        for (int64_t j = 0; j < nb; ++j) kv_unrotate(oh + j * kB, layer, kvh * nb + j, oh + j * kB);
      const double inv = 1.0 / denom[(size_t)idx];
      const float* gh = gate + t * gate_row_stride + h * gate_head_stride;
      float* dst = out + t * Hq * hd + h * hd;
      for (int64_t i = 0; i < hd; ++i) dst[i] = static_cast<float>(oh[i] * inv) * detail::sigmoid(gh[i]);
    }
  });
}

}  // namespace qrig::cpu
