// Q8_0 repacking and the host reference of activation quantization (see q8_layout.h).
#include "runtime/cuda/q8_layout.h"
#include "runtime/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/matmul.h"
#include "runtime/cuda/variant.h"

namespace qrig::cuda {

void repack_q8_0(const uint8_t* src, int64_t rows, int64_t cols, int8_t* qs, uint16_t* scales) {
  if (rows <= 0 || cols <= 0 || cols % 32 != 0)
    throw KernelError(fmt::format("repack_q8_0: shape [{}][{}] is not rows x a positive multiple of 32", rows, cols));
  if (!src || !qs || !scales) throw KernelError("repack_q8_0: null buffer");
  const size_t blocks = (size_t)rows * (size_t)(cols / 32);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = src + b * 34;
    std::memcpy(&scales[b], blk, 2);
    std::memcpy(qs + b * 32, blk + 2, 32);
  }
}

void repack_wq(int64_t ggml_type, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* a, uint8_t* b) {
  const kernels::WqLayout l = kernels::wq_layout(ggml_type);
  if (rows <= 0 || cols <= 0 || cols % l.block_values != 0)
    throw KernelError(fmt::format("repack_wq: shape [{}][{}] is not rows of whole {}-value blocks", rows, cols,
                                  l.block_values));
  if (!src || !a || !b) throw KernelError("repack_wq: null buffer");
  const size_t blocks = (size_t)rows * (size_t)(cols / l.block_values), bb = (size_t)l.b_bytes();
  const size_t ab = (size_t)l.a_bytes, ao = (size_t)l.a_offset, tail = (size_t)l.block_bytes - ao - ab;
  for (size_t i = 0; i < blocks; ++i) {
    const uint8_t* blk = src + i * (size_t)l.block_bytes;
    std::memcpy(a + i * ab, blk + ao, ab);
    std::memcpy(b + i * bb, blk, ao);
    std::memcpy(b + i * bb + ao, blk + ao + ab, tail);
  }
}

void quantize_activation_q8(const float* x, int64_t n, int8_t* q, float* d, int8_t* q2) {
  if (n < 0 || n % 32 != 0) throw KernelError(fmt::format("quantize_activation_q8: {} values is not a multiple of 32", n));
  cpu::quantize_q8_activation(x, n, q, d, q2);
}

std::vector<float> dequantize_activation_q8(const int8_t* q, const float* d, int64_t n, const int8_t* q2) {
  std::vector<float> out((size_t)n);
  for (int64_t i = 0; i < n; ++i)
    out[(size_t)i] = q2 ? d[i / 32] * std::fma((float)q2[i], 1.0f / 254.0f, (float)q[i]) : (float)q[i] * d[i / 32];
  return out;
}

}  // namespace qrig::cuda
