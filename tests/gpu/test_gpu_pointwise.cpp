// The pointwise kernels (runtime/cuda/pointwise.h) against their CPU reference ops on fresh random inputs at
// 9B shapes, outputs poisoned first. Error = max|gpu - cpu| / max|cpu|. Thresholds:
//   add_f32             exact   one fp32 add per value, as the CPU
//   swiglu_f32          1e-6    expf vs std::exp: a few ulp
//   conv1d_silu_f32     1e-6    same tap order; expf in SiLU; the carried window (state) exact
//   head_rmsnorm_f32    2e-6    fp32 sum of squares vs the CPU's double
//   gated_rmsnorm_f32   2e-6    same, plus SiLU's expf
//   rope_neox_f32       2e-6    fp64 angles and sin/cos as the CPU; rotation in fp32 (CPU: double) -> ~1 ulp
//   kv_write_f16        exact   round-to-nearest-even fp16, as gguf::float_to_fp16
//   argmax_f32          exact   the same index as the host (first maximum; padding rows excluded)
#include <catch2/catch.hpp>

#include <algorithm>

#include "runtime/cuda/pointwise.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {


std::vector<float> sync_download(const DeviceBuffer<float>& b, const std::string& what) {
  Gpu::get().stream.sync(what);
  return b.download();
}

}  // namespace

TEST_CASE("add_f32 and swiglu_f32 match the CPU ops", "[gpu][short]") {
  Gpu& g = Gpu::get();
  for (int64_t n : {int64_t{4}, int64_t{12288}, int64_t{512 * 12288}}) {
    INFO(n);
    const auto a = randn((size_t)n, 1 + n), b = randn((size_t)n, 2 + n, 0.0f, 2.0f);
    auto da = dev(a, "a"), db = dev(b, "b");
    auto out = poisoned_device((size_t)n, "out");
    std::vector<float> ref((size_t)n);
    launch_add_f32(g.load(add_f32_variant()), da.data(), db.data(), out.data(), n, g.stream.get());
    cpu::add(a.data(), b.data(), n, ref.data());
    const double e_add = rel_err(sync_download(out, "add"), ref);
    report("add_f32", fmt::format("n={}", n), "vs cpu::add", e_add, -1);
    CHECK(e_add == 0);
    out.fill_bytes(0xFF);
    launch_swiglu_f32(g.load(swiglu_f32_variant()), da.data(), db.data(), out.data(), n, g.stream.get());
    cpu::swiglu(a.data(), b.data(), n, ref.data());
    const double e_sw = rel_err(sync_download(out, "swiglu"), ref);
    report("swiglu_f32", fmt::format("n={}", n), "vs cpu::swiglu", e_sw, 4e-7);
    CHECK(e_sw <= 4e-7);
  }
}

TEST_CASE("conv1d_silu_f32 matches the CPU op and carries its window", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const int64_t C = 8192, K = 4;  // 9B: conv over q|k|v = 2*16*128 + 32*128 channels
  const auto w = randn((size_t)(C * K), 11, 0.0f, 0.5f);
  auto dw = dev(w, "w");
  std::vector<float> state = randn((size_t)((K - 1) * C), 12);
  auto dstate = dev(state, "state");
  const LoadedKernel k = g.load(conv1d_silu_f32_variant(K));
  int64_t seed = 100;
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{64}, int64_t{1}, int64_t{300}}) {
    INFO(T);
    const auto x = randn((size_t)(T * C), (uint64_t)seed++);
    auto dx = dev(x, "x");
    auto out = poisoned_device((size_t)(T * C), "out");
    launch_conv1d_silu_f32(k, dx.data(), T, C, dw.data(), dstate.data(), out.data(), g.stream.get());
    std::vector<float> ref((size_t)(T * C));
    cpu::conv1d_causal_silu(x.data(), T, C, w.data(), K, state.data(), ref.data());
    const double e = rel_err(sync_download(out, "conv"), ref);
    report("conv1d_silu_f32", fmt::format("T={} C={}", T, C), "vs cpu::conv1d_causal_silu", e, 6e-7);
    CHECK(e <= 6e-7);
    CHECK(cpu::test::bit_equal(dstate.download(), state));  // the window is copied, never computed
  }
}

TEST_CASE("head_rmsnorm_f32 and gated_rmsnorm_f32 match the CPU ops", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const int64_t T = 37;
  {  // q norm of the 9B: q and gate interleaved per head, 16 heads of 256
    const int64_t H = 16, hd = 256, row = 2 * H * hd;
    const auto x = randn((size_t)(T * row), 21, 0.3f, 2.0f), w = randn((size_t)hd, 22, 1.0f, 0.2f);
    auto dx = dev(x, "x"), dw = dev(w, "w");
    auto out = poisoned_device((size_t)(T * H * hd), "out");
    launch_head_rmsnorm_f32(g.load(head_rmsnorm_f32_variant(hd)), dx.data(), row, 2 * hd, 0, dw.data(), T, H, 1e-6f,
                            out.data(), g.stream.get());
    std::vector<float> ref((size_t)(T * H * hd));
    cpu::head_rmsnorm(x.data(), row, 2 * hd, 0, w.data(), T, H, hd, 1e-6f, ref.data());
    const double e = rel_err(sync_download(out, "head_rmsnorm"), ref);
    report("head_rmsnorm_f32", "T=37 16x256 strided", "vs cpu::head_rmsnorm", e, 5e-7);
    CHECK(e <= 5e-7);
  }
  {  // GDN output norm: 32 heads of 128
    const int64_t H = 32, dv = 128;
    const auto o = randn((size_t)(T * H * dv), 23), z = randn((size_t)(T * H * dv), 24),
               w = randn((size_t)dv, 25, 1.0f, 0.2f);
    auto d_o = dev(o, "o"), dz = dev(z, "z"), dw = dev(w, "w");
    auto out = poisoned_device((size_t)(T * H * dv), "out");
    launch_gated_rmsnorm_f32(g.load(gated_rmsnorm_f32_variant(dv)), d_o.data(), dz.data(), dw.data(), T, H, 1e-6f,
                             out.data(), g.stream.get());
    std::vector<float> ref((size_t)(T * H * dv));
    cpu::gated_rmsnorm(o.data(), z.data(), w.data(), T, H, dv, 1e-6f, ref.data());
    const double e = rel_err(sync_download(out, "gated_rmsnorm"), ref);
    report("gated_rmsnorm_f32", "T=37 32x128", "vs cpu::gated_rmsnorm", e, 5e-7);
    CHECK(e <= 5e-7);
  }
}

TEST_CASE("rope_neox_f32 matches the CPU op up to the longest contexts", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const int64_t H = 16, hd = 256, rd = 64;
  std::vector<int32_t> pos = {0, 1, 2, 17, 1000, 4095, 32767, 65536, 131071, 262143, 262144, 7};
  const int64_t T = (int64_t)pos.size();
  const auto x = randn((size_t)(T * H * hd), 31);
  auto dx = dev(x, "x");
  auto dout = poisoned_device(x.size(), "rope out");
  DeviceBuffer<int32_t> dpos(0, pos.size(), "pos");
  dpos.upload(pos);
  const auto inv = rope_inv_freq(rd, 1e7f);
  DeviceBuffer<double> dinv(0, inv.size(), "inv_freq");
  dinv.upload(inv);
  const LoadedKernel k = g.load(rope_neox_f32_variant(hd, rd));
  launch_rope_neox_f32(k, dx.data(), dout.data(), dpos.data(), T, H, dinv.data(), g.stream.get());
  std::vector<float> ref = x;
  cpu::rope_neox(ref.data(), pos.data(), T, H, hd, rd, 1e7f);
  const double e = rel_err(sync_download(dout, "rope"), ref);
  report("rope_neox_f32", "16x256 r64, pos up to 262144", "vs cpu::rope_neox", e, 2e-7);
  CHECK(e <= 2e-7);
  CHECK(cpu::test::bit_equal(dx.download(), x));  // out of place: the input is untouched
  launch_rope_neox_f32(k, dx.data(), dx.data(), dpos.data(), T, H, dinv.data(), g.stream.get());  // in place
  CHECK(cpu::test::bit_equal(sync_download(dx, "rope in place"), sync_download(dout, "rope")));
}

TEST_CASE("kv_write_f16 rounds like the host and writes only its rows", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const int64_t W = 1024, ctx = 300, pos0 = 250, T = 50;
  const auto k = randn((size_t)(T * W), 41, 0.0f, 3.0f), v = randn((size_t)(T * W), 42, 0.0f, 100.0f);
  auto dk = dev(k, "k"), dv = dev(v, "v");
  DeviceBuffer<uint16_t> cache(0, (size_t)(2 * ctx * W), "cache");
  cache.fill_bytes(0x7E);  // a pattern the kernel must leave alone outside rows pos0..pos0+T-1
  launch_kv_write_f16(g.load(kv_write_f16_variant()), dk.data(), dv.data(), cache.data(), cache.data() + ctx * W, pos0,
                      T, W, g.stream.get());
  g.stream.sync("kv_write");
  const auto got = cache.download();
  int64_t bad = 0;
  for (int64_t p = 0; p < ctx; ++p)
    for (int64_t j = 0; j < W; ++j)
      for (int kv = 0; kv < 2; ++kv) {
        const uint16_t h = got[(size_t)((kv * ctx + p) * W + j)];
        uint16_t want = 0x7E7E;
        if (p >= pos0 && p < pos0 + T) want = gguf::float_to_fp16((kv ? v : k)[(size_t)((p - pos0) * W + j)]);
        bad += h != want;
      }
  report("kv_write_f16", "T=50 W=1024 at 250", "values differing from the host rounding", (double)bad, -1);
  CHECK(bad == 0);
}

TEST_CASE("argmax_f32 picks the host's index and never a padding row", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const int64_t V = 248320, valid = 248077, rows = 3;
  auto l = randn((size_t)(rows * V), 51);
  l[(size_t)(0 * V + 5)] = 50.0f;             // row 0: an early maximum
  l[(size_t)(1 * V + valid - 1)] = 60.0f;     // row 1: the last valid id
  l[(size_t)(1 * V + valid + 3)] = 99.0f;     // ... a larger padding logit must lose
  l[(size_t)(2 * V + 1000)] = 7.0f;           // row 2: a tie, the first index wins
  l[(size_t)(2 * V + 200000)] = 7.0f;
  auto dl = dev(l, "logits");
  DeviceBuffer<int32_t> out(0, (size_t)rows, "argmax");
  out.fill_bytes(0xFF);
  launch_argmax_f32(g.load(argmax_f32_variant()), dl.data(), rows, V, valid, out.data(), g.stream.get());
  g.stream.sync("argmax");
  const auto got = out.download();
  for (int64_t r = 0; r < rows; ++r) {
    const float* b = l.data() + r * V;
    const int32_t want = (int32_t)(std::max_element(b, b + valid) - b);
    CHECK(got[(size_t)r] == want);
  }
  CHECK(got[1] == valid - 1);
  CHECK(got[2] == 1000);
}
