// Rig TOML reading/writing. Format (see rigs/*.toml):
//   [rig] name = "..."
//   [[device]] kind = "cuda", name, arch, sms, memory_gib, clock_mhz, mem_bw_gbps,
//              dp4a_tops, fp32_tflops, hfma2_tflops, hmma_tflops, imma_tops, tensor_cores_throttled
//   [[link]] from = "host", to = "0", h2d_gbps, d2h_gbps, p2p, p2p_gbps
#include "compiler/rig.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "compiler/hparams.h"

namespace qrig::compiler {

Rig Rig::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw CompileError(fmt::format("cannot read rig file '{}'", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

Rig Rig::parse(const std::string& text, const std::string& source) {
  toml::table t;
  try {
    t = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw CompileError(fmt::format("{}: {}", source, e.description()));
  }
  Rig r;
  r.name = t["rig"]["name"].value_or(std::string("unnamed"));
  const toml::array* devs = t["device"].as_array();
  if (!devs || devs->empty()) throw CompileError(fmt::format("{}: a rig needs at least one [[device]]", source));
  for (size_t k = 0; k < devs->size(); ++k) {
    const toml::table* d = (*devs)[k].as_table();
    if (!d) throw CompileError(fmt::format("{}: [[device]] {} is not a table", source, k));
    RigDevice dev;
    dev.kind = (*d)["kind"].value_or(std::string());
    if (dev.kind != "cpu" && dev.kind != "cuda")
      throw CompileError(fmt::format("{}: device {} kind '{}' (must be \"cpu\" or \"cuda\")", source, k, dev.kind));
    dev.name = (*d)["name"].value_or(std::string());
    dev.arch = (*d)["arch"].value_or(std::string());
    if (dev.kind == "cuda" && dev.arch.rfind("sm_", 0) != 0)
      throw CompileError(fmt::format("{}: cuda device {} needs arch = \"sm_XY\"", source, k));
    dev.sms = (int)(*d)["sms"].value_or(int64_t{0});
    dev.memory_gib = (*d)["memory_gib"].value_or(0.0);
    if (dev.memory_gib <= 0) throw CompileError(fmt::format("{}: device {} needs memory_gib > 0", source, k));
    dev.clock_mhz = (*d)["clock_mhz"].value_or(0.0);
    dev.mem_bw_gbps = (*d)["mem_bw_gbps"].value_or(0.0);
    dev.dp4a_tops = (*d)["dp4a_tops"].value_or(0.0);
    dev.fp32_tflops = (*d)["fp32_tflops"].value_or(0.0);
    dev.hfma2_tflops = (*d)["hfma2_tflops"].value_or(0.0);
    dev.hmma_tflops = (*d)["hmma_tflops"].value_or(0.0);
    dev.imma_tops = (*d)["imma_tops"].value_or(0.0);
    dev.tensor_cores_throttled = (*d)["tensor_cores_throttled"].value_or(false);
    r.devices.push_back(dev);
  }
  if (const toml::array* links = t["link"].as_array()) {
    for (const auto& e : *links) {
      const toml::table* l = e.as_table();
      if (!l) throw CompileError(fmt::format("{}: [[link]] entries must be tables", source));
      RigLink link;
      link.from = (*l)["from"].value_or(std::string("host"));
      link.to = (*l)["to"].value_or(std::string());
      link.h2d_gbps = (*l)["h2d_gbps"].value_or(0.0);
      link.d2h_gbps = (*l)["d2h_gbps"].value_or(0.0);
      link.p2p = (*l)["p2p"].value_or(false);
      link.p2p_gbps = (*l)["p2p_gbps"].value_or(0.0);
      r.links.push_back(link);
    }
  }
  return r;
}

Rig Rig::default_cpu() {
  Rig r;
  r.name = "cpu (default)";
  RigDevice d;
  d.kind = "cpu";
  d.name = "host CPU";
  d.sms = (int)std::max(1u, std::thread::hardware_concurrency());
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  d.memory_gib = pages > 0 && page > 0 ? (double)pages * (double)page / (1024.0 * 1024 * 1024) * 0.8 : 8.0;
  r.devices.push_back(d);
  return r;
}

bool Rig::has_cuda() const {
  for (const auto& d : devices)
    if (d.kind == "cuda") return true;
  return false;
}

std::string Rig::to_toml() const {
  toml::array devs;
  for (const auto& d : devices)
    devs.push_back(toml::table{{"kind", d.kind}, {"name", d.name}, {"arch", d.arch}, {"sms", d.sms},
                               {"memory_gib", d.memory_gib}, {"clock_mhz", d.clock_mhz}, {"mem_bw_gbps", d.mem_bw_gbps},
                               {"dp4a_tops", d.dp4a_tops}, {"fp32_tflops", d.fp32_tflops},
                               {"hfma2_tflops", d.hfma2_tflops}, {"hmma_tflops", d.hmma_tflops},
                               {"imma_tops", d.imma_tops}, {"tensor_cores_throttled", d.tensor_cores_throttled}});
  toml::array links_arr;
  for (const auto& l : links)
    links_arr.push_back(toml::table{{"from", l.from}, {"to", l.to}, {"h2d_gbps", l.h2d_gbps}, {"d2h_gbps", l.d2h_gbps},
                                    {"p2p", l.p2p}, {"p2p_gbps", l.p2p_gbps}});
  toml::table root{{"rig", toml::table{{"name", name}}}, {"device", devs}, {"link", links_arr}};
  std::ostringstream ss;
  ss << root << "\n";
  return ss.str();
}

}  // namespace qrig::compiler
