// Registry entries, variants and launchers of the pointwise kernels (see pointwise.h).
#include "runtime/cuda/pointwise.h"

#include <climits>
#include <cmath>

#include <fmt/format.h>

#include "runtime/cuda/variant_parts.h"

namespace qrig::cuda {

std::vector<TemplateInfo> pointwise_templates() {
  return {
      {"add_f32", "add_f32.cu", {threads_param()}, "residual add of f32 vectors (float4)"},
      {"swiglu_f32", "swiglu_f32.cu", {threads_param()}, "silu(gate) * up of f32 vectors (float4)"},
      {"conv1d_silu_f32", "conv1d_silu_f32.cu",
       {{"k", "QRIG_K", 2, 8, 1, "taps"}, threads_param()},
       "causal depthwise conv over time + SiLU with a carried window, one thread per channel"},
      {"head_rmsnorm_f32", "head_rmsnorm_f32.cu",
       {{"d", "QRIG_D", 32, 1024, 32, "head dim"}, threads_param()},
       "RMSNorm per head of strided heads (q/k norms), one warp per token and head"},
      {"gated_rmsnorm_f32", "gated_rmsnorm_f32.cu",
       {{"d", "QRIG_D", 32, 1024, 32, "head dim"}, threads_param()},
       "w * rmsnorm(o) * silu(z) per head (GDN output norm), one warp per token and head"},
      {"rope_neox_f32", "rope_neox_f32.cu",
       {{"d", "QRIG_D", 2, 1024, 2, "head dim"}, {"r", "QRIG_R", 2, 1024, 2, "rotated dims"}, threads_param()},
       "partial NeoX RoPE (out may equal in), fp64 angles, one block per token"},
      {"kv_write_f16", "kv_write_f16.cu", {threads_param()}, "append keys and values to the fp16 KV cache"},
      {"argmax_f32", "argmax_f32.cu", {threads_param()}, "index of the largest logit per row (greedy sampling)"},
  };
}

Variant add_f32_variant() { return make_variant("add_f32", {{"t", 256}}); }
Variant swiglu_f32_variant() { return make_variant("swiglu_f32", {{"t", 256}}); }
Variant conv1d_silu_f32_variant(int64_t taps) { return make_variant("conv1d_silu_f32", {{"k", taps}, {"t", 128}}); }
Variant head_rmsnorm_f32_variant(int64_t hd) { return make_variant("head_rmsnorm_f32", {{"d", hd}, {"t", 128}}); }
Variant gated_rmsnorm_f32_variant(int64_t hd) { return make_variant("gated_rmsnorm_f32", {{"d", hd}, {"t", 128}}); }
Variant rope_neox_f32_variant(int64_t hd, int64_t rd) {
  return make_variant("rope_neox_f32", {{"d", hd}, {"r", rd}, {"t", 128}});
}
Variant kv_write_f16_variant() { return make_variant("kv_write_f16", {{"t", 256}}); }
Variant argmax_f32_variant() { return make_variant("argmax_f32", {{"t", 1024}}); }

namespace {

void require_kernel(const LoadedKernel& k, const char* kernel) {
  if (k.variant.kernel != kernel) throw KernelError(fmt::format("{} launcher given the variant {}", kernel, k.variant.name));
}

void require_ptr(const void* p, size_t align, const LoadedKernel& k, const char* what) {
  if (!p) throw KernelError(fmt::format("{}: {} is null", k.variant.name, what));
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw KernelError(fmt::format("{}: {} is not {}-byte aligned", k.variant.name, what, align));
}

void require_positive(int64_t v, int64_t limit, const LoadedKernel& k, const char* what) {
  if (v <= 0 || v > limit) throw KernelError(fmt::format("{}: {} = {} is out of range", k.variant.name, what, v));
}

// Grid-stride kernels: enough blocks to fill the GPU several times over, never more than the items need.
unsigned stride_grid(int64_t items, const LoadedKernel& k) {
  const int64_t t = k.variant.threads();
  return (unsigned)std::min<int64_t>((items + t - 1) / t, 65535);
}

unsigned grid_of(int64_t items, int64_t per_block, const LoadedKernel& k) {
  const int64_t g = (items + per_block - 1) / per_block;
  if (g <= 0 || g > INT_MAX) throw KernelError(fmt::format("{}: {} items need {} blocks", k.variant.name, items, g));
  return (unsigned)g;
}

}  // namespace

void launch_add_f32(const LoadedKernel& k, const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  require_kernel(k, "add_f32");
  require_ptr(a, 16, k, "a");
  require_ptr(b, 16, k, "b");
  require_ptr(out, 16, k, "out");
  if (n <= 0 || n % 4) throw KernelError(fmt::format("{}: n = {} is not a positive multiple of 4", k.variant.name, n));
  const long long n4 = n / 4;
  k.kernel.launch(dim3(stride_grid(n4, k)), dim3((unsigned)k.variant.threads()), 0, s, a, b, out, n4);
}

void launch_swiglu_f32(const LoadedKernel& k, const float* gate, const float* up, float* out, int64_t n,
                       cudaStream_t s) {
  require_kernel(k, "swiglu_f32");
  require_ptr(gate, 16, k, "gate");
  require_ptr(up, 16, k, "up");
  require_ptr(out, 16, k, "out");
  if (n <= 0 || n % 4) throw KernelError(fmt::format("{}: n = {} is not a positive multiple of 4", k.variant.name, n));
  const long long n4 = n / 4;
  k.kernel.launch(dim3(stride_grid(n4, k)), dim3((unsigned)k.variant.threads()), 0, s, gate, up, out, n4);
}

void launch_conv1d_silu_f32(const LoadedKernel& k, const float* x, int64_t T, int64_t C, const float* w,
                            float* state, float* out, cudaStream_t s) {
  require_kernel(k, "conv1d_silu_f32");
  require_ptr(x, 4, k, "x");
  require_ptr(w, 4, k, "w");
  require_ptr(state, 4, k, "state");
  require_ptr(out, 4, k, "out");
  require_positive(T, INT_MAX, k, "T");
  require_positive(C, INT_MAX, k, "C");
  if (x == out) throw KernelError(fmt::format("{}: out must not alias x", k.variant.name));
  k.kernel.launch(dim3(grid_of(C, k.variant.threads(), k)), dim3((unsigned)k.variant.threads()), 0, s, x, (int)T,
                  (int)C, w, state, out);
}

void launch_head_rmsnorm_f32(const LoadedKernel& k, const float* x, int64_t row_stride, int64_t head_stride,
                             int64_t head_offset, const float* w, int64_t T, int64_t heads, float eps, float* out,
                             cudaStream_t s) {
  require_kernel(k, "head_rmsnorm_f32");
  require_ptr(x, 4, k, "x");
  require_ptr(w, 4, k, "w");
  require_ptr(out, 4, k, "out");
  require_positive(T, INT_MAX, k, "T");
  require_positive(heads, INT_MAX, k, "heads");
  if (row_stride < 0 || head_stride < 0 || head_offset < 0)
    throw KernelError(fmt::format("{}: negative stride", k.variant.name));
  k.kernel.launch(dim3(grid_of(T * heads, k.variant.threads() / 32, k)), dim3((unsigned)k.variant.threads()), 0, s, x,
                  (long long)row_stride, (long long)head_stride, (long long)head_offset, w, (int)T, (int)heads, eps, out);
}

void launch_gated_rmsnorm_f32(const LoadedKernel& k, const float* o, const float* z, const float* w, int64_t T,
                              int64_t heads, float eps, float* out, cudaStream_t s) {
  require_kernel(k, "gated_rmsnorm_f32");
  require_ptr(o, 4, k, "o");
  require_ptr(z, 4, k, "z");
  require_ptr(w, 4, k, "w");
  require_ptr(out, 4, k, "out");
  require_positive(T, INT_MAX, k, "T");
  require_positive(heads, INT_MAX, k, "heads");
  const long long rows = (long long)(T * heads);
  k.kernel.launch(dim3(grid_of(rows, k.variant.threads() / 32, k)), dim3((unsigned)k.variant.threads()), 0, s, o, z,
                  w, rows, eps, out);
}

std::vector<double> rope_inv_freq(int64_t rope_dims, float theta) {
  std::vector<double> f((size_t)(rope_dims / 2));
  for (int64_t i = 0; i < rope_dims / 2; ++i)
    f[(size_t)i] = std::pow((double)theta, -2.0 * (double)i / (double)rope_dims);
  return f;
}

void launch_rope_neox_f32(const LoadedKernel& k, const float* in, float* out, const int32_t* pos, int64_t T,
                          int64_t heads, const double* inv_freq, cudaStream_t s) {
  require_kernel(k, "rope_neox_f32");
  require_ptr(in, 4, k, "in");
  require_ptr(out, 4, k, "out");
  require_ptr(pos, 4, k, "pos");
  require_ptr(inv_freq, 8, k, "inv_freq");
  require_positive(T, INT_MAX, k, "T");
  require_positive(heads, 65536, k, "heads");
  k.kernel.launch(dim3(grid_of(T, 1, k)), dim3((unsigned)k.variant.threads()), 0, s, in, out,
                  reinterpret_cast<const int*>(pos), (int)heads, inv_freq);
}

void launch_kv_write_f16(const LoadedKernel& k, const float* kin, const float* vin, uint16_t* kcache,
                         uint16_t* vcache, int64_t pos0, int64_t T, int64_t W, cudaStream_t s) {
  require_kernel(k, "kv_write_f16");
  require_ptr(kin, 8, k, "k");
  require_ptr(vin, 8, k, "v");
  require_ptr(kcache, 4, k, "kcache");
  require_ptr(vcache, 4, k, "vcache");
  require_positive(T, INT_MAX, k, "T");
  if (W <= 0 || W % 2 || W > INT_MAX || pos0 < 0)
    throw KernelError(fmt::format("{}: W = {} (must be even), pos0 = {}", k.variant.name, W, pos0));
  const long long n2 = (long long)(T * W / 2);
  k.kernel.launch(dim3(stride_grid(n2, k)), dim3((unsigned)k.variant.threads()), 0, s, kin, vin,
                  reinterpret_cast<unsigned short*>(kcache), reinterpret_cast<unsigned short*>(vcache), (long long)pos0,
                  n2, (int)W);
}

void launch_argmax_f32(const LoadedKernel& k, const float* logits, int64_t rows, int64_t row_stride, int64_t n_valid,
                       int32_t* out, cudaStream_t s) {
  require_kernel(k, "argmax_f32");
  require_ptr(logits, 4, k, "logits");
  require_ptr(out, 4, k, "out");
  require_positive(rows, INT_MAX, k, "rows");
  require_positive(n_valid, INT_MAX, k, "n_valid");
  if (row_stride < n_valid) throw KernelError(fmt::format("{}: row stride {} < {}", k.variant.name, row_stride, n_valid));
  k.kernel.launch(dim3(grid_of(rows, 1, k)), dim3((unsigned)k.variant.threads()), 0, s, logits, (long long)row_stride,
                  (int)n_valid, reinterpret_cast<int*>(out));
}

}  // namespace qrig::cuda
