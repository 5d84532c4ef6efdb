// Micro-benchmarks of `qrig probe` (runtime/cuda/probe.cpp): the peak rate of each arithmetic unit, so a
// rig can say which units run at their architectural rate and which are throttled (a CMP 100-210's tensor
// cores run at ~1/16). Not a plan template: it is not in the variant registry, no plan ever requests it;
// the probe compiles it directly with NVRTC for the device's architecture (-DQRIG_SM=<sm>). It is the one
// source of qrig allowed to use tensor-core instructions (mma.sync), each gated on QRIG_SM.
//
// Each kernel runs CHAINS independent dependency chains per thread (enough instruction-level parallelism
// to cover the unit's latency with 8 warps per scheduler), UNROLL steps of every chain per loop iteration,
// `iters` iterations. One step of one chain is one instruction of the unit. Per warp and step:
//   probe_fp32_fma  fma.rn.f32                                    32 x 2 = 64 ops
//   probe_hfma2     fma.rn.f16x2                                  32 x 4 = 128 ops
//   probe_dp4a      dp4a.s32.s32                                  32 x 8 = 256 ops
//   probe_hmma      QRIG_SM >= 80: mma m16n8k16 f16 (f16 accumulate)   4096 ops
//                   QRIG_SM 75-79: mma m16n8k8 f16                     2048 ops
//                   QRIG_SM 70-74: mma m8n8k4 f16 (4 quad-pairs)       2048 ops
//   probe_imma      QRIG_SM >= 80: mma m16n8k32 s8 (s32 accumulate)    8192 ops
//                   QRIG_SM 75-79: mma m8n8k16 s8                      2048 ops  (none before sm_75)
// (a multiply-add counts 2 ops; the host's table, unit_kernel() in probe_rates.cpp, must agree;
// tests/cuda/test_probe.cpp checks the opcodes). The shapes are the native ones of each generation
// (CUTLASS's SM70/SM75/SM80 MMA atoms): older shapes issue at a fraction of the rate on newer tensor
// cores. Measured on an H200: m16n8k16 f16 0.65 of the architectural rate, m16n8k8 0.50; m16n8k32 s8 0.66,
// m8n8k16 0.25 (which would sit on the "throttled" threshold).
//
// Operands are kernel arguments (so nothing folds at compile time); values stay finite: f16 chains converge
// (x = x * m + a with m < 1), f16 mma accumulators grow by 2^-12 per step until the step rounds away (near
// 1); integer chains wrap.
// Every thread writes one value so no chain is dead code. Thread 0 of each block writes, per block,
// clock64 and %globaltimer (ns) at start and end: the host derives the SM clock under load from them.
// Launch: grid = SMs x 4 blocks of QRIG_THREADS (one full wave: 1024 threads and <= 64 registers per thread
// fit every SM from sm_70 up), `out` holds grid * QRIG_THREADS 32-bit values, `timing` grid * 4 u64.
#ifndef QRIG_SM
#error "QRIG_SM (feature-set architecture, e.g. 70) must be defined by the probe"
#endif
#ifndef QRIG_THREADS
#define QRIG_THREADS 256
#endif
#define QRIG_PROBE_MIN_BLOCKS 4
#define QRIG_PROBE_CHAINS 8
#define QRIG_PROBE_UNROLL 16

__device__ __forceinline__ unsigned long long probe_clock() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}

__device__ __forceinline__ unsigned long long probe_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Start and end stamps of the block; the end comes after every thread has stored its result.
struct ProbeStamp {
  unsigned long long clock0, ns0;
  __device__ __forceinline__ void start() {
    __syncthreads();
    if (threadIdx.x == 0) {
      ns0 = probe_ns();
      clock0 = probe_clock();
    }
  }
  __device__ __forceinline__ void finish(unsigned long long* timing) {
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned long long clock1 = probe_clock();
      const unsigned long long ns1 = probe_ns();
      unsigned long long* t = timing + 4ull * blockIdx.x;
      t[0] = clock0;
      t[1] = clock1;
      t[2] = ns0;
      t[3] = ns1;
    }
  }
};

__device__ __forceinline__ unsigned int probe_gid() { return blockIdx.x * QRIG_THREADS + threadIdx.x; }

extern "C" __global__ void __launch_bounds__(QRIG_THREADS, QRIG_PROBE_MIN_BLOCKS)
probe_fp32_fma(float* out, unsigned long long* timing, int iters, float m, float a) {
  ProbeStamp stamp;
  stamp.start();
  float x[QRIG_PROBE_CHAINS];
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) x[c] = (float)(threadIdx.x + c) * 1e-3f;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < QRIG_PROBE_UNROLL; ++u) {
#pragma unroll
      for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) asm("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x[c]) : "f"(m), "f"(a));
    }
  }
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) s += x[c];
  out[probe_gid()] = s;
  stamp.finish(timing);
}

// m2, a2: two fp16 values packed in 32 bits each.
extern "C" __global__ void __launch_bounds__(QRIG_THREADS, QRIG_PROBE_MIN_BLOCKS)
probe_hfma2(unsigned int* out, unsigned long long* timing, int iters, unsigned int m2, unsigned int a2) {
  ProbeStamp stamp;
  stamp.start();
  unsigned int x[QRIG_PROBE_CHAINS];
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) x[c] = 0x3C003C00u ^ ((threadIdx.x + c) & 0xFFu);  // about (1, 1)
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < QRIG_PROBE_UNROLL; ++u) {
#pragma unroll
      for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) asm("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(x[c]) : "r"(m2), "r"(a2));
    }
  }
  unsigned int s = 0;
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) s ^= x[c];
  out[probe_gid()] = s;
  stamp.finish(timing);
}

// Each chain feeds itself as the packed int8 operand: nothing about the sequence is loop-invariant.
extern "C" __global__ void __launch_bounds__(QRIG_THREADS, QRIG_PROBE_MIN_BLOCKS)
probe_dp4a(int* out, unsigned long long* timing, int iters, int b) {
  ProbeStamp stamp;
  stamp.start();
  int x[QRIG_PROBE_CHAINS];
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) x[c] = (int)(threadIdx.x * 0x01010101u) + c;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < QRIG_PROBE_UNROLL; ++u) {
#pragma unroll
      for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) asm("dp4a.s32.s32 %0, %0, %1, %0;" : "+r"(x[c]) : "r"(b));
    }
  }
  int s = 0;
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) s ^= x[c];
  out[probe_gid()] = s;
  stamp.finish(timing);
}

// fp16 tensor-core mma (f16 accumulate: the full rate on every board, GeForce included). a, b: the packed
// fp16 pair used for every A and B register; the accumulators (C = D) carry the dependency.
#if QRIG_SM >= 70
extern "C" __global__ void __launch_bounds__(QRIG_THREADS, QRIG_PROBE_MIN_BLOCKS)
probe_hmma(unsigned int* out, unsigned long long* timing, int iters, unsigned int a, unsigned int b) {
  ProbeStamp stamp;
  stamp.start();
#if QRIG_SM >= 75
  unsigned int d[QRIG_PROBE_CHAINS][2];
#else
  unsigned int d[QRIG_PROBE_CHAINS][4];
#endif
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c)
#pragma unroll
    for (int r = 0; r < (int)(sizeof(d[0]) / sizeof(d[0][0])); ++r) d[c][r] = 0;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < QRIG_PROBE_UNROLL; ++u) {
#pragma unroll
      for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) {
#if QRIG_SM >= 80
        asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
            : "+r"(d[c][0]), "+r"(d[c][1])
            : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));
#elif QRIG_SM >= 75
        asm("mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3}, {%4}, {%0,%1};"
            : "+r"(d[c][0]), "+r"(d[c][1])
            : "r"(a), "r"(a), "r"(b));
#else
        asm("mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16 {%0,%1,%2,%3}, {%4,%5}, {%6,%7}, {%0,%1,%2,%3};"
            : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
            : "r"(a), "r"(a), "r"(b), "r"(b));
#endif
      }
    }
  }
  unsigned int s = 0;
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c)
#pragma unroll
    for (int r = 0; r < (int)(sizeof(d[0]) / sizeof(d[0][0])); ++r) s ^= d[c][r];
  out[probe_gid()] = s;
  stamp.finish(timing);
}
#endif

// int8 tensor-core mma with s32 accumulators (sm_75+; Volta has none). a, b: four int8 packed per register.
#if QRIG_SM >= 75
extern "C" __global__ void __launch_bounds__(QRIG_THREADS, QRIG_PROBE_MIN_BLOCKS)
probe_imma(int* out, unsigned long long* timing, int iters, int a, int b) {
  ProbeStamp stamp;
  stamp.start();
#if QRIG_SM >= 80
  int d[QRIG_PROBE_CHAINS][4];
#else
  int d[QRIG_PROBE_CHAINS][2];
#endif
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c)
#pragma unroll
    for (int r = 0; r < (int)(sizeof(d[0]) / sizeof(d[0][0])); ++r) d[c][r] = c;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < QRIG_PROBE_UNROLL; ++u) {
#pragma unroll
      for (int c = 0; c < QRIG_PROBE_CHAINS; ++c) {
#if QRIG_SM >= 80
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
            : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));
#else
        asm("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%0,%1};"
            : "+r"(d[c][0]), "+r"(d[c][1])
            : "r"(a), "r"(b));
#endif
      }
    }
  }
  int s = 0;
#pragma unroll
  for (int c = 0; c < QRIG_PROBE_CHAINS; ++c)
#pragma unroll
    for (int r = 0; r < (int)(sizeof(d[0]) / sizeof(d[0][0])); ++r) s ^= d[c][r];
  out[probe_gid()] = s;
  stamp.finish(timing);
}
#endif
