// Typed, checked launchers of the default-family kernels (see launch.h).
#include "runtime/cuda/launch.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

namespace qrig::cuda {

void require_kernel(const LoadedKernel& k, const char* kernel) {
  if (k.variant.kernel != kernel)
    throw KernelError(fmt::format("{} launcher given the variant {}", kernel, k.variant.name));
}

void require_aligned(const void* p, size_t align, const std::string& who, const char* what) {
  if (!p) throw KernelError(fmt::format("{}: {} is null", who, what));
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw KernelError(fmt::format("{}: {} is not {}-byte aligned", who, what, align));
}

unsigned grid_for(int64_t items, int64_t per_block, const LoadedKernel& k) {
  const int64_t g = (items + per_block - 1) / per_block;
  if (g <= 0 || g > INT_MAX) throw KernelError(fmt::format("{}: {} items need a grid of {} blocks", k.variant.name, items, g));
  return (unsigned)g;
}

namespace {

void require_q8(const Q8Matrix& m, const LoadedKernel& k, const char* what) {
  if (m.wtype != 8)
    throw KernelError(fmt::format("{}: {} is of ggml type {}, not the Q8_0 layout", k.variant.name, what, m.wtype));
  require_aligned(m.qs, 16, k, what);
  require_aligned(m.scales, 2, k, what);
  if (m.rows <= 0 || m.rows > INT_MAX || m.cols <= 0 || m.cols % 32 != 0)
    throw KernelError(fmt::format("{}: {} has shape [{}][{}]", k.variant.name, what, m.rows, m.cols));
}

}  // namespace

LoadedKernel load_kernel(const CompiledKernel& c, bool ptx) {
  if (ptx && c.ptx.empty()) throw KernelError(fmt::format("{}: no PTX in its cache entry {}", c.variant.name, c.cache_stem));
  Library lib = ptx ? Library(std::vector<char>(c.ptx.begin(), c.ptx.end()),
                              fmt::format("{} (sm_{} PTX)", c.variant.name, c.arch.target_sm))
                    : Library(c.cubin, fmt::format("{} (sm_{})", c.variant.name, c.arch.target_sm));
  return {c.variant, lib.kernel(c.variant.kernel, (int)c.variant.threads())};
}

void launch_rmsnorm_f32(const LoadedKernel& k, const float* x, const float* w, float* out, int64_t rows, float eps,
                        StreamHandle stream) {
  require_kernel(k, "rmsnorm_f32");
  if (k.variant.param("q") != 0) throw KernelError(fmt::format("{}: quantizes its output (launch_rmsnorm_quant_f32)", k.variant.name));
  require_aligned(x, 16, k, "x");
  require_aligned(w, 16, k, "w");
  require_aligned(out, 16, k, "out");
  if (rows <= 0) throw KernelError(fmt::format("{}: {} rows", k.variant.name, rows));
  signed char* none = nullptr;
  float* none_f = nullptr;
  k.kernel.launch(Dim3(grid_for(rows, 1, k)), Dim3((unsigned)k.variant.threads()), 0, stream, x, w, out, eps, none,
                  none_f, none);
}

void launch_rmsnorm_quant_f32(const LoadedKernel& k, const float* x, const float* w, float* out, int64_t rows,
                              float eps, int8_t* xq, float* xd, int8_t* xq2, StreamHandle stream) {
  require_kernel(k, "rmsnorm_f32");
  const int64_t planes = k.variant.param("q");
  if (planes == 0) throw KernelError(fmt::format("{}: does not quantize its output (launch_rmsnorm_f32)", k.variant.name));
  require_aligned(x, 16, k, "x");
  require_aligned(w, 16, k, "w");
  require_aligned(out, 16, k, "out");
  require_aligned(xq, 4, k, "xq");
  require_aligned(xd, 4, k, "xd");
  if (planes == 2) require_aligned(xq2, 4, k, "xq2");
  if (rows <= 0) throw KernelError(fmt::format("{}: {} rows", k.variant.name, rows));
  signed char* q2 = planes == 2 ? reinterpret_cast<signed char*>(xq2) : nullptr;
  k.kernel.launch(Dim3(grid_for(rows, 1, k)), Dim3((unsigned)k.variant.threads()), 0, stream, x, w, out, eps,
                  reinterpret_cast<signed char*>(xq), xd, q2);
}

// The second activation plane: required (as aligned as the first) for p = 2, ignored for p = 1.
const signed char* second_plane(const LoadedKernel& k, const int8_t* xq2, size_t align) {
  if (k.variant.param("p") == 1) return nullptr;
  require_aligned(xq2, align, k, "xq2");
  return reinterpret_cast<const signed char*>(xq2);
}

void launch_quant_act_q8(const LoadedKernel& k, const float* x, int8_t* xq, float* xd, int8_t* xq2, int64_t n,
                         StreamHandle stream) {
  require_kernel(k, "quant_act_q8");
  require_aligned(x, 4, k, "x");
  require_aligned(xq, 1, k, "xq");
  require_aligned(xd, 4, k, "xd");
  signed char* q2 = const_cast<signed char*>(second_plane(k, xq2, 1));
  if (n <= 0 || n % 32 != 0) throw KernelError(fmt::format("{}: {} values is not a positive multiple of 32", k.variant.name, n));
  const long long blocks = n / 32;
  const int64_t warps = k.variant.threads() / 32;
  k.kernel.launch(Dim3(grid_for(blocks, warps, k)), Dim3((unsigned)k.variant.threads()), 0, stream, x,
                  reinterpret_cast<signed char*>(xq), xd, q2, blocks);
}

void launch_gemv_q8_0(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd, const int8_t* xq2,
                      float* y, StreamHandle stream) {
  float* const ys[4] = {y, nullptr, nullptr, nullptr};
  const int64_t rows[4] = {w.rows, 0, 0, 0};
  launch_gemv_q8_0_split(k, w, xq, xd, xq2, ys, rows, stream);
}

void launch_gemv_q8_0_split(const LoadedKernel& k, const Q8Matrix& w, const int8_t* xq, const float* xd,
                            const int8_t* xq2, float* const y[4], const int64_t rows[4], StreamHandle stream) {
  require_kernel(k, "gemv_q8_0_dp4a");
  require_q8(w, k, "weights");
  if (w.cols != k.variant.param("k"))
    throw KernelError(fmt::format("{}: weights have {} columns", k.variant.name, w.cols));
  require_aligned(xq, 16, k, "xq");
  require_aligned(xd, 4, k, "xd");
  const signed char* q2 = second_plane(k, xq2, 16);
  const SplitOutputs o = split_outputs(k, y, rows, w.rows, 4);
  const int64_t rows_per_block = k.variant.param("r") * (k.variant.threads() / 32);
  k.kernel.launch(Dim3(grid_for(w.rows, rows_per_block, k)), Dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const signed char*>(w.qs), reinterpret_cast<const unsigned short*>(w.scales),
                  reinterpret_cast<const signed char*>(xq), xd, q2, o.y[0], o.y[1], o.y[2], o.y[3], o.bound[0],
                  o.bound[1], o.bound[2], (int)w.rows);
}

SplitOutputs split_outputs(const LoadedKernel& k, float* const y[4], const int64_t rows[4], int64_t total,
                           size_t align) {
  if (total <= 0 || total > INT_MAX) throw KernelError(fmt::format("{}: a matrix of {} rows", k.variant.name, total));
  SplitOutputs o{};
  int64_t sum = 0;
  for (int i = 0; i < 4; ++i) {
    if (rows[i] < 0 || (rows[i] > 0 && !y[i]))
      throw KernelError(fmt::format("{}: output {} has {} rows and pointer {}", k.variant.name, i, rows[i], (const void*)y[i]));
    if (rows[i] > 0) require_aligned(y[i], align, k, "y");
    if (i > 0) o.bound[i - 1] = (int)std::min(sum, total);
    sum += rows[i];
    o.y[i] = rows[i] > 0 ? y[i] : y[0];
  }
  if (sum != total)
    throw KernelError(fmt::format("{}: outputs take {} rows of a {}-row matrix", k.variant.name, sum, total));
  return o;
}

void launch_embed_q8_0(const LoadedKernel& k, const Q8Matrix& table, const int32_t* tokens, int64_t n_tokens,
                       float* out, StreamHandle stream) {
  require_kernel(k, "embed_q8_0");
  require_q8(table, k, "table");
  if (table.cols != k.variant.param("d"))
    throw KernelError(fmt::format("{}: the table has {} columns", k.variant.name, table.cols));
  require_aligned(tokens, 4, k, "tokens");
  require_aligned(out, 16, k, "out");
  if (n_tokens <= 0) throw KernelError(fmt::format("{}: {} tokens", k.variant.name, n_tokens));
  k.kernel.launch(Dim3(grid_for(n_tokens, 1, k)), Dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const signed char*>(table.qs), reinterpret_cast<const unsigned short*>(table.scales),
                  reinterpret_cast<const int*>(tokens), (int)table.rows, out);
}

void launch_embed_wq(const LoadedKernel& k, const Q8Matrix& table, const int32_t* tokens, int64_t n_tokens,
                     float* out, StreamHandle stream) {
  require_kernel(k, "embed_wq");
  if (table.wtype != k.variant.param("w"))
    throw KernelError(fmt::format("{}: the table is of ggml type {}", k.variant.name, table.wtype));
  require_aligned(table.qs, 16, k, "table (quant bytes)");
  require_aligned(table.scales, 16, k, "table (scale bytes)");  // read up to 16 bytes wide (qrig_wtypes.cuh)
  if (table.cols != k.variant.param("d") || table.rows <= 0 || table.rows > INT_MAX)
    throw KernelError(fmt::format("{}: the table is [{}][{}]", k.variant.name, table.rows, table.cols));
  require_aligned(tokens, 4, k, "tokens");
  require_aligned(out, 16, k, "out");
  if (n_tokens <= 0) throw KernelError(fmt::format("{}: {} tokens", k.variant.name, n_tokens));
  k.kernel.launch(Dim3(grid_for(n_tokens, 1, k)), Dim3((unsigned)k.variant.threads()), 0, stream,
                  reinterpret_cast<const unsigned char*>(table.qs), reinterpret_cast<const unsigned char*>(table.scales),
                  reinterpret_cast<const int*>(tokens), (int)table.rows, out);
}

}  // namespace qrig::cuda
