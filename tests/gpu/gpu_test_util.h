// Shared helpers of the GPU tests (qrig_tests_gpu, run on a GPU machine by tests/gpu/run.sh): the device
// under test, kernels compiled for its architecture through the cubin cache, fast random Q8_0 matrices at
// real model shapes (GGUF bytes for the CPU reference + the repacked device copy), and a report file where
// each comparison records its error and threshold ($QRIG_GPU_REPORT, printed as a table by run.sh).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compiler/rig.h"
#include "gguf/gguf.h"
#include "runtime/cpu/ops.h"
#include "runtime/cuda/device.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/nvrtc.h"
#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "kernels/sampling.h"
#include "runtime/cuda/q8_layout.h"
#include "tests/cuda/kernel_sets.h"
#include "tests/gpu/broken_kernels.h"
#include "tests/runtime/cpu_test_util.h"

namespace qrig::cuda::gputest {

// The kernel library's variants and choices, and the kernel sets built from them as a plan builds them.
using namespace qrig::kernels;
using qrig::cuda::test::attention_choice;
using qrig::cuda::test::attention_kernels;
using qrig::cuda::test::gdn_kernels;
using qrig::cuda::test::launch_ranges;
using qrig::cuda::test::matmul_kernels;
using qrig::cuda::test::PlanMatmul;

using cpu::test::rel_err;

// Device 0 and a kernel compiler whose cache is the default one ($XDG_CACHE_HOME/qrig/kernels: run.sh points
// it under $OUT so the cubins and PTX come back with the logs). The kernels are compiled for the device's own
// architecture, or, with QRIG_GPU_TEST_FAMILY=sm_70 (tests/gpu/cmp_family.sh), for that older feature set and
// loaded as PTX through the driver's JIT: how the CMP's sm_70 kernels are tested on a newer GPU.
struct Gpu {
  DeviceInfo info;
  int family_sm = 0;  // the feature set the kernels are compiled for
  bool ptx = false;   // loaded as PTX (family_sm older than the device)
  KernelCompiler compiler;
  Stream stream;

  static Gpu& get() {
    static Gpu g;
    return g;
  }
  LoadedKernel load(const Variant& v) { return load_kernel(compiler.get(v, family_sm), ptx); }

 private:
  Gpu() : info(first_device()), family_sm(family(info.sm)), ptx(family_sm != info.sm), compiler(), stream(0) {}
  static int family(int device_sm) {
    const char* f = std::getenv("QRIG_GPU_TEST_FAMILY");
    if (!f || !*f) return device_sm;
    int sm = 0;
    if (std::sscanf(f, "sm_%d", &sm) != 1 || sm < 70 || sm > device_sm)
      throw CudaError(fmt::format("QRIG_GPU_TEST_FAMILY={}: want sm_NN, at least sm_70 and at most this GPU's sm_{}",
                                  f, device_sm));
    return sm;
  }
  static DeviceInfo first_device() {
    std::string why;
    if (device_count(&why) == 0) throw CudaError("no CUDA device to test: " + why);
    init_devices();
    return device_info(0);
  }
};

// xorshift64*: fills ~1 GB of test weights in about a second (std::mt19937 would take much longer).
struct FastRng {
  uint64_t s;
  explicit FastRng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  float uniform() { return (float)((next() >> 40) * (1.0 / 16777216.0)); }  // [0, 1)
};

// A random Q8_0 matrix [rows][cols]: int8 values over the whole range (-128 included) with per-block scales
// around 1/(64 sqrt(cols)) (jittered 0.5x..1.5x), like real weights; GGUF bytes + the repacked device copy.
struct Q8Test {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> gguf;  // rows * cols/32 blocks of 34 bytes
  DeviceBuffer<int8_t> qs;
  DeviceBuffer<uint16_t> scales;

  Q8Test(int64_t rows_, int64_t cols_, uint64_t seed) : rows(rows_), cols(cols_) {
    const size_t blocks = (size_t)rows * (size_t)(cols / 32);
    gguf.resize(blocks * 34);
    FastRng rng(seed);
    const float base = 1.0f / (64.0f * std::sqrt((float)cols));
    for (size_t b = 0; b < blocks; ++b) {
      uint8_t* blk = gguf.data() + b * 34;
      const uint16_t h = gguf::float_to_fp16(base * (0.5f + rng.uniform()));
      std::memcpy(blk, &h, 2);
      for (int i = 0; i < 32; i += 8) {
        const uint64_t r = rng.next();
        std::memcpy(blk + 2 + i, &r, 8);
      }
    }
    std::vector<int8_t> hq(q8_qs_bytes(rows, cols));
    std::vector<uint16_t> hs(q8_scale_bytes(rows, cols) / 2);
    repack_q8_0(gguf.data(), rows, cols, hq.data(), hs.data());
    qs = DeviceBuffer<int8_t>(0, hq.size(), fmt::format("Q8_0 values [{}][{}]", rows, cols));
    scales = DeviceBuffer<uint16_t>(0, hs.size(), fmt::format("Q8_0 scales [{}][{}]", rows, cols / 32));
    qs.upload(hq);
    scales.upload(hs);
  }
  Q8Matrix device() const { return {qs.data(), scales.data(), rows, cols}; }
  cpu::Matrix host() const { return {gguf::TensorType::Q8_0, gguf.data(), cols, rows}; }
};

inline std::vector<float> randn(size_t n, uint64_t seed, float mean = 0.0f, float sd = 1.0f) {
  FastRng rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i += 2) {  // Box-Muller
    const double u1 = std::max(1e-300, (double)rng.uniform()), u2 = rng.uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    v[i] = mean + sd * (float)(r * std::cos(6.283185307179586 * u2));
    if (i + 1 < n) v[i + 1] = mean + sd * (float)(r * std::sin(6.283185307179586 * u2));
  }
  return v;
}

// A device buffer whose every float is NaN (bytes 0xFF), so an element the kernel forgets shows up.
// A device copy of v.
inline DeviceBuffer<float> dev(const std::vector<float>& v, const char* what) {
  DeviceBuffer<float> b(0, v.size(), what);
  b.upload(v);
  return b;
}

// A rig of this GPU alone: the device's name, SMs and memory, and as the arch its family (the device's, or
// QRIG_GPU_TEST_FAMILY's, then run as PTX).
inline compiler::Rig this_gpu_rig() {
  Gpu& g = Gpu::get();
  compiler::Rig rig;
  rig.name = "this-gpu";
  compiler::RigDevice d;
  d.kind = "cuda";
  d.name = g.info.name;
  d.arch = fmt::format("sm_{}", g.family_sm);
  d.sms = g.info.sms;
  d.memory_gib = (double)g.info.total_bytes / (1 << 30);
  rig.devices.push_back(d);
  return rig;
}

inline DeviceBuffer<float> poisoned_device(size_t n, const std::string& what) {
  DeviceBuffer<float> b(0, n, what);
  b.fill_bytes(0xFF);
  return b;
}

// A table row to stdout and appended to $QRIG_GPU_REPORT (when set).
inline void report_row(const std::string& line) {
  std::printf("%s\n", line.c_str());
  if (const char* path = std::getenv("QRIG_GPU_REPORT"))
    if (FILE* f = std::fopen(path, "a")) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
}

// Appends "op | shape | measure | value | threshold | ok/FAIL" to $QRIG_GPU_REPORT (when set) and prints it.
inline void report(const std::string& op, const std::string& shape, const std::string& measure, double value,
                   double threshold) {
  report_row(fmt::format("| {} | {} | {} | {:.3g} | {} | {} |", op, shape, measure, value,
                         threshold < 0 ? std::string("exact") : fmt::format("{:.3g}", threshold),
                         (threshold < 0 ? value == 0 : value <= threshold) ? "ok" : "FAIL"));
}

// A deliberately broken kernel's row (tests/gpu/broken_kernels.h): its error must EXCEED the real test's
// threshold ("caught"; "MISSED" is the failure). The unpatched template through the same path (b.from empty)
// must stay within it (ok / FAIL, as report()).
inline void report_bug(const broken::Bug& b, const std::string& shape, const std::string& measure, double value,
                       double threshold) {
  const bool none = b.from.empty();
  report_row(fmt::format("| {}, bug: {} | {} | {} | {:.3g} | {} | {} |", b.kernel, none ? "none (the template as is)" : b.what,
                         shape, none ? measure : measure + " (must exceed)", value, fmt::format("{:.3g}", threshold),
                         none ? (value <= threshold ? "ok" : "FAIL") : (value > threshold ? "caught" : "MISSED")));
}

// The template of `v` with the bug patched in, compiled for this GPU's feature set (once per variant and bug in a
// run: kernel sets are built again for every case) and loaded like Gpu::load's.
inline LoadedKernel load_patched(const Variant& v, const broken::Bug& b) {
  Gpu& g = Gpu::get();
  static std::map<std::string, CompiledKernel> compiled;
  const std::string key = v.name + "\n" + b.what + "\n" + b.from + "\n" + b.to;
  auto it = compiled.find(key);
  if (it == compiled.end()) it = compiled.emplace(key, broken::compile_patched(v, b, choose_arch(g.family_sm))).first;
  return load_kernel(it->second, g.ptx);
}

// A loader for the kernel sets (gemm.h, gdn.h, attention.h) that compiles b.kernel's variants through
// load_patched (with the bug, or as they are when b.from is empty: the same path) and every other variant as
// Gpu::load does; *patched counts the patched loads (a bug whose kernel never ran would prove nothing).
inline KernelLoader patched_loader(const broken::Bug& b, int* patched) {
  return [b, patched](const Variant& v) {
    if (v.kernel != b.kernel) return Gpu::get().load(v);
    ++*patched;
    return load_patched(v, b);
  };
}

// The unpatched template of `kernel` as a Bug (the reference row of a broken-kernel test).
inline broken::Bug no_bug(const std::string& kernel) { return {kernel, "", "", ""}; }

}  // namespace qrig::cuda::gputest
