// Host halves of the GPU's int8 data layouts (plain C++, no CUDA): Q8_0 weights repacked at load time, and
// the reference of the activation quantization kernel (templates/quant_act_q8.cu), bit-exact with it.
//
// GGUF Q8_0 stores 34-byte blocks (fp16 scale + 32 int8), so no row or block is 16-byte aligned. The GPU
// keeps a matrix [rows][cols] as two arrays instead: qs int8 [rows][cols] (row r, block b at r*cols + 32*b:
// 16-byte aligned when cols % 16 == 0) and scales fp16 [rows][cols/32]: the same bytes, but every 16-byte
// load of the kernels is aligned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qrig::cuda {

// Bytes of each array of a repacked [rows][cols] matrix.
inline size_t q8_qs_bytes(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)cols; }
inline size_t q8_scale_bytes(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)(cols / 32) * 2; }

// GGUF Q8_0 rows (rows * cols/32 blocks of 34 bytes) -> qs + scales. cols must be a positive multiple of 32
// (KernelError otherwise).
void repack_q8_0(const uint8_t* gguf_q8_0, int64_t rows, int64_t cols, int8_t* qs, uint16_t* scales);

// The GGUF block types other than Q8_0 (kernels/matmul.h wq_layout): every block of a [rows][cols] matrix of
// type `ggml_type` split into its quant bytes (to a: a_bytes per block, 16-byte aligned) and the rest (to b), in
// block order; rows * cols / block_values blocks each. KernelError for another type or a shape that is not whole
// blocks.
void repack_wq(int64_t ggml_type, const uint8_t* gguf_blocks, int64_t rows, int64_t cols, uint8_t* a, uint8_t* b);

// The activation quantization of quant_act_q8, on the host: per 32 consecutive values, d = amax / 127,
// q = clamp(roundf(x * (1 / d)), -127, 127) (all in fp32); d = 0 and q = 0 for an all-zero block; d = NaN
// and q = 0 when the block holds a NaN or an infinity. n must be a multiple of 32. With q2, also the second
// plane of two-plane ("p2") activations (cpu::quantize_q8_activation says how).
void quantize_activation_q8(const float* x, int64_t n, int8_t* q, float* d, int8_t* q2 = nullptr);

// q * d per value, or d * (q + q2 * (1/254)) with a second plane (what the GPU matmul effectively multiplies
// the weights with).
std::vector<float> dequantize_activation_q8(const int8_t* q, const float* d, int64_t n, const int8_t* q2 = nullptr);

}  // namespace qrig::cuda
