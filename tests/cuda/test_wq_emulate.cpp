// CI without a GPU: the block-type matmul kernels (templates/gemm_wq_dp4a_skinny.cu, gemm_wq_dp4a_tiled.cu,
// gemv_wq_dp4a.cu) run on
// the host, every CUDA thread of a CTA a std::thread (tests/cuda/wq_emulate_host.h: __syncthreads a barrier, the
// warp sum an exchange through memory), for every block type: two tilings of the tiled GEMM (64 x 32 one plane,
// 128 x 64 two planes: partial row and token tiles, several 128-value stages), the skinny kernel as
// GEMV (c1 r2, two planes: rows whose units do not fill the last step of 32 lanes) and at a skinny width (c8 r1,
// 5 of 8 tokens), the decode GEMV gemv_wq_dp4a (r2 s2 u2, two planes: two warps per row, partial steps), Q4_K and
// Q5_K's gemv_wq_k4_dp4a (gemv_wq_k4_dp4a.cu: r1/r2/r4, one and two planes, a row whose chunks end mid-step),
// against the float64 product of gguf::dequantize's weights (an independent decode) and the kernels' activation
// x = xd * (xq + xq2/254), outputs poisoned with NaN; and a stack's single-row launch with four outputs (the GEMV
// and the skinny kernel write each member's rows to its own buffer). This checks what a GPU run would of the kernels' index
// arithmetic, decode use, scale and offset terms, clamping and stores; not what only a GPU has (the memory
// model, races across warps without a barrier, registers): tests/gpu/test_gpu_wq.cpp does.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <set>
#include <random>

#include "kernels/matmul.h"
#include "runtime/cuda/q8_layout.h"
#include "tests/cuda/wq_emulate_host.h"

#define __device__
#define __forceinline__ inline
#define __restrict__
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define QRIG_HOST_EMULATION 1
#define QRIG_SM 70

#include "tests/cuda/wq_emulate_variants.h"

#undef __shared__

namespace {

using namespace qrig;
using Kernel = void (*)(const unsigned char*, const unsigned char*, const signed char*, const float*, const signed char*,
                        float*, int, int, int);
// The skinny kernel and the GEMV take up to four outputs with row bounds (y0..y3, b1..b3): stacked weights.
using SkinnyKernel = void (*)(const unsigned char*, const unsigned char*, const signed char*, const float*,
                              const signed char*, float*, float*, float*, float*, int, int, int, int, int, int);
using GemvKernel = void (*)(const unsigned char*, const unsigned char*, const signed char*, const float*,
                            const signed char*, float*, float*, float*, float*, int, int, int, int, int);
// gemv_wq_dp4a r2 s2 u2 t128, two planes: 2 groups of 2 warps per CTA, a lane's second unit past the row's end.
const std::vector<std::pair<int64_t, GemvKernel>> kGemvEmu = {
    {2, ns_emu_g_w2::emu_g_w2},
    {3, ns_emu_g_w3::emu_g_w3},
    {6, ns_emu_g_w6::emu_g_w6},
    {7, ns_emu_g_w7::emu_g_w7},
    {10, ns_emu_g_w10::emu_g_w10},
    {11, ns_emu_g_w11::emu_g_w11},
    {12, ns_emu_g_w12::emu_g_w12},
    {13, ns_emu_g_w13::emu_g_w13},
    {14, ns_emu_g_w14::emu_g_w14},
    {20, ns_emu_g_w20::emu_g_w20},
    {23, ns_emu_g_w23::emu_g_w23},
};
// gemv_wq_k4_dp4a (Q4_K / Q5_K, a lane per 64-value chunk): type, planes, rows per warp, threads; two planes with
// 2 rows per warp, one plane with 4 (a row group past the matrix's end) and with 1 row on 2-warp CTAs.
struct K4Emu {
  int64_t type;
  int planes, rows, threads;
  GemvKernel gemv;
};
const std::vector<K4Emu> kK4Emu = {
    {12, 2, 2, 128, ns_emu_k_w12_p2_r2::emu_k_w12_p2_r2},
    {13, 2, 2, 128, ns_emu_k_w13_p2_r2::emu_k_w13_p2_r2},
    {12, 1, 4, 128, ns_emu_k_w12_p1_r4::emu_k_w12_p1_r4},
    {13, 1, 1, 64, ns_emu_k_w13_p1_r1::emu_k_w13_p1_r1},
};
struct Emu {
  int64_t type;
  bool tiled;
  int planes, bn, bt, cols, rows, threads;
  const char* name;
  Kernel kernel;                // gemm_wq_dp4a_tiled
  SkinnyKernel skinny = nullptr;  // gemm_wq_dp4a_skinny
  GemvKernel gemv = nullptr;      // gemv_wq_dp4a (cols 1, rows per group, split warps per row)
  int split = 0;
};
const std::vector<Emu> kEmu = {
    {2, true, 1, 64, 32, 0, 0, 128, "emu_t1_w2", ns_emu_t1_w2::emu_t1_w2},
    {2, true, 2, 128, 64, 0, 0, 256, "emu_t2_w2", ns_emu_t2_w2::emu_t2_w2},
    {2, false, 2, 0, 0, 1, 2, 128, "emu_s1_w2", nullptr, ns_emu_s1_w2::emu_s1_w2},
    {2, false, 1, 0, 0, 8, 1, 128, "emu_s2_w2", nullptr, ns_emu_s2_w2::emu_s2_w2},
    {3, true, 1, 64, 32, 0, 0, 128, "emu_t1_w3", ns_emu_t1_w3::emu_t1_w3},
    {3, true, 2, 128, 64, 0, 0, 256, "emu_t2_w3", ns_emu_t2_w3::emu_t2_w3},
    {3, false, 2, 0, 0, 1, 2, 128, "emu_s1_w3", nullptr, ns_emu_s1_w3::emu_s1_w3},
    {3, false, 1, 0, 0, 8, 1, 128, "emu_s2_w3", nullptr, ns_emu_s2_w3::emu_s2_w3},
    {6, true, 1, 64, 32, 0, 0, 128, "emu_t1_w6", ns_emu_t1_w6::emu_t1_w6},
    {6, true, 2, 128, 64, 0, 0, 256, "emu_t2_w6", ns_emu_t2_w6::emu_t2_w6},
    {6, false, 2, 0, 0, 1, 2, 128, "emu_s1_w6", nullptr, ns_emu_s1_w6::emu_s1_w6},
    {6, false, 1, 0, 0, 8, 1, 128, "emu_s2_w6", nullptr, ns_emu_s2_w6::emu_s2_w6},
    {7, true, 1, 64, 32, 0, 0, 128, "emu_t1_w7", ns_emu_t1_w7::emu_t1_w7},
    {7, true, 2, 128, 64, 0, 0, 256, "emu_t2_w7", ns_emu_t2_w7::emu_t2_w7},
    {7, false, 2, 0, 0, 1, 2, 128, "emu_s1_w7", nullptr, ns_emu_s1_w7::emu_s1_w7},
    {7, false, 1, 0, 0, 8, 1, 128, "emu_s2_w7", nullptr, ns_emu_s2_w7::emu_s2_w7},
    {10, true, 1, 64, 32, 0, 0, 128, "emu_t1_w10", ns_emu_t1_w10::emu_t1_w10},
    {10, true, 2, 128, 64, 0, 0, 256, "emu_t2_w10", ns_emu_t2_w10::emu_t2_w10},
    {10, false, 2, 0, 0, 1, 2, 128, "emu_s1_w10", nullptr, ns_emu_s1_w10::emu_s1_w10},
    {10, false, 1, 0, 0, 8, 1, 128, "emu_s2_w10", nullptr, ns_emu_s2_w10::emu_s2_w10},
    {11, true, 1, 64, 32, 0, 0, 128, "emu_t1_w11", ns_emu_t1_w11::emu_t1_w11},
    {11, true, 2, 128, 64, 0, 0, 256, "emu_t2_w11", ns_emu_t2_w11::emu_t2_w11},
    {11, false, 2, 0, 0, 1, 2, 128, "emu_s1_w11", nullptr, ns_emu_s1_w11::emu_s1_w11},
    {11, false, 1, 0, 0, 8, 1, 128, "emu_s2_w11", nullptr, ns_emu_s2_w11::emu_s2_w11},
    {12, true, 1, 64, 32, 0, 0, 128, "emu_t1_w12", ns_emu_t1_w12::emu_t1_w12},
    {12, true, 2, 128, 64, 0, 0, 256, "emu_t2_w12", ns_emu_t2_w12::emu_t2_w12},
    {12, false, 2, 0, 0, 1, 2, 128, "emu_s1_w12", nullptr, ns_emu_s1_w12::emu_s1_w12},
    {12, false, 1, 0, 0, 8, 1, 128, "emu_s2_w12", nullptr, ns_emu_s2_w12::emu_s2_w12},
    {13, true, 1, 64, 32, 0, 0, 128, "emu_t1_w13", ns_emu_t1_w13::emu_t1_w13},
    {13, true, 2, 128, 64, 0, 0, 256, "emu_t2_w13", ns_emu_t2_w13::emu_t2_w13},
    {13, false, 2, 0, 0, 1, 2, 128, "emu_s1_w13", nullptr, ns_emu_s1_w13::emu_s1_w13},
    {13, false, 1, 0, 0, 8, 1, 128, "emu_s2_w13", nullptr, ns_emu_s2_w13::emu_s2_w13},
    {14, true, 1, 64, 32, 0, 0, 128, "emu_t1_w14", ns_emu_t1_w14::emu_t1_w14},
    {14, true, 2, 128, 64, 0, 0, 256, "emu_t2_w14", ns_emu_t2_w14::emu_t2_w14},
    {14, false, 2, 0, 0, 1, 2, 128, "emu_s1_w14", nullptr, ns_emu_s1_w14::emu_s1_w14},
    {14, false, 1, 0, 0, 8, 1, 128, "emu_s2_w14", nullptr, ns_emu_s2_w14::emu_s2_w14},
    {20, true, 1, 64, 32, 0, 0, 128, "emu_t1_w20", ns_emu_t1_w20::emu_t1_w20},
    {20, true, 2, 128, 64, 0, 0, 256, "emu_t2_w20", ns_emu_t2_w20::emu_t2_w20},
    {20, false, 2, 0, 0, 1, 2, 128, "emu_s1_w20", nullptr, ns_emu_s1_w20::emu_s1_w20},
    {20, false, 1, 0, 0, 8, 1, 128, "emu_s2_w20", nullptr, ns_emu_s2_w20::emu_s2_w20},
    {23, true, 1, 64, 32, 0, 0, 128, "emu_t1_w23", ns_emu_t1_w23::emu_t1_w23},
    {23, true, 2, 128, 64, 0, 0, 256, "emu_t2_w23", ns_emu_t2_w23::emu_t2_w23},
    {23, false, 2, 0, 0, 1, 2, 128, "emu_s1_w23", nullptr, ns_emu_s1_w23::emu_s1_w23},
    {23, false, 1, 0, 0, 8, 1, 128, "emu_s2_w23", nullptr, ns_emu_s2_w23::emu_s2_w23},
};

std::vector<int> half_offsets(int64_t t) {  // the block's fp16 scales (d, dmin), set to finite values
  switch (t) {
    case 3: case 7: case 12: case 13: return {0, 2};
    case 10: return {80, 82};
    case 11: return {108};
    case 14: return {208};
    default: return {0};
  }
}

// Random blocks of one type (finite fp16 scales), repacked as the device holds them (a, b: 16-byte aligned, a word
// of slack), and their dequantized weights (gguf::dequantize: an independent decode).
struct Blocks {
  std::vector<uint8_t> src;
  std::vector<wqemu::int4> abuf, bbuf;
  std::vector<float> w;
  uint8_t* a() { return reinterpret_cast<uint8_t*>(abuf.data()); }
  uint8_t* b() { return reinterpret_cast<uint8_t*>(bbuf.data()); }
};
Blocks random_blocks(int64_t type, int64_t N, int64_t K, std::mt19937_64& rng) {
  const kernels::WqLayout l = kernels::wq_layout(type);
  const size_t blocks = (size_t)(N * K / l.block_values);
  Blocks bl;
  bl.src.resize(blocks * (size_t)l.block_bytes);
  for (auto& c : bl.src) c = (uint8_t)rng();
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  for (size_t i = 0; i < blocks; ++i)
    for (int off : half_offsets(type)) {
      const uint16_t h = gguf::float_to_fp16(scale(rng));
      std::memcpy(bl.src.data() + i * (size_t)l.block_bytes + off, &h, 2);
    }
  bl.abuf.resize(blocks * (size_t)l.a_bytes / 16 + 1);
  bl.bbuf.resize(blocks * (size_t)l.b_bytes() / 16 + 2);
  cuda::repack_wq(type, bl.src.data(), N, K, bl.a(), bl.b());
  bl.w.resize((size_t)(N * K));
  gguf::dequantize((gguf::TensorType)type, bl.src.data(), bl.w.data(), bl.w.size());
  return bl;
}

// T random quantized activation rows of K values (both planes).
struct Acts {
  std::vector<wqemu::int4> xqb, xq2b;
  std::vector<float> xd;
  signed char* xq() { return reinterpret_cast<signed char*>(xqb.data()); }
  signed char* xq2() { return reinterpret_cast<signed char*>(xq2b.data()); }
};
Acts random_acts(int64_t T, int64_t K, std::mt19937_64& rng) {
  Acts x;
  x.xqb.resize((size_t)(T * K / 16));
  x.xq2b.resize((size_t)(T * K / 16));
  x.xd.resize((size_t)(T * K / 32));
  for (int64_t i = 0; i < T * K; ++i) {
    x.xq()[i] = (signed char)((int)(rng() % 255) - 127);
    x.xq2()[i] = (signed char)((int)(rng() % 255) - 127);
  }
  for (auto& d : x.xd) d = 0.001f * (float)(1 + rng() % 100);
  return x;
}

// The float64 product of weight row r with activation row t as the kernels see it: x = xd * (xq + xq2/254).
double reference(const std::vector<float>& w, Acts& x, int64_t K, int64_t r, int64_t t, int planes) {
  double s = 0;
  for (int64_t i = 0; i < K; ++i) {
    const size_t j = (size_t)(t * K + i);
    const double v = planes == 2 ? (double)x.xd[j / 32] * std::fma((float)x.xq2()[j], 1.0f / 254.0f, (float)x.xq()[j])
                                 : (double)x.xd[j / 32] * (double)x.xq()[j];
    s += (double)w[(size_t)(r * K + i)] * v;
  }
  return s;
}

}  // namespace

TEST_CASE("the block-type matmul kernels run on host threads match the float64 product of the dequantized weights",
          "[cuda][wq]") {
  std::mt19937_64 rng(20261202);
  std::vector<Emu> all = kEmu;
  for (const auto& [t, k] : kGemvEmu) all.push_back({t, false, 2, 0, 0, 1, 2, 128, "emu_g", nullptr, nullptr, k, 2});
  for (const K4Emu& k : kK4Emu)
    all.push_back({k.type, false, k.planes, 0, 0, 1, k.rows, k.threads, "emu_k4", nullptr, nullptr, k.gemv, 1});
  for (const Emu& e : all) {
    INFO(e.name << " type " << e.type);
    const kernels::WqLayout l = kernels::wq_layout(e.type);
    // K: whole 128-value stages (tiled); for the GEMV a row whose units do not fill the last step of 32 lanes.
    const int64_t K = e.tiled ? 512 : (l.block_values == 32 ? 4128 : 4352), N = 70;
    const int64_t T = e.tiled ? 40 : e.gemv ? 1 : 5;
    Blocks bl = random_blocks(e.type, N, K, rng);
    uint8_t* a = bl.a();
    uint8_t* b = bl.b();
    Acts x = random_acts(T, K, rng);
    signed char* xq = x.xq();
    signed char* xq2 = x.xq2();
    std::vector<float>& xd = x.xd;
    std::vector<float> y((size_t)(T * N), std::nanf(""));
    if (e.tiled) {
      wqemu::launch((unsigned)((T + e.bt - 1) / e.bt), (unsigned)((N + e.bn - 1) / e.bn), e.threads, [&] {
        e.kernel(a, b, xq, xd.data(), xq2, y.data(), (int)K, (int)N, (int)T);
      });
    } else if (e.gemv) {
      const int64_t per_block = e.rows * (e.threads / 32) / e.split;
      wqemu::launch((unsigned)((N + per_block - 1) / per_block), 1, e.threads, [&] {
        e.gemv(a, b, xq, xd.data(), xq2, y.data(), y.data(), y.data(), y.data(), (int)N, (int)N, (int)N, (int)K,
               (int)N);
      });
    } else {
      const int64_t per_block = e.rows * (e.threads / 32);
      for (int64_t t0 = 0; t0 < T; t0 += e.cols)
        wqemu::launch((unsigned)((N + per_block - 1) / per_block), 1, e.threads, [&] {
          float* out = y.data() + t0 * N;
          e.skinny(a, b, xq + t0 * K, xd.data() + t0 * (K / 32), xq2 + t0 * K, out, out, out, out, (int)N, (int)N,
                   (int)N, (int)K, (int)N, (int)std::min<int64_t>(e.cols, T - t0));
        });
    }
    double err = 0, ref_max = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < N; ++r) {
        const double s = reference(bl.w, x, K, r, t, e.planes);
        const float got = y[(size_t)(t * N + r)];
        REQUIRE(got == got);  // every output written
        err = std::max(err, std::fabs((double)got - s));
        ref_max = std::max(ref_max, std::fabs(s));
      }
    CHECK(ref_max > 0);
    CHECK(err / ref_max < 2e-6);  // fp32 rounding only (measured ~3e-7)
  }
}

// A matmul_stack's single-row launch: four members of one type (5, 6, 3 and 2 rows: bounds inside warps, row
// groups and CTAs) in one repacked matrix, as the executor uploads a stack (each member's blocks at its first row),
// one launch with four outputs. The GEMV (r2 s2 u2, two planes) and the skinny kernel as GEMV (c1 r2, two planes;
// the tuning's one-row kernel of most types) write each member's rows to its own buffer, bit for bit what one
// output over the whole stack gives and within fp32 rounding of each member's float64 product; the skinny kernel at
// c8 (one plane, 3 tokens) writes each output [tokens][its rows]. Outputs poisoned with NaN; the words after each
// output must stay untouched. The output selection does not depend on the type: four types (a 32-value one, one
// with offsets, Q6_K, a codebook one) keep this test to ~1 s of host threads (the test above runs every type); and
// Q4_K's gemv_wq_k4_dp4a (r2, two planes), which has its own output code.
TEST_CASE("the block-type GEMV and skinny kernels write a stack's members to their own outputs", "[cuda][wq]") {
  std::mt19937_64 rng(20261203);
  const std::vector<int64_t> rows = {5, 6, 3, 2};
  const std::set<int64_t> types = {2, 12, 14, 23};
  const int64_t N = 16, K = 1024;
  const int b1 = 5, b2 = 11, b3 = 14;
  std::map<int64_t, SkinnyKernel> c8;
  for (const Emu& e : kEmu)
    if (!e.tiled && e.cols == 8 && types.count(e.type)) c8[e.type] = e.skinny;
  struct Case {
    int64_t type;
    const char* what;
    SkinnyKernel skinny;
    GemvKernel gemv;
    int planes, T, per_block;
  };
  std::vector<Case> cases;
  for (const Emu& e : kEmu)
    if (!e.tiled && e.cols == 1 && types.count(e.type))
      cases.push_back({e.type, "skinny c1", e.skinny, nullptr, 2, 1, e.rows * e.threads / 32});
  for (const auto& [t, k] : kGemvEmu)
    if (types.count(t)) cases.push_back({t, "gemv", nullptr, k, 2, 1, 2 * (128 / 32) / 2});
  for (const auto& [t, k] : c8) cases.push_back({t, "skinny c8", k, nullptr, 1, 3, 1 * 128 / 32});
  REQUIRE(cases.size() == 3 * types.size());
  cases.push_back({12, "gemv_wq_k4 r2", nullptr, kK4Emu[0].gemv, 2, 1, 2 * 128 / 32});  // Q4_K's pair GEMV
  constexpr float kGuard = 12345.0f;
  for (const Case& c : cases) {
    INFO(c.what << " type " << c.type);
    Blocks bl = random_blocks(c.type, N, K, rng);
    Acts x = random_acts(c.T, K, rng);
    auto launch = [&](float* y0, float* y1, float* y2, float* y3, int p1, int p2, int p3) {
      wqemu::launch((unsigned)((N + c.per_block - 1) / c.per_block), 1, 128, [&] {
        if (c.gemv)
          c.gemv(bl.a(), bl.b(), x.xq(), x.xd.data(), x.xq2(), y0, y1, y2, y3, p1, p2, p3, (int)K, (int)N);
        else
          c.skinny(bl.a(), bl.b(), x.xq(), x.xd.data(), x.xq2(), y0, y1, y2, y3, p1, p2, p3, (int)K, (int)N, c.T);
      });
    };
    std::vector<float> whole((size_t)(c.T * N), std::nanf(""));
    launch(whole.data(), whole.data(), whole.data(), whole.data(), (int)N, (int)N, (int)N);
    std::vector<std::vector<float>> out(4);
    for (size_t m = 0; m < 4; ++m) {
      out[m].assign((size_t)(c.T * rows[m]), std::nanf(""));
      out[m].resize(out[m].size() + 4, kGuard);
    }
    launch(out[0].data(), out[1].data(), out[2].data(), out[3].data(), b1, b2, b3);
    double err = 0, ref_max = 0;
    int64_t first = 0;
    for (size_t m = 0; m < 4; ++m) {
      INFO("member " << m);
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t r = 0; r < rows[m]; ++r) {
          const float got = out[m][(size_t)(t * rows[m] + r)];
          REQUIRE(got == got);  // every output written
          CHECK(std::memcmp(&got, &whole[(size_t)(t * N + first + r)], 4) == 0);
          const double s = reference(bl.w, x, K, first + r, t, c.planes);
          err = std::max(err, std::fabs((double)got - s));
          ref_max = std::max(ref_max, std::fabs(s));
        }
      for (size_t i = (size_t)(c.T * rows[m]); i < out[m].size(); ++i) CHECK(out[m][i] == kGuard);
      first += rows[m];
    }
    CHECK(ref_max > 0);
    CHECK(err / ref_max < 2e-6);
  }
}
