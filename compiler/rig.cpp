// Rig TOML reading/writing. Format (see rigs/*.toml):
//   [rig] name = "..."
//   [[device]] kind = "cuda", name, arch, sms, memory_gib, clock_mhz, mem_bw_gbps,
//              dp4a_tops, fp32_tflops, hfma2_tflops, hmma_tflops, imma_tops, tensor_cores_throttled
//   [[link]] from = "host", to = "0", h2d_gbps, d2h_gbps, p2p, p2p_gbps
//   [tuning] source, gdn_recurrent_below; [[tuning.gemm_tiling]] planes, bn, bt, tn, tt, kb, sk, ctas_per_sm, eff;
//            [tuning.attention_resident] decode_g4_n1 = 4, ... (kernels/tuning.h: measured numbers that replace
//            the kernel library's defaults)
#include "compiler/rig.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <regex>
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

namespace {

// Checked reads of one table's fields: a wrong type, a non-finite number or a value out of range is an error
// naming the file, the table and the key (a rig file is input like any other).
struct RigFields {
  const toml::table& t;
  std::string where;
  double number(const char* key, double lo, double hi, double dflt) const {
    const toml::node* n = t.get(key);
    if (!n) return dflt;
    std::optional<double> v = n->value<double>();  // integers are accepted too
    if (!v || !(n->is_floating_point() || n->is_integer()))
      throw CompileError(fmt::format("{}: {} must be a number", where, key));
    if (!std::isfinite(*v) || *v < lo || *v > hi)
      throw CompileError(fmt::format("{}: {} = {} is out of range [{}, {}]", where, key, *v, lo, hi));
    return *v;
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi, int64_t dflt) const {
    const toml::node* n = t.get(key);
    if (!n) return dflt;
    auto v = n->value_exact<int64_t>();
    if (!v) throw CompileError(fmt::format("{}: {} must be an integer", where, key));
    if (*v < lo || *v > hi) throw CompileError(fmt::format("{}: {} = {} is out of range [{}, {}]", where, key, *v, lo, hi));
    return *v;
  }
  std::string str(const char* key, const std::string& dflt) const {
    const toml::node* n = t.get(key);
    if (!n) return dflt;
    auto v = n->value_exact<std::string>();
    if (!v) throw CompileError(fmt::format("{}: {} must be a string", where, key));
    return *v;
  }
  bool boolean(const char* key, bool dflt) const {
    const toml::node* n = t.get(key);
    if (!n) return dflt;
    auto v = n->value_exact<bool>();
    if (!v) throw CompileError(fmt::format("{}: {} must be true or false", where, key));
    return *v;
  }
};

constexpr double kMaxRate = 1e6;  // tera-ops/s or GB/s: anything above is a typo

RigTuning parse_tuning(const toml::table& t, const std::string& source) {
  RigTuning r;
  r.present = true;
  const RigFields f{t, source + " [tuning]"};
  r.source = f.str("source", "the rig file's [tuning]");
  r.gdn_recurrent_below = f.integer("gdn_recurrent_below", 1, 65536, 0);
  if (const toml::node* n = t.get("gemm_tiling")) {
    const toml::array* arr = n->as_array();
    if (!arr) throw CompileError(fmt::format("{}: [[tuning.gemm_tiling]] must be an array of tables", source));
    for (const auto& e : *arr) {
      const toml::table* et = e.as_table();
      if (!et) throw CompileError(fmt::format("{}: [[tuning.gemm_tiling]] entries must be tables", source));
      const RigFields g{*et, source + " [[tuning.gemm_tiling]]"};
      const int64_t planes = g.integer("planes", 1, 2, 1);
      kernels::GemmTiling x;
      x.bn = g.integer("bn", 32, 256, 0);
      x.bt = g.integer("bt", 16, 256, 0);
      x.tn = g.integer("tn", 4, 8, 0);
      x.tt = g.integer("tt", 4, 8, 0);
      x.kb = g.integer("kb", 1, 2, 0);
      x.sk = g.integer("sk", 1, 8, 0);
      x.ctas_per_sm = g.integer("ctas_per_sm", 1, 64, 0);
      x.eff = g.number("eff", 0.001, 1.0, 0);
      if (x.bn == 0 || x.bt == 0 || x.tn == 0 || x.tt == 0 || x.kb == 0 || x.sk == 0 || x.ctas_per_sm == 0 || x.eff == 0)
        throw CompileError(fmt::format("{}: a [[tuning.gemm_tiling]] needs bn, bt, tn, tt, kb, sk, ctas_per_sm and eff",
                                       source));
      r.gemm_tilings[planes - 1].push_back(x);
    }
  }
  if (const toml::node* n = t.get("attention_resident")) {
    const toml::table* at = n->as_table();
    if (!at) throw CompileError(fmt::format("{}: [tuning.attention_resident] must be a table", source));
    const RigFields a{*at, source + " [tuning.attention_resident]"};
    for (const auto& [k, v] : *at) {
      const std::string key(k.str());
      r.attention_resident.emplace_back(key, a.integer(key.c_str(), 1, 64, 1));
    }
  }
  return r;
}

}  // namespace

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
  if (devs->size() > 64) throw CompileError(fmt::format("{}: {} devices (at most 64)", source, devs->size()));
  for (size_t k = 0; k < devs->size(); ++k) {
    const toml::table* d = (*devs)[k].as_table();
    if (!d) throw CompileError(fmt::format("{}: [[device]] {} is not a table", source, k));
    const RigFields f{*d, fmt::format("{} [[device]] {}", source, k)};
    RigDevice dev;
    dev.kind = f.str("kind", "");
    if (dev.kind != "cpu" && dev.kind != "cuda")
      throw CompileError(fmt::format("{}: device {} kind '{}' (must be \"cpu\" or \"cuda\")", source, k, dev.kind));
    dev.name = f.str("name", "");
    dev.arch = f.str("arch", "");
    static const std::regex sm_re("sm_[0-9]{2,3}");
    if (dev.kind == "cuda" && !std::regex_match(dev.arch, sm_re))
      throw CompileError(fmt::format("{}: cuda device {} needs arch = \"sm_XY\"", source, k));
    dev.sms = (int)f.integer("sms", dev.kind == "cuda" ? 1 : 0, 4096, dev.kind == "cuda" ? -1 : 0);
    if (dev.sms < 0) throw CompileError(fmt::format("{}: cuda device {} needs sms (its SM count)", source, k));
    dev.memory_gib = f.number("memory_gib", 0, 1 << 20, 0);
    if (dev.memory_gib <= 0) throw CompileError(fmt::format("{}: device {} needs memory_gib > 0", source, k));
    dev.clock_mhz = f.number("clock_mhz", 0, 1e5, 0);
    dev.mem_bw_gbps = f.number("mem_bw_gbps", 0, kMaxRate, 0);
    dev.dp4a_tops = f.number("dp4a_tops", 0, kMaxRate, 0);
    dev.fp32_tflops = f.number("fp32_tflops", 0, kMaxRate, 0);
    dev.hfma2_tflops = f.number("hfma2_tflops", 0, kMaxRate, 0);
    dev.hmma_tflops = f.number("hmma_tflops", 0, kMaxRate, 0);
    dev.imma_tops = f.number("imma_tops", 0, kMaxRate, 0);
    dev.tensor_cores_throttled = f.boolean("tensor_cores_throttled", false);
    dev.ordinal = (int)f.integer("ordinal", -1, 1023, -1);
    if (dev.kind != "cuda" && dev.ordinal >= 0)
      throw CompileError(fmt::format("{}: device {}: ordinal is for cuda devices", source, k));
    r.devices.push_back(dev);
  }
  if (const toml::array* links = t["link"].as_array()) {
    for (const auto& e : *links) {
      const toml::table* l = e.as_table();
      if (!l) throw CompileError(fmt::format("{}: [[link]] entries must be tables", source));
      const RigFields f{*l, source + " [[link]]"};
      RigLink link;
      link.from = f.str("from", "host");
      link.to = f.str("to", "");
      link.h2d_gbps = f.number("h2d_gbps", 0, kMaxRate, 0);
      link.d2h_gbps = f.number("d2h_gbps", 0, kMaxRate, 0);
      link.p2p = f.boolean("p2p", false);
      link.p2p_gbps = f.number("p2p_gbps", 0, kMaxRate, 0);
      r.links.push_back(link);
    }
  }
  if (const toml::table* tun = t["tuning"].as_table()) r.tuning = parse_tuning(*tun, source);
  return r;
}

kernels::Tuning Rig::tuning_for(int sm) const {
  kernels::Tuning t = kernels::default_tuning(sm);
  if (!tuning.present) return t;
  t.source = tuning.source + " (the rest: " + t.source + ")";
  for (int p = 0; p < 2; ++p)
    if (!tuning.gemm_tilings[p].empty()) t.matmul.tiled[p] = tuning.gemm_tilings[p];
  for (const auto& kv : tuning.attention_resident) {
    bool replaced = false;
    for (auto& x : t.attention.resident)
      if (x.first == kv.first) x.second = kv.second, replaced = true;
    if (!replaced) t.attention.resident.push_back(kv);
  }
  if (tuning.gdn_recurrent_below > 0) t.gdn_recurrent_below = tuning.gdn_recurrent_below;
  return t;
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
