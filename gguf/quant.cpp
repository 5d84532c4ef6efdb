// Conversions between GGUF storage types and float: F32, F16, BF16 and Q8_0 here, the other block formats
// (K-quants, legacy 4/5-bit, IQ4) in quant_blocks.cpp, dispatched from dequantize().
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "gguf/gguf.h"
#include "gguf/quant_blocks.h"

namespace qrig::gguf {

float fp16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { ++e; man <<= 1; } while ((man & 0x400) == 0);
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));  // inf / nan
  if (absx >= 0x477ff000) return (uint16_t)(sign | 0x7c00);                                     // overflow
  if (absx < 0x38800000) {  // subnormal or zero in half: round to nearest even
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;  // 2^24: one half subnormal ulp = 2^-24
    uint32_t m = (uint32_t)std::nearbyint(scaled);
    return (uint16_t)(sign | m);
  }
  uint32_t exp = ((absx >> 23) - 127 + 15);
  uint32_t man = absx & 0x7fffff;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // round to nearest even (may carry into exp)
  return (uint16_t)(sign | h);
}

float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool can_dequantize(TensorType t) {
  return t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16 || t == TensorType::Q8_0 ||
         is_block_type(t);
}

const char* dequantizable_types() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";
}

void dequantize(TensorType type, const uint8_t* src, float* dst, size_t n) {
  switch (type) {
    case TensorType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case TensorType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = fp16_to_float(h);
      }
      return;
    case TensorType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_float(h);
      }
      return;
    case TensorType::Q8_0: {
      if (n % kQ8_0Block) throw Error(fmt::format("Q8_0 dequantize of {} values (not a multiple of 32)", n));
      for (size_t b = 0; b < n / kQ8_0Block; ++b) {
        const uint8_t* blk = src + b * kQ8_0Bytes;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        float d = fp16_to_float(h);
        const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
        for (size_t k = 0; k < kQ8_0Block; ++k) dst[b * kQ8_0Block + k] = d * (float)q[k];
      }
      return;
    }
    default:
      if (is_block_type(type)) return dequantize_blocks(type, src, dst, n);
      throw Error(fmt::format("tensor type {} is not supported yet (supported: {})", tensor_type_name(type),
                              dequantizable_types()));
  }
}

void quantize_q8_0(const float* src, uint8_t* dst, size_t n) {
  if (n % kQ8_0Block) throw Error(fmt::format("Q8_0 quantize of {} values (not a multiple of 32)", n));
  for (size_t b = 0; b < n / kQ8_0Block; ++b) {
    const float* x = src + b * kQ8_0Block;
    float amax = 0;
    for (size_t k = 0; k < kQ8_0Block; ++k) amax = std::fmax(amax, std::fabs(x[k]));
    float d = amax / 127.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    uint16_t h = float_to_fp16(d);
    uint8_t* blk = dst + b * kQ8_0Bytes;
    std::memcpy(blk, &h, 2);
    for (size_t k = 0; k < kQ8_0Block; ++k) {
      float v = std::nearbyint(x[k] * id);
      v = std::fmin(127.0f, std::fmax(-127.0f, v));
      blk[2 + k] = (uint8_t)(int8_t)v;
    }
  }
}

}  // namespace qrig::gguf
