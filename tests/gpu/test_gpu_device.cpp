// The checked CUDA layer on a real GPU: shared-memory opt-in set and working on every device (the seed engine
// set it on GPU 0 only), clear errors for launches over the limits, bad cubins, missing kernels, allocations
// that cannot succeed and launchers given the wrong variant or misaligned pointers.
#include <catch2/catch.hpp>

#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda;
using namespace qrig::cuda::gputest;

namespace {

// Fills `n` floats of dynamic shared memory, then writes their sum: runs only if the opt-in took.
const char* kBigSmem = R"(
extern "C" __global__ void __launch_bounds__(256) big_smem(float* out, int n) {
  extern __shared__ float s[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (int i = 0; i < n; ++i) t += s[i];
    out[blockIdx.x] = t;
  }
}
)";

}  // namespace

TEST_CASE("shared-memory opt-in is set, and works, on every device", "[gpu][short]") {
  Gpu& g = Gpu::get();
  const auto devices = init_devices();
  REQUIRE(!devices.empty());
  for (const auto& d : devices) INFO("device " << d.index << ": " << d.name << " sm_" << d.sm);
  const ArchChoice arch = choose_arch(g.info.sm);
  const NvrtcOutput o = nvrtc_compile("big_smem.cu", kBigSmem, {}, {fmt::format("--gpu-architecture=sm_{}", arch.target_sm)}, arch.lib);
  Library lib(o.cubin, "big_smem");
  Kernel k = lib.kernel("big_smem", 256);
  int limit = 1 << 30;
  for (const auto& d : devices) limit = std::min(limit, d.smem_per_block_optin);
  REQUIRE(limit > 48 * 1024);
  const int n = limit / 4;
  CHECK_THROWS_WITH(k.launch(Dim3(1), Dim3(256), (size_t)limit, g.stream.get(), (float*)nullptr, n),
                    Catch::Contains("without opt_in_shared"));
  CHECK_THROWS_WITH(k.opt_in_shared((size_t)limit + 1024), Catch::Contains("exceed"));
  k.opt_in_shared((size_t)limit);
  CHECK(k.dynamic_shared_limit() == (size_t)limit);
  for (const auto& d : devices) {
    INFO("device " << d.index);
    DeviceGuard guard(d.index);
    Stream s(d.index);
    DeviceBuffer<float> out(d.index, 2, "big_smem out");
    out.fill_bytes(0);
    k.launch(Dim3(2), Dim3(256), (size_t)limit, s.get(), out.data(), n);
    s.sync("big_smem");
    const auto v = out.download();
    CHECK(v[0] == (float)n);
    CHECK(v[1] == (float)n);
  }
}

TEST_CASE("launch, load and allocation failures are clear errors", "[gpu]") {
  Gpu& g = Gpu::get();
  const LoadedKernel k = g.load(rmsnorm_f32_variant(4096));
  DeviceBuffer<float> x(0, 4096, "x");
  CHECK_THROWS_WITH(k.kernel.launch(Dim3(1, 70000), Dim3(256), 0, g.stream.get(), x.data(), x.data(), x.data(), 1e-6f),
                    Catch::Contains("65535"));
  CHECK_THROWS_WITH(k.kernel.launch(Dim3(1), Dim3(512), 0, g.stream.get(), x.data(), x.data(), x.data(), 1e-6f),
                    Catch::Contains("launch bounds allow 256"));
  CHECK_THROWS_WITH(k.kernel.launch(Dim3(0), Dim3(256), 0, g.stream.get(), x.data(), x.data(), x.data(), 1e-6f),
                    Catch::Contains("empty"));
  // Garbage instead of a cubin fails at load or, with lazy module loading (seen on the H200), at the first
  // kernel lookup: either way an exception, never a launch of garbage.
  CHECK_THROWS([] {
    Library bad(std::vector<char>(4096, 'x'), "garbage");
    bad.kernel("rmsnorm_f32", 256);
  }());
  Library lib(g.compiler.get(rmsnorm_f32_variant(4096), g.info.sm).cubin, "rmsnorm");
  CHECK_THROWS_WITH(lib.kernel("no_such_kernel", 256), Catch::Contains("no_such_kernel"));
  CHECK_THROWS_WITH(DeviceBuffer<char>(0, (size_t)g.info.total_bytes * 2, "too big"),
                    Catch::Contains("cuMemAlloc") && Catch::Contains("too big") && Catch::Contains("MiB free"));
  // Launchers refuse the wrong template, a shape the variant was not compiled for, misaligned pointers.
  CHECK_THROWS_WITH(launch_quant_act_q8(k, x.data(), nullptr, x.data(), nullptr, 32, g.stream.get()),
                    Catch::Contains("quant_act_q8 launcher"));
  const LoadedKernel gemv = g.load(gemv_q8_0_variant(4096, 2));
  const int8_t* xi = reinterpret_cast<const int8_t*>(x.data());
  Q8Matrix m{xi, reinterpret_cast<const uint16_t*>(x.data()), 4, 2048};
  CHECK_THROWS_WITH(launch_gemv_q8_0(gemv, m, xi, x.data(), xi, x.data(), g.stream.get()), Catch::Contains("2048 columns"));
  m.cols = 4096;
  CHECK_THROWS_WITH(launch_gemv_q8_0(gemv, m, xi + 4, x.data(), xi, x.data(), g.stream.get()),
                    Catch::Contains("xq is not 16-byte aligned"));
  CHECK_THROWS_WITH(launch_gemv_q8_0(gemv, m, xi, x.data(), nullptr, x.data(), g.stream.get()),
                    Catch::Contains("xq2 is null"));
  CHECK_THROWS_WITH(launch_gemv_q8_0(gemv, m, xi, x.data(), xi + 4, x.data(), g.stream.get()),
                    Catch::Contains("xq2 is not 16-byte aligned"));
  // Nothing above reached the GPU: the context is healthy.
  synchronize(0, "after refused launches");
}
