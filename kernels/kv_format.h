// The element formats of the key and value caches, keys and values chosen separately (docs/kv-cache.md):
//   f32  fp32 values (the CPU reference's exact cache);
//   f16  fp16 values (the GPU family's cache; the CPU holds them as fp32 values rounded to fp16);
//   q8   int8 per value and an fp16 scale per 32 values (amax / 127, rounded up to fp16: ~8.5 bits);
//   t4   per head vector of 256 values: one fp32 scale and a 4-bit code per coordinate of the vector rotated by a
//        fixed random-sign Walsh-Hadamard transform, the codes indexing the 16-level Lloyd-Max codebook of the
//        standard Gaussian (~4.1 bits);
//   t3   the same with 3-bit codes and the 8-level codebook (~3.1 bits).
// This file holds what the compiler (bytes per token), the CPU reference ops and the GPU kernels must agree on:
// the names, the byte layout of a cache row, the codebooks and the rotation's signs. It includes nothing of qrig.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qrig::kernels {

enum class KvFormat { f32, f16, q8, t4, t3 };

const char* kv_format_name(KvFormat f);                       // "f32", "f16", "q8", "t4", "t3"
std::optional<KvFormat> parse_kv_format(std::string_view s);  // nullopt for anything else
int kv_format_bits(KvFormat f);                               // 32, 16, 8, 4, 3 (the digits of "k8v3")
bool kv_format_rotated(KvFormat f);                           // t4, t3

// A key format and a value format, spelled "k<bits>v<bits>" (k16v16, k8v3, k3v3; k32v32 for f32).
struct KvPair {
  KvFormat k = KvFormat::f16, v = KvFormat::f16;
  bool operator==(const KvPair&) const = default;
};
std::string kv_pair_name(KvPair p);
std::optional<KvPair> parse_kv_pair(std::string_view s);  // nullopt for a spelling that names no formats

constexpr int64_t kKvQ8Block = 32;      // q8: values per scale
constexpr int64_t kKvRotBlock = 256;    // t4/t3: values per rotated vector (a head of head_dim 256)
constexpr int64_t kKvRowAlign = 16;     // quantized rows are padded to 16 bytes (aligned vector loads)

// Bytes of one cache row (one position: `width` = kv_heads x head_dim values) as stored. `cpu`: the CPU backend,
// which holds f16 rows as fp32 values (4 bytes each) and quantized rows in exactly the GPU's layout:
//   q8:    width int8 values, then width/32 fp16 scales; padded to 16 bytes;
//   t4/t3: the codes of each 256-value vector in turn (t4: 128 bytes, value 2i in the low nibble of byte i;
//          t3: 96 bytes, each 8 values as a 24-bit little-endian word, value j at bits 3j..3j+2), then one fp32
//          scale per vector; padded to 16 bytes.
// Throws std::invalid_argument for a width the format cannot store (q8: a multiple of 32; t4/t3: of 256).
int64_t kv_row_bytes(KvFormat f, int64_t width, bool cpu);
// Whether kv_row_bytes takes this width.
bool kv_width_ok(KvFormat f, int64_t width);

// The Lloyd-Max codebook of N(0, 1) for t4 (16 levels) and t3 (8 levels), ascending and symmetric; the decision
// thresholds are the midpoints of neighbours (a value exactly on one takes the upper level). Empty for others.
const std::vector<float>& kv_codebook(KvFormat f);
// The optimum's mean squared error for N(0, 1) at that many levels (Max 1960: 0.03455 for 8, 0.009497 for 16).
double kv_codebook_mse(KvFormat f);

// The int8 levels of t4 and t3 keys for attention with an int8 query (dp4a over the key codes: the plan's
// query_int8_tokens, docs/kv-cache.md): level c is approximated by kv_key_levels_i8(f)[c] * kv_key_level_scale(f),
// the integers and the scale that minimise the squared error weighted by the levels' probabilities under N(0, 1)
// (1.1e-6 for t3 and 1.0e-5 for t4 per unit coordinate, against the codes' own 0.035 and 0.0095). The GPU's copy
// is templates/qrig_kv.cuh's QRIG_KV_KEY_I8_T3/T4. Empty (and 0) for other formats.
const std::vector<int8_t>& kv_key_levels_i8(KvFormat f);
float kv_key_level_scale(KvFormat f);

// The rotation of vector `head` (the kv head) of layer `layer`: R x = H (s * x) / 16, H the 256 x 256 Sylvester
// Hadamard matrix (H[i][j] = (-1)^popcount(i & j)), s[i] = -1 where bit i % 64 of kv_rotation_signs(layer,
// head, i / 64) is set. R is orthogonal and its own transpose's inverse: R^T y = s * (H y) / 16.
// Keys and values of one (layer, head) share the rotation.
uint64_t kv_rotation_signs(int64_t layer, int64_t head, int word);

}  // namespace qrig::kernels
