// The on-disk cubin cache: one entry per (variant, sources, NVRTC version, archs, options), stored as
// <stem>.cubin with the PTX (<stem>.ptx) and the ptxas report (<stem>.log) beside it, for people tuning a
// rig and for CI's PTX scans. Every file is written to a temporary name and renamed into place (atomic on
// POSIX), and the cubin goes last: a reader, even in another process, sees a complete entry or none.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qrig::cuda {

class KernelCache {
 public:
  struct Entry {
    std::vector<char> cubin;
    std::string ptx;
    std::string log;
  };

  // Creates the directory when missing; throws KernelError when it cannot.
  explicit KernelCache(std::filesystem::path dir);
  // $XDG_CACHE_HOME/qrig/kernels, else $HOME/.cache/qrig/kernels; throws KernelError when neither is set.
  static std::filesystem::path default_dir();

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path path(const std::string& stem, const char* ext) const;  // ext: ".cubin", ".ptx", ".log"

  // nullopt when the entry is absent or incomplete (a file missing or unreadable).
  std::optional<Entry> load(const std::string& stem) const;
  // Atomic per file, cubin last; throws KernelError naming the file on any I/O failure (no partial files
  // are left behind).
  void store(const std::string& stem, const Entry& e) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace qrig::cuda
