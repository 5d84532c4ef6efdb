// The probe's measurements on real devices (see probe.h): unit micro-benchmarks (templates/probe_units.cu,
// compiled by NVRTC once per architecture and loaded as a context-independent library), device copy, pinned
// host links and peer copies. Everything is timed with CUDA events; every duration is calibrated first
// (doubling the work until a launch is long enough to time), then the best of opt.reps timed runs counts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "runtime/cuda/device.h"
#include "runtime/cuda/probe.h"
#include "runtime/cuda/templates.h"

namespace qrig::cuda {

namespace {

constexpr size_t kMiB = (size_t)1 << 20;

// The benchmark kernels of one feature-set architecture, loaded once for every device that has it.
struct UnitKernels {
  ArchChoice arch;
  std::unique_ptr<Library> lib;
  std::map<Unit, Kernel> kernels;
};

std::shared_ptr<UnitKernels> load_unit_kernels(int sm) {
  auto k = std::make_shared<UnitKernels>();
  ProbeBuild b = compile_probe_units(sm);
  k->arch = b.arch;
  k->lib = std::make_unique<Library>(b.out.cubin, fmt::format("probe_units.cu for sm_{}", sm));
  for (Unit u : kUnits)
    if (auto uk = unit_kernel(u, sm)) k->kernels.emplace(u, k->lib->kernel(uk->entry, kProbeThreads));
  return k;
}

// Event-timed work on one stream.
struct Timer {
  const Stream& stream;
  Event e0, e1;
  explicit Timer(const Stream& s) : stream(s), e0(s.device()), e1(s.device()) {}
  template <class F>
  double ms(F&& work) {
    e0.record(stream.get());
    work();
    e1.record(stream.get());
    e1.sync();
    return Event::elapsed_ms(e0, e1);
  }
};

struct UnitRun {
  double ms = 0;
  double clock_mhz = 0;  // 0 when the stamps do not give a plausible clock
};

// SM clock from the blocks' clock64 and globaltimer stamps: all cycles over all nanoseconds.
double clock_from_stamps(const std::vector<unsigned long long>& t, double peak_mhz) {
  double cycles = 0, ns = 0;
  for (size_t i = 0; i + 3 < t.size(); i += 4)
    if (t[i + 1] > t[i] && t[i + 3] > t[i + 2]) {
      cycles += (double)(t[i + 1] - t[i]);
      ns += (double)(t[i + 3] - t[i + 2]);
    }
  if (ns <= 0) return 0;
  const double mhz = cycles / ns * 1000.0;
  // globaltimer may tick coarsely or not at all on some systems: keep only plausible clocks.
  return peak_mhz > 0 && (mhz < 0.1 * peak_mhz || mhz > 1.5 * peak_mhz) ? 0 : mhz;
}

UnitRun run_unit(Unit u, const Kernel& k, int iters, int blocks, const Stream& s, DeviceBuffer<uint32_t>& out,
                 DeviceBuffer<unsigned long long>& stamps, double peak_mhz) {
  Timer timer(s);
  void* o = out.data();
  unsigned long long* t = stamps.data();
  const Dim3 grid((unsigned)blocks), block(kProbeThreads);
  UnitRun r;
  r.ms = timer.ms([&] {
    switch (u) {
      case Unit::fp32_fma: k.launch(grid, block, 0, s.get(), o, t, iters, 0.9999f, 1e-4f); break;
      case Unit::hfma2: k.launch(grid, block, 0, s.get(), o, t, iters, 0x3BFF3BFFu, 0x14001400u); break;  // 0.9995, 2^-10
      case Unit::dp4a: k.launch(grid, block, 0, s.get(), o, t, iters, (int)0x01FE037Fu); break;
      case Unit::hmma: k.launch(grid, block, 0, s.get(), o, t, iters, 0x1C001C00u, 0x1C001C00u); break;   // 2^-8
      case Unit::imma: k.launch(grid, block, 0, s.get(), o, t, iters, (int)0x01010101u, (int)0x01FF01FFu); break;
    }
  });
  r.clock_mhz = clock_from_stamps(stamps.download(), peak_mhz);
  return r;
}

void measure_unit(DeviceProbe& d, Unit u, const Kernel& k, const ProbeOptions& opt, const Stream& s) {
  const UnitKernel uk = *unit_kernel(u, d.sm);
  UnitRate& r = d.unit(u);
  r.opcode = uk.opcode;
  const int blocks = d.sms * kProbeBlocksPerSm;
  DeviceBuffer<uint32_t> out(d.index, (size_t)blocks * kProbeThreads, fmt::format("{} benchmark output", unit_name(u)));
  DeviceBuffer<unsigned long long> stamps(d.index, (size_t)blocks * 4, fmt::format("{} benchmark stamps", unit_name(u)));
  // Calibrate: grow the work until a launch takes 2 ms, then scale it to opt.unit_ms.
  int64_t iters = 4;
  UnitRun run = run_unit(u, k, (int)iters, blocks, s, out, stamps, d.sm_clock_mhz);
  while (run.ms < 2.0 && iters < ((int64_t)1 << 26)) {
    iters *= run.ms < 0.25 ? 8 : 2;
    run = run_unit(u, k, (int)iters, blocks, s, out, stamps, d.sm_clock_mhz);
  }
  iters = std::clamp<int64_t>((int64_t)std::ceil((double)iters * opt.unit_ms / std::max(run.ms, 1e-3)), 1,
                              (int64_t)1 << 30);
  UnitRun best;
  for (int rep = 0; rep < std::max(1, opt.reps); ++rep) {
    run = run_unit(u, k, (int)iters, blocks, s, out, stamps, d.sm_clock_mhz);
    if (best.ms == 0 || run.ms < best.ms) best = run;
  }
  const double ops = (double)blocks * (kProbeThreads / 32) * (double)iters * kProbeUnroll * kProbeChains *
                     uk.ops_per_warp_step;
  const double seconds = best.ms * 1e-3;
  r.measured = true;
  r.tops = ops / seconds / 1e12;
  r.clock_mhz = best.clock_mhz;
  const double clock_hz = (best.clock_mhz > 0 ? best.clock_mhz : d.sm_clock_mhz) * 1e6;
  r.ops_per_clk_per_sm = clock_hz > 0 ? ops / seconds / clock_hz / d.sms : 0;
}

void measure_units(DeviceProbe& d, const ProbeOptions& opt, std::map<int, std::shared_ptr<UnitKernels>>& cache) {
  for (Unit u : kUnits)
    if (auto uk = unit_kernel(u, d.sm)) d.unit(u).opcode = uk->opcode;
  if (d.sm < 70) {
    d.notes.push_back(fmt::format("sm_{}: qrig needs sm_70 or newer; unit benchmarks skipped", d.sm));
    return;
  }
  std::shared_ptr<UnitKernels> k;
  try {
    const ArchChoice arch = choose_arch(d.sm);
    if (arch.substituted()) {
      d.notes.push_back(fmt::format("unit rates not measured: no NVRTC here emits sm_{} code (found: {}); tensor "
                                    "cores are not judged healthy. {}",
                                    d.sm, nvrtc_versions(), nvrtc_install_hint(d.sm)));
      return;
    }
    auto it = cache.find(d.sm);
    k = it != cache.end() ? it->second : (cache[d.sm] = load_unit_kernels(d.sm));
  } catch (const std::exception& e) {
    d.errors.push_back(fmt::format("unit benchmarks for sm_{} could not be built or loaded: {}", d.sm, e.what()));
    return;
  }
  Stream s(d.index);
  for (Unit u : kUnits) {
    auto it = k->kernels.find(u);
    if (it == k->kernels.end()) continue;  // the architecture has no such instruction
    try {
      measure_unit(d, u, it->second, opt, s);
    } catch (const std::exception& e) {
      d.errors.push_back(fmt::format("{} benchmark: {}", unit_name(u), e.what()));
    }
  }
  d.sm_clock_load_mhz = d.unit(Unit::fp32_fma).clock_mhz;
}

// Bytes per second of `batch(n)` moving `bytes` each time: calibrated to opt.copy_ms, best of opt.reps.
template <class Batch>
double copy_rate(size_t bytes, const ProbeOptions& opt, Batch&& batch) {
  batch(1);  // warm-up
  const double one = std::max(batch(1), 1e-3);
  const int n = (int)std::clamp(std::ceil(opt.copy_ms / one), 1.0, 10000.0);
  double best = 0;
  for (int rep = 0; rep < std::max(1, opt.reps); ++rep) {
    const double ms = batch(n);
    if (best == 0 || ms < best) best = ms;
  }
  return (double)bytes * n / (best * 1e-3);
}

// Device-to-device copy within one device, bytes read + written (as ../shared/BASELINES.md counts it).
void measure_copy(DeviceProbe& d, const ProbeOptions& opt) {
  size_t free_b = 0, total_b = 0;
  memory_info(d.index, &free_b, &total_b);
  // 1 GiB like the ~4.3 TB/s H200 figure of ../shared/BASELINES.md (256 MiB reads ~3% lower there); far
  // above any L2. A quarter of the free memory at most.
  const size_t bytes = std::min<size_t>(1024 * kMiB, free_b / 4) / kMiB * kMiB;
  if (bytes < 8 * kMiB) {
    d.errors.push_back(fmt::format("device copy: only {:.0f} MiB free", free_b / (double)kMiB));
    return;
  }
  DeviceBuffer<char> a(d.index, bytes, "probe copy source"), b(d.index, bytes, "probe copy destination");
  a.fill_bytes(1);
  Stream s(d.index);
  Timer timer(s);
  d.copy_gbps = 2.0 * copy_rate(bytes, opt, [&](int n) {
                  return timer.ms([&] {
                    for (int i = 0; i < n; ++i) copy_on_device(b.data(), a.data(), bytes, s.get(), "probe device copy");
                  });
                }) / 1e9;
}

// Pinned host memory <-> device, each direction on its own. The chunk grows until one copy takes 10 ms, so
// a 0.25 GB/s riser link is timed as well as a 50 GB/s slot.
void measure_host_link(DeviceProbe& d, const ProbeOptions& opt) {
  const size_t max_bytes = 64 * kMiB;
  PinnedBuffer host(max_bytes, "probe host buffer");
  std::memset(host.data(), 0x5A, max_bytes);
  DeviceBuffer<char> dev(d.index, max_bytes, "probe link buffer");
  Stream s(d.index);
  Timer timer(s);
  for (const bool h2d : {true, false}) {
    void* dst = h2d ? (void*)dev.data() : host.data();
    const void* src = h2d ? (const void*)host.data() : (const void*)dev.data();
    auto batch_of = [&](size_t bytes) {
      return [&, bytes](int n) {
        return timer.ms([&] {
          for (int i = 0; i < n; ++i)
            if (h2d)
              copy_to_device_async(dst, src, bytes, s.get(), "probe host-to-device copy");
            else
              copy_to_host_async(dst, src, bytes, s.get(), "probe device-to-host copy");
        });
      };
    };
    size_t bytes = kMiB;
    batch_of(bytes)(1);  // warm-up
    while (bytes < max_bytes && batch_of(bytes)(1) < 10.0) bytes = std::min(max_bytes, bytes * 4);
    (h2d ? d.h2d_gbps : d.d2h_gbps) = copy_rate(bytes, opt, batch_of(bytes)) / 1e9;
  }
}

DeviceProbe probe_one(int device, const ProbeOptions& opt, std::map<int, std::shared_ptr<UnitKernels>>& cache) {
  DeviceGuard guard(device);
  const DeviceInfo info = device_info(device);
  DeviceProbe d;
  d.index = device;
  d.name = info.name;
  d.sm = info.sm;
  d.sms = info.sms;
  d.total_bytes = info.total_bytes;
  d.sm_clock_mhz = device_attribute(device, drv::kClockRate, "SM clock") / 1000.0;
  d.mem_clock_mhz = device_attribute(device, drv::kMemoryClockRate, "memory clock") / 1000.0;
  d.mem_bus_bits = device_attribute(device, drv::kGlobalMemoryBusWidth, "memory bus width");
  d.kernels = arch_kernels(d.sm);
  for (Unit u : kUnits) d.unit(u).unit = u;
  measure_units(d, opt, cache);
  try {
    measure_copy(d, opt);
  } catch (const std::exception& e) {
    d.errors.push_back(fmt::format("device copy: {}", e.what()));
  }
  if (opt.links) {
    try {
      measure_host_link(d, opt);
    } catch (const std::exception& e) {
      d.errors.push_back(fmt::format("host link: {}", e.what()));
    }
  }
  apply_verdicts(d);
  return d;
}

// Copy bandwidth from device `src` to device `dst` with src's access to dst turned on.
double peer_copy_gbps(int src, int dst, const ProbeOptions& opt) {
  const bool enabled = enable_peer_access(src, dst);
  struct Off {
    bool on;
    int a, b;
    ~Off() {
      if (on) disable_peer_access(a, b);
    }
  } off{enabled, src, dst};
  DeviceGuard guard(src);  // before the fill: the fill runs in the buffer's device's context
  const size_t bytes = 64 * kMiB;
  DeviceBuffer<char> from(src, bytes, "probe peer source"), to(dst, bytes, "probe peer destination");
  from.fill_bytes(3);
  Stream s(src);
  Timer timer(s);
  return copy_rate(bytes, opt, [&](int n) {
           return timer.ms([&] {
             for (int i = 0; i < n; ++i) copy_peer_async(to.data(), dst, from.data(), src, bytes, s.get(), "probe peer copy");
           });
         }) / 1e9;
}

}  // namespace

ProbeBuild compile_probe_units(int feature_sm) {
  const TemplateFile* f = find_template("probe_units.cu");
  if (!f) throw KernelError("templates/probe_units.cu is not embedded in this binary");
  ProbeBuild b;
  b.arch = choose_arch(feature_sm);
  const std::vector<std::string> options = {
      fmt::format("--gpu-architecture=sm_{}", b.arch.target_sm),
      "-std=c++17",
      "--ptxas-options=-v",
      fmt::format("-DQRIG_SM={}", b.arch.feature_sm),
      fmt::format("-DQRIG_THREADS={}", kProbeThreads),
  };
  b.out = nvrtc_compile("probe_units.cu", f->source, {}, options, b.arch.lib);
  return b;
}

DeviceProbe probe_device(int device, const ProbeOptions& opt) {
  std::map<int, std::shared_ptr<UnitKernels>> cache;
  return probe_one(device, opt, cache);
}

PeerProbe probe_peers(int a, int b, const ProbeOptions& opt) {
  PeerProbe p;
  p.a = a;
  p.b = b;
  try {
    p.a_to_b = can_access_peer(a, b);
    p.b_to_a = can_access_peer(b, a);
  } catch (const std::exception& e) {
    p.errors.push_back(e.what());
    return p;
  }
  for (const bool forward : {true, false}) {
    if (!(forward ? p.a_to_b : p.b_to_a)) continue;
    try {
      (forward ? p.a_to_b_gbps : p.b_to_a_gbps) = forward ? peer_copy_gbps(a, b, opt) : peer_copy_gbps(b, a, opt);
    } catch (const std::exception& e) {
      p.errors.push_back(fmt::format("peer copy {} -> {}: {}", forward ? a : b, forward ? b : a, e.what()));
    }
  }
  return p;
}

ProbeResult probe_rig(const ProbeOptions& opt) {
  std::string why;
  const int n = device_count(&why);
  if (n == 0)
    throw CudaError("no CUDA device to probe: " + why +
                    ". The probe needs an NVIDIA GPU and its driver (nvidia-smi lists what the driver sees)");
  const auto t0 = std::chrono::steady_clock::now();
  init_devices();
  ProbeResult r;
  r.toolchain = toolchain_report();
  std::map<int, std::shared_ptr<UnitKernels>> cache;
  for (int i = 0; i < n; ++i) r.devices.push_back(probe_one(i, opt, cache));
  if (opt.links)
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) r.peers.push_back(probe_peers(a, b, opt));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace qrig::cuda
