// NVRTC compilation of kernel variants and the compiler object with its memory + disk cache (see nvrtc.h).
#include "runtime/cuda/nvrtc.h"

#include <algorithm>
#include <regex>

#include <fmt/format.h>

#include "runtime/cuda/driver_api.h"
#include "runtime/cuda/templates.h"

namespace qrig::cuda {

namespace fs = std::filesystem;

namespace {

void check_nvrtc(const NvrtcLib& lib, NvrtcApi::Result r, const char* what) {
  if (r != 0) throw KernelError(fmt::format("NVRTC {} {}: {}", lib.version(), what, lib.api.GetErrorString(r)));
}

// FNV-1a 64: a stable hash (the cache must mean the same thing in every process and build).
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The shared headers (*.cuh), given to NVRTC by name, so templates compile without an include path.
const std::vector<NvrtcHeader>& template_headers() {
  static const std::vector<NvrtcHeader> headers = [] {
    std::vector<NvrtcHeader> h;
    for (const auto& f : embedded_templates()) {
      std::string name = f.name;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".cuh") == 0) h.push_back({name, f.source});
    }
    return h;
  }();
  return headers;
}

// Hash of every embedded template file: a change to any of them (even one a variant does not include)
// gives new cache entries. Conservative and simple.
uint64_t sources_hash() {
  static const uint64_t h = [] {
    uint64_t x = fnv1a("qrig templates");
    for (const auto& f : embedded_templates()) x = fnv1a(std::string(f.source), fnv1a(std::string(f.name), x));
    return x;
  }();
  return h;
}

}  // namespace

std::string nvrtc_versions() {
  std::string out;
  for (const NvrtcLib& l : nvrtc_libraries()) out += fmt::format("{}{} ({})", out.empty() ? "" : ", ", l.version(), l.path);
  return out.empty() ? "none" : out;
}

std::vector<std::string> toolchain_report() {
  std::vector<std::string> out;
  std::string why;
  const int v = drv::driver_version();
  if (drv::driver_status(&why))
    out.push_back(fmt::format("driver: CUDA {}.{} (libcuda.so.1, driver API)", v / 1000, v % 1000 / 10));
  else
    out.push_back("driver: " + why);
  for (const std::string& line : nvrtc_search_report()) out.push_back("nvrtc: " + line);
  return out;
}

ArchKernels arch_kernels(int sm) { return arch_kernels_among(nvrtc_libraries(), sm, drv::driver_major_version()); }

ArchKernels arch_kernels_among(const std::vector<NvrtcLib>& libs, int sm, int driver) {
  ArchKernels k;
  try {
    const ArchChoice a = choose_arch_among(libs, sm, driver);
    if (a.substituted()) {
      k.text = a.note;
      return k;
    }
    k.text = fmt::format("sm_{} kernels: NVRTC {} ({})", sm, a.nvrtc, a.lib ? a.lib->path : "?");
    k.ok = true;
    if (a.lib && driver > 0 && a.lib->major > driver) {
      k.ok = false;
      k.text += fmt::format("; warning: NVRTC {} is newer than the driver (CUDA {}), whose loader may refuse its code: "
                            "install an NVRTC {}.x or a newer driver",
                            a.nvrtc, driver, driver);
    }
  } catch (const KernelError& e) {
    k.text = e.what();
  }
  return k;
}

int parse_sm(const std::string& arch) {
  static const std::regex re("sm_([0-9]{2,3})");
  std::smatch m;
  if (!std::regex_match(arch, m, re)) throw KernelError(fmt::format("'{}' is not a CUDA architecture like sm_90", arch));
  return std::stoi(m[1].str());
}

ArchChoice choose_arch(int feature_sm, const std::string& nvrtc, int target_sm) {
  const std::vector<NvrtcLib>& libs = nvrtc_libraries();
  if (nvrtc.empty()) return choose_arch_among(libs, feature_sm, drv::driver_major_version());
  ArchChoice c;  // what a plan recorded: that NVRTC if it is here, else the cache alone
  c.feature_sm = feature_sm;
  c.nvrtc = nvrtc;
  c.target_sm = target_sm > 0 ? target_sm : feature_sm;
  for (const NvrtcLib& l : libs)
    if (l.version() == nvrtc && l.supports(c.target_sm)) c.lib = &l;
  if (c.substituted())
    c.note = fmt::format("kernels: the sm_{} feature set was compiled for sm_{} by NVRTC {} (degraded: {})", feature_sm,
                         c.target_sm, nvrtc, nvrtc_install_hint(feature_sm));
  return c;
}

ArchChoice choose_arch_among(const std::vector<NvrtcLib>& libs, int feature_sm, int driver_major) {
  ArchChoice c;
  c.feature_sm = feature_sm;
  std::vector<NvrtcInfo> info;
  for (const NvrtcLib& l : libs) info.push_back({l.major, l.minor, l.archs});
  std::string found;
  for (const NvrtcLib& l : libs) found += fmt::format("{}NVRTC {} ({})", found.empty() ? "" : ", ", l.version(), l.path);
  if (found.empty()) found = &libs == &nvrtc_libraries() ? "none; " + nvrtc_search_report().back() : "none";
  const NvrtcPick p = pick_nvrtc(info, feature_sm, driver_major);
  if (p.lib < 0)
    throw KernelError(fmt::format("no NVRTC can compile for sm_{} (found: {}): {}", feature_sm, found,
                                  nvrtc_install_hint(feature_sm)));
  c.lib = &libs[(size_t)p.lib];
  c.nvrtc = c.lib->version();
  c.target_sm = p.target_sm;
  if (p.degraded)
    c.note = fmt::format(
        "kernels: no NVRTC found here targets sm_{} (found: {}); the sm_{} feature set (no mma, wmma, wgmma, ldmatrix, "
        "cp.async, redux.sync or bf16 arithmetic) is compiled for sm_{} by NVRTC {} instead, a degraded mode: these "
        "cubins do not run on sm_{} GPUs. {}",
        feature_sm, found, feature_sm, c.target_sm, c.nvrtc, feature_sm, nvrtc_install_hint(feature_sm));
  return c;
}

NvrtcOutput nvrtc_compile(const std::string& program_name, const std::string& source,
                          const std::vector<NvrtcHeader>& headers, const std::vector<std::string>& options,
                          const NvrtcLib* lib_in) {
  const NvrtcLib* lp = lib_in;
  if (!lp) {
    if (nvrtc_libraries().empty())
      throw KernelError(fmt::format("no NVRTC library found to compile {} ({})", program_name, nvrtc_search_report().back()));
    lp = &nvrtc_libraries().front();
  }
  const NvrtcLib& lib = *lp;
  const NvrtcApi& api = lib.api;
  std::vector<const char*> hsrc, hname, opts;
  for (const auto& h : headers) {
    hsrc.push_back(h.source.c_str());
    hname.push_back(h.name.c_str());
  }
  for (const auto& o : options) opts.push_back(o.c_str());
  NvrtcApi::Program prog = nullptr;
  check_nvrtc(lib, api.CreateProgram(&prog, source.c_str(), program_name.c_str(), (int)headers.size(),
                                     hsrc.empty() ? nullptr : hsrc.data(), hname.empty() ? nullptr : hname.data()),
              "create program");
  struct Destroy {
    const NvrtcApi& api;
    NvrtcApi::Program* p;
    ~Destroy() { api.DestroyProgram(p); }
  } destroy{api, &prog};
  const NvrtcApi::Result r = api.CompileProgram(prog, (int)opts.size(), opts.empty() ? nullptr : opts.data());
  NvrtcOutput out;
  size_t n = 0;
  check_nvrtc(lib, api.GetProgramLogSize(prog, &n), "log size");
  out.log.resize(n);
  if (n) check_nvrtc(lib, api.GetProgramLog(prog, out.log.data()), "log");
  while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  if (r != 0) {
    std::string joined;
    for (const auto& o : options) joined += " " + o;
    throw KernelError(fmt::format("NVRTC {} could not compile {} ({}) with options{}:\n{}", lib.version(), program_name,
                                  api.GetErrorString(r), joined, out.log));
  }
  check_nvrtc(lib, api.GetPTXSize(prog, &n), "PTX size");
  out.ptx.resize(n);
  check_nvrtc(lib, api.GetPTX(prog, out.ptx.data()), "PTX");
  while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  check_nvrtc(lib, api.GetCUBINSize(prog, &n), "cubin size");
  if (n == 0) throw KernelError(fmt::format("NVRTC produced no cubin for {} (is the target a real sm_XX arch?)", program_name));
  out.cubin.resize(n);
  check_nvrtc(lib, api.GetCUBIN(prog, out.cubin.data()), "cubin");
  return out;
}

std::vector<std::string> variant_options(const Variant& v, const ArchChoice& arch) {
  std::vector<std::string> o = {
      fmt::format("--gpu-architecture=sm_{}", arch.target_sm),
      "-std=c++17",
      "-lineinfo",             // source lines for compute-sanitizer and profilers; no code change
      "--ptxas-options=-v",    // registers and spills in the log (checked by tests/cuda)
      fmt::format("-DQRIG_SM={}", arch.feature_sm),
  };
  for (auto& d : v.defines()) o.push_back(std::move(d));
  return o;
}

PtxasReport parse_ptxas_report(const std::string& log) {
  PtxasReport r;
  static const std::regex regs("Used ([0-9]+) registers");
  static const std::regex spills("([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads");
  std::smatch m;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), regs); it != std::sregex_iterator(); ++it)
    r.registers = std::max(r.registers, std::stoi((*it)[1].str()));
  for (auto it = std::sregex_iterator(log.begin(), log.end(), spills); it != std::sregex_iterator(); ++it) {
    r.stack_frame_bytes = std::max<int64_t>(r.stack_frame_bytes, std::stoll((*it)[1].str()));
    r.spill_store_bytes += std::stoll((*it)[2].str());
    r.spill_load_bytes += std::stoll((*it)[3].str());
  }
  return r;
}

KernelCompiler::KernelCompiler(fs::path cache_dir)
    : cache_(cache_dir.empty() ? KernelCache::default_dir() : std::move(cache_dir)) {}

std::string KernelCompiler::cache_stem(const Variant& v, const ArchChoice& arch) {
  std::string key = fmt::format("qrig kernel cache v1\nvariant={}\nsources={:016x}\nnvrtc={}\ntarget=sm_{}\nfeature=sm_{}\n",
                                v.name, sources_hash(), arch.nvrtc, arch.target_sm, arch.feature_sm);
  for (const auto& o : variant_options(v, arch)) key += "option=" + o + "\n";
  return fmt::format("{}.sm_{}.{:016x}", v.name, arch.target_sm, fnv1a(key));
}

std::vector<std::string> KernelCompiler::notes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return notes_;
}

CompiledKernel KernelCompiler::get(const Variant& v, int feature_sm) { return get(v, choose_arch(feature_sm)); }

CompiledKernel KernelCompiler::get(const Variant& v, const ArchChoice& arch) {
  const std::string stem = cache_stem(v, arch);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!arch.note.empty() && std::find(notes_.begin(), notes_.end(), arch.note) == notes_.end())
      notes_.push_back(arch.note);
    auto it = memory_.find(stem);
    if (it != memory_.end()) {
      ++memory_hits_;
      CompiledKernel k = it->second;
      k.from_disk = false;
      return k;
    }
  }
  CompiledKernel k;
  k.variant = v;
  k.arch = arch;
  k.cache_stem = stem;
  if (auto e = cache_.load(stem)) {
    ++disk_hits_;
    k.cubin = std::move(e->cubin);
    k.ptx = std::move(e->ptx);
    k.log = std::move(e->log);
    k.from_disk = true;
  } else {
    if (jit_forbidden_)
      throw JitForbidden(fmt::format("kernel {} for sm_{} is not in the cache ({}) and compiling after warm-up is "
                                     "forbidden: precompile the plan's kernels (qrig compile)",
                                     v.name, arch.target_sm, cache_.dir().string()));
    if (!arch.lib)
      throw KernelError(fmt::format("kernel {} for sm_{} by NVRTC {} is not in the cache ({}), and that NVRTC is not on "
                                    "this machine (found: {}): copy the plan's kernel cache along, or recompile the "
                                    "plan here (qrig compile)",
                                    v.name, arch.target_sm, arch.nvrtc, cache_.dir().string(), nvrtc_versions()));
    const TemplateFile* src = find_template(v.file);
    if (!src) throw KernelError(fmt::format("kernel {}: template file {} is not embedded in this binary", v.name, v.file));
    NvrtcOutput out = nvrtc_compile(v.file, src->source, template_headers(), variant_options(v, arch), arch.lib);
    ++compiles_;
    k.cubin = std::move(out.cubin);
    k.ptx = std::move(out.ptx);
    k.log = std::move(out.log);
    cache_.store(stem, {k.cubin, k.ptx, k.log});
  }
  std::lock_guard<std::mutex> lock(mu_);
  memory_.emplace(stem, k);
  return k;
}

}  // namespace qrig::cuda
