// What the CUDA backend has for speculative decoding (docs/speculative.md), on the GPU against the CPU reference:
// the draft head's concat kernel, the verify step's conv and recurrent GDN kernels keeping the state after each
// position, and the executor's verify step of k + 1 tokens with its rollback, on ../shared/fixtures/tiny-mtp.gguf.
// Inputs fresh and random per case, every output and kept buffer poisoned with NaN first. Thresholds (max|gpu -
// cpu| / max|cpu|, rel_err):
//   concat_f32 vs cpu::concat_rows           exact   copies
//   conv1d_silu_f32 out                      6e-7    as test_gpu_pointwise (same tap order; expf in SiLU)
//   conv1d_silu_f32 kept windows             exact   the window is copied, never computed
//   gdn_recurrent out, state, kept states    3e-6    as test_gpu_gdn (fp32 like the reference, only the order of
//                                                    the 128-term sums differs; measured <= 6.2e-7 there)
//   kept state t vs a run of the first t + 1 tokens, keep on vs off      bit-equal (the same token loop)
// Executor (a CUDA plan of tiny-mtp with two activation planes everywhere, --precise, and --draft 4):
//   a verify step [x, d1..dk] rolled back to p + j, then one token: bit-equal to a verify step with the same first
//   j tokens and another tail, rolled back to the same place (a rollback restores exactly the kept state; a wrong
//   copy, position or stale state gives other logits);
//   ... and within 1e-2 of a plain run of those j tokens then the same token: the steps differ in rows (matmul
//   kernels, the attention's one-token or multi-row kernel), so only fp32 rounding may differ (the precise
//   plan is 3.4e-4 from the float64 reference, test_gpu_model.cpp); a rollback to a wrong position or a state of
//   another position gives errors of order 1 on this random model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <future>
#include <random>

#include "compiler/compile.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/pointwise.h"
#include "tests/fixtures.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/runtime/engine_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

// Whether every float of v[from, to) is still the NaN poison (bytes 0xFF).
bool still_poisoned(const std::vector<float>& v, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    if (u != 0xFFFFFFFFu) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("concat_f32 matches cpu::concat_rows", "[gpu][short][draft]") {
  Gpu& g = Gpu::get();
  const LoadedKernel k = g.load(concat_f32_variant());
  uint64_t seed = 700;
  // The MTP head's [enorm(e) ; hnorm(h)] at the tiny fixture's, 9B's and 27B's widths, and odd widths.
  for (const auto& [wa, wb] : std::vector<std::pair<int64_t, int64_t>>{{256, 256}, {4096, 4096}, {5120, 5120}, {33, 7}})
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{64}}) {
      INFO(wa << "+" << wb << " x " << n);
      const auto a = randn((size_t)(n * wa), seed++), b = randn((size_t)(n * wb), seed++);
      auto da = dev(a, "a"), db = dev(b, "b");
      auto out = poisoned_device((size_t)(n * (wa + wb)), "concat out");
      launch_concat_f32(k, da.data(), wa, db.data(), wb, n, out.data(), g.stream.get());
      g.stream.sync("concat");
      std::vector<float> ref = cpu::test::poisoned((size_t)(n * (wa + wb)));
      cpu::concat_rows(a.data(), wa, b.data(), wb, n, ref.data());
      const bool same = cpu::test::bit_equal(out.download(), ref);
      report("concat_f32", fmt::format("{}+{} x {}", wa, wb, n), "vs cpu::concat_rows", same ? 0.0 : 1.0, -1);
      CHECK(same);
    }
}

TEST_CASE("conv1d_silu_f32 keeps the window after each token of a verify step", "[gpu][short][draft]") {
  Gpu& g = Gpu::get();
  const int64_t C = 8192, K = 4, H = K - 1;  // 9B's GDN input conv
  const LoadedKernel k = g.load(conv1d_silu_f32_variant(K));
  uint64_t seed = 800;
  for (int64_t T : {int64_t{2}, int64_t{3}, int64_t{5}}) {  // verify steps of k = 1, 2, 4 drafts
    INFO("T=" << T);
    const auto w = randn((size_t)(C * K), seed++, 0.0f, 0.5f);
    const auto state0 = randn((size_t)(H * C), seed++);
    const auto x = randn((size_t)(T * C), seed++);
    auto dw = dev(w, "w"), dx = dev(x, "x"), dstate = dev(state0, "state");
    const int64_t stride = H * C + 64;  // copies apart by more than a window: the gaps must stay untouched
    auto kept = poisoned_device((size_t)(T * stride), "kept windows");
    auto out = poisoned_device((size_t)(T * C), "out");
    launch_conv1d_silu_f32(k, dx.data(), T, C, dw.data(), dstate.data(), out.data(), g.stream.get(), kept.data(), T - 1,
                           stride);
    g.stream.sync("conv keep");
    // The CPU backend's verify: token by token, the window copied after each (runtime/cpu/executor.cpp run_conv).
    std::vector<float> st = state0, ref((size_t)(T * C));
    std::vector<std::vector<float>> ref_kept;
    for (int64_t t = 0; t < T; ++t) {
      cpu::conv1d_causal_silu(x.data() + t * C, 1, C, w.data(), K, st.data(), ref.data() + t * C);
      ref_kept.push_back(st);
    }
    const double e = rel_err(out.download(), ref);
    report("conv1d_silu_f32 keep", fmt::format("T={} C={}", T, C), "out vs cpu::conv1d_causal_silu", e, 6e-7);
    CHECK(e <= 6e-7);
    CHECK(cpu::test::bit_equal(dstate.download(), st));
    const std::vector<float> kh = kept.download();
    bool windows = true, gaps = true;
    for (int64_t t = 0; t < T; ++t) {
      const size_t at = (size_t)(t * stride);
      if (t < T - 1) {
        windows &= cpu::test::bit_equal(std::vector<float>(kh.begin() + at, kh.begin() + at + H * C), ref_kept[t]);
        gaps &= still_poisoned(kh, at + H * C, at + stride);
      } else {
        gaps &= still_poisoned(kh, at, at + stride);  // nothing kept after the last token (it is the live state)
      }
    }
    report("conv1d_silu_f32 keep", fmt::format("T={} C={}", T, C), "kept windows vs the CPU's", windows ? 0.0 : 1.0, -1);
    CHECK(windows);
    CHECK(gaps);
  }
}

TEST_CASE("gdn_recurrent keeps the state after each token of a verify step", "[gpu][short][draft]") {
  Gpu& g = Gpu::get();
  constexpr double kTol = 3e-6;
  uint64_t seed = 900;
  for (const GdnDims& d : std::vector<GdnDims>{{2, 4, 128, 128}, {16, 32, 128, 128}, {1, 3, 64, 32}}) {
    const GdnKernels rec = gdn_kernels([](const Variant& v) { return Gpu::get().load(v); }, d, 64);
    const int64_t conv = 2 * d.Hk * d.dk + d.Hv * d.dv, S = d.Hv * d.dk * d.dv;
    const cpu::GdnShape sh{d.Hk, d.Hv, d.dk, d.dv};
    for (int64_t T : {int64_t{2}, int64_t{3}, int64_t{5}}) {
      const std::string what = fmt::format("Hk{} Hv{} dk{} dv{} T={}", d.Hk, d.Hv, d.dk, d.dv, T);
      INFO(what);
      REQUIRE(rec.recurrent_for(T));
      auto mixed = randn((size_t)(T * conv), seed++);
      for (float& x : mixed) x = x / (1.0f + std::exp(-x));  // silu, as after the causal conv
      const auto alpha = randn((size_t)(T * d.Hv), seed++), beta = randn((size_t)(T * d.Hv), seed++);
      auto ssm_a = randn((size_t)d.Hv, seed++, 0.0f, 0.5f);
      for (float& a : ssm_a) a = -std::exp(a);
      const auto dt_bias = randn((size_t)d.Hv, seed++, 0.0f, 0.5f);
      const auto state0 = randn((size_t)S, seed++, 0.0f, 0.3f);
      auto dm = dev(mixed, "mixed"), da = dev(alpha, "alpha"), db = dev(beta, "beta"), dsa = dev(ssm_a, "ssm_a"),
           ddt = dev(dt_bias, "dt_bias");
      const int64_t stride = S + 64;
      // keep on; then keep off from the same state; then each prefix alone.
      auto run = [&](int64_t n, int64_t keep, DeviceBuffer<float>* kept, std::vector<float>& state_out) {
        auto st = dev(state0, "state");
        auto out = poisoned_device((size_t)(n * d.Hv * d.dv), "gdn out");
        rec.run(dm.data(), da.data(), db.data(), dsa.data(), ddt.data(), n, st.data(), out.data(), nullptr,
                g.stream.get(), kept ? kept->data() : nullptr, keep, stride);
        g.stream.sync("gdn keep");
        state_out = st.download();
        return out.download();
      };
      auto kept = poisoned_device((size_t)(T * stride), "kept states");
      std::vector<float> st_keep, st_plain;
      const std::vector<float> out_keep = run(T, T - 1, &kept, st_keep);
      const std::vector<float> out_plain = run(T, 0, nullptr, st_plain);
      const std::vector<float> kh = kept.download();

      // The CPU backend's verify: token by token, the state copied after each (runtime/cpu/executor.cpp run_gdn).
      std::vector<float> st = state0, ref((size_t)(T * d.Hv * d.dv));
      double e_kept = 0;
      bool prefix_equal = true, gaps = true;
      for (int64_t t = 0; t < T; ++t) {
        cpu::gdn_recurrent(sh, mixed.data() + t * conv, alpha.data() + t * d.Hv, beta.data() + t * d.Hv, ssm_a.data(),
                           dt_bias.data(), 1, st.data(), ref.data() + t * d.Hv * d.dv);
        const size_t at = (size_t)(t * stride);
        if (t == T - 1) {
          gaps &= still_poisoned(kh, at, at + (size_t)stride);
          break;
        }
        const std::vector<float> k_t(kh.begin() + at, kh.begin() + at + S);
        e_kept = std::max(e_kept, rel_err(k_t, st));
        gaps &= still_poisoned(kh, at + S, at + stride);
        std::vector<float> st_prefix;
        run(t + 1, 0, nullptr, st_prefix);  // what a step ending at token t leaves
        prefix_equal &= cpu::test::bit_equal(k_t, st_prefix);
      }
      const double eo = rel_err(out_keep, ref), es = rel_err(st_keep, st);
      report("gdn_recurrent keep", what, "out vs cpu::gdn_recurrent", eo, kTol);
      report("gdn_recurrent keep", what, "state vs cpu::gdn_recurrent", es, kTol);
      report("gdn_recurrent keep", what, "kept states vs the CPU's", e_kept, kTol);
      report("gdn_recurrent keep", what, "kept state t vs a run of t+1 tokens", prefix_equal ? 0.0 : 1.0, -1);
      CHECK(eo <= kTol);
      CHECK(es <= kTol);
      CHECK(e_kept <= kTol);
      CHECK(prefix_equal);
      CHECK(gaps);
      CHECK(cpu::test::bit_equal(out_keep, out_plain));  // keeping changes nothing the step computes
      CHECK(cpu::test::bit_equal(st_keep, st_plain));
    }
  }
}

namespace {

// A CUDA plan of tiny-mtp for this GPU, two activation planes everywhere (--precise), drafting `draft` tokens.
ir::Plan verify_plan(int64_t draft) {
  Gpu& g = Gpu::get();
  compiler::Rig rig = this_gpu_rig();
  const gguf::File f = gguf::File::open(fixtures::shared_path("fixtures/tiny-mtp.gguf"));
  compiler::CompileOptions co;
  co.context_length = 1024;
  co.max_sequences = 2;
  co.precise_rows = 1 << 20;  // two planes at every row count, as test_gpu_model.cpp's precise plan
  co.ptx_jit = g.ptx;
  co.max_batch_tokens = 64;
  co.max_logit_rows = 16;
  co.draft_tokens = draft;
  ir::Plan p = compiler::compile(f, rig, co);
  REQUIRE(p.backend == "cuda");
  REQUIRE(p.memory.devices.size() == 1);
  REQUIRE(p.draft_tokens == draft);
  return p;
}

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, uint64_t seed) {
  FastRng r(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = (int32_t)(r.next() % (uint64_t)vocab);
  return t;
}

}  // namespace

TEST_CASE("a verify step of k + 1 tokens rolls back exactly on the GPU", "[gpu][short][draft][fixtures]") {
  const ir::Plan plan = verify_plan(4);
  auto be = runtime::make_backend(plan);
  const int64_t V = be->vocab_rows();
  const int64_t vocab = plan.vocab_real > 0 ? plan.vocab_real : V;
  const std::vector<int32_t> prompt = random_tokens(13, vocab, 1);
  const int64_t p = (int64_t)prompt.size();
  uint64_t seed = 10;
  double worst_plain = 0;
  int cases = 0;
  for (int k : {1, 2, 4}) {
    const std::vector<int32_t> verify = random_tokens((size_t)k + 1, vocab, seed++);
    const int32_t next = random_tokens(1, vocab, seed++)[0];
    // One slot: the prompt, a step of `tokens` (logits of all its rows when rows > 1), a rollback to p + j, `next`.
    auto after = [&](int slot, const std::vector<int32_t>& tokens, int32_t rows, int64_t j) {
      be->reset(slot);
      be->step({runtime::StepInput{slot, prompt, false}});
      runtime::StepInput in{slot, tokens, true};
      in.logit_rows = rows;
      const auto v = be->step({in});
      REQUIRE(v[0].size() == (size_t)(rows * V));
      for (float x : v[0]) REQUIRE(std::isfinite(x));
      if (rows > 1) be->rollback(slot, p + j);
      REQUIRE(be->position(slot) == p + j);
      return be->step({runtime::StepInput{slot, {next}, true}})[0];
    };
    for (int64_t j = 1; j <= k + 1; ++j) {
      INFO("k=" << k << " rollback to p+" << j);
      std::vector<int32_t> other = verify;
      const std::vector<int32_t> tail = random_tokens((size_t)(k + 1), vocab, seed++);
      for (int64_t i = j; i <= k; ++i)  // another token at every position after the kept ones
        other[(size_t)i] = (int32_t)((verify[(size_t)i] + 1 + tail[(size_t)i] % (vocab - 1)) % vocab);
      const std::vector<float> a = after(0, verify, k + 1, j);
      const std::vector<float> b = after(1, other, k + 1, j);
      const std::vector<float> c = after(0, std::vector<int32_t>(verify.begin(), verify.begin() + j), 1, j);
      const bool same = cpu::test::bit_equal(a, b);
      const double e = rel_err(a, c);
      worst_plain = std::max(worst_plain, e);
      ++cases;
      report("verify + rollback", fmt::format("tiny-mtp k={} to p+{}", k, j), "vs another tail, rolled back",
             same ? 0.0 : 1.0, -1);
      report("verify + rollback", fmt::format("tiny-mtp k={} to p+{}", k, j), "vs a plain run of the kept tokens", e, 1e-2);
      CHECK(same);
      CHECK(e <= 1e-2);
    }
  }
  CHECK(cases == 2 + 3 + 5);
  // Only a position the last verify step kept can be rolled back to; a plan step of more tokens than it keeps is
  // refused before anything runs.
  be->reset(0);
  be->step({runtime::StepInput{0, prompt, false}});
  runtime::StepInput in{0, random_tokens(3, vocab, 99), true};
  in.logit_rows = 3;
  be->step({in});
  CHECK_THROWS_WITH(be->rollback(0, p), Catch::Contains("kept positions"));
  CHECK_THROWS_WITH(be->rollback(0, p + 4), Catch::Contains("kept positions"));
  CHECK_NOTHROW(be->rollback(0, p + 2));
  CHECK_THROWS_WITH(be->rollback(0, p + 1), Catch::Contains("kept positions"));  // the copies are stale now
  runtime::StepInput big{0, random_tokens(6, vocab, 98), true};
  big.logit_rows = 6;
  CHECK_THROWS_WITH(be->step({big}), Catch::Contains("keeps the states of 4 draft tokens"));
  CHECK(be->position(0) == p + 2);
}

// The CUDA draft head against the CPU reference head (runtime/cpu/draft_head.cpp) on the same tokens: each draft()
// call's logit rows (the picks are fixed tokens, so both heads run the same rows whatever their argmax), after a
// prompt, and again after a verify step and its rollback (the waiting rows the head keeps, its positions, the carried
// row of each draft step). The CUDA plan has two activation planes everywhere and an f16 head cache: 5e-3 (qrig
// verify's --precise tolerance; the main model alone is 3.4e-4 from the float64 reference there).
TEST_CASE("the CUDA draft head drafts what the CPU reference head drafts, after a prompt and after a rollback",
          "[gpu][short][draft][fixtures]") {
  constexpr double kTol = 5e-3;
  const ir::Plan gpu_plan = verify_plan(4);
  const gguf::File f = gguf::File::open(fixtures::shared_path("fixtures/tiny-mtp.gguf"));
  compiler::CompileOptions co;
  co.context_length = 1024;
  co.max_sequences = 2;
  co.max_batch_tokens = 64;
  co.draft_tokens = 4;
  const ir::Plan cpu_plan =
      compiler::compile(f, compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n", "t"), co);
  auto gpu = runtime::make_backend(gpu_plan);
  auto cpu = runtime::make_backend(cpu_plan);
  REQUIRE(gpu->draft_tokens() == 4);
  REQUIRE(cpu->draft_tokens() == 4);
  const int64_t V = gpu->vocab_rows();
  REQUIRE(cpu->vocab_rows() == V);
  const std::vector<int32_t> prompt = random_tokens(37, gpu_plan.vocab_real, 3);
  const int64_t p = (int64_t)prompt.size();
  // Drafts k rows after `next` on both with the picks `picks`; compares every row.
  auto both_draft = [&](const std::string& what, int32_t next, const std::vector<int32_t>& picks) {
    std::vector<std::vector<float>> rows[2];
    runtime::Backend* be[2] = {gpu.get(), cpu.get()};
    for (int b = 0; b < 2; ++b) {
      REQUIRE(be[b]->can_draft(0));
      size_t j = 0;
      const auto d = be[b]->draft(0, next, (int)picks.size(), [&](const float* logits) {
        rows[b].emplace_back(logits, logits + V);
        return picks[j++];
      });
      CHECK(d == picks);
    }
    REQUIRE(rows[0].size() == picks.size());
    for (size_t j = 0; j < picks.size(); ++j) {
      const double e = rel_err(rows[0][j], rows[1][j]);
      report("draft head", fmt::format("tiny-mtp {} row {}", what, j), "logits vs the CPU head", e, kTol);
      CHECK(e <= kTol);
    }
  };
  for (auto* be : {gpu.get(), cpu.get()}) be->step({runtime::StepInput{0, prompt, false}});
  const std::vector<int32_t> d1 = random_tokens(4, gpu_plan.vocab_real, 4);
  const int32_t x = random_tokens(1, gpu_plan.vocab_real, 5)[0];
  both_draft("after the prompt", x, d1);
  // Verify [x, d1] (every row's logits on both), keep two drafts, draft again after the target's token.
  std::vector<int32_t> verify{x};
  verify.insert(verify.end(), d1.begin(), d1.end());
  std::vector<std::vector<float>> vrows;
  for (auto* be : {gpu.get(), cpu.get()}) {
    runtime::StepInput in{0, verify, true};
    in.logit_rows = (int32_t)verify.size();
    vrows.push_back(be->step({in})[0]);
    be->rollback(0, p + 1 + 2);
    REQUIRE(be->position(0) == p + 3);
  }
  const double ev = rel_err(vrows[0], vrows[1]);
  report("verify step", "tiny-mtp k=4", "logits vs the CPU backend's", ev, kTol);
  CHECK(ev <= kTol);
  const int32_t y = random_tokens(1, gpu_plan.vocab_real, 6)[0];
  both_draft("after a rollback to p+3", y, random_tokens(3, gpu_plan.vocab_real, 7));
  // A plain step of the drafted-after token, then drafting again (the head ran the rows the verify left waiting).
  for (auto* be : {gpu.get(), cpu.get()}) {
    runtime::StepInput in{0, {y}, false};
    be->step({in});
  }
  both_draft("after a plain step", random_tokens(1, gpu_plan.vocab_real, 8)[0], random_tokens(2, gpu_plan.vocab_real, 9));
}

// ---- drafting with the MTP head on the GPU, through the engine ------------------------------------------------
//
// Greedy generation on tiny-mtp with drafting on (k = 1, 2, 4) against the same plan's requests with drafting off
// ("draft": false: the same kernels and activation planes, decode one token per step). A verify step's rows run other
// kernels than a one-row decode (the skinny GEMM for the GEMV, the multi-row or prefill attention for the one-token
// decode), so the fp32 sums are ordered differently and the logits agree to rounding, not bit for bit: the outputs
// are expected equal token for token except where the drafting-off run's top-2 logits are within rounding of each
// other. A divergence is allowed only where that gap is at most kTieTol of the row's largest |logit| (twice the 1e-2
// the rollback test above holds a verify row to a plain run's); a divergence at a larger gap is a fault (a wrong
// rollback, a stale state, a wrong acceptance), as is any request that drafts nothing. Sequences run one at a time
// for that check; run several at once, the two runs put different rows together in a step (a prompt piece beside
// other sequences' verify or decode rows), and a step above the plan's two-plane rows quantizes all its rows to one
// plane (~8e-2 of the logit range on this model: qrig verify's one-plane tolerance is 1e-1), so there a divergence
// is allowed at twice that (kMixedTol) and the identical tokens are reported.
namespace {

constexpr double kTieTol = 2e-2, kMixedTol = 2e-1;

// tiny-mtp for this GPU with the compile defaults (512 tokens per step, one or two planes by rows) and `draft` tokens.
ir::Plan engine_plan(int64_t draft, int64_t slots) {
  const gguf::File f = gguf::File::open(fixtures::shared_path("fixtures/tiny-mtp.gguf"));
  compiler::CompileOptions co;
  co.context_length = 1024;
  co.max_sequences = slots;
  co.ptx_jit = Gpu::get().ptx;
  co.draft_tokens = draft;
  ir::Plan p = compiler::compile(f, this_gpu_rig(), co);
  REQUIRE(p.backend == "cuda");
  REQUIRE(p.draft_tokens == draft);
  return p;
}

// (top1 - top2) / max|logit| over the real vocabulary.
double top2_gap(const std::vector<float>& l, int64_t n_real) {
  float a = -INFINITY, b = -INFINITY, m = 0;
  for (int64_t i = 0; i < n_real; ++i) {
    const float x = l[(size_t)i];
    m = std::max(m, std::fabs(x));
    if (x > a) b = a, a = x;
    else if (x > b) b = x;
  }
  return m > 0 ? (double)(a - b) / m : 0.0;
}

std::vector<qrig::test::Result> run_all(runtime::Engine& e, const std::vector<runtime::Request>& reqs, bool at_once) {
  std::vector<qrig::test::Result> out;
  if (!at_once) {
    for (const auto& r : reqs) out.push_back(qrig::test::submit(e, r).get());
    return out;
  }
  std::vector<std::future<qrig::test::Result>> fs;
  for (const auto& r : reqs) fs.push_back(qrig::test::submit(e, r));
  for (auto& f : fs) out.push_back(f.get());
  return out;
}

// Compares a drafting run's tokens with the drafting-off run's (whose logits `off` recorded): the identical prefix,
// and at the first divergence the drafting-off row's top-2 gap, which must be within `tol`. Returns the prefix.
int64_t compare_run(const std::string& what, const runtime::Request& req, const qrig::test::Result& on,
                    const qrig::test::Result& off, const qrig::test::RecordingBackend& rec, int64_t n_real, double tol = kTieTol) {
  INFO(what);
  INFO("drafting on: " << on.done.error << "; off: " << off.done.error);
  CHECK(on.done.error.empty());  // a step that failed (the engine ends the request) is no rounding tie
  CHECK(off.done.error.empty());
  const size_t n = std::min(on.tokens.size(), off.tokens.size());
  size_t same = 0;
  while (same < n && on.tokens[same] == off.tokens[same]) ++same;
  CHECK(on.tokens.size() == off.tokens.size());
  if (same < n) {
    std::vector<int32_t> history = req.prompt;
    history.insert(history.end(), off.tokens.begin(), off.tokens.begin() + (long)same);
    const auto rows = rec.logits_after(history);
    REQUIRE_FALSE(rows.empty());
    const double gap = top2_gap(rows.back(), n_real);
    report("drafting vs off", what, fmt::format("top-2 gap where token {} differs", same), gap, tol);
    CHECK(gap <= tol);
  }
  return (int64_t)same;
}

}  // namespace

TEST_CASE("greedy generation with drafting on the GPU (k = 1, 2, 4) equals drafting off except at rounding ties",
          "[gpu][draft][fixtures]") {
  std::mt19937 rng(11);
  std::vector<runtime::Request> reqs;
  for (int n : {1, 7, 40, 130}) reqs.push_back(qrig::test::greedy(qrig::test::random_prompt(rng, n), 24));
  auto off_reqs = reqs;
  for (auto& r : off_reqs) r.draft = false;
  for (int64_t k : {1, 2, 4}) {
    INFO("k = " << k);
    const ir::Plan plan = engine_plan(k, 4);
    const int64_t n_real = plan.vocab_real;
    // Phase 1: one request at a time (the prompt's step is the same in both runs); phase 2: all four at once,
    // after phase 1 (a slot reuses what it holds of a prompt; the steps hold one verify or decode per sequence and
    // what is left of the prompts, mostly within the plan's two-plane rows).
    auto rec_owned = std::make_unique<qrig::test::RecordingBackend>(runtime::make_backend(plan));
    qrig::test::RecordingBackend& rec = *rec_owned;
    std::vector<std::vector<qrig::test::Result>> off(2), on(2);
    {
      runtime::Engine e(std::move(rec_owned));
      off[0] = run_all(e, off_reqs, false);
      off[1] = run_all(e, off_reqs, true);
      // The recorder outlives the engine below only as long as this scope: compare here.
      {
        runtime::Engine d(runtime::make_backend(plan));
        on[0] = run_all(d, reqs, false);
        on[1] = run_all(d, reqs, true);
      }
      int64_t same = 0, total = 0, drafted = 0, accepted = 0, steps = 0, generated = 0;
      for (int ph = 0; ph < 2; ++ph)
        for (size_t i = 0; i < reqs.size(); ++i) {
          const std::string what = fmt::format("tiny-mtp k={} {} prompt {}", k, ph == 0 ? "one at a time" : "4 at once",
                                               reqs[i].prompt.size());
          same += compare_run(what, reqs[i], on[ph][i], off[ph][i], rec, n_real, ph == 0 ? kTieTol : kMixedTol);
          total += (int64_t)off[ph][i].tokens.size();
          CHECK(off[ph][i].tokens.size() == 24);
          CHECK(off[ph][i].done.drafted == 0);
          CHECK(on[ph][i].done.drafted > 0);
          drafted += on[ph][i].done.drafted;
          accepted += on[ph][i].done.accepted;
          steps += on[ph][i].done.decode_steps;
          generated += on[ph][i].done.generated_tokens;
          CHECK(on[ph][i].done.cached_tokens == off[ph][i].done.cached_tokens);  // the same reuse of each slot
        }
      report_row(fmt::format("| drafting vs off | tiny-mtp k={} | identical tokens (up to the first difference) | "
                             "{}/{} | | acceptance {}/{}, {:.2f} tokens per step |",
                             k, same, total, accepted, drafted, steps > 0 ? (double)generated / (double)steps : 0.0));
    }
  }
}

namespace {

// Proposes the target's own greedy continuation (the drafting-off run's) with the token at draft index `wrong_at`
// replaced (none when wrong_at >= k); the MTP head still runs (its state follows the sequence). As the CPU test's
// (tests/runtime/test_speculative.cpp).
class OracleDrafter final : public qrig::test::ForwardingBackend {
 public:
  OracleDrafter(const ir::Plan& plan, std::vector<int32_t> prompt, std::vector<int32_t> continuation, int wrong_at)
      : ForwardingBackend(plan), prompt_(std::move(prompt)), cont_(std::move(continuation)), wrong_at_(wrong_at) {}
  std::vector<int32_t> draft(int slot, int32_t next, int k, const DraftPick& pick) override {
    const int64_t m = position(slot) - (int64_t)prompt_.size();  // next is continuation[m] (while they agree)
    int j = 0;
    auto oracle = [&](const float* logits) {
      (void)pick(logits);  // the engine's own pick runs too (its bookkeeping), its choice is replaced
      const size_t at = (size_t)(m + 1 + j);
      int32_t t = at < cont_.size() ? cont_[at] : 0;
      if (j == wrong_at_) t = (t + 1) % 1000;
      ++j;
      return t;
    };
    return ForwardingBackend::draft(slot, next, k, oracle);
  }
  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    for (const auto& in : batch) max_rows = std::max<int64_t>(max_rows, in.logit_rows);
    return ForwardingBackend::step(batch);
  }
  int64_t max_rows = 0;

 private:
  std::vector<int32_t> prompt_, cont_;
  int wrong_at_;
};

}  // namespace

TEST_CASE("a drafter proposing the target's own tokens on the GPU: tokens per step and a rollback at every rejection "
          "position", "[gpu][draft][fixtures]") {
  std::mt19937 rng(5);
  const auto prompt = qrig::test::random_prompt(rng, 21);
  const int64_t N = 30;
  for (int64_t k : {1, 2, 4}) {
    const ir::Plan plan = engine_plan(k, 1);
    auto rec_owned = std::make_unique<qrig::test::RecordingBackend>(runtime::make_backend(plan));
    qrig::test::RecordingBackend& rec = *rec_owned;
    runtime::Engine off(std::move(rec_owned));
    auto req = qrig::test::greedy(prompt, N);
    req.draft = false;
    const qrig::test::Result want = run_all(off, {req}, false)[0];
    REQUIRE((int64_t)want.tokens.size() == N);
    for (int wrong_at = 0; wrong_at <= (int)k; ++wrong_at) {  // wrong_at == k: every draft is right
      const std::string what = fmt::format("tiny-mtp k={} draft {} wrong", k, wrong_at);
      INFO(what);
      auto backend = std::make_unique<OracleDrafter>(plan, prompt, want.tokens, wrong_at);
      OracleDrafter* oracle = backend.get();
      runtime::Engine e(std::move(backend));
      const qrig::test::Result got = run_all(e, {qrig::test::greedy(prompt, N)}, false)[0];
      CHECK(got.done.generated_tokens == N);
      CHECK(oracle->max_rows == k + 1);
      if (got.tokens != want.tokens) {  // only at a rounding tie (see above); the counts below assume none
        compare_run(what, qrig::test::greedy(prompt, N), got, want, rec, plan.vocab_real);
        continue;
      }
      // The prompt's step gives the first token; then each step drafts min(k, tokens left - 1) and keeps the drafts
      // before the wrong one, plus the target's own token.
      int64_t generated = 1, steps = 1, drafted = 0, accepted = 0;
      while (generated < N) {
        const int64_t room = std::min<int64_t>(k, N - generated - 1);
        const int64_t keep = room > 0 ? std::min<int64_t>(wrong_at, room) : 0;
        drafted += room;
        accepted += keep;
        generated += keep + 1;
        ++steps;
      }
      CHECK(got.done.decode_steps == steps);
      CHECK(got.done.drafted == drafted);
      CHECK(got.done.accepted == accepted);
      report("forced acceptance", what, "steps, drafted, accepted vs expected",
             got.done.decode_steps == steps && got.done.drafted == drafted && got.done.accepted == accepted ? 0.0 : 1.0,
             -1);
    }
  }
}
