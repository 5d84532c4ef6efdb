// Device helpers shared by the templates of the default kernel family: fp16 bits -> float without
// cuda_fp16.h, dp4a, an exact small-int -> float conversion and deterministic warp reductions. Everything
// here must be sm_70 material: no mma/wmma/wgmma, ldmatrix, cp.async, redux.sync or bf16 arithmetic (the
// CMP rigs are sm_70; tests/cuda scans the PTX of their plans for those instructions).
//
// QRIG_SM is the feature-set architecture the kernel is written for (70 for a CMP 100-210 even when NVRTC
// must emit sm_75 code); __CUDA_ARCH__ is the code target. Gate optional newer features on QRIG_SM.
#pragma once

#ifndef QRIG_SM
#error "QRIG_SM (feature-set architecture, e.g. 70) must be defined by the kernel compiler"
#endif
#if QRIG_SM < 70
#error "the default kernel family needs sm_70 or newer"
#endif

#define QRIG_FULL_MASK 0xffffffffu

// Shared memory one SM can give its CTAs, in KiB, for the feature-set architecture (CUDA programming guide,
// "technical specifications per compute capability"). Kernels whose launch bounds ask for several CTAs per SM
// ask only for as many as fit: a register cap for CTAs that can never be resident only makes ptxas spill.
#if QRIG_SM >= 100
#define QRIG_SMEM_PER_SM_KIB (QRIG_SM == 100 || QRIG_SM == 103 ? 228 : 100)
#elif QRIG_SM >= 90
#define QRIG_SMEM_PER_SM_KIB 228
#elif QRIG_SM >= 80
#define QRIG_SMEM_PER_SM_KIB (QRIG_SM == 80 || QRIG_SM == 87 ? 164 : 100)
#elif QRIG_SM >= 75
#define QRIG_SMEM_PER_SM_KIB 64
#else
#define QRIG_SMEM_PER_SM_KIB 96
#endif
// The CTAs of `kib` KiB each (plus the 1 KiB the hardware reserves per CTA) that fit one SM, at most `want`.
#define QRIG_CTAS_FITTING(want, kib) \
  (QRIG_SMEM_PER_SM_KIB / ((kib) + 1) < (want) ? QRIG_SMEM_PER_SM_KIB / ((kib) + 1) : (want))

// Programmatic dependent launch (sm_90+: docs/gpu.md "launch overlap"). Every kernel of the family but the
// tiled GEMMs (TemplateInfo::plain_launch: launched plainly) calls this first, before it reads or writes any global memory: it waits until the kernel launched before it on the
// stream has finished and its writes are visible (griddepcontrol.wait), then lets the next kernel be launched
// (griddepcontrol.launch_dependents), whose CTAs are then resident and waiting here when this one ends. A plan
// with programmatic_launch launches its kernels with that attribute, so a kernel's launch latency overlaps
// the one before it; without the attribute (older GPUs, tests, --no-pdl) the wait returns at once. Below sm_90
// it is nothing. The executor checks each kernel's PTX for the wait before launching it so.
__device__ __forceinline__ void qrig_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// fp16 (IEEE binary16 bits) -> float, exact for every value (subnormals, inf, NaN included).
__device__ __forceinline__ float qrig_half_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// float -> fp16 bits, round to nearest even (what gguf::float_to_fp16 does on the host).
__device__ __forceinline__ unsigned short qrig_float_to_half(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// x * sigmoid(x) with the accurate expf (the CPU reference uses std::exp: a few ulp apart).
__device__ __forceinline__ float qrig_silu(float x) { return x / (1.0f + expf(-x)); }

// Exact int -> float for |s| < 2^22 with one integer and one float add (the magic-number trick: the I2F
// unit runs at a quarter of the dp4a rate). A dot of 16 int8 pairs is at most 16 * 128 * 128 = 2^18.
__device__ __forceinline__ float qrig_small_int_to_float(int s) {
  return __int_as_float(0x4B400000 + s) - 12582912.0f;
}

// Sum of the 4 int8 x int8 products of two packed words, plus acc (dp4a, sm_61+). The PTX instruction, not the
// __dp4a intrinsic: NVRTC 11.8 (the sm_70 compiler) declares __dp4a but leaves it undefined.
__device__ __forceinline__ int qrig_dot4(int a, int b, int acc) {
  int r;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
  return r;
}

// Dot of 16 int8 pairs held in two int4.
__device__ __forceinline__ int qrig_dot16(int4 a, int4 b) {
  int s = qrig_dot4(a.x, b.x, 0);
  s = qrig_dot4(a.y, b.y, s);
  s = qrig_dot4(a.z, b.z, s);
  return qrig_dot4(a.w, b.w, s);
}

// Butterfly reductions: every lane ends with the same value, combined in the same fixed order on every
// run (floating-point addition is commutative, so lane i and lane i^m agree bit for bit).
__device__ __forceinline__ float qrig_warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(QRIG_FULL_MASK, v, m);
  return v;
}

__device__ __forceinline__ float qrig_warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(QRIG_FULL_MASK, v, m));
  return v;
}

// Sum over the block (threads = T, a multiple of 32) of a float, int or double; every thread gets the
// result. Deterministic: warp butterflies, then the warp sums added in warp order. `scratch` holds T/32
// values of shared memory; the function synchronises before returning, so scratch may be reused afterwards.
template <int T, class V>
__device__ __forceinline__ V qrig_block_add(V v, V* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(QRIG_FULL_MASK, v, m);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  V s = 0;
  // In eights: fully unrolled, ptxas (NVRTC 11.8's) loads all T/32 partial sums at once, which at T = 1024
  // (64 registers a thread) spilled. The additions stay in warp order either way.
#pragma unroll 8
  for (int w = 0; w < T / 32; ++w) s += scratch[w];
  __syncthreads();
  return s;
}

template <int T>
__device__ __forceinline__ float qrig_block_sum(float v, float* scratch) {
  return qrig_block_add<T, float>(v, scratch);
}
