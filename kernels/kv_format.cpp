// KV cache formats: names, row layout, codebooks, rotation signs (kv_format.h; the choices in docs/kv-cache.md).
#include "kernels/kv_format.h"

#include <stdexcept>
#include <string>

namespace qrig::kernels {

const char* kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::f32: return "f32";
    case KvFormat::f16: return "f16";
    case KvFormat::q8: return "q8";
    case KvFormat::t4: return "t4";
    case KvFormat::t3: return "t3";
  }
  return "?";
}

std::optional<KvFormat> parse_kv_format(std::string_view s) {
  for (KvFormat f : {KvFormat::f32, KvFormat::f16, KvFormat::q8, KvFormat::t4, KvFormat::t3})
    if (s == kv_format_name(f)) return f;
  return std::nullopt;
}

int kv_format_bits(KvFormat f) {
  switch (f) {
    case KvFormat::f32: return 32;
    case KvFormat::f16: return 16;
    case KvFormat::q8: return 8;
    case KvFormat::t4: return 4;
    case KvFormat::t3: return 3;
  }
  return 0;
}

bool kv_format_rotated(KvFormat f) { return f == KvFormat::t4 || f == KvFormat::t3; }

std::string kv_pair_name(KvPair p) {
  return "k" + std::to_string(kv_format_bits(p.k)) + "v" + std::to_string(kv_format_bits(p.v));
}

std::optional<KvPair> parse_kv_pair(std::string_view s) {
  auto from_bits = [](std::string_view b) -> std::optional<KvFormat> {
    for (KvFormat f : {KvFormat::f32, KvFormat::f16, KvFormat::q8, KvFormat::t4, KvFormat::t3})
      if (b == std::to_string(kv_format_bits(f))) return f;
    return std::nullopt;
  };
  if (s.size() < 4 || s[0] != 'k') return std::nullopt;
  const size_t v = s.find('v');
  if (v == std::string_view::npos) return std::nullopt;
  auto k = from_bits(s.substr(1, v - 1)), val = from_bits(s.substr(v + 1));
  if (!k || !val) return std::nullopt;
  return KvPair{*k, *val};
}

bool kv_width_ok(KvFormat f, int64_t width) {
  if (width <= 0) return false;
  if (f == KvFormat::q8) return width % kKvQ8Block == 0;
  if (kv_format_rotated(f)) return width % kKvRotBlock == 0;
  return true;
}

int64_t kv_row_bytes(KvFormat f, int64_t width, bool cpu) {
  if (!kv_width_ok(f, width))
    throw std::invalid_argument(std::string("a ") + kv_format_name(f) + " cache row cannot hold " +
                                std::to_string(width) + " values (q8: a multiple of 32, t4/t3: of 256)");
  auto pad = [](int64_t b) { return (b + kKvRowAlign - 1) / kKvRowAlign * kKvRowAlign; };
  switch (f) {
    case KvFormat::f32: return width * 4;
    case KvFormat::f16: return width * (cpu ? 4 : 2);
    case KvFormat::q8: return pad(width + width / kKvQ8Block * 2);
    case KvFormat::t4: return pad(width / 2 + width / kKvRotBlock * 4);
    case KvFormat::t3: return pad(width * 3 / 8 + width / kKvRotBlock * 4);
  }
  return 0;
}

const std::vector<float>& kv_codebook(KvFormat f) {
  // Lloyd-Max levels of N(0, 1), computed by iterating the centroid and midpoint conditions to convergence
  // (double precision; their mean squared errors 0.0345478 and 0.0095010 reproduce Max's table).
  static const std::vector<float> c8 = {-2.151945705f, -1.343909279f, -0.756005281f, -0.245094179f,
                                        0.245094179f,  0.756005281f,  1.343909279f,  2.151945705f};
  static const std::vector<float> c16 = {
      -2.732589571f, -2.069017227f, -1.618046386f, -1.256231197f, -0.942340456f, -0.656759119f,
      -0.388048299f, -0.128395030f, 0.128395030f,  0.388048299f,  0.656759119f,  0.942340456f,
      1.256231197f,  1.618046386f,  2.069017227f,  2.732589571f};
  static const std::vector<float> none;
  return f == KvFormat::t3 ? c8 : f == KvFormat::t4 ? c16 : none;
}

const std::vector<int8_t>& kv_key_levels_i8(KvFormat f) {
  // Found by scanning the scale over [0.5, 1] x 127 / (largest level), rounding each level, and taking the
  // least-squares scale of those integers under the levels' cell probabilities (the smallest weighted error).
  static const std::vector<int8_t> t3 = {-88, -55, -31, -10, 10, 31, 55, 88};
  static const std::vector<int8_t> t4 = {-104, -79, -62, -48, -36, -25, -15, -5, 5, 15, 25, 36, 48, 62, 79, 104};
  static const std::vector<int8_t> none;
  return f == KvFormat::t3 ? t3 : f == KvFormat::t4 ? t4 : none;
}

float kv_key_level_scale(KvFormat f) {
  return f == KvFormat::t3 ? 0.024434783802002077f : f == KvFormat::t4 ? 0.026168606450098948f : 0.0f;
}

double kv_codebook_mse(KvFormat f) { return f == KvFormat::t3 ? 0.03455 : f == KvFormat::t4 ? 0.009497 : 0.0; }

uint64_t kv_rotation_signs(int64_t layer, int64_t head, int word) {
  // splitmix64 of (layer, head, word) packed without overlap (layer < 2^40, head < 2^20, word < 4).
  uint64_t z = ((uint64_t)layer << 22) ^ ((uint64_t)head << 2) ^ (uint64_t)word;
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace qrig::kernels
