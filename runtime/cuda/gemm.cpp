// The Q8_0 x int8 GEMM launchers (gemm.h) and the per-range kernel sets of a plan's matmuls.
#include "runtime/cuda/gemm.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "kernels/matmul.h"

namespace qrig::cuda {

namespace {

// The shared checks of both GEMM launchers; returns the second plane to pass (null for p1).
const signed char* require_gemm_args(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                                     const int8_t* xq2, int64_t T, float* y) {
  require_aligned(w.qs, 16, k, "weights");
  require_aligned(w.scales, 2, k, "weight scales");
  if (w.rows <= 0 || w.rows > INT_MAX || w.cols <= 0 || w.cols % 32 != 0 || w.cols > INT_MAX / 2)
    throw KernelError(fmt::format("{}: weights have shape [{}][{}]", k.variant.name, w.rows, w.cols));
  require_aligned(xq, 16, k, "xq");
  require_aligned(xd, 4, k, "xd");
  require_aligned(y, 16, k, "y");
  if (T <= 0 || T > INT_MAX) throw KernelError(fmt::format("{}: {} activation rows", k.variant.name, T));
  if (k.variant.param("p") == 1) return nullptr;
  require_aligned(xq2, 16, k, "xq2 (the second activation plane)");
  return reinterpret_cast<const signed char*>(xq2);
}

}  // namespace

void launch_gemm_q8_0_tiled(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, int64_t T, float* y, StreamHandle stream) {
  require_kernel(k, "gemm_q8_0_dp4a_tiled");
  const signed char* q2 = require_gemm_args(k, w, xq, xd, xq2, T, y);
  const int64_t bn = k.variant.param("bn"), bt = k.variant.param("bt");
  const int64_t per_stage = 32 * k.variant.param("kb") * k.variant.param("sk");
  if (w.cols % per_stage != 0)
    throw KernelError(fmt::format("{}: {} columns are not a multiple of {}", k.variant.name, w.cols, per_stage));
  const int64_t gx = (T + bt - 1) / bt, gy = (w.rows + bn - 1) / bn;
  if (gx > INT_MAX || gy > 65535)
    throw KernelError(fmt::format("{}: a grid of {} x {} CTAs", k.variant.name, gx, gy));
  k.kernel.launch(Dim3((unsigned)gx, (unsigned)gy), Dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const signed char*>(w.qs), reinterpret_cast<const unsigned short*>(w.scales),
                  reinterpret_cast<const signed char*>(xq), xd, q2, y, (int)w.cols, (int)w.rows, (int)T);
}

void launch_gemm_q8_0_skinny(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                             const int8_t* xq2, int64_t T, float* y, StreamHandle stream) {
  require_kernel(k, "gemm_q8_0_dp4a_skinny");
  const signed char* q2 = require_gemm_args(k, w, xq, xd, xq2, T, y);
  if (T > k.variant.param("c"))
    throw KernelError(fmt::format("{}: {} activation rows, more than its {}", k.variant.name, T, k.variant.param("c")));
  const int64_t rows_per_block = k.variant.param("r") * (k.variant.threads() / 32);
  const int64_t g = (w.rows + rows_per_block - 1) / rows_per_block;
  k.kernel.launch(Dim3((unsigned)g), Dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const signed char*>(w.qs), reinterpret_cast<const unsigned short*>(w.scales),
                  reinterpret_cast<const signed char*>(xq), xd, q2, y, (int)w.cols, (int)w.rows, (int)T);
}


// The shared checks of the block-type launchers.
static void require_wq_args(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2) {
  if (w.wtype != k.variant.param("w"))
    throw KernelError(fmt::format("{}: the weights are of ggml type {}", k.variant.name, w.wtype));
  require_aligned(w.qs, 16, k, "weights (quant bytes)");
  require_aligned(w.scales, 16, k, "weights (scale bytes)");  // read with loads up to 16 bytes wide
  const int64_t block = kernels::wq_block_values(w.wtype);
  if (w.rows <= 0 || w.rows > INT_MAX || w.cols <= 0 || w.cols % block != 0 || w.cols > INT_MAX / 16)
    throw KernelError(fmt::format("{}: weights have shape [{}][{}]", k.variant.name, w.rows, w.cols));
  require_aligned(xq, 16, k, "xq");
  require_aligned(xd, 4, k, "xd");
  if (k.variant.param("p") == 2) require_aligned(xq2, 16, k, "xq2 (the second activation plane)");
}

void launch_gemm_wq_tiled(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                          const int8_t* xq2, int64_t T, float* y, StreamHandle stream) {
  require_kernel(k, "gemm_wq_dp4a_tiled");
  require_wq_args(k, w, xq, xd, xq2);
  require_aligned(y, 16, k, "y");
  if (w.cols % 128 != 0)
    throw KernelError(fmt::format("{}: {} columns are not a multiple of 128", k.variant.name, w.cols));
  if (T <= 0 || T > INT_MAX) throw KernelError(fmt::format("{}: {} activation rows", k.variant.name, T));
  const int64_t bn = k.variant.param("bn"), bt = k.variant.param("bt");
  const int64_t gx = (T + bt - 1) / bt, gy = (w.rows + bn - 1) / bn;
  if (gx > INT_MAX || gy > 65535)
    throw KernelError(fmt::format("{}: a grid of {} x {} CTAs", k.variant.name, gx, gy));
  const bool p2 = k.variant.param("p") == 2;
  k.kernel.launch(Dim3((unsigned)gx, (unsigned)gy), Dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const unsigned char*>(w.qs), reinterpret_cast<const unsigned char*>(w.scales),
                  reinterpret_cast<const signed char*>(xq), xd,
                  p2 ? reinterpret_cast<const signed char*>(xq2) : nullptr, y, (int)w.cols, (int)w.rows, (int)T);
}

void launch_gemv_wq(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2,
                    float* y, StreamHandle stream) {
  if (!kernels::is_wq_gemv(k.variant.kernel)) require_kernel(k, "gemv_wq_dp4a");
  float* const ys[4] = {y, nullptr, nullptr, nullptr};
  const int64_t rows[4] = {w.rows, 0, 0, 0};
  launch_matmul_wq_split(k, w, xq, xd, xq2, ys, rows, stream);
}

void launch_matmul_wq_split(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, float* const y[4], const int64_t rows[4], StreamHandle stream) {
  const bool gemv = kernels::is_wq_gemv(k.variant.kernel);
  if (!gemv) require_kernel(k, "gemm_wq_dp4a_skinny");
  require_wq_args(k, w, xq, xd, xq2);
  const SplitOutputs o = split_outputs(k, y, rows, w.rows, 4);
  const bool p2 = k.variant.param("p") == 2;
  const int64_t rows_per_block =
      k.variant.param("r") * (k.variant.threads() / 32) / (k.variant.kernel == "gemv_wq_dp4a" ? k.variant.param("s") : 1);
  const unsigned g = grid_for(w.rows, rows_per_block, k);
  auto* wa = reinterpret_cast<const unsigned char*>(w.qs);
  auto* wb = reinterpret_cast<const unsigned char*>(w.scales);
  auto* q = reinterpret_cast<const signed char*>(xq);
  const signed char* q2 = p2 ? reinterpret_cast<const signed char*>(xq2) : nullptr;
  if (gemv)
    k.kernel.launch(Dim3(g), Dim3((unsigned)k.variant.threads()), 0, stream, wa, wb, q, xd, q2, o.y[0], o.y[1],
                    o.y[2], o.y[3], o.bound[0], o.bound[1], o.bound[2], (int)w.cols, (int)w.rows);
  else
    k.kernel.launch(Dim3(g), Dim3((unsigned)k.variant.threads()), 0, stream, wa, wb, q, xd, q2, o.y[0], o.y[1],
                    o.y[2], o.y[3], o.bound[0], o.bound[1], o.bound[2], (int)w.cols, (int)w.rows, 1);
}

void launch_matmul_wq(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2,
                      int64_t T, float* y, StreamHandle stream) {
  if (k.variant.kernel == "gemm_wq_dp4a_tiled") return launch_gemm_wq_tiled(k, w, xq, xd, xq2, T, y, stream);
  if (kernels::is_wq_gemv(k.variant.kernel)) {
    if (T != 1) throw KernelError(fmt::format("{}: the GEMV takes one row, not {}", k.variant.name, T));
    return launch_gemv_wq(k, w, xq, xd, xq2, y, stream);
  }
  require_kernel(k, "gemm_wq_dp4a_skinny");
  require_wq_args(k, w, xq, xd, xq2);
  const bool p2 = k.variant.param("p") == 2;
  const int64_t c = k.variant.param("c");
  // The kernel indexes activations with 32-bit offsets: one launch's rows times the row length must fit.
  if (T <= 0 || c * w.cols > INT_MAX) throw KernelError(fmt::format("{}: {} activation rows", k.variant.name, T));
  const int64_t rows_per_block = k.variant.param("r") * (k.variant.threads() / 32);
  const unsigned g = grid_for(w.rows, rows_per_block, k);
  const int n_rows = (int)w.rows;  // one output: b1 = b2 = b3 = n_rows
  for (int64_t t0 = 0; t0 < T; t0 += c) {
    const int64_t n = std::min(c, T - t0);
    float* out = y + t0 * w.rows;
    k.kernel.launch(Dim3(g), Dim3((unsigned)k.variant.threads()), 0, stream,
                    reinterpret_cast<const unsigned char*>(w.qs), reinterpret_cast<const unsigned char*>(w.scales),
                    reinterpret_cast<const signed char*>(xq + t0 * w.cols), xd + t0 * (w.cols / 32),
                    p2 ? reinterpret_cast<const signed char*>(xq2 + t0 * w.cols) : nullptr, out, out, out, out, n_rows,
                    n_rows, n_rows, (int)w.cols, n_rows, (int)n);
  }
}

void launch_matmul_q8_0(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                        const int8_t* xq2, int64_t T, float* y, StreamHandle stream) {
  if (k.variant.kernel == "gemm_wq_dp4a_skinny" || k.variant.kernel == "gemm_wq_dp4a_tiled" ||
      kernels::is_wq_gemv(k.variant.kernel)) {
    launch_matmul_wq(k, w, xq, xd, xq2, T, y, stream);
  } else if (k.variant.kernel == "gemm_q8_0_dp4a_tiled") {
    launch_gemm_q8_0_tiled(k, w, xq, xd, xq2, T, y, stream);
  } else if (k.variant.kernel == "gemm_q8_0_dp4a_skinny") {
    launch_gemm_q8_0_skinny(k, w, xq, xd, xq2, T, y, stream);
  } else {
    if (T != 1) throw KernelError(fmt::format("{}: the GEMV takes one row, not {}", k.variant.name, T));
    launch_gemv_q8_0(k, w, xq, xd, xq2, y, stream);
  }
}

MatmulKernels::MatmulKernels(const KernelLoader& load, const std::vector<ir::LaunchRange>& ranges, size_t part) {
  for (const ir::LaunchRange& r : ranges) {
    if (r.parts.size() == 1 && part > 0) continue;  // a single launch over a stack: not this member's
    if (part >= r.parts.size() || r.parts[part].size() != 1)
      throw KernelError(fmt::format("matmul: rows {}-{} name {} parts, no single variant for part {}", r.first, r.last,
                                    r.parts.size(), part));
    LoadedKernel k = load(parse_variant(r.parts[part][0]));
    const std::string& t = k.variant.kernel;
    if (t != "gemv_q8_0_dp4a" && t != "gemm_q8_0_dp4a_tiled" && t != "gemm_q8_0_dp4a_skinny" &&
        t != "gemm_wq_dp4a_skinny" && t != "gemm_wq_dp4a_tiled" && !kernels::is_wq_gemv(t))
      throw KernelError(fmt::format("matmul: {} is not a matmul kernel", k.variant.name));
    if ((t == "gemv_q8_0_dp4a" || kernels::is_wq_gemv(t)) && r.last != 1)
      throw KernelError(fmt::format("matmul: the GEMV {} cannot run rows {}-{}", k.variant.name, r.first, r.last));
    if (t == "gemm_q8_0_dp4a_skinny" && r.last > k.variant.param("c"))
      throw KernelError(fmt::format("matmul: {} takes at most {} rows, not {}", k.variant.name, k.variant.param("c"),
                                    r.last));
    if (!ranges_.empty() && r.first != ranges_.back().second + 1)
      throw KernelError(fmt::format("matmul: rows {}-{} do not continue {}", r.first, r.last, ranges_.back().second));
    kernels_.push_back(std::move(k));
    ranges_.emplace_back(r.first, r.last);
  }
  if (kernels_.empty()) throw KernelError("matmul: no kernel");
}

const LoadedKernel& MatmulKernels::kernel_for(int64_t T) const {
  for (size_t i = 0; i < ranges_.size(); ++i)
    if (T >= ranges_[i].first && T <= ranges_[i].second) return kernels_[i];
  throw KernelError(fmt::format("matmul: {} rows, outside the plan's {}..{}", T, min_rows(), max_rows()));
}

void MatmulKernels::run(const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2, int64_t T, float* y,
                        StreamHandle stream) const {
  launch_matmul_q8_0(kernel_for(T), w, xq, xd, xq2, T, y, stream);
}

}  // namespace qrig::cuda
