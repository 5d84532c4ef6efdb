// Gated DeltaNet kernel set (gdn.h): the checked launches of the recurrent step and the two-kernel chunked
// prefill, for the variants the plan names. Launch geometry is read from the loaded variants themselves, so a
// loader may hand back another valid tiling of the same dims (the benchmark sweeps tilings that way).
#include "runtime/cuda/gdn.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

namespace qrig::cuda {

namespace {

void require_variant(const LoadedKernel& k, const char* kernel, const GdnDims& d, int64_t chunk) {
  const Variant& v = k.variant;
  if (v.kernel != kernel) throw KernelError(fmt::format("gdn: expected a {} variant, got {}", kernel, v.name));
  if (v.param("dk") != d.dk || v.param("dv") != d.dv)
    throw KernelError(fmt::format("gdn: {} does not match dk={} dv={}", v.name, d.dk, d.dv));
  if (v.kernel != std::string("gdn_recurrent") && v.param("c") != chunk)
    throw KernelError(fmt::format("gdn: {} does not match chunk length {}", v.name, chunk));
  bool ok = true;
  if (v.kernel == "gdn_recurrent") ok = kernels::gdn_recurrent_tiling_ok(d, v.param("cw"), v.threads());
  if (v.kernel == "gdn_recurrent" && v.param("b") != 0)
    throw KernelError(fmt::format("gdn: {} is the batched decode kernel, not one sequence's", v.name));
  if (v.kernel == "gdn_chunk_prep") ok = v.threads() == 256;
  if (v.kernel == "gdn_chunk_scan") ok = kernels::gdn_scan_tiling_ok(d, chunk, v.param("ct"), v.threads());
  if (!ok) throw KernelError(fmt::format("gdn: {} is not a valid tiling for dk={} dv={}", v.name, d.dk, d.dv));
}

}  // namespace

GdnKernels::GdnKernels(const KernelLoader& load, const GdnDims& d, int64_t chunk,
                       const std::vector<ir::LaunchRange>& ranges)
    : d_(d), chunk_(chunk) {
  kernels::gdn_check_dims(d, chunk);
  for (const ir::LaunchRange& lr : ranges) {
    if (lr.parts.size() != 1 || (lr.parts[0].size() != 1 && lr.parts[0].size() != 2))
      throw KernelError(fmt::format("gdn: rows {}-{} must name the recurrent kernel or the chunked pair", lr.first,
                                    lr.last));
    Range r{lr.first, lr.last, {}};
    for (const auto& name : lr.parts[0]) r.kernels.push_back(load(parse_variant(name)));
    if (r.kernels.size() == 1) {
      require_variant(r.kernels[0], "gdn_recurrent", d_, chunk_);
    } else {
      require_variant(r.kernels[0], "gdn_chunk_prep", d_, chunk_);
      require_variant(r.kernels[1], "gdn_chunk_scan", d_, chunk_);
    }
    ranges_.push_back(std::move(r));
  }
  if (ranges_.empty()) throw KernelError("gdn: no kernel");
}

const GdnKernels::Range& GdnKernels::range_for(int64_t T) const {
  for (const Range& r : ranges_)
    if (T >= r.first && T <= r.last) return r;
  throw KernelError(fmt::format("gdn: {} tokens, outside the plan's {}..{}", T, ranges_.front().first,
                                ranges_.back().last));
}

bool GdnKernels::recurrent_for(int64_t T) const { return range_for(T).kernels.size() == 1; }

void GdnKernels::run(const float* mixed, const float* alpha, const float* beta, const float* ssm_a,
                     const float* dt_bias, int64_t T, float* state, float* out, void* workspace,
                     StreamHandle stream, float* kept, int64_t keep, int64_t kept_stride) const {
  if (T < 0 || T > INT_MAX / 2) throw KernelError(fmt::format("gdn: {} tokens", T));
  if (T == 0) return;
  require_aligned(mixed, 16, "gdn", "mixed");
  require_aligned(alpha, 4, "gdn", "alpha");
  require_aligned(beta, 4, "gdn", "beta");
  require_aligned(ssm_a, 4, "gdn", "ssm_a");
  require_aligned(dt_bias, 4, "gdn", "dt_bias");
  require_aligned(state, 16, "gdn", "state");
  require_aligned(out, 16, "gdn", "out");
  const int n = (int)T, hk = (int)d_.Hk, hv = (int)d_.Hv;
  const Range& r = range_for(T);
  if (keep < 0 || keep >= T) throw KernelError(fmt::format("gdn: keeping the state after {} of {} tokens", keep, T));
  if (keep > 0) {
    if (r.kernels.size() != 1)
      throw KernelError(fmt::format("gdn: a step of {} tokens runs the chunked pair, which keeps no state per token", T));
    require_aligned(kept, 16, "gdn", "kept");
    if (kept_stride < d_.Hv * d_.dk * d_.dv || kept_stride % 4 || kept_stride > INT_MAX)
      throw KernelError(fmt::format("gdn: kept states {} floats apart, each {}", kept_stride, d_.Hv * d_.dk * d_.dv));
  }
  if (r.kernels.size() == 1) {
    const LoadedKernel& k = r.kernels[0];
    const int64_t cols = k.variant.param("cw") * (k.variant.threads() / 32);
    float* kept_arg = keep > 0 ? kept : nullptr;
    k.kernel.launch(Dim3((unsigned)(d_.dv / cols), (unsigned)hv), Dim3((unsigned)k.variant.threads()), 0, stream,
                    mixed, alpha, beta, ssm_a, dt_bias, n, hk, hv, state, out, kept_arg, (int)keep,
                    (int)(keep > 0 ? kept_stride : 0), static_cast<float* const*>(nullptr),
                    static_cast<const int*>(nullptr), 0LL);
    return;
  }
  require_aligned(workspace, 256, "gdn", "workspace");
  float* ws = static_cast<float*>(workspace);
  const int64_t chunks = (T + chunk_ - 1) / chunk_;
  const LoadedKernel& prep = r.kernels[0];
  prep.kernel.launch(Dim3((unsigned)chunks, (unsigned)hv), Dim3((unsigned)prep.variant.threads()), 0, stream, mixed,
                     alpha, beta, ssm_a, dt_bias, n, hk, hv, ws);
  const LoadedKernel& scan = r.kernels[1];
  const float* cws = ws;
  scan.kernel.launch(Dim3((unsigned)(d_.dv / scan.variant.param("ct")), (unsigned)hv),
                     Dim3((unsigned)scan.variant.threads()), 0, stream, mixed, n, hk, hv, cws, state, out);
}

void launch_gdn_recurrent_batched(const LoadedKernel& k, const GdnDims& d, const float* mixed, const float* alpha,
                                  const float* beta, const float* ssm_a, const float* dt_bias, int64_t seqs,
                                  float* const* rec_of, const int32_t* seq_slot, int64_t state_offset, float* out,
                                  StreamHandle stream) {
  const Variant& v = k.variant;
  if (v.kernel != "gdn_recurrent" || v.param("b") != 1)
    throw KernelError(fmt::format("gdn: {} is not the batched recurrent kernel", v.name));
  if (v.param("dk") != d.dk || v.param("dv") != d.dv || !kernels::gdn_recurrent_tiling_ok(d, v.param("cw"), v.threads()))
    throw KernelError(fmt::format("gdn: {} does not match dk={} dv={}", v.name, d.dk, d.dv));
  if (seqs <= 0 || seqs > 65535) throw KernelError(fmt::format("gdn: a batched step of {} sequences", seqs));
  if (state_offset < 0 || state_offset % 4)
    throw KernelError(fmt::format("gdn: state offset {} (a multiple of 4 floats)", state_offset));
  require_aligned(mixed, 16, "gdn", "mixed");
  require_aligned(alpha, 4, "gdn", "alpha");
  require_aligned(beta, 4, "gdn", "beta");
  require_aligned(ssm_a, 4, "gdn", "ssm_a");
  require_aligned(dt_bias, 4, "gdn", "dt_bias");
  require_aligned(out, 16, "gdn", "out");
  require_aligned(rec_of, 8, "gdn", "rec_of");
  require_aligned(seq_slot, 4, "gdn", "seq_slot");
  const int64_t cols = v.param("cw") * (v.threads() / 32);
  k.kernel.launch(Dim3((unsigned)(d.dv / cols), (unsigned)d.Hv, (unsigned)seqs), Dim3((unsigned)v.threads()), 0, stream,
                  mixed, alpha, beta, ssm_a, dt_bias, 1, (int)d.Hk, (int)d.Hv, static_cast<float*>(nullptr), out,
                  static_cast<float*>(nullptr), 0, 0, rec_of, reinterpret_cast<const int*>(seq_slot),
                  (long long)state_offset);
}

}  // namespace qrig::cuda
