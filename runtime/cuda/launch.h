// Typed launchers of the default-family kernels: each checks that the loaded variant is the right template
// for the shapes it is given (a K mismatch would read the wrong rows, silently), that pointers are aligned
// for the kernel's vector loads, and that counts fit, then computes the grid and launches on a stream.
// Device pointers only. The CPU reference of each is named in its template's header comment.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "runtime/cuda/device.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/cuda/variant.h"

namespace qrig::cuda {

// A compiled variant loaded on the GPU(s).
struct LoadedKernel {
  Variant variant;
  Kernel kernel;
};
// Loads the cubin (or with ptx, the PTX, which the driver JIT-compiles for the GPU) and finds the variant's
// entry point.
LoadedKernel load_kernel(const CompiledKernel& k, bool ptx = false);

// The checks every launcher makes, defined once: the loaded variant is of the template the launcher runs;
// a pointer is non-null and aligned (`who` names the variant or the kernel area in the message); a grid of
// ceil(items / per_block) blocks fits.
void require_kernel(const LoadedKernel& k, const char* kernel);
void require_aligned(const void* p, size_t align, const std::string& who, const char* what);
inline void require_aligned(const void* p, size_t align, const LoadedKernel& k, const char* what) {
  require_aligned(p, align, k.variant.name, what);
}
unsigned grid_for(int64_t items, int64_t per_block, const LoadedKernel& k);

// How the kernel sets of each area (gemm.h, gdn.h, attention.h, pointwise.h) obtain their variants: compiled
// (or read from the cubin cache) for the plan's feature set and loaded. The executor passes one backed by its
// KernelCompiler; tests pass one backed by theirs.
using KernelLoader = std::function<LoadedKernel(const Variant&)>;

// A repacked weight matrix in device memory (q8_layout.h). Q8_0 (wtype 8): qs int8 [rows][cols], scales fp16
// [rows][cols/32]. The other block types (wtype their ggml id, kernels/matmul.h wq_layout): qs the quant bytes
// (array A), scales the rest of the blocks (array B, even bytes per block).
struct Q8Matrix {
  const int8_t* qs = nullptr;
  const uint16_t* scales = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t wtype = 8;
};

// out[r] = rmsnorm(x[r]) * w for `rows` rows of variant.d floats (rmsnorm_f32, q = 0). out may equal x.
void launch_rmsnorm_f32(const LoadedKernel& k, const float* x, const float* w, float* out, int64_t rows, float eps,
                        StreamHandle stream);
// The same, and out quantized for the matmuls it feeds into xq/xd (and xq2 for q = 2), bit-identical to
// launch_quant_act_q8 of out (rmsnorm_f32 with q = 1 or 2).
void launch_rmsnorm_quant_f32(const LoadedKernel& k, const float* x, const float* w, float* out, int64_t rows,
                              float eps, int8_t* xq, float* xd, int8_t* xq2, StreamHandle stream);

// n values (a multiple of 32; rows are contiguous) -> int8 xq[n] + f32 xd[n/32] (quant_act_q8), and the
// second plane xq2[n] when the variant has p = 2 (xq2 is ignored, and may be null, for p = 1).
void launch_quant_act_q8(const LoadedKernel& k, const float* x, int8_t* xq, float* xd, int8_t* xq2, int64_t n,
                         StreamHandle stream);

// y[w.rows] = W x for one quantized activation row (gemv_q8_0_dp4a; variant.k must equal w.cols; xq2 as
// for launch_quant_act_q8).
void launch_gemv_q8_0(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2,
                      float* y, StreamHandle stream);
// The same over stacked weights whose output rows go to up to four places: rows [0, rows[0]) to y[0],
// the next rows[1] to y[1], ... (rows sum to w.rows; unused entries 0).
void launch_gemv_q8_0_split(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, float* const y[4], const int64_t rows[4], StreamHandle stream);
// The output arguments of a launch over stacked weights as the split kernels take them (y0..y3, b1..b3): rows as
// above, checked against the matrix's `total` rows (KernelError naming the variant: negative counts, a null or
// unaligned pointer of a used output, a sum other than total); an unused output's pointer is y[0].
struct SplitOutputs {
  float* y[4];
  int bound[3];  // b1, b2, b3: the first row of outputs 1, 2, 3
};
SplitOutputs split_outputs(const LoadedKernel& k, float* const y[4], const int64_t rows[4], int64_t total,
                           size_t align);

// The same for a table of another block type (embed_wq; variant.w must equal table.wtype).
void launch_embed_wq(const LoadedKernel& k, const Q8Matrix& table, const int32_t* tokens, int64_t n_tokens,
                     float* out, StreamHandle stream);
// out[t] = row tokens[t] of the table as f32 (embed_q8_0; variant.d must equal table.cols). Ids are checked
// by the caller on the host (the kernel writes NaN rows for bad ids rather than reading out of bounds).
void launch_embed_q8_0(const LoadedKernel& k, const Q8Matrix& table, const int32_t* tokens, int64_t n_tokens,
                       float* out, StreamHandle stream);

}  // namespace qrig::cuda
