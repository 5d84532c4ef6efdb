// Gated DeltaNet kernel set (gdn.h): the templates of this area, the variants a GDN layer needs, and the
// checked launchers of the recurrent step and the two-kernel chunked prefill (gdn_chunk_prep, then
// gdn_chunk_scan through a workspace). Launch geometry is read from the loaded variants themselves, so a
// loader may hand back another valid tiling of the same dims (the benchmark sweeps tilings that way).
#include "runtime/cuda/gdn.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "runtime/cuda/variant_parts.h"

namespace qrig::cuda {

std::vector<TemplateInfo> gdn_templates() {
  const TemplateParam dk{"dk", "QRIG_DK", 32, 128, 32, "key head dim"};
  const TemplateParam dv{"dv", "QRIG_DV", 32, 256, 32, "value head dim"};
  const TemplateParam c{"c", "QRIG_CHUNK", 16, 64, 16, "chunk length (tokens)"};
  return {
      {"gdn_recurrent", "gdn_recurrent.cu",
       {dk, dv, {"cw", "QRIG_CW", 4, 32, 4, "value columns per warp (4, 8, 16 or 32)"}, threads_param()},
       "Gated DeltaNet token-serial recurrence (decode, short steps); state slice in registers"},
      {"gdn_chunk_prep", "gdn_chunk_prep.cu",
       {dk, dv, c, threads_param()},
       "chunked Gated DeltaNet, state-independent part per (chunk, value head): decays, A, P = QK^T*D, "
       "W and U by forward substitution; block size 256"},
      {"gdn_chunk_scan", "gdn_chunk_scan.cu",
       {dk, dv, c, {"ct", "QRIG_CT", 1, 32, 1, "value columns per block (divides 32)"}, threads_param()},
       "chunked Gated DeltaNet, sequential over chunks per (column tile, value head): V' = U - WS, outputs, "
       "state update"},
  };
}

namespace {

// Workspace floats per (value head, chunk): W [C][DK], U [C][DV], P [C][C], fq, fk [C], e_last + 3 pad
// (the BLK of templates/gdn_chunk_prep.cu and gdn_chunk_scan.cu).
int64_t block_floats(const GdnDims& d, int64_t chunk) { return chunk * (d.dk + d.dv + chunk + 4); }

void check_dims(const GdnDims& d, int64_t chunk) {
  if (d.Hk <= 0 || d.Hv <= 0 || d.dk <= 0 || d.dv <= 0 || d.Hv % d.Hk != 0 || d.Hv > 65535)
    throw KernelError(fmt::format("gdn: bad dims Hk={} Hv={} dk={} dv={} (Hv a multiple of Hk, at most 65535)",
                                  d.Hk, d.Hv, d.dk, d.dv));
  if (2 * d.Hk * d.dk + d.Hv * d.dv > INT_MAX / 64)  // the kernels index a chunk's rows with int offsets
    throw KernelError(fmt::format("gdn: a mixed row of {} floats is too long", 2 * d.Hk * d.dk + d.Hv * d.dv));
  if (chunk != 16 && chunk != 32 && chunk != 48 && chunk != 64)
    throw KernelError(fmt::format("gdn: chunk length {} (the chunked kernels take 16, 32, 48 or 64)", chunk));
}

// The static_asserts of gdn_chunk_scan.cu for a tiling (ct columns, t threads), shared memory included.
bool scan_tiling_ok(const GdnDims& d, int64_t chunk, int64_t ct, int64_t t) {
  if (ct <= 0 || ct > 32 || 32 % ct != 0 || t % ct != 0 || t < chunk || d.dv % ct != 0) return false;
  const int64_t g = t / ct;
  const int64_t tile = chunk * (std::max(d.dk, chunk) + 4);
  return chunk % g == 0 && (chunk / g) % 4 == 0 && d.dk % g == 0 && (d.dk / g) % 4 == 0 &&
         (d.dk * ct + chunk * ct + chunk + tile) * 4 <= 48 * 1024;
}

// gdn_recurrent.cu's: cw in {4, 8, 16, 32}, DK a multiple of the row groups, DV of the block's columns.
bool recurrent_tiling_ok(const GdnDims& d, int64_t cw, int64_t t) {
  if (cw != 4 && cw != 8 && cw != 16 && cw != 32) return false;
  const int64_t row_groups = 32 / (cw / 4);
  return t % 32 == 0 && d.dk % 32 == 0 && d.dk % row_groups == 0 && d.dv % (cw * (t / 32)) == 0;
}

Variant recurrent_variant(const GdnDims& d) {
  // 8 columns per warp (32-byte row segments), 4 warps: 32 columns per block, 128 blocks at 9B dims.
  for (int64_t t : {128, 64, 32})
    if (recurrent_tiling_ok(d, 8, t))
      return make_variant("gdn_recurrent", {{"dk", d.dk}, {"dv", d.dv}, {"cw", 8}, {"t", t}});
  throw KernelError(fmt::format("gdn_recurrent: no tiling for dk={} dv={}", d.dk, d.dv));
}

Variant scan_variant(const GdnDims& d, int64_t chunk) {
  // 16 columns per block, 16 row groups (256 threads): 256 blocks at 9B dims (fastest on the H200; bench).
  for (int64_t ct : {16, 8, 32})
    for (int64_t g : {16, 8, 4})
      if (scan_tiling_ok(d, chunk, ct, ct * g))
        return make_variant("gdn_chunk_scan", {{"dk", d.dk}, {"dv", d.dv}, {"c", chunk}, {"ct", ct}, {"t", ct * g}});
  throw KernelError(fmt::format("gdn_chunk_scan: no tiling for dk={} dv={} chunk={}", d.dk, d.dv, chunk));
}

void require_ptr(const void* p, size_t align, const char* what) {
  if (!p) throw KernelError(fmt::format("gdn: {} is null", what));
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    throw KernelError(fmt::format("gdn: {} is not {}-byte aligned", what, align));
}

void require_variant(const LoadedKernel& k, const char* kernel, const GdnDims& d, int64_t chunk) {
  const Variant& v = k.variant;
  if (v.kernel != kernel) throw KernelError(fmt::format("gdn: expected a {} variant, got {}", kernel, v.name));
  if (v.param("dk") != d.dk || v.param("dv") != d.dv)
    throw KernelError(fmt::format("gdn: {} does not match dk={} dv={}", v.name, d.dk, d.dv));
  if (v.kernel != std::string("gdn_recurrent") && v.param("c") != chunk)
    throw KernelError(fmt::format("gdn: {} does not match chunk length {}", v.name, chunk));
  bool ok = true;
  if (v.kernel == "gdn_recurrent") ok = recurrent_tiling_ok(d, v.param("cw"), v.threads());
  if (v.kernel == "gdn_chunk_prep") ok = v.threads() == 256;
  if (v.kernel == "gdn_chunk_scan") ok = scan_tiling_ok(d, chunk, v.param("ct"), v.threads());
  if (!ok) throw KernelError(fmt::format("gdn: {} is not a valid tiling for dk={} dv={}", v.name, d.dk, d.dv));
}

}  // namespace

std::vector<Variant> gdn_variants(const GdnDims& d, int64_t chunk) {
  check_dims(d, chunk);
  return {recurrent_variant(d),
          make_variant("gdn_chunk_prep", {{"dk", d.dk}, {"dv", d.dv}, {"c", chunk}, {"t", 256}}),
          scan_variant(d, chunk)};
}

GdnKernels::GdnKernels(const KernelLoader& load, const GdnDims& d, int64_t chunk) : d_(d), chunk_(chunk) {
  const std::vector<Variant> vs = gdn_variants(d, chunk);
  for (const Variant& v : vs) kernels_.push_back(load(v));
  require_variant(kernels_[0], "gdn_recurrent", d_, chunk_);
  require_variant(kernels_[1], "gdn_chunk_prep", d_, chunk_);
  require_variant(kernels_[2], "gdn_chunk_scan", d_, chunk_);
}

size_t GdnKernels::workspace_bytes(int64_t max_t) const {
  if (max_t <= 0) return 0;
  const int64_t chunks = (max_t + chunk_ - 1) / chunk_;
  return (size_t)chunks * (size_t)d_.Hv * (size_t)block_floats(d_, chunk_) * sizeof(float);
}

void GdnKernels::run(const float* mixed, const float* alpha, const float* beta, const float* ssm_a,
                     const float* dt_bias, int64_t T, float* state, float* out, bool recurrent, void* workspace,
                     cudaStream_t stream) const {
  if (T < 0 || T > INT_MAX / 2) throw KernelError(fmt::format("gdn: {} tokens", T));
  if (T == 0) return;
  require_ptr(mixed, 16, "mixed");
  require_ptr(alpha, 4, "alpha");
  require_ptr(beta, 4, "beta");
  require_ptr(ssm_a, 4, "ssm_a");
  require_ptr(dt_bias, 4, "dt_bias");
  require_ptr(state, 16, "state");
  require_ptr(out, 16, "out");
  const int n = (int)T, hk = (int)d_.Hk, hv = (int)d_.Hv;
  if (recurrent) {
    const LoadedKernel& k = kernels_[0];
    const int64_t cols = k.variant.param("cw") * (k.variant.threads() / 32);
    k.kernel.launch(dim3((unsigned)(d_.dv / cols), (unsigned)hv), dim3((unsigned)k.variant.threads()), 0, stream,
                    mixed, alpha, beta, ssm_a, dt_bias, n, hk, hv, state, out);
    return;
  }
  require_ptr(workspace, 256, "workspace");
  float* ws = static_cast<float*>(workspace);
  const int64_t chunks = (T + chunk_ - 1) / chunk_;
  const LoadedKernel& prep = kernels_[1];
  prep.kernel.launch(dim3((unsigned)chunks, (unsigned)hv), dim3((unsigned)prep.variant.threads()), 0, stream, mixed,
                     alpha, beta, ssm_a, dt_bias, n, hk, hv, ws);
  const LoadedKernel& scan = kernels_[2];
  const float* cws = ws;
  scan.kernel.launch(dim3((unsigned)(d_.dv / scan.variant.param("ct")), (unsigned)hv),
                     dim3((unsigned)scan.variant.threads()), 0, stream, mixed, n, hk, hv, cws, state, out);
}

}  // namespace qrig::cuda
