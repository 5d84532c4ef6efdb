// The CUDA driver API (driver_api.h, loaded at run time), checked: device discovery and per-device setup
// (each device's primary context, made current per thread by DeviceGuard, as cudart does), device memory,
// streams, events, code loaded as libraries (cuLibraryLoadData, context-independent: one load serves every
// device; a cubin, or PTX that the driver JIT-compiles for the GPU) and kernel launches (cuLaunchKernel on a
// CUkernel). Every call is checked and a failure throws CudaError saying what was attempted, on which device,
// with CUDA's error name and message (the seed engine's worst bugs were unchecked allocations and launches).
// Nothing here loads the driver until called: on a machine without one, device_count() is 0 and says why.
// Calls that take no device use the thread's current context, device 0's when the thread has none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/cuda/driver_api.h"

namespace qrig::cuda {

// Throws CudaError "<what>: <CUDA error name> (<message>)" unless r is CUDA_SUCCESS.
void check(drv::CUresult r, const std::string& what);

// The number of CUDA devices; 0, never an exception, when there is no driver or no device (why, when given,
// then says which).
int device_count(std::string* why = nullptr);

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm = 0;                     // compute capability as 70, 90, ...
  int sms = 0;
  int64_t total_bytes = 0;
  int max_threads_per_block = 0;
  int smem_per_block = 0;         // without opt-in (48 KiB)
  int smem_per_block_optin = 0;   // the most dynamic + static shared memory a kernel may opt in to
  int smem_per_sm = 0;
  int l2_bytes = 0;
  int64_t max_grid_x = 0, max_grid_y = 0, max_grid_z = 0;
};
DeviceInfo device_info(int device);

// Setup of every device, not only the first: retains its primary context, reads its limits. Throws CudaError naming the device that fails; returns nothing when there is no device.
std::vector<DeviceInfo> init_devices();

// A device's primary context (retained on first use, kept for the process's life). Throws CudaError.
drv::CUcontext primary_context(int device);

// Makes `device` (its primary context) current on this thread for the scope; restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  drv::CUcontext prev_ = nullptr;
};

// Raw, checked memory operations (the typed buffer below uses them). `what` names the buffer in errors.
// copy_to_device, copy_to_host and fill_device_bytes are synchronous: the data is in place when they return.
// They do not wait for kernels on other streams: synchronise a stream before reading what its kernels wrote.
void* device_alloc(int device, size_t bytes, const std::string& what);
void device_free(int device, void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes, const std::string& what);
void copy_to_host(void* dst, const void* src, size_t bytes, const std::string& what);
void fill_device_bytes(void* dst, int byte, size_t bytes, const std::string& what);
void copy_on_device(void* dst, const void* src, size_t bytes, StreamHandle stream, const std::string& what);  // async
// Ordered on `stream`. From pageable host memory the source may be reused when the call returns (CUDA stages
// it); to pageable host memory the data is there only after the stream is synchronised.
void copy_to_device_async(void* dst, const void* src, size_t bytes, StreamHandle stream, const std::string& what);
void copy_to_host_async(void* dst, const void* src, size_t bytes, StreamHandle stream, const std::string& what);
void fill_device_bytes_async(void* dst, int byte, size_t bytes, StreamHandle stream, const std::string& what);
void synchronize(int device, const std::string& what);  // cuCtxSynchronize on its context, checked

// An owned device allocation of `count` T on one device. Move-only.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, size_t count, std::string what)
      : device_(device), count_(count), what_(std::move(what)) {
    ptr_ = static_cast<T*>(device_alloc(device, count * sizeof(T), what_));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      device_ = o.device_;
      ptr_ = o.ptr_;
      count_ = o.count_;
      what_ = std::move(o.what_);
      o.ptr_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  T* data() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  int device() const { return device_; }

  void upload(const T* src, size_t n) {
    require(n);
    copy_to_device(ptr_, src, n * sizeof(T), "upload to " + what_);
  }
  void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
  void download(T* dst, size_t n) const {
    require(n);
    copy_to_host(dst, ptr_, n * sizeof(T), "download of " + what_);
  }
  std::vector<T> download() const {
    std::vector<T> v(count_);
    download(v.data(), count_);
    return v;
  }
  void fill_bytes(int byte) { fill_device_bytes(ptr_, byte, bytes(), "fill of " + what_); }

 private:
  void require(size_t n) const {
    if (n > count_)
      throw CudaError(what_ + ": " + std::to_string(n) + " elements do not fit in " + std::to_string(count_));
  }
  void reset() noexcept {
    if (ptr_) device_free(device_, ptr_);
    ptr_ = nullptr;
  }
  int device_ = 0;
  T* ptr_ = nullptr;
  size_t count_ = 0;
  std::string what_;
};

// A non-blocking stream on one device.
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle get() const { return s_; }
  int device() const { return device_; }
  void sync(const std::string& what) const;  // cuStreamSynchronize, checked (reports kernel faults)

 private:
  int device_;
  StreamHandle s_ = nullptr;
};

// A timing event (CUDA events: the target cards have no CUPTI).
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(StreamHandle s);
  void sync() const;
  // Milliseconds between two recorded, completed events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  drv::CUevent e_ = nullptr;
};

// Where a checked launch goes instead of cuLaunchKernel while a hook is installed on the calling thread
// (graph.h: recording the graph nodes of a stream capture, or updating them in an instantiated graph).
class LaunchHook {
 public:
  virtual ~LaunchHook() = default;
  virtual void launch(KernelHandle kernel, const std::string& name, Dim3 grid, Dim3 block, size_t smem,
                      StreamHandle stream, void** args, bool programmatic) = 0;
};

// cuLaunchKernel, or with `programmatic` cuLaunchKernelEx with programmatic stream serialization: the grid may
// start while the kernel before it on the stream is still running, and waits for it itself (the templates'
// qrig_grid_dependency_wait). Returns the driver's result.
drv::CUresult launch_function(drv::CUfunction f, Dim3 grid, Dim3 block, size_t smem, StreamHandle stream, void** args,
                              bool programmatic);

// Installs a hook on this thread for its lifetime (nests: the previous one comes back).
class ScopedLaunchHook {
 public:
  explicit ScopedLaunchHook(LaunchHook* hook);
  ~ScopedLaunchHook();
  ScopedLaunchHook(const ScopedLaunchHook&) = delete;
  ScopedLaunchHook& operator=(const ScopedLaunchHook&) = delete;

 private:
  LaunchHook* previous_;
};

// A kernel of a loaded library. Cheap to copy; keeps its library loaded.
class Kernel {
 public:
  const std::string& name() const { return name_; }
  KernelHandle handle() const { return handle_; }
  int max_threads() const { return max_threads_; }  // its __launch_bounds__
  // Programmatic dependent launch (sm_90+): launches overlap the kernel before them on the stream, which is
  // only correct for a kernel that waits for it before touching memory (the templates'
  // qrig_grid_dependency_wait). Off by default; the executor turns it on for its copies where the plan says
  // so (programmatic_launch) and the kernel's PTX has the wait.
  void set_programmatic(bool on) { programmatic_ = on; }
  bool programmatic() const { return programmatic_; }

  // Allows `bytes` of dynamic shared memory (above the 48 KiB default) on every device of the process,
  // checking each device's opt-in limit. Throws CudaError naming the device that cannot.
  void opt_in_shared(size_t bytes);
  size_t dynamic_shared_limit() const { return *smem_opt_in_; }
  // Resident blocks per SM of `device` at this block size and dynamic shared memory (the occupancy API).
  int max_active_blocks_per_sm(int device, int block_threads, size_t smem) const;

  // Checked launch: grid and block within the device limits and the kernel's launch bounds, dynamic shared
  // memory within what was opted in, then cuLaunchKernel (or the thread's LaunchHook).
  void launch_raw(Dim3 grid, Dim3 block, size_t smem, StreamHandle stream, void** args) const;
  template <class... A>
  void launch(Dim3 grid, Dim3 block, size_t smem, StreamHandle stream, A... args) const {
    void* ptrs[] = {static_cast<void*>(&args)...};
    launch_raw(grid, block, smem, stream, ptrs);
  }

 private:
  friend class Library;
  std::shared_ptr<void> library_;  // the CUlibrary, unloaded with its last kernel or Library
  KernelHandle handle_ = nullptr;
  std::string name_;
  int max_threads_ = 0;
  bool programmatic_ = false;            // per copy
  std::shared_ptr<size_t> smem_opt_in_;  // shared by copies
};

// Code loaded with cuLibraryLoadData (not tied to a device or context): a cubin (an ELF file) for the GPUs'
// architecture, or PTX text, which the driver compiles for each GPU it runs on (its JIT: how a plan for an
// older architecture runs on a newer GPU). A JIT failure's log is in the error.
class Library {
 public:
  Library(const std::vector<char>& code, const std::string& what);
  static bool is_cubin(const std::vector<char>& code);  // ELF magic
  // The kernel `entry` (an extern "C" name), whose launch bounds are max_threads.
  Kernel kernel(const std::string& entry, int max_threads) const;
  const std::string& what() const { return what_; }

 private:
  std::shared_ptr<void> lib_;
  std::string what_;
};


// Page-locked (pinned) host memory (cuMemHostAlloc, portable: every context may use it): copies from and to
// it run asynchronously at the link's full speed. Move-only; freed with cuMemFreeHost.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(size_t bytes, std::string what);
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void reset() noexcept;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::string what_;
};

// cuDeviceGetAttribute, checked.
int device_attribute(int device, drv::DeviceAttr attr, const std::string& what);
// Free and total bytes of a device's memory now (cuMemGetInfo), checked.
void memory_info(int device, size_t* free_bytes, size_t* total_bytes);

// Peer-to-peer: whether `device` can address `peer`'s memory (cuDeviceCanAccessPeer), and turning that
// access on (returns false when it was already on: leave it on then) and off again.
bool can_access_peer(int device, int peer);
bool enable_peer_access(int device, int peer);
void disable_peer_access(int device, int peer) noexcept;
// cuMemcpyPeerAsync on `stream`: direct when peer access is on, staged through the host otherwise.
void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes, StreamHandle stream,
                     const std::string& what);

}  // namespace qrig::cuda
