// Internal to gguf/: the block formats' dequantization (quant_blocks.cpp), which dequantize() (quant.cpp)
// dispatches to. Everyone else calls dequantize() / check_blocks() of gguf.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf/gguf.h"

namespace qrig::gguf {

// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS (Q8_0 lives in quant.cpp).
bool is_block_type(TensorType t);
// n values (a multiple of the type's block) from whole blocks at src.
void dequantize_blocks(TensorType type, const uint8_t* src, float* dst, size_t n);

}  // namespace qrig::gguf
