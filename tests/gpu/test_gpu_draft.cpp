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

#include "compiler/compile.h"
#include "runtime/backend.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/pointwise.h"
#include "tests/fixtures.h"
#include "tests/gpu/gpu_test_util.h"

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
