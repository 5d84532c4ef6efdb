// NVRTC: compiles kernel variants (variant.h) from the embedded templates to cubins for one architecture,
// keeping the PTX and the ptxas report, through an on-disk cache (kernel_cache.h) keyed by variant name +
// template sources + NVRTC version + architectures + options. After warm-up the runtime forbids compiling
// (forbid_jit): a variant missing from the cache then is an error, not a silent multi-second stall.
//
// Architectures: a kernel is written for a feature-set architecture (the plan's arch_target, passed to the
// templates as QRIG_SM) and compiled for a code target by one of the NVRTC libraries found at run time
// (nvrtc_lib.h): the newest that targets the feature set itself (sm_70: NVRTC 11.8 or 12.x; NVRTC 13 cannot).
// When none can, the feature set is compiled for the oldest newer target of the newest NVRTC (sm_70 under
// NVRTC 13 -> sm_75): a degraded mode, reported (ArchChoice::note) with what to install. Such cubins do not run
// on an sm_70 GPU; they prove the feature set compiles. A plan records which NVRTC and target compiled its
// kernels, so a machine without that NVRTC still runs them from the cache.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/nvrtc_lib.h"
#include "runtime/cuda/variant.h"

namespace qrig::cuda {

// A compile was needed while compiling is forbidden (KernelCompiler::forbid_jit).
struct JitForbidden : KernelError {
  using KernelError::KernelError;
};

// The NVRTC versions found, newest first, e.g. "13.0 (/usr/local/cuda/lib64/libnvrtc.so.13...), 11.8 (...)";
// "none" when there is none.
std::string nvrtc_versions();
// What builds and loads kernels on this machine, a line each: the CUDA driver (its version, or why there is
// none) and every NVRTC candidate (loaded: version, file, code targets; or why not).
std::vector<std::string> toolchain_report();
// Which NVRTC builds kernels for a GPU of architecture `sm`, in words; ok false when none can build code that
// runs on it (degraded or missing: the text says what to install) or the chosen NVRTC is newer than the
// driver (its code may not load). Never throws.
struct ArchKernels {
  std::string text;
  bool ok = false;
};
ArchKernels arch_kernels(int sm);
ArchKernels arch_kernels_among(const std::vector<NvrtcLib>& libs, int sm, int driver_major);
// "sm_90" -> 90; throws KernelError for anything else.
int parse_sm(const std::string& arch);

struct ArchChoice {
  int feature_sm = 0;   // what the kernels may use (QRIG_SM)
  int target_sm = 0;    // what NVRTC emits code for
  std::string nvrtc;    // the NVRTC version that compiles (part of the cache key), e.g. "11.8"
  const NvrtcLib* lib = nullptr;  // that library; null when it is not on this machine (cached kernels only)
  std::string note;     // non-empty when degraded (target_sm != feature_sm): say so, with what to install
  bool substituted() const { return target_sm != feature_sm; }
};
// The NVRTC and code target for a feature set (pick_nvrtc over the libraries found, the driver's major version
// when a driver is present). nvrtc / target_sm given (what a plan recorded): that NVRTC if found, else the
// cache alone (lib null). KernelError when nothing can compile or load the feature set, naming what to install.
ArchChoice choose_arch(int feature_sm, const std::string& nvrtc = "", int target_sm = 0);
// The choice among given libraries (choose_arch's, over nvrtc_libraries()); lib points into `libs`.
ArchChoice choose_arch_among(const std::vector<NvrtcLib>& libs, int feature_sm, int driver_major);


// One NVRTC compilation of a source (the template, or any test kernel) for a real architecture.
struct NvrtcOutput {
  std::vector<char> cubin;
  std::string ptx;
  std::string log;  // NVRTC + ptxas messages (the options include -Xptxas -v: registers, spills)
};
struct NvrtcHeader {
  std::string name;    // as #included
  std::string source;
};
// Throws KernelError with the program name, options and NVRTC's log when compilation fails. lib: which NVRTC
// (default: the newest found).
NvrtcOutput nvrtc_compile(const std::string& program_name, const std::string& source,
                          const std::vector<NvrtcHeader>& headers, const std::vector<std::string>& options,
                          const NvrtcLib* lib = nullptr);

// The options a variant compiles with (besides the template's headers).
std::vector<std::string> variant_options(const Variant& v, const ArchChoice& arch);

struct CompiledKernel {
  Variant variant;
  ArchChoice arch;
  std::string cache_stem;  // the cache entry: <variant>.<sm_XX>.<hash>
  std::vector<char> cubin;
  std::string ptx;
  std::string log;
  bool from_disk = false;  // read from the cache directory (not compiled, not in memory)
};

// ptxas' per-kernel report, parsed from the log: registers and spills.
struct PtxasReport {
  int registers = -1;             // -1 when the log does not say
  int64_t spill_store_bytes = 0;
  int64_t spill_load_bytes = 0;
  int64_t stack_frame_bytes = 0;
};
PtxasReport parse_ptxas_report(const std::string& log);

class KernelCompiler {
 public:
  // cache_dir empty: KernelCache::default_dir(). The directory is created when missing.
  explicit KernelCompiler(std::filesystem::path cache_dir = {});

  // The variant compiled for the feature set `feature_sm` (e.g. 70, 90): from memory, else from the cache
  // directory, else compiled by NVRTC and stored (unless compiling is forbidden: JitForbidden).
  // Thread-safe; concurrent requests for one variant may compile it twice, the cache keeps one.
  CompiledKernel get(const Variant& v, int feature_sm);
  CompiledKernel get(const std::string& variant_name, int feature_sm) { return get(parse_variant(variant_name), feature_sm); }
  // The same for a given arch choice (choose_arch(feature_sm, the plan's NVRTC and target)).
  CompiledKernel get(const Variant& v, const ArchChoice& arch);

  // After warm-up: any get() that would have to compile throws JitForbidden instead.
  void forbid_jit(bool forbid = true) { jit_forbidden_ = forbid; }
  bool jit_forbidden() const { return jit_forbidden_; }

  int64_t compiles() const { return compiles_; }      // NVRTC runs by this object
  int64_t disk_hits() const { return disk_hits_; }
  int64_t memory_hits() const { return memory_hits_; }
  const KernelCache& cache() const { return cache_; }
  // The arch substitution notes of everything requested so far (each once), for the plan's notes.
  std::vector<std::string> notes() const;

  // The cache entry name of a variant for an arch choice (depends on the embedded sources and NVRTC).
  static std::string cache_stem(const Variant& v, const ArchChoice& arch);

 private:
  KernelCache cache_;
  std::atomic<bool> jit_forbidden_{false};
  std::atomic<int64_t> compiles_{0}, disk_hits_{0}, memory_hits_{0};
  mutable std::mutex mu_;
  std::map<std::string, CompiledKernel> memory_;  // by cache stem
  std::vector<std::string> notes_;
};

}  // namespace qrig::cuda
