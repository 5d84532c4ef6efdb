// Launchers of the pointwise kernels (see pointwise.h).
#include "runtime/cuda/pointwise.h"

#include <climits>
#include <cmath>

#include <fmt/format.h>


namespace qrig::cuda {

namespace {

void require_positive(int64_t v, int64_t limit, const LoadedKernel& k, const char* what) {
  if (v <= 0 || v > limit) throw KernelError(fmt::format("{}: {} = {} is out of range", k.variant.name, what, v));
}

// Grid-stride kernels: enough blocks to fill the GPU several times over, never more than the items need.
unsigned stride_grid(int64_t items, const LoadedKernel& k) {
  const int64_t t = k.variant.threads();
  return (unsigned)std::min<int64_t>((items + t - 1) / t, 65535);
}

}  // namespace

void launch_add_f32(const LoadedKernel& k, const float* a, const float* b, float* out, int64_t n, StreamHandle s) {
  require_kernel(k, "add_f32");
  require_aligned(a, 16, k, "a");
  require_aligned(b, 16, k, "b");
  require_aligned(out, 16, k, "out");
  if (n <= 0 || n % 4) throw KernelError(fmt::format("{}: n = {} is not a positive multiple of 4", k.variant.name, n));
  const long long n4 = n / 4;
  k.kernel.launch(Dim3(stride_grid(n4, k)), Dim3((unsigned)k.variant.threads()), 0, s, a, b, out, n4);
}

void launch_swiglu_f32(const LoadedKernel& k, const float* gate, const float* up, float* out, int64_t n,
                       StreamHandle s) {
  require_kernel(k, "swiglu_f32");
  require_aligned(gate, 16, k, "gate");
  require_aligned(up, 16, k, "up");
  require_aligned(out, 16, k, "out");
  if (n <= 0 || n % 4) throw KernelError(fmt::format("{}: n = {} is not a positive multiple of 4", k.variant.name, n));
  const long long n4 = n / 4;
  k.kernel.launch(Dim3(stride_grid(n4, k)), Dim3((unsigned)k.variant.threads()), 0, s, gate, up, out, n4);
}

void launch_add_rmsnorm_q8(const LoadedKernel& k, const float* a, const float* b, float* sum, const float* w,
                           int64_t rows, int64_t width, float eps, int8_t* xq, float* xd, int8_t* xq2, StreamHandle s) {
  require_kernel(k, "add_rmsnorm_q8");
  if (width != k.variant.param("d"))
    throw KernelError(fmt::format("{}: rows of {} values", k.variant.name, width));
  const int64_t planes = k.variant.param("p");
  require_aligned(a, 16, k, "a");
  require_aligned(b, 16, k, "b");
  require_aligned(sum, 16, k, "sum");
  require_aligned(w, 16, k, "w");
  require_aligned(xq, 4, k, "xq");
  require_aligned(xd, 4, k, "xd");
  if (planes == 2) require_aligned(xq2, 4, k, "xq2");
  require_positive(rows, INT_MAX, k, "rows");
  signed char* q2 = planes == 2 ? reinterpret_cast<signed char*>(xq2) : nullptr;
  k.kernel.launch(Dim3(grid_for(rows, 1, k)), Dim3((unsigned)k.variant.threads()), 0, s, a, b, sum, w, eps,
                  reinterpret_cast<signed char*>(xq), xd, q2);
}

void launch_swiglu_q8(const LoadedKernel& k, const float* gate, const float* up, int64_t n, int8_t* xq, float* xd,
                      int8_t* xq2, StreamHandle s) {
  require_kernel(k, "swiglu_q8");
  const int64_t planes = k.variant.param("p");
  require_aligned(gate, 16, k, "gate");
  require_aligned(up, 16, k, "up");
  require_aligned(xq, 4, k, "xq");
  require_aligned(xd, 4, k, "xd");
  if (planes == 2) require_aligned(xq2, 4, k, "xq2");
  if (n <= 0 || n % 32) throw KernelError(fmt::format("{}: n = {} is not a positive multiple of 32", k.variant.name, n));
  const long long n4 = n / 4;
  signed char* q2 = planes == 2 ? reinterpret_cast<signed char*>(xq2) : nullptr;
  k.kernel.launch(Dim3(stride_grid(n4, k)), Dim3((unsigned)k.variant.threads()), 0, s, gate, up,
                  reinterpret_cast<signed char*>(xq), xd, q2, n4);
}

void launch_conv1d_silu_f32(const LoadedKernel& k, const float* x, int64_t T, int64_t C, const float* w,
                            float* state, float* out, StreamHandle s, float* kept, int64_t keep, int64_t kept_stride) {
  require_kernel(k, "conv1d_silu_f32");
  if (k.variant.param("b") != 0)
    throw KernelError(fmt::format("{}: a batched variant (launch_conv1d_silu_batched)", k.variant.name));
  require_aligned(x, 4, k, "x");
  require_aligned(w, 4, k, "w");
  require_aligned(state, 4, k, "state");
  require_aligned(out, 4, k, "out");
  require_positive(T, INT_MAX, k, "T");
  require_positive(C, INT_MAX, k, "C");
  if (x == out) throw KernelError(fmt::format("{}: out must not alias x", k.variant.name));
  if (keep < 0 || keep >= T || (keep > 0 && (!kept || kept_stride < (k.variant.param("k") - 1) * C)))
    throw KernelError(fmt::format("{}: keeping {} of {} windows (stride {} floats, {} per window)", k.variant.name, keep,
                                  T, kept_stride, (k.variant.param("k") - 1) * C));
  if (keep > 0) require_aligned(kept, 4, k, "kept");
  float* kept_arg = keep > 0 ? kept : nullptr;
  k.kernel.launch(Dim3(grid_for(C, k.variant.threads(), k)), Dim3((unsigned)k.variant.threads()), 0, s, x, (int)T,
                  (int)C, w, state, out, kept_arg, (int)keep, (long long)kept_stride, static_cast<float* const*>(nullptr),
                  static_cast<const int*>(nullptr), 0LL);
}

void launch_conv1d_silu_batched(const LoadedKernel& k, const float* x, int64_t seqs, int64_t C, const float* w,
                                float* const* rec_of, const int32_t* seq_slot, int64_t state_offset, float* out,
                                StreamHandle s) {
  require_kernel(k, "conv1d_silu_f32");
  if (k.variant.param("b") != 1)
    throw KernelError(fmt::format("{}: not a batched variant (launch_conv1d_silu_f32)", k.variant.name));
  require_aligned(x, 4, k, "x");
  require_aligned(w, 4, k, "w");
  require_aligned(out, 4, k, "out");
  require_aligned(rec_of, 8, k, "rec_of");
  require_aligned(seq_slot, 4, k, "seq_slot");
  require_positive(seqs, 65535, k, "sequences");
  require_positive(C, INT_MAX, k, "C");
  if (x == out) throw KernelError(fmt::format("{}: out must not alias x", k.variant.name));
  if (state_offset < 0) throw KernelError(fmt::format("{}: state offset {}", k.variant.name, state_offset));
  k.kernel.launch(Dim3(grid_for(C, k.variant.threads(), k), (unsigned)seqs), Dim3((unsigned)k.variant.threads()), 0, s,
                  x, 1, (int)C, w, static_cast<float*>(nullptr), out, static_cast<float*>(nullptr), 0, 0LL, rec_of,
                  reinterpret_cast<const int*>(seq_slot), (long long)state_offset);
}

void launch_concat_f32(const LoadedKernel& k, const float* a, int64_t wa, const float* b, int64_t wb, int64_t n,
                       float* out, StreamHandle s) {
  require_kernel(k, "concat_f32");
  require_aligned(a, 4, k, "a");
  require_aligned(b, 4, k, "b");
  require_aligned(out, 4, k, "out");
  require_positive(wa, INT_MAX, k, "wa");
  require_positive(wb, INT_MAX, k, "wb");
  require_positive(n, INT_MAX, k, "n");
  if (out == a || out == b) throw KernelError(fmt::format("{}: out must not alias a or b", k.variant.name));
  k.kernel.launch(Dim3(stride_grid(n * (wa + wb), k)), Dim3((unsigned)k.variant.threads()), 0, s, a, (int)wa, b,
                  (int)wb, (int)n, out);
}

void launch_head_rmsnorm_f32(const LoadedKernel& k, const float* x, int64_t row_stride, int64_t head_stride,
                             int64_t head_offset, const float* w, int64_t T, int64_t heads, float eps, float* out,
                             StreamHandle s) {
  require_kernel(k, "head_rmsnorm_f32");
  require_aligned(x, 4, k, "x");
  require_aligned(w, 4, k, "w");
  require_aligned(out, 4, k, "out");
  require_positive(T, INT_MAX, k, "T");
  require_positive(heads, INT_MAX, k, "heads");
  if (row_stride < 0 || head_stride < 0 || head_offset < 0)
    throw KernelError(fmt::format("{}: negative stride", k.variant.name));
  k.kernel.launch(Dim3(grid_for(T * heads, k.variant.threads() / 32, k)), Dim3((unsigned)k.variant.threads()), 0, s, x,
                  (long long)row_stride, (long long)head_stride, (long long)head_offset, w, (int)T, (int)heads, eps, out);
}

void launch_gated_rmsnorm_f32(const LoadedKernel& k, const float* o, const float* z, const float* w, int64_t T,
                              int64_t heads, float eps, float* out, StreamHandle s) {
  require_kernel(k, "gated_rmsnorm_f32");
  require_aligned(o, 4, k, "o");
  require_aligned(z, 4, k, "z");
  require_aligned(w, 4, k, "w");
  require_aligned(out, 4, k, "out");
  require_positive(T, INT_MAX, k, "T");
  require_positive(heads, INT_MAX, k, "heads");
  const long long rows = (long long)(T * heads);
  k.kernel.launch(Dim3(grid_for(rows, k.variant.threads() / 32, k)), Dim3((unsigned)k.variant.threads()), 0, s, o, z,
                  w, rows, eps, out);
}

std::vector<double> rope_inv_freq(int64_t rope_dims, float theta) {
  std::vector<double> f((size_t)(rope_dims / 2));
  for (int64_t i = 0; i < rope_dims / 2; ++i)
    f[(size_t)i] = std::pow((double)theta, -2.0 * (double)i / (double)rope_dims);
  return f;
}

void launch_rope_neox_f32(const LoadedKernel& k, const float* in, float* out, const int32_t* pos, int64_t T,
                          int64_t heads, const double* inv_freq, StreamHandle s) {
  require_kernel(k, "rope_neox_f32");
  require_aligned(in, 4, k, "in");
  require_aligned(out, 4, k, "out");
  require_aligned(pos, 4, k, "pos");
  require_aligned(inv_freq, 8, k, "inv_freq");
  require_positive(T, INT_MAX, k, "T");
  require_positive(heads, 65536, k, "heads");
  k.kernel.launch(Dim3(grid_for(T, 1, k)), Dim3((unsigned)k.variant.threads()), 0, s, in, out,
                  reinterpret_cast<const int*>(pos), (int)heads, inv_freq);
}

void launch_kv_write_f16(const LoadedKernel& k, const float* kin, const float* vin, uint16_t* kcache,
                         uint16_t* vcache, int64_t pos0, int64_t T, int64_t W, StreamHandle s) {
  require_kernel(k, "kv_write_f16");
  require_aligned(kin, 8, k, "k");
  require_aligned(vin, 8, k, "v");
  require_aligned(kcache, 4, k, "kcache");
  require_aligned(vcache, 4, k, "vcache");
  require_positive(T, INT_MAX, k, "T");
  if (W <= 0 || W % 2 || W > INT_MAX || pos0 < 0)
    throw KernelError(fmt::format("{}: W = {} (must be even), pos0 = {}", k.variant.name, W, pos0));
  const long long n2 = (long long)(T * W / 2);
  k.kernel.launch(Dim3(stride_grid(n2, k)), Dim3((unsigned)k.variant.threads()), 0, s, kin, vin,
                  reinterpret_cast<unsigned short*>(kcache), reinterpret_cast<unsigned short*>(vcache), (long long)pos0,
                  n2, (int)W);
}

void launch_argmax_f32(const LoadedKernel& k, const float* logits, int64_t rows, int64_t row_stride, int64_t n_valid,
                       int32_t* out, StreamHandle s) {
  require_kernel(k, "argmax_f32");
  require_aligned(logits, 4, k, "logits");
  require_aligned(out, 4, k, "out");
  require_positive(rows, INT_MAX, k, "rows");
  require_positive(n_valid, INT_MAX, k, "n_valid");
  if (row_stride < n_valid) throw KernelError(fmt::format("{}: row stride {} < {}", k.variant.name, row_stride, n_valid));
  k.kernel.launch(Dim3(grid_for(rows, 1, k)), Dim3((unsigned)k.variant.threads()), 0, s, logits, (long long)row_stride,
                  (int)n_valid, reinterpret_cast<int*>(out));
}

}  // namespace qrig::cuda
