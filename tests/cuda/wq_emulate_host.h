// Internal to tests/cuda/test_wq_emulate.cpp: what the block-type matmul templates use of CUDA and of
// qrig_common.cuh, for the host: vector types, __ldg, dp4a, the exact int -> float conversion, and a CTA's
// threads as std::threads (threadIdx per thread, blockIdx per launch, __syncthreads a std::barrier, a warp's
// butterfly sum an exchange through memory between two per-warp barriers). Semantics, not speed: every thread
// of a CTA runs at once, CTAs one after another.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "gguf/gguf.h"

namespace wqemu {
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline int4 __ldg(const int4* p) { return *p; }
inline uint2 __ldg(const uint2* p) { return *p; }
inline unsigned __ldg(const unsigned* p) { return *p; }
inline unsigned short __ldg(const unsigned short* p) { return *p; }
inline unsigned char __ldg(const unsigned char* p) { return *p; }
inline signed char __ldg(const signed char* p) { return *p; }
inline float __ldg(const float* p) { return *p; }
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
using std::min;
// PTX prmt (default mode): byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y, x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = ((uint64_t)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
inline float qrig_half_to_float(unsigned short h) { return qrig::gguf::fp16_to_float(h); }
inline float qrig_small_int_to_float(int s) { return __int_as_float(0x4B400000 + s) - 12582912.0f; }
inline void qrig_grid_dependency_wait() {}  // one launch at a time on the host: nothing runs before it
inline int qrig_dot4(int a, int b, int acc) {
  for (int i = 0; i < 4; ++i) acc += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return acc;
}

struct Idx {
  unsigned x = 0, y = 0;
};
inline thread_local Idx threadIdx;
inline Idx blockIdx;
inline std::barrier<>* g_block_barrier = nullptr;
inline std::vector<std::barrier<>*> g_warp_barriers;
inline float g_warp_slots[32][32];
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
// The warp's sum, the same value in every lane (lanes of a warp that returned early never call it: whole
// warps leave the kernels together).
inline float qrig_warp_sum(float v) {
  const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_warp_slots[w][l] = v;
  g_warp_barriers[w]->arrive_and_wait();
  float s = 0;
  for (int i = 0; i < 32; ++i) s += g_warp_slots[w][i];
  g_warp_barriers[w]->arrive_and_wait();
  return s;
}

inline void __syncwarp() {
  g_warp_barriers[threadIdx.x / 32]->arrive_and_wait();
}

// Runs body (the kernel call) on `threads` host threads per CTA, for every CTA of the grid in turn.
inline void launch(unsigned gx, unsigned gy, int threads, const std::function<void()>& body) {
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      blockIdx = {bx, by};
      std::barrier<> bar(threads);
      g_block_barrier = &bar;
      std::vector<std::unique_ptr<std::barrier<>>> wb;
      g_warp_barriers.clear();
      for (int w = 0; w < threads / 32; ++w) {
        wb.push_back(std::make_unique<std::barrier<>>(32));
        g_warp_barriers.push_back(wb.back().get());
      }
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          threadIdx = {(unsigned)t, 0};
          body();
        });
      for (auto& t : ts) t.join();
    }
}
}  // namespace wqemu
