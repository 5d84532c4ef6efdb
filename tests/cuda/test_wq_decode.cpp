// CI without a GPU: the device decode of the GGUF block types (templates/qrig_wtypes.cuh, what gemm_wq_dp4a_skinny
// and embed_wq run) compiled for the host with a few stand-ins for CUDA built-ins, once per type, and run on
// random blocks repacked by repack_wq: every unit's 32 values fmaf(d, q, m) equal gguf::dequantize's bit for bit,
// every value of a block is covered exactly once, each half's offset is 16-aligned and, for types without
// offsets, m = 0; types that declare one scale per unit (WQ_SAME32) or per aligned 32 values (WQ_SCALE32, what
// the tiled GEMM relies on) have them. So a wrong bit position, scale index or value order in the kernels' decode fails here, without
// a GPU (the GPU tests then check the kernels around it).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "runtime/cuda/q8_layout.h"

namespace wqhost {
// Host stand-ins for what the header uses of CUDA.
struct alignas(16) int4_storage {
  unsigned char b[16];
};
struct int4 {
  int x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
inline int4 __ldg(const int4* p) { return *p; }
inline uint2 __ldg(const uint2* p) { return *p; }
inline unsigned __ldg(const unsigned* p) { return *p; }
inline unsigned short __ldg(const unsigned short* p) { return *p; }
inline unsigned char __ldg(const unsigned char* p) { return *p; }
inline signed char __ldg(const signed char* p) { return *p; }
// PTX prmt (default mode): byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y, x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = ((uint64_t)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
inline float qrig_half_to_float(unsigned short h) { return qrig::gguf::fp16_to_float(h); }
}  // namespace wqhost

#define __device__
#define __forceinline__ inline
#define __restrict__
using wqhost::int4_storage;

#define QRIG_WTYPE 2
#define WQ_NS wq2
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 3
#define WQ_NS wq3
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 6
#define WQ_NS wq6
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 7
#define WQ_NS wq7
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 10
#define WQ_NS wq10
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 11
#define WQ_NS wq11
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 12
#define WQ_NS wq12
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 13
#define WQ_NS wq13
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 14
#define WQ_NS wq14
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 20
#define WQ_NS wq20
#include "tests/cuda/wq_decode_one.h"
#define QRIG_WTYPE 23
#define WQ_NS wq23
#include "tests/cuda/wq_decode_one.h"

namespace {

using namespace qrig;

struct Decoder {
  gguf::TensorType type;
  int64_t block, units, abytes, bbytes;
  bool has_min, same32, scale32;
  std::vector<int> half_offsets;  // fp16 scales in the GGUF block, set to finite values
  // Unit u of the block at a / b: 32 values into out (by position in the block), and whether each half has m == 0.
  void (*unit)(const unsigned char*, const unsigned char*, int, float*, int*, bool*, float*, float*);
};

// One unit's values into out, and each 16-value group's scale and offset into gd / gm (by group in the block).
template <class U>
void emit(const U& w, float* out, int* hits, bool* zero_m, float* gd, float* gm, bool same32) {
  if (same32) {  // the halves are one 32-value block with one scale and offset (what the kernels assume)
    CHECK(w.o0 % 32 == 0);
    CHECK(w.o1 == w.o0 + 16);
    CHECK(std::memcmp(&w.d0, &w.d1, 4) == 0);
    CHECK(std::memcmp(&w.m0, &w.m1, 4) == 0);
  }
  for (int h = 0; h < 2; ++h) {
    const int o = h ? w.o1 : w.o0;
    const float d = h ? w.d1 : w.d0, m = h ? w.m1 : w.m0;
    zero_m[h] = m == 0.0f;
    CHECK(o % 16 == 0);
    gd[o / 16] = d;
    gm[o / 16] = m;
    for (int i = 0; i < 16; ++i) {
      const int q = (int)(signed char)((w.q[4 * h + i / 4] >> (8 * (i % 4))) & 0xff);
      out[o + i] = std::fma(d, (float)q, m);
      ++hits[o + i];
    }
  }
}

#define WQ_DECODER(NS, T, OFFS)                                                                                   \
  Decoder{gguf::TensorType::T, NS::kWqBlock, NS::kWqUnits, NS::kWqABytes, NS::kWqBBytes, NS::kWqHasMin != 0,       \
          NS::kWqSame32 != 0, NS::kWqScale32 != 0, OFFS,                                                          \
          [](const unsigned char* a, const unsigned char* b, int u, float* out, int* hits, bool* zm, float* gd,   \
             float* gm) {                                                                                         \
            NS::WqUnit w;                                                                                         \
            NS::wq_decode(a, b, u, w);                                                                            \
            emit(w, out, hits, zm, gd, gm, NS::kWqSame32 != 0);                                                   \
          }}

const std::vector<Decoder>& decoders() {
  static const std::vector<Decoder> d = {
      WQ_DECODER(wq2, Q4_0, (std::vector<int>{0})),      WQ_DECODER(wq3, Q4_1, (std::vector<int>{0, 2})),
      WQ_DECODER(wq6, Q5_0, (std::vector<int>{0})),      WQ_DECODER(wq7, Q5_1, (std::vector<int>{0, 2})),
      WQ_DECODER(wq10, Q2_K, (std::vector<int>{80, 82})), WQ_DECODER(wq11, Q3_K, (std::vector<int>{108})),
      WQ_DECODER(wq12, Q4_K, (std::vector<int>{0, 2})),   WQ_DECODER(wq13, Q5_K, (std::vector<int>{0, 2})),
      WQ_DECODER(wq14, Q6_K, (std::vector<int>{208})),    WQ_DECODER(wq20, IQ4_NL, (std::vector<int>{0})),
      WQ_DECODER(wq23, IQ4_XS, (std::vector<int>{0}))};
  return d;
}

}  // namespace

TEST_CASE("the kernels' decode of every block type equals gguf::dequantize bit for bit (host build of the header)",
          "[cuda][wq]") {
  std::mt19937_64 rng(20261202);
  for (const Decoder& dec : decoders()) {
    INFO(gguf::tensor_type_name(dec.type));
    const kernels::WqLayout l = kernels::wq_layout((int64_t)dec.type);
    // The header's layout is the library's (what repack_wq and the plans' byte counts use).
    REQUIRE(l.block_values == dec.block);
    REQUIRE(l.a_bytes == dec.abytes);
    REQUIRE(l.b_bytes() == dec.bbytes);
    REQUIRE(dec.units * 32 == dec.block);
    const int64_t rows = 3, cols = 4 * dec.block;
    const size_t blocks = (size_t)(rows * cols / dec.block);
    std::vector<uint8_t> src(blocks * (size_t)l.block_bytes);
    for (auto& c : src) c = (uint8_t)rng();
    std::uniform_real_distribution<float> scale(0.001f, 0.1f);
    for (size_t i = 0; i < blocks; ++i)
      for (int off : dec.half_offsets) {
        const uint16_t h = gguf::float_to_fp16(scale(rng));
        std::memcpy(src.data() + i * (size_t)l.block_bytes + off, &h, 2);
      }
    // 16-byte aligned A, as on the device.
    std::vector<int4_storage> abuf((blocks * (size_t)l.a_bytes + 15) / 16);
    std::vector<uint8_t> b(blocks * (size_t)l.b_bytes());
    auto* a = reinterpret_cast<uint8_t*>(abuf.data());
    cuda::repack_wq((int64_t)dec.type, src.data(), rows, cols, a, b.data());
    std::vector<float> ref((size_t)(rows * cols));
    gguf::dequantize(dec.type, src.data(), ref.data(), ref.size());
    bool any_nonzero_m = false;
    for (size_t i = 0; i < blocks; ++i) {
      std::vector<float> got((size_t)dec.block, std::nanf(""));
      std::vector<int> hits((size_t)dec.block, 0);
      std::vector<float> gd((size_t)dec.block / 16), gm((size_t)dec.block / 16);
      for (int u = 0; u < dec.units; ++u) {
        bool zm[2];
        dec.unit(a + i * (size_t)l.a_bytes, b.data() + i * (size_t)l.b_bytes(), u, got.data(), hits.data(), zm,
                 gd.data(), gm.data());
        if (!dec.has_min) CHECK((zm[0] && zm[1]));
        any_nonzero_m |= !zm[0] || !zm[1];
      }
      // Types that claim one scale and offset per aligned 32 values (the tiled GEMM applies them per 32) have it.
      if (dec.scale32)
        for (size_t g = 0; g < gd.size(); g += 2) {
          CHECK(std::memcmp(&gd[g], &gd[g + 1], 4) == 0);
          CHECK(std::memcmp(&gm[g], &gm[g + 1], 4) == 0);
        }
      for (int64_t j = 0; j < dec.block; ++j) {
        INFO("block " << i << " value " << j);
        REQUIRE(hits[(size_t)j] == 1);
        const float r = ref[i * (size_t)dec.block + (size_t)j];
        CHECK(std::memcmp(&got[(size_t)j], &r, 4) == 0);
      }
    }
    CHECK(any_nonzero_m == dec.has_min);
  }
}
