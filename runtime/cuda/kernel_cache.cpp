// The on-disk cubin cache (see kernel_cache.h): temp file + fsync + rename per file, cubin last.
#include "runtime/cuda/kernel_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "runtime/cuda/variant.h"

namespace qrig::cuda {

namespace fs = std::filesystem;

namespace {

std::optional<std::string> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return std::nullopt;
  return s;
}

// Writes `data` to a unique temporary file in the same directory, flushes it to disk, then renames it over
// `target`. On failure the temporary file is removed and KernelError says which file and why.
void write_atomic(const fs::path& target, const char* data, size_t n) {
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = target.parent_path() /
                       fmt::format(".{}.tmp.{}.{}", target.filename().string(), (long)getpid(), counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw KernelError(fmt::format("kernel cache: cannot create '{}': {}", tmp.string(), std::strerror(errno)));
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw KernelError(fmt::format("kernel cache: {} '{}' failed: {}", what, tmp.string(), std::strerror(err)));
  };
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write to");
    }
    done += (size_t)w;
  }
  if (::fsync(fd) != 0) fail("fsync of");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw KernelError(fmt::format("kernel cache: close of '{}' failed: {}", tmp.string(), std::strerror(err)));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw KernelError(fmt::format("kernel cache: rename of '{}' to '{}' failed: {}", tmp.string(), target.string(),
                                  std::strerror(err)));
  }
}

}  // namespace

KernelCache::KernelCache(fs::path dir) : dir_(std::move(dir)) {
  if (dir_.empty()) throw KernelError("kernel cache: empty directory name");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw KernelError(fmt::format("kernel cache: cannot create the directory '{}': {}", dir_.string(),
                                  ec ? ec.message() : "not a directory"));
}

fs::path KernelCache::default_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "qrig" / "kernels";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "qrig" / "kernels";
  throw KernelError("kernel cache: neither XDG_CACHE_HOME nor HOME is set; give a cache directory");
}

fs::path KernelCache::path(const std::string& stem, const char* ext) const { return dir_ / (stem + ext); }

std::optional<KernelCache::Entry> KernelCache::load(const std::string& stem) const {
  // The cubin is renamed into place last, so its presence means the PTX and log are complete too.
  auto cubin = read_file(path(stem, ".cubin"));
  if (!cubin || cubin->empty()) return std::nullopt;
  auto ptx = read_file(path(stem, ".ptx"));
  auto log = read_file(path(stem, ".log"));
  if (!ptx || !log) return std::nullopt;
  Entry e;
  e.cubin.assign(cubin->begin(), cubin->end());
  e.ptx = std::move(*ptx);
  e.log = std::move(*log);
  return e;
}

void KernelCache::store(const std::string& stem, const Entry& e) const {
  if (e.cubin.empty()) throw KernelError(fmt::format("kernel cache: refusing to store an empty cubin for {}", stem));
  write_atomic(path(stem, ".ptx"), e.ptx.data(), e.ptx.size());
  write_atomic(path(stem, ".log"), e.log.data(), e.log.size());
  write_atomic(path(stem, ".cubin"), e.cubin.data(), e.cubin.size());
}

}  // namespace qrig::cuda
