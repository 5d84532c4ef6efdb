// Gated DeltaNet kernels (gdn.h): registry entries, tiling rules, variants and the choice per range of tokens.
#include "kernels/gdn.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "kernels/registry.h"

namespace qrig::kernels {

std::vector<TemplateInfo> gdn_templates() {
  const TemplateParam dk{"dk", "QRIG_DK", 32, 128, 32, "key head dim"};
  const TemplateParam dv{"dv", "QRIG_DV", 32, 256, 32, "value head dim"};
  const TemplateParam c{"c", "QRIG_CHUNK", 16, 64, 16, "chunk length (tokens)"};
  return {
      {"gdn_recurrent", "gdn_recurrent.cu",
       {dk, dv, {"cw", "QRIG_CW", 4, 32, 4, "value columns per warp (4, 8, 16 or 32)"}, batched_param(),
        threads_param()},
       "Gated DeltaNet token-serial recurrence (decode, short steps); state slice in registers (b1: grid.z over the "
       "sequences of a decode step)"},
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

void gdn_check_dims(const GdnDims& d, int64_t chunk) {
  if (d.Hk <= 0 || d.Hv <= 0 || d.dk <= 0 || d.dv <= 0 || d.Hv % d.Hk != 0 || d.Hv > 65535)
    throw KernelError(fmt::format("gdn: bad dims Hk={} Hv={} dk={} dv={} (Hv a multiple of Hk, at most 65535)",
                                  d.Hk, d.Hv, d.dk, d.dv));
  if (2 * d.Hk * d.dk + d.Hv * d.dv > INT_MAX / 64)  // the kernels index a chunk's rows with int offsets
    throw KernelError(fmt::format("gdn: a mixed row of {} floats is too long", 2 * d.Hk * d.dk + d.Hv * d.dv));
  if (chunk != 16 && chunk != 32 && chunk != 48 && chunk != 64)
    throw KernelError(fmt::format("gdn: chunk length {} (the chunked kernels take 16, 32, 48 or 64)", chunk));
}

bool gdn_scan_tiling_ok(const GdnDims& d, int64_t chunk, int64_t ct, int64_t t) {
  if (ct <= 0 || ct > 32 || 32 % ct != 0 || t % ct != 0 || t < chunk || d.dv % ct != 0) return false;
  const int64_t g = t / ct;
  const int64_t tile = chunk * (std::max(d.dk, chunk) + 4);
  return chunk % g == 0 && (chunk / g) % 4 == 0 && d.dk % g == 0 && (d.dk / g) % 4 == 0 &&
         (d.dk * ct + chunk * ct + chunk + tile) * 4 <= 48 * 1024;
}

bool gdn_recurrent_tiling_ok(const GdnDims& d, int64_t cw, int64_t t) {
  if (cw != 4 && cw != 8 && cw != 16 && cw != 32) return false;
  const int64_t row_groups = 32 / (cw / 4);
  return t % 32 == 0 && d.dk % 32 == 0 && d.dk % row_groups == 0 && d.dv % (cw * (t / 32)) == 0;
}

Variant gdn_recurrent_variant(const GdnDims& d, int64_t batched) {
  // 8 columns per warp (32-byte row segments), 4 warps: 32 columns per block, 128 blocks at 9B dims.
  for (int64_t t : {128, 64, 32})
    if (gdn_recurrent_tiling_ok(d, 8, t))
      return make_variant("gdn_recurrent", {{"dk", d.dk}, {"dv", d.dv}, {"cw", 8}, {"b", batched}, {"t", t}});
  throw KernelError(fmt::format("gdn_recurrent: no tiling for dk={} dv={}", d.dk, d.dv));
}

Variant gdn_chunk_prep_variant(const GdnDims& d, int64_t chunk) {
  return make_variant("gdn_chunk_prep", {{"dk", d.dk}, {"dv", d.dv}, {"c", chunk}, {"t", 256}});
}

Variant gdn_chunk_scan_variant(const GdnDims& d, int64_t chunk) {
  // 16 columns per block, 16 row groups (256 threads): 256 blocks at 9B dims (fastest on the H200; bench).
  for (int64_t ct : {16, 8, 32})
    for (int64_t g : {16, 8, 4})
      if (gdn_scan_tiling_ok(d, chunk, ct, ct * g))
        return make_variant("gdn_chunk_scan", {{"dk", d.dk}, {"dv", d.dv}, {"c", chunk}, {"ct", ct}, {"t", ct * g}});
  throw KernelError(fmt::format("gdn_chunk_scan: no tiling for dk={} dv={} chunk={}", d.dk, d.dv, chunk));
}

// Workspace floats per (value head, chunk): W [C][DK], U [C][DV], P [C][C], fq, fk [C], e_last + 3 pad
// (the BLK of templates/gdn_chunk_prep.cu and gdn_chunk_scan.cu).
int64_t gdn_workspace_bytes(const GdnDims& d, int64_t chunk, int64_t max_t) {
  if (max_t <= 0) return 0;
  const int64_t chunks = (max_t + chunk - 1) / chunk;
  return chunks * d.Hv * chunk * (d.dk + d.dv + chunk + 4) * 4;
}

std::vector<KernelRange> choose_gdn(const GdnDims& d, int64_t chunk, int64_t max_tokens, const Tuning& t) {
  gdn_check_dims(d, chunk);
  if (max_tokens < 1) throw KernelError(fmt::format("gdn: {} tokens", max_tokens));
  std::vector<KernelRange> out;
  const int64_t below = std::max<int64_t>(1, t.gdn_recurrent_below);
  if (below > 1)
    out.push_back({1, std::min(below - 1, max_tokens), {{gdn_recurrent_variant(d)}},
                   fmt::format("fewer than {} tokens per sequence: the token-serial kernel (state in registers) beats "
                               "the chunked pair", below)});
  if (max_tokens >= below)
    out.push_back({below, max_tokens, {{gdn_chunk_prep_variant(d, chunk), gdn_chunk_scan_variant(d, chunk)}},
                   fmt::format("{} tokens or more: the chunked algorithm ({}-token chunks, parallel prep, then a scan "
                               "over chunks)", below, chunk)});
  return out;
}

std::vector<KernelRange> choose_gdn_decode(const GdnDims& d, int64_t chunk, int64_t max_seqs, const Tuning& t) {
  if (max_seqs < 1) throw KernelError(fmt::format("gdn: decode steps of {} sequences", max_seqs));
  const std::vector<KernelRange> one = choose_gdn(d, chunk, 1, t);
  if (one.at(0).parts.at(0).size() != 1) return {};
  std::vector<KernelRange> out = {{1, 1, one[0].parts, "one sequence: the recurrent kernel over its state"}};
  if (max_seqs >= 2)
    out.push_back({2, max_seqs, {{gdn_recurrent_variant(d, 1)}},
                   "a decode step's sequences in one launch (grid.z over sequences, each its slot's state)"});
  return out;
}

std::vector<Variant> gdn_variants(const GdnDims& d, int64_t chunk) {
  gdn_check_dims(d, chunk);
  return {gdn_recurrent_variant(d), gdn_chunk_prep_variant(d, chunk), gdn_chunk_scan_variant(d, chunk)};
}

}  // namespace qrig::kernels
