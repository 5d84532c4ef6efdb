// The NVRTC libraries qrig can compile kernels with, found and loaded at run time (dlopen), never linked: a build
// needs no CUDA toolkit, and one binary uses whatever NVRTC a machine has (a CUDA 13 toolkit's libnvrtc.so.13, a
// CUDA 12 one's .12, Debian non-free's NVRTC 11.8 as libnvrtc.so.11.2, ...). Several may be loaded at once
// (each brings its own builtins library); per architecture the newest one that can target it compiles. That
// matters because NVRTC 13 dropped sm_70 (CMP 100-210, V100) while 11.8 and 12.x still target it.
//
// Search: the CUDA toolkits' lib directories (/usr/local/cuda*, /opt/cuda), then the dynamic loader's own
// search by soname (LD_LIBRARY_PATH, the distribution's libraries). QRIG_NVRTC (files or directories,
// ':'-separated; a deployment setting, like LD_LIBRARY_PATH) replaces that search: exactly those NVRTCs are
// used. The same file (by real path) is loaded once.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace qrig::cuda {

// NVRTC's C API, as pointers into one loaded library (types declared here: no CUDA headers needed).
struct NvrtcApi {
  using Program = struct _nvrtcProgram*;
  using Result = int;  // NVRTC_SUCCESS = 0
  const char* (*GetErrorString)(Result) = nullptr;
  Result (*Version)(int*, int*) = nullptr;
  Result (*GetNumSupportedArchs)(int*) = nullptr;
  Result (*GetSupportedArchs)(int*) = nullptr;
  Result (*CreateProgram)(Program*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  Result (*DestroyProgram)(Program*) = nullptr;
  Result (*CompileProgram)(Program, int, const char* const*) = nullptr;
  Result (*GetPTXSize)(Program, size_t*) = nullptr;
  Result (*GetPTX)(Program, char*) = nullptr;
  Result (*GetCUBINSize)(Program, size_t*) = nullptr;
  Result (*GetCUBIN)(Program, char*) = nullptr;
  Result (*GetProgramLogSize)(Program, size_t*) = nullptr;
  Result (*GetProgramLog)(Program, char*) = nullptr;
};

struct NvrtcLib {
  std::string path;        // as loaded
  int major = 0, minor = 0;
  std::vector<int> archs;  // code targets it can emit (75, 80, ...), ascending
  NvrtcApi api;
  std::string version() const { return std::to_string(major) + "." + std::to_string(minor); }
  bool supports(int sm) const;
};

// Every NVRTC found, newest first; loaded on first call. Never throws: a candidate that does not load is
// skipped and said so in nvrtc_search_report().
const std::vector<NvrtcLib>& nvrtc_libraries();
// One line per candidate tried: loaded (version, architectures) or why not.
const std::vector<std::string>& nvrtc_search_report();

// Which NVRTC compiles code of a feature-set architecture, and for which code target.
struct NvrtcPick {
  int lib = -1;        // index into the list given, -1: none can
  int target_sm = 0;   // the code target (the feature set itself unless degraded)
  bool degraded = false;  // no NVRTC targets the feature set: its code is compiled for the oldest newer target
};
// The choice over libraries described by (major, architectures), newest first: the newest that targets `sm`
// exactly, among those not newer than the driver (driver_major > 0: a CUDA driver of that major version is
// present; a newer NVRTC's code may not load on it) when any is; else degraded: the newest one's oldest target
// above `sm`. Pure (tests give it lists).
struct NvrtcInfo {
  int major = 0, minor = 0;
  std::vector<int> archs;
};
NvrtcPick pick_nvrtc(const std::vector<NvrtcInfo>& libs, int sm, int driver_major);

// What to install for an architecture no found NVRTC targets (e.g. sm_70: NVRTC 11.8-12.x; on Debian, enable
// non-free and `apt install libnvrtc11.2 libnvrtc-builtins11.8`).
std::string nvrtc_install_hint(int sm);

}  // namespace qrig::cuda
