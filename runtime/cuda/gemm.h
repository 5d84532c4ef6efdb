// Q8_0 x int8 matrix multiplication for any number of activation rows on the GPU (prefill GEMM, the
// multi-row decode of several sequences, the decode GEMV): Y[T][n] = X[T][k] W[n][k]^T, with W repacked Q8_0
// (launch.h Q8Matrix) and X quantized by quant_act_q8 (int8 xq [T][k] row-major, f32 xd [T][k/32], and for
// two-plane variants the second plane xq2 laid out like xq). CPU reference: cpu::matmul on the same weights and
// the dequantized activation. The variants, their tilings and which one runs for how many rows are the kernel
// library's (kernels/matmul.h) and the plan's: this file launches what it is given.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ir/kernel_attr.h"
#include "runtime/cuda/launch.h"

namespace qrig::cuda {

// Checked launchers: y [T][w.rows] f32 = xq/xd(/xq2) [T][w.cols] x w^T. The tiling and the number of planes
// come from the loaded variant. xq 16-byte aligned, xd 4, y 16; xq2 (the second plane, read only by p2
// variants, which require it) 16, may be null for p1. tiled: w.cols a multiple of 32*kb*sk. skinny: T <= cols.
void launch_gemm_q8_0_tiled(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, int64_t T, float* y, StreamHandle stream);
void launch_gemm_q8_0_skinny(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                             const int8_t* xq2, int64_t T, float* y, StreamHandle stream);
// The GGUF block types other than Q8_0 (w.wtype must be the variant's w; w.scales, the B bytes, 16-byte
// aligned): gemm_wq_dp4a_skinny runs T rows in launches of at most the variant's c rows each, gemm_wq_dp4a_tiled
// (w.cols a multiple of 128) all T in one launch, gemv_wq_dp4a one row; launch_matmul_wq takes any of them.
void launch_matmul_wq(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2,
                      int64_t T, float* y, StreamHandle stream);
void launch_gemm_wq_tiled(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                          const int8_t* xq2, int64_t T, float* y, StreamHandle stream);
void launch_gemv_wq(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2,
                    float* y, StreamHandle stream);
// One activation row over stacked block-type weights (a matmul_stack's members of one type, their rows one after
// the other: kernels/matmul.h check_wq_stack) whose output rows go to up to four places as launch_gemv_q8_0_split's
// do: the type's one-row kernel, gemv_wq_dp4a or gemm_wq_dp4a_skinny (one token). y 4-byte aligned.
void launch_matmul_wq_split(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, float* const y[4], const int64_t rows[4], StreamHandle stream);
// Any of the matmul templates (GEMV for T = 1 only), by the variant's kernel.
void launch_matmul_q8_0(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                        const int8_t* xq2, int64_t T, float* y, StreamHandle stream);

// The kernels of one matmul for its ranges of rows, as a plan names them (one variant per range), loaded once;
// run() launches the range's kernel for T rows.
class MatmulKernels {
 public:
  // ranges: one part of one variant each (ir/kernel_attr.h); part selects which part of a multi-part entry
  // (a stacked matmul's member) these kernels are. Ranges whose part is a single stacked launch are skipped.
  MatmulKernels(const KernelLoader& load, const std::vector<ir::LaunchRange>& ranges, size_t part = 0);
  // y [T][n] f32 = xq/xd(/xq2) [T][k] x w^T for T rows within the ranges. Device pointers; y 16-byte aligned; xq2
  // the second plane (required when the range's variant has two planes).
  void run(const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2, int64_t T, float* y,
           StreamHandle stream) const;
  const LoadedKernel& kernel_for(int64_t T) const;  // throws KernelError outside the ranges
  int64_t planes_for(int64_t T) const { return kernel_for(T).variant.param("p"); }
  int64_t min_rows() const { return ranges_.empty() ? 0 : ranges_.front().first; }
  int64_t max_rows() const { return ranges_.empty() ? 0 : ranges_.back().second; }

 private:
  std::vector<LoadedKernel> kernels_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // rows [first, last] of kernels_[i]
};

}  // namespace qrig::cuda
