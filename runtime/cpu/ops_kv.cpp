// Quantized key and value caches on the CPU: the rotation, quantize / dequantize of a cache row (q8, t4, t3), and
// gated attention over caches of any format, computed the way the GPU kernels are designed to (keys scored and
// values accumulated in the rotated domain, the query rotated once and the output rotated back once). The
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
                        int64_t gate_row_stride, int64_t gate_head_stride, float* out) {
  const char* op = "attention_gated_kv";
  auto plain = [](KvFormat f) { return f == KvFormat::f32 || f == KvFormat::f16; };
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

  // Per (token, head) item: the query (rotated once into the keys' domain for t4/t3 keys), the running max and
  // sum of the softmax, and the output accumulator (in the values' rotated domain for t4/t3 values).
  std::vector<float> qr((size_t)(items * hd)), o((size_t)(items * hd), 0.0f), m((size_t)items, -INFINITY);
  std::vector<double> denom((size_t)items, 0.0);
  parallel_for(items, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t t = idx / Hq, h = idx % Hq, kvh = h / group;
      const float* qh = q + t * Hq * hd + h * hd;
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
  constexpr int64_t kChunk = 512;
  std::vector<float> kbuf((size_t)(kChunk * width)), vbuf((size_t)(kChunk * width));
  std::vector<float> kscale((size_t)(kChunk * row_blocks), 1.0f), vscale((size_t)(kChunk * row_blocks), 1.0f);
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
    expand(k, c0, c1, kbuf, kscale);
    expand(v, c0, c1, vbuf, vscale);
    parallel_for(items, [&](int64_t b, int64_t e) {
      std::vector<float> scores((size_t)kChunk);
      for (int64_t idx = b; idx < e; ++idx) {
        const int64_t t = idx / Hq, h = idx % Hq, kvh = h / group;
        const int64_t end = std::min(c1, pos0 + t + 1);  // attended positions 0..pos0+t
        if (end <= c0) continue;
        const float* qh = qr.data() + idx * hd;
        float* oh = o.data() + idx * hd;
        float mc = -INFINITY;
        for (int64_t p = c0; p < end; ++p) {
          const float* kr = kbuf.data() + (p - c0) * width + kvh * hd;
          float sc = 0.0f;
          if (k_rot)
            for (int64_t j = 0; j < nb; ++j)
              sc += kscale[(size_t)((p - c0) * row_blocks + kvh * nb + j)] * detail::dot(qh + j * kB, kr + j * kB, kB);
          else
            sc = detail::dot(qh, kr, hd);
          scores[(size_t)(p - c0)] = sc * scale;
          mc = std::max(mc, scores[(size_t)(p - c0)]);
        }
        const float mn = std::max(m[(size_t)idx], mc);
        if (m[(size_t)idx] != mn && m[(size_t)idx] != -INFINITY) {  // rescale what earlier chunks summed
          const float f = std::exp(m[(size_t)idx] - mn);
          denom[(size_t)idx] *= f;
          detail::scale(f, oh, hd);
        }
        m[(size_t)idx] = mn;
        for (int64_t p = c0; p < end; ++p) {
          const float w = std::exp(scores[(size_t)(p - c0)] - mn);
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
