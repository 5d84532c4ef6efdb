// Finding and loading NVRTC libraries at run time (nvrtc_lib.h).
#include "runtime/cuda/nvrtc_lib.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>


namespace qrig::cuda {

namespace fs = std::filesystem;

bool NvrtcLib::supports(int sm) const { return std::find(archs.begin(), archs.end(), sm) != archs.end(); }

namespace {

// Sonames, newest first (NVRTC 11.x keeps the soname libnvrtc.so.11.2 for every 11.2+ release).
const std::vector<std::string> kSonames = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};

std::vector<std::string> candidates() {
  std::vector<std::string> out;
  auto add_dir = [&](const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return;
    for (const auto& so : kSonames)
      if (fs::exists(dir / so, ec)) out.push_back((dir / so).string());
  };
  if (const char* env = std::getenv("QRIG_NVRTC"); env && *env) {  // these, instead of searching
    std::string s = env;
    size_t b = 0;
    while (b <= s.size()) {
      const size_t e = std::min(s.find(':', b), s.size());
      const std::string item = s.substr(b, e - b);
      std::error_code ec;
      if (!item.empty()) {
        if (fs::is_directory(item, ec)) {
          const size_t before = out.size();
          add_dir(item);
          if (out.size() == before) out.push_back((fs::path(item) / "libnvrtc.so.*").string());  // reported missing
        } else {
          out.push_back(item);
        }
      }
      b = e + 1;
    }
    return out;
  }
  std::vector<fs::path> toolkits = {"/usr/local/cuda", "/opt/cuda"};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/local", ec))
    if (e.path().filename().string().rfind("cuda-", 0) == 0) toolkits.push_back(e.path());
  for (const auto& t : toolkits)
    for (const char* sub : {"lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"}) add_dir(t / sub);
  for (const auto& so : kSonames) out.push_back(so);  // the loader's own search
  return out;
}

template <class F>
bool sym(void* h, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(h, name));
  return f != nullptr;
}

struct Registry {
  std::vector<NvrtcLib> libs;
  std::vector<std::string> report;
};

Registry load_all() {
  Registry r;
  std::vector<std::string> seen;  // real paths of the files loaded
  for (const std::string& c : candidates()) {
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      if (c.find('/') != std::string::npos) r.report.push_back(fmt::format("{}: not loaded ({})", c, dlerror()));
      continue;
    }
    // The file behind a soname or link: load each NVRTC once.
    std::string real = c;
    if (void* any = dlsym(h, "nvrtcVersion")) {
      Dl_info info{};
      if (dladdr(any, &info) && info.dli_fname) {
        std::error_code ec;
        const fs::path p = fs::canonical(info.dli_fname, ec);
        real = ec ? std::string(info.dli_fname) : p.string();
      }
    }
    if (std::find(seen.begin(), seen.end(), real) != seen.end()) {
      dlclose(h);
      continue;
    }
    NvrtcLib lib;
    lib.path = real;
    NvrtcApi& a = lib.api;
    const bool ok = sym(h, "nvrtcGetErrorString", a.GetErrorString) && sym(h, "nvrtcVersion", a.Version) &&
                    sym(h, "nvrtcGetNumSupportedArchs", a.GetNumSupportedArchs) &&
                    sym(h, "nvrtcGetSupportedArchs", a.GetSupportedArchs) && sym(h, "nvrtcCreateProgram", a.CreateProgram) &&
                    sym(h, "nvrtcDestroyProgram", a.DestroyProgram) && sym(h, "nvrtcCompileProgram", a.CompileProgram) &&
                    sym(h, "nvrtcGetPTXSize", a.GetPTXSize) && sym(h, "nvrtcGetPTX", a.GetPTX) &&
                    sym(h, "nvrtcGetCUBINSize", a.GetCUBINSize) && sym(h, "nvrtcGetCUBIN", a.GetCUBIN) &&
                    sym(h, "nvrtcGetProgramLogSize", a.GetProgramLogSize) && sym(h, "nvrtcGetProgramLog", a.GetProgramLog);
    int n = 0;
    if (!ok || a.Version(&lib.major, &lib.minor) != 0 || a.GetNumSupportedArchs(&n) != 0 || n <= 0 || n > 256) {
      r.report.push_back(fmt::format("{}: skipped (not an NVRTC 11.2 or newer: a symbol or query is missing)", real));
      dlclose(h);
      continue;
    }
    lib.archs.resize((size_t)n);
    if (a.GetSupportedArchs(lib.archs.data()) != 0) {
      r.report.push_back(fmt::format("{}: skipped (its supported architectures cannot be read)", real));
      dlclose(h);
      continue;
    }
    std::sort(lib.archs.begin(), lib.archs.end());
    seen.push_back(real);
    r.report.push_back(fmt::format("{}: NVRTC {}, sm_{}..sm_{}", real, lib.version(), lib.archs.front(), lib.archs.back()));
    r.libs.push_back(std::move(lib));  // the handle stays open for the process
  }
  std::stable_sort(r.libs.begin(), r.libs.end(), [](const NvrtcLib& x, const NvrtcLib& y) {
    return std::tie(x.major, x.minor) > std::tie(y.major, y.minor);
  });
  if (r.libs.empty())
    r.report.push_back(std::getenv("QRIG_NVRTC") && *std::getenv("QRIG_NVRTC")
                           ? fmt::format("no NVRTC found in QRIG_NVRTC={}", std::getenv("QRIG_NVRTC"))
                           : "no NVRTC found: install one (Debian: libnvrtc11.2 from non-free; or a CUDA toolkit), or "
                             "name it with QRIG_NVRTC");
  return r;
}

const Registry& registry() {
  static const Registry r = load_all();
  return r;
}

}  // namespace

const std::vector<NvrtcLib>& nvrtc_libraries() { return registry().libs; }
const std::vector<std::string>& nvrtc_search_report() { return registry().report; }

NvrtcPick pick_nvrtc(const std::vector<NvrtcInfo>& libs, int sm, int driver_major) {
  NvrtcPick p;
  auto targets = [&](const NvrtcInfo& l) { return std::find(l.archs.begin(), l.archs.end(), sm) != l.archs.end(); };
  // Exact targets: one the driver can load first, else any (no driver: the newest).
  for (int pass = 0; pass < 2 && p.lib < 0; ++pass)
    for (size_t i = 0; i < libs.size(); ++i)
      if (targets(libs[i]) && (pass == 1 || driver_major <= 0 || libs[i].major <= driver_major)) {
        p.lib = (int)i;
        p.target_sm = sm;
        break;
      }
  if (p.lib >= 0) return p;
  for (size_t i = 0; i < libs.size(); ++i) {
    const auto& a = libs[i].archs;
    auto above = std::find_if(a.begin(), a.end(), [&](int x) { return x > sm; });
    if (above != a.end()) {
      p.lib = (int)i;
      p.target_sm = *above;
      p.degraded = true;
      return p;
    }
  }
  return p;
}

std::string nvrtc_install_hint(int sm) {
  if (sm < 75)
    return fmt::format("sm_{} needs an NVRTC from CUDA 11.8 to 12.x (NVRTC 13 cannot target it): on Debian enable "
                       "the non-free component and `apt install libnvrtc11.2 libnvrtc-builtins11.8`, or install a "
                       "CUDA 12 toolkit's NVRTC; QRIG_NVRTC=/path/to/libnvrtc.so.N names one explicitly",
                       sm);
  return fmt::format("install an NVRTC that targets sm_{} (a newer CUDA toolkit), or name one with QRIG_NVRTC", sm);
}

}  // namespace qrig::cuda
