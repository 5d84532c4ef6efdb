// The CUDA runtime API, checked: device discovery and per-device setup, device memory, streams, events,
// cubins loaded as libraries (cudaLibraryLoadData, context-independent: one load serves every device) and
// kernel launches (cudaLaunchKernel on a cudaKernel_t). Every call is checked and a failure throws CudaError
// saying what was attempted, on which device, with CUDA's error name and message (the seed engine's worst
// bugs were unchecked allocations and launches). cudart is linked statically and loads libcuda lazily, so
// nothing here runs until called: on a machine without a driver, device_count() is 0 and says why.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if !defined(CUDART_VERSION) || CUDART_VERSION < 12010
#error "qrig's CUDA runtime needs CUDA 12.1 or newer (cudaLibraryLoadData, cudaKernel_t)"
#endif

namespace qrig::cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws CudaError "<what>: <cudaErrorName> (<message>)" unless e is cudaSuccess.
void check(cudaError_t e, const std::string& what);

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

// Setup of every device, not only the first: creates its primary context (cudaFree(0) on it), reads its
// limits. Throws CudaError naming the device that fails; returns nothing when there is no device.
std::vector<DeviceInfo> init_devices();

// Makes `device` current for the scope; restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// Raw, checked memory operations (the typed buffer below uses them). `what` names the buffer in errors.
// copy_to_device, copy_to_host and fill_device_bytes are synchronous: the data is in place when they return.
// They do not wait for kernels on other streams: synchronise a stream before reading what its kernels wrote.
void* device_alloc(int device, size_t bytes, const std::string& what);
void device_free(int device, void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes, const std::string& what);
void copy_to_host(void* dst, const void* src, size_t bytes, const std::string& what);
void fill_device_bytes(void* dst, int byte, size_t bytes, const std::string& what);
void copy_on_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, const std::string& what);  // async
// Ordered on `stream`. From pageable host memory the source may be reused when the call returns (CUDA stages
// it); to pageable host memory the data is there only after the stream is synchronised.
void copy_to_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream, const std::string& what);
void copy_to_host_async(void* dst, const void* src, size_t bytes, cudaStream_t stream, const std::string& what);
void fill_device_bytes_async(void* dst, int byte, size_t bytes, cudaStream_t stream, const std::string& what);
void synchronize(int device, const std::string& what);  // cudaDeviceSynchronize, checked

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
  cudaStream_t get() const { return s_; }
  int device() const { return device_; }
  void sync(const std::string& what) const;  // cudaStreamSynchronize, checked (reports kernel faults)

 private:
  int device_;
  cudaStream_t s_ = nullptr;
};

// A timing event (CUDA events: the target cards have no CUPTI).
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t s);
  void sync() const;
  // Milliseconds between two recorded, completed events.
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  cudaEvent_t e_ = nullptr;
};

// Where a checked launch goes instead of cudaLaunchKernel while a hook is installed on the calling thread
// (graph.h: recording the graph nodes of a stream capture, or updating them in an instantiated graph).
class LaunchHook {
 public:
  virtual ~LaunchHook() = default;
  virtual void launch(cudaKernel_t kernel, const std::string& name, dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, void** args) = 0;
};

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
  cudaKernel_t handle() const { return handle_; }
  int max_threads() const { return max_threads_; }  // its __launch_bounds__

  // Allows `bytes` of dynamic shared memory (above the 48 KiB default) on every device of the process,
  // checking each device's opt-in limit. Throws CudaError naming the device that cannot.
  void opt_in_shared(size_t bytes);
  size_t dynamic_shared_limit() const { return *smem_opt_in_; }

  // Checked launch: grid and block within the device limits and the kernel's launch bounds, dynamic shared
  // memory within what was opted in, then cudaLaunchKernel and cudaGetLastError (or the thread's LaunchHook).
  void launch_raw(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args) const;
  template <class... A>
  void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A... args) const {
    void* ptrs[] = {static_cast<void*>(&args)...};
    launch_raw(grid, block, smem, stream, ptrs);
  }

 private:
  friend class Library;
  std::shared_ptr<void> library_;  // the cudaLibrary_t, unloaded with its last kernel or Library
  cudaKernel_t handle_ = nullptr;
  std::string name_;
  int max_threads_ = 0;
  std::shared_ptr<size_t> smem_opt_in_;  // shared by copies
};

// A cubin loaded with cudaLibraryLoadData (not tied to a device or context).
class Library {
 public:
  Library(const std::vector<char>& cubin, const std::string& what);
  // The kernel `entry` (an extern "C" name), whose launch bounds are max_threads.
  Kernel kernel(const std::string& entry, int max_threads) const;
  const std::string& what() const { return what_; }

 private:
  std::shared_ptr<void> lib_;
  std::string what_;
};


// Page-locked (pinned) host memory (cudaMallocHost): copies from and to it run asynchronously at the
// link's full speed. Move-only; freed with cudaFreeHost.
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

// cudaDeviceGetAttribute, checked (clock rates live here since CUDA 13 dropped them from cudaDeviceProp).
int device_attribute(int device, cudaDeviceAttr attr, const std::string& what);
// Free and total bytes of a device's memory now (cudaMemGetInfo), checked.
void memory_info(int device, size_t* free_bytes, size_t* total_bytes);

// Peer-to-peer: whether `device` can address `peer`'s memory (cudaDeviceCanAccessPeer), and turning that
// access on (returns false when it was already on: leave it on then) and off again.
bool can_access_peer(int device, int peer);
bool enable_peer_access(int device, int peer);
void disable_peer_access(int device, int peer) noexcept;
// cudaMemcpyPeerAsync on `stream`: direct when peer access is on, staged through the host otherwise.
void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes, cudaStream_t stream,
                     const std::string& what);

}  // namespace qrig::cuda
