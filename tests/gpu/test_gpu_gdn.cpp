// The Gated DeltaNet kernels (runtime/cuda/gdn.h) against the CPU reference ops on the same inputs: the
// recurrent path against cpu::gdn_recurrent, the chunked path (gdn_chunk_prep + gdn_chunk_scan) against
// cpu::gdn_chunked, outputs and final state, at the tiny fixture's dims (Hk 2, Hv 4, head dims 128), the 9B
// dims (16 / 32 / 128 / 128) and odd dims (Hk 1, Hv 3, dk 64, dv 32), for T in {1, 2, 5, 15, 16, 63, 64,
// 65, 130, 512} on both paths, starting from a nonzero state; the serving pattern (chunked prefill, then
// recurrent steps, then more chunked prefill) continuing the state; other chunk lengths; determinism.
// Inputs are realistic: mixed = silu(N(0,1)), alpha and beta raw N(0,1), ssm_a = -exp(N(0,0.5)) with value
// head 0 at -30 (its cumulative decay underflows within a chunk: the decays must be exp of differences),
// dt_bias N(0,0.5), state N(0,0.3). Outputs, state and workspace are poisoned with NaN first.
// Error = max|gpu - cpu| / max|cpu| (rel_err). Thresholds:
//   recurrent vs cpu::gdn_recurrent   3e-6   fp32 throughout, like the reference; only the order of the
//   chunked   vs cpu::gdn_chunked     3e-6   128-term dot products and of the forward substitution differ (the
//                                            reference solves for T = (I+A)^-1 first), and the gates are fp32
//                                            where the reference uses double: measured <= 6.2e-7 over every
//                                            shape and T (H200, 2026-12-02; was 1e-4). The state is
//                                            contractive (|k| = 1, beta < 1, decay <= 1), so rounding does not
//                                            grow with T. Deliberately broken kernels (a dropped decay term, a
//                                            mask off by one; tests/gpu/broken_kernels.h) must miss it.
//   chunked vs recurrent (both GPU)   3e-6   the two algorithms are the same math
//   repeated runs                     bit-equal (fixed reduction order)
#include <catch2/catch.hpp>

#include "runtime/cuda/gdn.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

constexpr double kTol = 3e-6;  // measured <= 6.2e-7 over every shape and T here (H200, 2026-12-02); was 1e-4

struct Inputs {
  GdnDims d;
  int64_t T = 0;
  std::vector<float> mixed, alpha, beta, ssm_a, dt_bias, state0;
  int64_t conv() const { return 2 * d.Hk * d.dk + d.Hv * d.dv; }
  size_t out_size(int64_t n) const { return (size_t)(n * d.Hv * d.dv); }
};

Inputs make_inputs(const GdnDims& d, int64_t T, uint64_t seed) {
  Inputs in;
  in.d = d;
  in.T = T;
  in.mixed = randn((size_t)(T * in.conv()), seed);
  for (float& x : in.mixed) x = x / (1.0f + std::exp(-x));  // silu, as after the causal conv
  in.alpha = randn((size_t)(T * d.Hv), seed + 1);
  in.beta = randn((size_t)(T * d.Hv), seed + 2);
  in.ssm_a = randn((size_t)d.Hv, seed + 3, 0.0f, 0.5f);
  for (float& a : in.ssm_a) a = -std::exp(a);
  in.ssm_a[0] = -30.0f;
  in.dt_bias = randn((size_t)d.Hv, seed + 4, 0.0f, 0.5f);
  in.state0 = randn((size_t)(d.Hv * d.dk * d.dv), seed + 5, 0.0f, 0.3f);
  return in;
}

cpu::GdnShape shape(const GdnDims& d) { return {d.Hk, d.Hv, d.dk, d.dv}; }

// The inputs and state on the GPU, and the kernels; run() advances the state over tokens [t0, t0 + n).
struct GpuGdn {
  const Inputs& in;
  int64_t chunk;
  GdnKernels rec, chunked;  // every length on the recurrent kernel, and on the chunked pair
  DeviceBuffer<float> mixed, alpha, beta, ssm_a, dt_bias, state, ws;

  static LoadedKernel gpu_load(const Variant& v) { return Gpu::get().load(v); }
  GpuGdn(const Inputs& in_, int64_t chunk_ = 64, const KernelLoader& load = gpu_load)
      : in(in_),
        chunk(chunk_),
        rec(gdn_kernels(load, in_.d, chunk_, 1 << 16, (1 << 16) + 1)),
        chunked(gdn_kernels(load, in_.d, chunk_, 1 << 16, 1)),
        mixed(0, in_.mixed.size(), "gdn mixed"),
        alpha(0, in_.alpha.size(), "gdn alpha"),
        beta(0, in_.beta.size(), "gdn beta"),
        ssm_a(0, in_.ssm_a.size(), "gdn ssm_a"),
        dt_bias(0, in_.dt_bias.size(), "gdn dt_bias"),
        state(0, in_.state0.size(), "gdn state"),
        ws(0, std::max<size_t>(1, (size_t)gdn_workspace_bytes(in_.d, chunk_, in_.T) / 4), "gdn workspace") {
    mixed.upload(in.mixed);
    alpha.upload(in.alpha);
    beta.upload(in.beta);
    ssm_a.upload(in.ssm_a);
    dt_bias.upload(in.dt_bias);
    state.upload(in.state0);
  }
  std::vector<float> run(int64_t t0, int64_t n, bool recurrent) {
    Gpu& g = Gpu::get();
    auto out = poisoned_device(in.out_size(n), "gdn out");
    ws.fill_bytes(0xFF);
    (recurrent ? rec : chunked)
        .run(mixed.data() + t0 * in.conv(), alpha.data() + t0 * in.d.Hv, beta.data() + t0 * in.d.Hv, ssm_a.data(),
             dt_bias.data(), n, state.data(), out.data(), ws.data(), g.stream.get());
    g.stream.sync(recurrent ? "gdn recurrent" : "gdn chunked");
    return out.download();
  }
};

// The CPU reference over tokens [t0, t0 + n), continuing `state`.
std::vector<float> cpu_run(const Inputs& in, int64_t t0, int64_t n, bool recurrent, std::vector<float>& state,
                           int64_t chunk = 64) {
  std::vector<float> out = cpu::test::poisoned(in.out_size(n));
  const float* mixed = in.mixed.data() + t0 * in.conv();
  const float* alpha = in.alpha.data() + t0 * in.d.Hv;
  const float* beta = in.beta.data() + t0 * in.d.Hv;
  if (recurrent)
    cpu::gdn_recurrent(shape(in.d), mixed, alpha, beta, in.ssm_a.data(), in.dt_bias.data(), n, state.data(), out.data());
  else
    cpu::gdn_chunked(shape(in.d), mixed, alpha, beta, in.ssm_a.data(), in.dt_bias.data(), n, state.data(), out.data(),
                     chunk);
  return out;
}

std::string dims_name(const GdnDims& d) { return fmt::format("Hk{} Hv{} dk{} dv{}", d.Hk, d.Hv, d.dk, d.dv); }

void check_both_paths(const GdnDims& d, const std::vector<int64_t>& lengths, bool determinism) {
  for (int64_t T : lengths)
    for (bool recurrent : {true, false}) {
      const std::string op = recurrent ? "gdn recurrent" : "gdn chunked";
      const std::string what = fmt::format("{} T={}", dims_name(d), T);
      INFO(op << " " << what);
      const Inputs in = make_inputs(d, T, 1000 + (uint64_t)T);
      std::vector<float> ref_state = in.state0;
      const std::vector<float> ref = cpu_run(in, 0, T, recurrent, ref_state);
      GpuGdn gpu(in);
      const std::vector<float> out = gpu.run(0, T, recurrent);
      const std::vector<float> state = gpu.state.download();
      const std::string vs = recurrent ? "vs cpu::gdn_recurrent" : "vs cpu::gdn_chunked";
      const double eo = rel_err(out, ref), es = rel_err(state, ref_state);
      report(op, what, "out " + vs, eo, kTol);
      report(op, what, "state " + vs, es, kTol);
      CHECK(eo <= kTol);
      CHECK(es <= kTol);
      if (determinism) {
        gpu.state.upload(in.state0);
        CHECK(cpu::test::bit_equal(gpu.run(0, T, recurrent), out));
        CHECK(cpu::test::bit_equal(gpu.state.download(), state));
      }
    }
}

// Chunked prefill of a prefix, recurrent steps, more chunked prefill: the state carries across calls and paths.
void check_serving_pattern(const GdnDims& d, int64_t prefix, int64_t steps, int64_t more) {
  const int64_t T = prefix + steps + more;
  const std::string what = fmt::format("{} chunked {} + recurrent {}x1 + chunked {}", dims_name(d), prefix, steps, more);
  INFO(what);
  const Inputs in = make_inputs(d, T, 2000 + (uint64_t)T);
  std::vector<float> ref_state = in.state0;
  GpuGdn gpu(in);
  std::vector<float> ref, out;
  auto append = [](std::vector<float>& to, const std::vector<float>& v) { to.insert(to.end(), v.begin(), v.end()); };
  append(ref, cpu_run(in, 0, prefix, false, ref_state));
  append(out, gpu.run(0, prefix, false));
  for (int64_t t = prefix; t < prefix + steps; ++t) {
    append(ref, cpu_run(in, t, 1, true, ref_state));
    append(out, gpu.run(t, 1, true));
  }
  append(ref, cpu_run(in, prefix + steps, more, false, ref_state));
  append(out, gpu.run(prefix + steps, more, false));
  const double eo = rel_err(out, ref), es = rel_err(gpu.state.download(), ref_state);
  report("gdn chunked+recurrent", what, "out vs cpu ops", eo, kTol);
  report("gdn chunked+recurrent", what, "state vs cpu ops", es, kTol);
  CHECK(eo <= kTol);
  CHECK(es <= kTol);
}

void check_chunk_lengths(const GdnDims& d, int64_t T) {
  for (int64_t chunk : {16, 32, 48}) {
    const std::string what = fmt::format("{} T={} chunk={}", dims_name(d), T, chunk);
    INFO(what);
    const Inputs in = make_inputs(d, T, 3000 + (uint64_t)chunk);
    std::vector<float> ref_state = in.state0;
    const std::vector<float> ref = cpu_run(in, 0, T, false, ref_state, chunk);
    GpuGdn gpu(in, chunk);
    const std::vector<float> out = gpu.run(0, T, false);
    const double eo = rel_err(out, ref), es = rel_err(gpu.state.download(), ref_state);
    report("gdn chunked", what, "out vs cpu::gdn_chunked", eo, kTol);
    report("gdn chunked", what, "state vs cpu::gdn_chunked", es, kTol);
    CHECK(eo <= kTol);
    CHECK(es <= kTol);
  }
}

const GdnDims kTiny{2, 4, 128, 128}, k9B{16, 32, 128, 128}, kOdd{1, 3, 64, 32};
const std::vector<int64_t> kLengths = {1, 2, 5, 15, 16, 63, 64, 65, 130, 512};

}  // namespace

TEST_CASE("gdn recurrent and chunked match the CPU ops at the tiny model's dims (short subset)", "[gpu][short][gdn]") {
  check_both_paths(kTiny, {1, 5, 65}, true);
  check_serving_pattern(kTiny, 70, 2, 5);
}

TEST_CASE("gdn recurrent and chunked match the CPU ops at the tiny model's and odd dims, every length", "[gpu][gdn]") {
  check_both_paths(kTiny, kLengths, false);
  check_both_paths(kOdd, kLengths, false);
  check_chunk_lengths(kTiny, 130);
  check_serving_pattern(kOdd, 64, 3, 1);
}

TEST_CASE("gdn recurrent and chunked match the CPU ops at 9B dims", "[gpu][gdn]") {
  check_both_paths(k9B, kLengths, false);
  check_both_paths(k9B, {130}, true);
  check_serving_pattern(k9B, 130, 3, 64);
}

TEST_CASE("gdn chunked and recurrent agree with each other on the GPU (9B dims, 200 tokens)", "[gpu][gdn]") {
  const Inputs in = make_inputs(k9B, 200, 4000);
  GpuGdn a(in), b(in);
  const std::vector<float> oc = a.run(0, in.T, false), orc = b.run(0, in.T, true);
  const double eo = rel_err(oc, orc), es = rel_err(a.state.download(), b.state.download());
  report("gdn chunked vs recurrent", "9B T=200", "out", eo, kTol);
  report("gdn chunked vs recurrent", "9B T=200", "state", es, kTol);
  CHECK(eo <= kTol);
  CHECK(es <= kTol);
}

// The thresholds catch real bugs: each GDN bug of tests/gpu/broken_kernels.h (a dropped state decay term, a
// softplus without its log1p term, a dropped query scale, P's causal mask off by one, a dropped chunk decay) patched
// into its template and compiled by NVRTC must miss kTol on the output or the final state, the real test's
// comparison, at the tiny model's dims (T = 130: three chunks, the last partial; 17 batches of the recurrent
// kernel's 8 tokens, the last partial); the unpatched templates through the same path stay within it. Both paths
// run for every bug: the patched kernel's path carries the bug, the other one runs the real kernels (their error
// stays small, so the maximum is the bug's).
TEST_CASE("deliberately broken GDN kernels (recurrent and chunked) fail the GDN threshold", "[gpu][broken][gdn]") {
  std::vector<broken::Bug> bugs;
  for (const std::string kernel : {"gdn_recurrent", "gdn_chunk_prep", "gdn_chunk_scan"}) bugs.push_back(no_bug(kernel));
  for (const broken::Bug& b : broken::bugs_of("gdn")) bugs.push_back(b);
  REQUIRE(bugs.size() == 9);
  const std::vector<std::pair<GdnDims, int64_t>> cases = {{kTiny, 130}};
  std::vector<Inputs> inputs;
  std::vector<std::pair<std::vector<float>, std::vector<float>>> refs[2];  // [recurrent][case]: out, state
  for (size_t c = 0; c < cases.size(); ++c) inputs.push_back(make_inputs(cases[c].first, cases[c].second, 5000 + c));
  for (int recurrent = 0; recurrent < 2; ++recurrent)
    for (const Inputs& in : inputs) {
      std::vector<float> state = in.state0;
      std::vector<float> out = cpu_run(in, 0, in.T, recurrent == 1, state);
      refs[recurrent].push_back({std::move(out), std::move(state)});
    }
  for (const broken::Bug& b : bugs) {
    INFO(b.kernel << ", bug: " << (b.from.empty() ? "none" : b.what));
    int patched = 0;
    const KernelLoader load = patched_loader(b, &patched);
    double e = 0;
    for (size_t c = 0; c < inputs.size(); ++c) {
      GpuGdn gpu(inputs[c], 64, load);
      for (int recurrent = 0; recurrent < 2; ++recurrent) {
        gpu.state.upload(inputs[c].state0);
        const std::vector<float> out = gpu.run(0, inputs[c].T, recurrent == 1);
        e = std::max({e, rel_err(out, refs[recurrent][c].first), rel_err(gpu.state.download(), refs[recurrent][c].second)});
      }
    }
    CHECK(patched > 0);
    report_bug(b, "tiny T=130, both paths", "out and state vs cpu ops", e, kTol);
    if (b.from.empty()) CHECK(e <= kTol);
    else CHECK(e > kTol);
  }
}
