// A probe of this machine (runtime/cuda/probe.h) as a rig description (compiler/rig.h) and its TOML file: the
// one place where the probe's measurements meet the compiler's rig, since the runtime may not include the
// compiler. Header-only so that the no-GPU tests (tests/cuda/test_probe.cpp) check the exact text
// `qrig probe -o` writes by parsing it back.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "compiler/rig.h"
#include "runtime/cuda/probe.h"

namespace qrig::cli {

// x rounded to 3 significant digits (rig files are read by people; the probe is not more precise than that).
inline double round3(double x) {
  if (x == 0 || !std::isfinite(x)) return 0;
  const double scale = std::pow(10.0, 2 - (int)std::floor(std::log10(std::fabs(x))));
  return std::round(x * scale) / scale;
}

// Unit rates that were not measured are 0 (as the rig format says); tensor_cores_throttled is the probe's
// verdict. Links: one per device from the host (pinned copies), one per pair of devices (p2p only when
// access works both ways; its bandwidth is the slower direction).
inline compiler::Rig rig_from_probe(const cuda::ProbeResult& p, const std::string& name) {
  compiler::Rig rig;
  rig.name = name;
  auto rate = [](const cuda::DeviceProbe& d, cuda::Unit u) { return d.unit(u).measured ? round3(d.unit(u).tops) : 0.0; };
  for (const cuda::DeviceProbe& d : p.devices) {
    compiler::RigDevice x;
    x.kind = "cuda";
    x.name = d.name;
    x.arch = fmt::format("sm_{}", d.sm);
    x.sms = d.sms;
    x.memory_gib = round3((double)d.total_bytes / (1024.0 * 1024.0 * 1024.0));
    x.clock_mhz = std::round(d.sm_clock_mhz);
    x.mem_bw_gbps = round3(d.copy_gbps);
    x.dp4a_tops = rate(d, cuda::Unit::dp4a);
    x.fp32_tflops = rate(d, cuda::Unit::fp32_fma);
    x.hfma2_tflops = rate(d, cuda::Unit::hfma2);
    x.hmma_tflops = rate(d, cuda::Unit::hmma);
    x.imma_tops = rate(d, cuda::Unit::imma);
    x.tensor_cores_throttled = d.tensor_cores_throttled;
    rig.devices.push_back(x);
  }
  for (const cuda::DeviceProbe& d : p.devices)
    rig.links.push_back({"host", std::to_string(d.index), round3(d.h2d_gbps), round3(d.d2h_gbps), false, 0.0});
  for (const cuda::PeerProbe& q : p.peers)
    rig.links.push_back({std::to_string(q.a), std::to_string(q.b), 0.0, 0.0, q.p2p(),
                         q.p2p() ? round3(std::min(q.a_to_b_gbps, q.b_to_a_gbps)) : 0.0});
  return rig;
}

// The file `qrig probe -o` writes: a comment header (when, where, each device's verdicts) then the rig.
inline std::string rig_toml_from_probe(const cuda::ProbeResult& p, const std::string& name, const std::string& when,
                                       const std::string& host) {
  std::string s = fmt::format("# Written by `qrig probe` on {} (host {}, {:.1f} s). Rates in TOPS / TFLOP/s, bandwidth "
                              "in GB/s;\n# the fraction of each unit's architectural rate follows (THROTTLED below "
                              "{:g}).\n",
                              when, host, p.seconds, cuda::kThrottledBelow);
  for (const cuda::DeviceProbe& d : p.devices) {
    std::string units;
    for (cuda::Unit u : cuda::kUnits) {
      const cuda::UnitRate& r = d.unit(u);
      units += fmt::format("{}{} ", units.empty() ? "" : ", ", cuda::unit_name(u));
      units += r.verdict == cuda::Verdict::ok ? fmt::format("{:.2f}", r.ratio)
               : r.verdict == cuda::Verdict::throttled ? fmt::format("{:.3f} THROTTLED", r.ratio)
                                                        : std::string(cuda::verdict_name(r.verdict));
    }
    s += fmt::format("# device {} {} (sm_{}): {}; tensor cores {}\n", d.index, d.name, d.sm, units,
                     d.tensor_cores_throttled ? "not healthy (the tensor-core family is never planned)" : "healthy");
    for (const auto& n : d.notes) s += fmt::format("#   note: {}\n", n);
  }
  return s + rig_from_probe(p, name).to_toml();
}

}  // namespace qrig::cli
