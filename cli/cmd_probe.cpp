// `qrig probe [-o RIG.toml] [--name NAME]`: measures this machine's GPUs and links (runtime/cuda/probe.h),
// prints a table for people, and writes the rig description the compiler plans for (cli/probe_rig.h).
// Without a GPU or a driver it fails with a message (exit 1). When a measurement fails it prints what it
// could and writes nothing (exit 1): a rig file should never hold a guess.
#include <unistd.h>

#include <ctime>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"

#ifdef QRIG_HAVE_CUDA
#include "cli/probe_rig.h"
#include "runtime/cuda/device.h"
#endif

namespace qrig::cli {

#ifdef QRIG_HAVE_CUDA
namespace {

std::string hostname() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 && buf[0] ? std::string(buf) : std::string("localhost");
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&t));
  return buf;
}

std::string rate_text(const cuda::UnitRate& r) {
  if (!r.measured) return "-";
  return fmt::format("{:.1f} {}", r.tops, r.unit == cuda::Unit::dp4a || r.unit == cuda::Unit::imma ? "TOPS" : "TFLOP/s");
}

void print_device(const cuda::DeviceProbe& d) {
  fmt::print("device {}: {}, sm_{}, {} SMs, {:.1f} GiB, SM clock {:.0f} MHz", d.index, d.name, d.sm, d.sms,
             (double)d.total_bytes / (1024.0 * 1024.0 * 1024.0), d.sm_clock_mhz);
  if (d.sm_clock_load_mhz > 0) fmt::print(" ({:.0f} MHz under load)", d.sm_clock_load_mhz);
  fmt::print(", memory clock {:.0f} MHz x {} bits\n", d.mem_clock_mhz, d.mem_bus_bits);
  fmt::print("  {:<9} {:<52} {:>15} {:>6} {:>10} {:>9} {:>6}  {}\n", "unit", "instruction", "measured", "MHz",
             "ops/clk/SM", "expected", "ratio", "verdict");
  for (cuda::Unit u : cuda::kUnits) {
    const cuda::UnitRate& r = d.unit(u);
    fmt::print("  {:<9} {:<52} {:>15} {:>6} {:>10} {:>9} {:>6}  {}\n", cuda::unit_name(u),
               r.opcode.empty() ? "-" : r.opcode, rate_text(r), r.clock_mhz > 0 ? fmt::format("{:.0f}", r.clock_mhz) : "-",
               r.measured ? fmt::format("{:.1f}", r.ops_per_clk_per_sm) : "-",
               r.expected_ops_per_clk_per_sm > 0 ? fmt::format("{:.0f}", r.expected_ops_per_clk_per_sm) : "-",
               r.ratio > 0 ? fmt::format("{:.2f}", r.ratio) : "-", cuda::verdict_name(r.verdict));
  }
  fmt::print("  memory: device copy {:.0f} GB/s (read + written); pinned host -> device {:.2f} GB/s, device -> host "
             "{:.2f} GB/s\n",
             d.copy_gbps, d.h2d_gbps, d.d2h_gbps);
  fmt::print("  tensor cores: {}\n", d.tensor_cores_throttled
                                         ? "not healthy or not measured: plans use the DP4A + HFMA2/FP32 family only"
                                         : "healthy");
  for (const auto& n : d.notes) fmt::print("  note: {}\n", n);
  for (const auto& e : d.errors) fmt::print(stderr, "  device {} error: {}\n", d.index, e);
}

}  // namespace
#endif

int cmd_probe(int argc, char** argv) {
  Args a(argc, argv, 2, {"-o", "--out", "--name"}, {});
  if (!a.positional().empty()) throw UsageError("usage: qrig probe [-o RIG.toml] [--name NAME]");
#ifndef QRIG_HAVE_CUDA
  throw std::runtime_error("this qrig was built without CUDA (QRIG_CUDA=OFF): there is no GPU to probe");
#else
  const std::string out = a.get("-o", a.get("--out"));
  const std::string host = hostname();
  const std::string name = a.get("--name", "probe-" + host);
  // Before anything is compiled or measured: what builds kernels here, and for each GPU whether its
  // architecture can be built for (an sm_70 GPU with only NVRTC 13 cannot: said here, with what to install).
  for (const auto& line : cuda::toolchain_report()) fmt::print("{}\n", line);
  {
    std::string why;
    const int n = cuda::device_count(&why);
    for (int i = 0; i < n; ++i) {
      const cuda::DeviceInfo info = cuda::device_info(i);
      const cuda::ArchKernels k = cuda::arch_kernels(info.sm);
      fmt::print(k.ok ? stdout : stderr, "device {} ({}, sm_{}): {}{}\n", i, info.name, info.sm, k.ok ? "" : "warning: ",
                 k.text);
    }
  }
  std::fflush(stdout);  // before a failure's message (stderr), even when stdout is a pipe
  const cuda::ProbeResult p = cuda::probe_rig();
  for (const auto& d : p.devices) print_device(d);
  for (const auto& q : p.peers) {
    fmt::print("devices {} <-> {}: peer access {}", q.a, q.b,
               q.p2p() ? "both ways" : q.a_to_b ? "one way" : q.b_to_a ? "one way" : "no (copies go through the host)");
    if (q.a_to_b) fmt::print(", {} -> {} {:.1f} GB/s", q.a, q.b, q.a_to_b_gbps);
    if (q.b_to_a) fmt::print(", {} -> {} {:.1f} GB/s", q.b, q.a, q.b_to_a_gbps);
    fmt::print("\n");
    for (const auto& e : q.errors) fmt::print(stderr, "  devices {} <-> {} error: {}\n", q.a, q.b, e);
  }
  fmt::print("probed {} device(s) in {:.1f} s\n", p.devices.size(), p.seconds);
  if (!p.ok()) {
    fmt::print(stderr, "qrig probe: some measurements failed (above){}\n", out.empty() ? "" : "; no rig file written");
    return 1;
  }
  if (!out.empty()) {
    const std::string text = rig_toml_from_probe(p, name, now_text(), host);
    compiler::Rig::parse(text, out);  // what the compiler will read back (throws if the probe wrote nonsense)
    std::ofstream f(out);
    if (!(f << text) || !(f.flush()))
      throw std::runtime_error(fmt::format("cannot write the rig file '{}'", out));
    fmt::print("wrote rig '{}' to {}\n", name, out);
  }
  return 0;
#endif
}

}  // namespace qrig::cli
