// The block formats of quant_blocks.cpp (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS): dequantization of
// random blocks equals a second, independent transcription of llama.cpp's reference formulas written here value
// by value (where the library loops over the output, this derives each value's bits from its index), bit for
// bit; NaN/inf scales are refused by check_blocks naming the block; shapes that are not whole blocks and tensor
// data cut short are reader errors naming the tensor.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"

using namespace qrig;
using gguf::TensorType;
using Catch::Matchers::Contains;

namespace {

uint16_t u16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
float h(const uint8_t* p) { return gguf::fp16_to_float(u16(p)); }
const int kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The K-quants' 6-bit scale / min pairs, sub-block j of 8, from the 12 packed bytes.
void k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] % 64;
    m = s[j + 4] % 64;
  } else {
    sc = s[j + 4] % 16 + 16 * (s[j - 4] / 64);
    m = s[j + 4] / 16 + 16 * (s[j] / 64);
  }
}

// Value i of one block, the reference formula for it.
float ref_value(TensorType t, const uint8_t* b, int i) {
  switch (t) {
    case TensorType::Q4_0: {
      const int q = i < 16 ? b[2 + i] % 16 : b[2 + i - 16] / 16;
      return (float)(q - 8) * h(b);
    }
    case TensorType::Q4_1: {
      const int q = i < 16 ? b[4 + i] % 16 : b[4 + i - 16] / 16;
      return (float)q * h(b) + h(b + 2);
    }
    case TensorType::Q5_0:
    case TensorType::Q5_1: {
      const bool one = t == TensorType::Q5_1;
      const uint8_t* qh = b + (one ? 4 : 2);
      const uint8_t* qs = qh + 4;
      const int lo = i < 16 ? qs[i] % 16 : qs[i - 16] / 16;
      const int hi = (qh[i / 8] >> (i % 8)) & 1;  // bit i of the little-endian 32-bit qh
      const int q = lo + 16 * hi;
      return one ? (float)q * h(b) + h(b + 2) : (float)(q - 16) * h(b);
    }
    case TensorType::Q2_K: {
      const int half = i / 128, g = (i % 128) / 32, l = i % 32;
      const int q = (b[16 + half * 32 + l] >> (2 * g)) & 3;
      const int sc = b[half * 8 + g * 2 + l / 16];
      const float dl = h(b + 80) * (float)(sc % 16), ml = h(b + 82) * (float)(sc / 16);
      return dl * (float)q - ml;
    }
    case TensorType::Q3_K: {
      const int half = i / 128, g = (i % 128) / 32, l = i % 32;
      const int lo2 = (b[32 + half * 32 + l] >> (2 * g)) & 3;
      const bool high = (b[l] >> (half * 4 + g)) & 1;
      const int j = half * 8 + g * 2 + l / 16;  // scale index
      const uint8_t* s = b + 96;
      const int sc6 = (j < 8 ? s[j] % 16 : s[j - 8] / 16) + 16 * ((s[8 + j % 4] >> (2 * (j / 4))) & 3);
      return h(b + 108) * (float)(sc6 - 32) * (float)(lo2 - (high ? 0 : 4));
    }
    case TensorType::Q4_K:
    case TensorType::Q5_K: {
      const bool five = t == TensorType::Q5_K;
      const int c = i / 64, upper = (i % 64) / 32, l = i % 32;
      const uint8_t* qs = b + (five ? 48 : 16);
      int q = upper ? qs[c * 32 + l] / 16 : qs[c * 32 + l] % 16;
      if (five) q += 16 * ((b[16 + l] >> (2 * c + upper)) & 1);
      int sc, m;
      k4(b + 4, 2 * c + upper, sc, m);
      return h(b) * (float)sc * (float)q - h(b + 2) * (float)m;
    }
    case TensorType::Q6_K: {
      const int half = i / 128, g = (i % 128) / 32, l = i % 32;
      const uint8_t qlb = b[half * 64 + (g % 2) * 32 + l];
      const int lo = g < 2 ? qlb % 16 : qlb / 16;
      const int hi = (b[128 + half * 32 + l] >> (2 * g)) & 3;
      const int sc = (int8_t)b[192 + half * 8 + g * 2 + l / 16];
      return h(b + 208) * (float)sc * (float)(lo + 16 * hi - 32);
    }
    case TensorType::IQ4_NL: {
      const int q = i < 16 ? b[2 + i] % 16 : b[2 + i - 16] / 16;
      return h(b) * (float)kLevels[q];
    }
    case TensorType::IQ4_XS: {
      const int ib = i / 32, r = i % 32;
      const uint8_t qb = b[8 + ib * 16 + r % 16];
      const int q = r < 16 ? qb % 16 : qb / 16;
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) % 16) + 16 * ((u16(b + 2) >> (2 * ib)) & 3);
      return h(b) * (float)(ls - 32) * (float)kLevels[q];
    }
    default:
      throw std::logic_error("no reference for this type");
  }
}

struct Case {
  TensorType type;
  std::vector<int> scale_offsets;  // fp16 scales in a block
};
const Case kCases[] = {
    {TensorType::Q4_0, {0}},      {TensorType::Q4_1, {0, 2}},  {TensorType::Q5_0, {0}},
    {TensorType::Q5_1, {0, 2}},   {TensorType::Q2_K, {80, 82}}, {TensorType::Q3_K, {108}},
    {TensorType::Q4_K, {0, 2}},   {TensorType::Q5_K, {0, 2}},  {TensorType::Q6_K, {208}},
    {TensorType::IQ4_NL, {0}},    {TensorType::IQ4_XS, {0}},   {TensorType::Q8_0, {0}},
};

const gguf::TypeTraits& traits(TensorType t) { return *gguf::type_traits((uint32_t)t); }

// Random bytes with every scale a random finite fp16 of either sign (normal or subnormal), some zero.
std::vector<uint8_t> random_blocks(const Case& c, size_t blocks, std::mt19937& rng) {
  const gguf::TypeTraits& tr = traits(c.type);
  std::vector<uint8_t> b(blocks * tr.block_bytes);
  for (auto& x : b) x = (uint8_t)rng();
  for (size_t k = 0; k < blocks; ++k)
    for (int off : c.scale_offsets) {
      uint16_t v = (uint16_t)rng();
      if ((v & 0x7c00) == 0x7c00) v &= 0xbfff;  // inf/NaN exponent -> a finite one
      if (rng() % 16 == 0) v = 0;
      std::memcpy(&b[k * tr.block_bytes + off], &v, 2);
    }
  return b;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("block formats: the traits are llama.cpp's block sizes and bytes", "[gguf]") {
  struct T { TensorType t; uint32_t elems, bytes; };
  for (T x : {T{TensorType::Q4_0, 32, 18}, T{TensorType::Q4_1, 32, 20}, T{TensorType::Q5_0, 32, 22},
              T{TensorType::Q5_1, 32, 24}, T{TensorType::Q8_0, 32, 34}, T{TensorType::Q2_K, 256, 84},
              T{TensorType::Q3_K, 256, 110}, T{TensorType::Q4_K, 256, 144}, T{TensorType::Q5_K, 256, 176},
              T{TensorType::Q6_K, 256, 210}, T{TensorType::IQ4_NL, 32, 18}, T{TensorType::IQ4_XS, 256, 136}}) {
    INFO(gguf::tensor_type_name(x.t));
    CHECK(traits(x.t).block_elems == x.elems);
    CHECK(traits(x.t).block_bytes == x.bytes);
    CHECK(gguf::can_dequantize(x.t));
    CHECK_THAT(gguf::dequantizable_types(), Contains(gguf::tensor_type_name(x.t)));
  }
  for (TensorType t : {TensorType::IQ2_XXS, TensorType::IQ3_S, TensorType::IQ1_M, TensorType::TQ1_0,
                       TensorType::MXFP4, TensorType::Q8_K}) {
    CHECK_FALSE(gguf::can_dequantize(t));
    std::vector<uint8_t> b(traits(t).block_bytes);
    std::vector<float> y(traits(t).block_elems);
    CHECK_THROWS_WITH(gguf::dequantize(t, b.data(), y.data(), y.size()), Contains(gguf::tensor_type_name(t)));
  }
}

TEST_CASE("block formats: dequantize equals the reference formulas bit for bit on random blocks", "[gguf]") {
  std::mt19937 rng(12);
  for (const Case& c : kCases) {
    if (c.type == TensorType::Q8_0) continue;  // test_gguf_quant.cpp
    const gguf::TypeTraits& tr = traits(c.type);
    INFO(tr.name);
    const size_t blocks = 64;
    const std::vector<uint8_t> b = random_blocks(c, blocks, rng);
    std::vector<float> y(blocks * tr.block_elems, NAN);
    gguf::dequantize(c.type, b.data(), y.data(), y.size());
    size_t wrong = 0, nonzero = 0;
    for (size_t k = 0; k < blocks; ++k)
      for (int i = 0; i < (int)tr.block_elems; ++i) {
        const float want = ref_value(c.type, b.data() + k * tr.block_bytes, i);
        const float got = y[k * tr.block_elems + i];
        if (bits(want) != bits(got) && !(want == 0 && got == 0)) {
          if (wrong++ < 4) UNSCOPED_INFO("block " << k << " value " << i << ": " << got << " want " << want);
        }
        nonzero += got != 0;
      }
    CHECK(wrong == 0);
    CHECK(nonzero > y.size() / 2);  // the blocks exercised real values
    // Part of a row: any whole number of blocks from a block boundary.
    std::vector<float> part(3 * tr.block_elems, NAN);
    gguf::dequantize(c.type, b.data() + 5 * tr.block_bytes, part.data(), part.size());
    CHECK(std::memcmp(part.data(), y.data() + 5 * tr.block_elems, part.size() * 4) == 0);
    CHECK_THROWS_WITH(gguf::dequantize(c.type, b.data(), y.data(), tr.block_elems + 16),
                      Contains(tr.name) && Contains("multiple"));
  }
}

TEST_CASE("block formats: the extreme codes of every field decode as the formulas say", "[gguf]") {
  // All-ones and all-zero bit patterns (every nibble 15 or 0, every high bit set or not) with scale 1.0.
  for (const Case& c : kCases) {
    if (c.type == TensorType::Q8_0) continue;
    const gguf::TypeTraits& tr = traits(c.type);
    INFO(tr.name);
    for (uint8_t fill : {(uint8_t)0x00, (uint8_t)0xff, (uint8_t)0x55, (uint8_t)0xaa}) {
      std::vector<uint8_t> b(tr.block_bytes, fill);
      for (int off : c.scale_offsets) { b[off] = 0x00; b[off + 1] = 0x3c; }  // 1.0
      std::vector<float> y(tr.block_elems);
      gguf::dequantize(c.type, b.data(), y.data(), y.size());
      for (int i = 0; i < (int)tr.block_elems; ++i) REQUIRE(y[i] == ref_value(c.type, b.data(), i));
    }
  }
}

TEST_CASE("block formats: check_blocks refuses NaN and infinite scales, naming the block", "[gguf]") {
  std::mt19937 rng(7);
  for (const Case& c : kCases) {
    const gguf::TypeTraits& tr = traits(c.type);
    INFO(tr.name);
    const size_t blocks = 9;
    std::vector<uint8_t> b = random_blocks(c, blocks, rng);
    const size_t n = blocks * tr.block_elems;
    CHECK_NOTHROW(gguf::check_blocks(c.type, b.data(), n, "w"));
    for (int off : c.scale_offsets)
      for (uint16_t bad : {(uint16_t)0x7c00, (uint16_t)0xfc00, (uint16_t)0x7e00, (uint16_t)0xfc01}) {
        std::vector<uint8_t> x = b;
        std::memcpy(&x[6 * tr.block_bytes + off], &bad, 2);
        const bool nan = (bad & 0x3ff) != 0;
        CHECK_THROWS_WITH(gguf::check_blocks(c.type, x.data(), n, "weight 'w'"),
                          Contains("weight 'w'") && Contains(tr.name) && Contains("block 6") &&
                              Contains(nan ? "NaN" : "infinite") && Contains("corrupt"));
      }
    CHECK_THROWS_WITH(gguf::check_blocks(c.type, b.data(), tr.block_elems + 1, "w"), Contains("blocks"));
  }
  // Plain types carry no scales: nothing to check.
  std::vector<uint8_t> f(64, 0xff);
  CHECK_NOTHROW(gguf::check_blocks(TensorType::F16, f.data(), 32, "w"));
}

TEST_CASE("block formats: rows that are not whole blocks and data cut short are reader errors", "[gguf]") {
  for (const Case& c : kCases) {
    const gguf::TypeTraits& tr = traits(c.type);
    INFO(tr.name);
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::of_str("test"));
    std::mt19937 rng(3);
    w.add_tensor("blk.0.ffn_up.weight", c.type, {tr.block_elems * 2, 3}, random_blocks(c, 6, rng));
    std::vector<uint8_t> bytes = w.to_bytes();
    const gguf::File ok = gguf::File::from_bytes(bytes.data(), bytes.size());
    CHECK(ok.tensor("blk.0.ffn_up.weight").n_bytes == 6 * tr.block_bytes);
    // Cut inside the tensor data (half a block before its end; the file may end in padding).
    const size_t end = ok.data_offset() + ok.tensor("blk.0.ffn_up.weight").offset + 6 * tr.block_bytes;
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + (long)(end - tr.block_bytes / 2));
    CHECK_THROWS_WITH(gguf::File::from_bytes(cut.data(), cut.size()),
                      Contains("truncated") && Contains("blk.0.ffn_up.weight"));
    // A row length that is not a multiple of the block: patch ne[0] (the first u64 after the name).
    const std::string name = "blk.0.ffn_up.weight";
    auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end()) - bytes.begin();
    const size_t ne0 = (size_t)at + name.size() + 4;  // after the u32 dimension count
    uint64_t odd = tr.block_elems * 2 - 16;
    std::vector<uint8_t> bad = bytes;
    std::memcpy(&bad[ne0], &odd, 8);
    CHECK_THROWS_WITH(gguf::File::from_bytes(bad.data(), bad.size()),
                      Contains("not a multiple") && Contains(tr.name) && Contains(name));
  }
}
