// Checked CUDA runtime calls (see device.h).
#include "runtime/cuda/device.h"

#include <fmt/format.h>

namespace qrig::cuda {

void check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that the next call does not report it again
  throw CudaError(fmt::format("{}: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), fmt::format("properties of CUDA device {}", device));
  DeviceInfo d;
  d.index = device;
  d.name = p.name;
  d.sm = p.major * 10 + p.minor;
  d.sms = p.multiProcessorCount;
  d.total_bytes = (int64_t)p.totalGlobalMem;
  d.max_threads_per_block = p.maxThreadsPerBlock;
  d.smem_per_block = (int)p.sharedMemPerBlock;
  d.smem_per_block_optin = (int)p.sharedMemPerBlockOptin;
  d.smem_per_sm = (int)p.sharedMemPerMultiprocessor;
  d.l2_bytes = p.l2CacheSize;
  d.max_grid_x = p.maxGridSize[0];
  d.max_grid_y = p.maxGridSize[1];
  d.max_grid_z = p.maxGridSize[2];
  return d;
}

std::vector<DeviceInfo> init_devices() {
  std::vector<DeviceInfo> out;
  const int n = device_count();
  for (int i = 0; i < n; ++i) {
    DeviceGuard g(i);
    check(cudaFree(nullptr), fmt::format("creating the context of CUDA device {}", i));
    out.push_back(device_info(i));
  }
  return out;
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&prev_), "cudaGetDevice");
  check(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
}

DeviceGuard::~DeviceGuard() { cudaSetDevice(prev_); }

void* device_alloc(int device, size_t bytes, const std::string& what) {
  DeviceGuard g(device);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    throw CudaError(fmt::format("cudaMalloc of {} bytes ({:.1f} MiB) for {} on device {} failed: {} ({}); {:.1f} of "
                                "{:.1f} MiB free",
                                bytes, bytes / 1048576.0, what, device, cudaGetErrorName(e), cudaGetErrorString(e),
                                free_b / 1048576.0, total_b / 1048576.0));
  }
  return p;
}

void device_free(int device, void* p) noexcept {
  int prev = 0;
  if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
    cudaFree(p);
    cudaSetDevice(prev);
  }
  cudaGetLastError();
}

// cudaMemcpy from pageable memory may return before its DMA has landed, and cudaMemset does not wait at all;
// both run on the legacy stream, which the non-blocking streams here do not wait for. So wait for it: after
// these calls the data is in place for any stream.
void copy_to_device(void* dst, const void* src, size_t bytes, const std::string& what) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), fmt::format("{} ({} bytes)", what, bytes));
  check(cudaStreamSynchronize(cudaStreamLegacy), fmt::format("{} ({} bytes): completion", what, bytes));
}

void copy_to_host(void* dst, const void* src, size_t bytes, const std::string& what) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), fmt::format("{} ({} bytes)", what, bytes));
}

void copy_on_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, const std::string& what) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  if (e != cudaSuccess) check(e, fmt::format("{} ({} bytes)", what, bytes));  // formatted on failure only
}

void copy_to_device_async(void* dst, const void* src, size_t bytes, cudaStream_t stream, const std::string& what) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) check(e, fmt::format("{} ({} bytes)", what, bytes));  // formatted on failure only
}

void copy_to_host_async(void* dst, const void* src, size_t bytes, cudaStream_t stream, const std::string& what) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) check(e, fmt::format("{} ({} bytes)", what, bytes));  // formatted on failure only
}

void fill_device_bytes_async(void* dst, int byte, size_t bytes, cudaStream_t stream, const std::string& what) {
  const cudaError_t e = cudaMemsetAsync(dst, byte, bytes, stream);
  if (e != cudaSuccess) check(e, fmt::format("{} ({} bytes)", what, bytes));  // formatted on failure only
}

void fill_device_bytes(void* dst, int byte, size_t bytes, const std::string& what) {
  check(cudaMemset(dst, byte, bytes), fmt::format("{} ({} bytes)", what, bytes));
  check(cudaStreamSynchronize(cudaStreamLegacy), fmt::format("{} ({} bytes): completion", what, bytes));
}

void synchronize(int device, const std::string& what) {
  DeviceGuard g(device);
  check(cudaDeviceSynchronize(), fmt::format("{} (device {})", what, device));
}

Stream::Stream(int device) : device_(device) {
  DeviceGuard g(device);
  check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), fmt::format("creating a stream on device {}", device));
}

Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}

void Stream::sync(const std::string& what) const {
  check(cudaStreamSynchronize(s_), fmt::format("{} (stream on device {})", what, device_));
}

Event::Event(int device) {
  DeviceGuard g(device);
  check(cudaEventCreate(&e_), fmt::format("creating an event on device {}", device));
}

Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}

void Event::record(cudaStream_t s) { check(cudaEventRecord(e_, s), "cudaEventRecord"); }

void Event::sync() const { check(cudaEventSynchronize(e_), "cudaEventSynchronize"); }

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start.e_, end.e_), "cudaEventElapsedTime");
  return ms;
}

Library::Library(const std::vector<char>& cubin, const std::string& what) : what_(what) {
  if (cubin.empty()) throw CudaError(fmt::format("loading {}: empty cubin", what));
  cudaLibrary_t lib = nullptr;
  check(cudaLibraryLoadData(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        fmt::format("loading the cubin of {} (cudaLibraryLoadData; was it compiled for this GPU's architecture?)", what));
  lib_ = std::shared_ptr<void>(lib, [](void* l) { cudaLibraryUnload(static_cast<cudaLibrary_t>(l)); });
}

Kernel Library::kernel(const std::string& entry, int max_threads) const {
  Kernel k;
  check(cudaLibraryGetKernel(&k.handle_, static_cast<cudaLibrary_t>(lib_.get()), entry.c_str()),
        fmt::format("kernel '{}' in {}", entry, what_));
  k.library_ = lib_;
  k.name_ = what_;
  k.max_threads_ = max_threads;
  k.smem_opt_in_ = std::make_shared<size_t>(0);
  return k;
}

void Kernel::opt_in_shared(size_t bytes) {
  const int n = device_count();
  if (n == 0) throw CudaError(fmt::format("{}: shared-memory opt-in without a CUDA device", name_));
  for (int d = 0; d < n; ++d) {
    const DeviceInfo info = device_info(d);
    int static_bytes = 0;
    {
      DeviceGuard g(d);
      cudaFuncAttributes a{};
      check(cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(handle_)),
            fmt::format("attributes of {} on device {}", name_, d));
      static_bytes = (int)a.sharedSizeBytes;
    }
    if ((int64_t)bytes + static_bytes > info.smem_per_block_optin)
      throw CudaError(fmt::format("{}: {} bytes of dynamic + {} of static shared memory exceed the {} bytes device {} "
                                  "({}) allows a block",
                                  name_, bytes, static_bytes, info.smem_per_block_optin, d, info.name));
#if CUDART_VERSION >= 13000  // per-device setter (present in 13.0; older 12.x may lack it: use the fallback)
    check(cudaKernelSetAttributeForDevice(handle_, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes, d),
          fmt::format("shared-memory opt-in of {} bytes for {} on device {}", bytes, name_, d));
#else
    DeviceGuard g(d);
    check(cudaFuncSetAttribute(reinterpret_cast<const void*>(handle_), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)bytes),
          fmt::format("shared-memory opt-in of {} bytes for {} on device {}", bytes, name_, d));
#endif
  }
  *smem_opt_in_ = bytes;
}

namespace {
thread_local LaunchHook* t_launch_hook = nullptr;
}  // namespace

ScopedLaunchHook::ScopedLaunchHook(LaunchHook* hook) : previous_(t_launch_hook) { t_launch_hook = hook; }
ScopedLaunchHook::~ScopedLaunchHook() { t_launch_hook = previous_; }

void Kernel::launch_raw(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, void** args) const {
  const int64_t threads = (int64_t)block.x * block.y * block.z;
  if (threads == 0 || threads > max_threads_)
    throw CudaError(fmt::format("launch of {}: a block of {}x{}x{} threads (its launch bounds allow {})", name_, block.x,
                                block.y, block.z, max_threads_));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    throw CudaError(fmt::format("launch of {}: grid {}x{}x{} is empty or over the limits (x < 2^31, y and z <= 65535)",
                                name_, grid.x, grid.y, grid.z));
  if (smem > 48 * 1024 && smem > *smem_opt_in_)
    throw CudaError(fmt::format("launch of {}: {} bytes of dynamic shared memory without opt_in_shared()", name_, smem));
  if (t_launch_hook) return t_launch_hook->launch(handle_, name_, grid, block, smem, stream, args);
  // The messages are formatted only on failure: a decode step launches hundreds of kernels.
  const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(handle_), grid, block, args, smem, stream);
  if (e != cudaSuccess) check(e, fmt::format("launch of {} (grid {}x{}x{}, block {})", name_, grid.x, grid.y, grid.z, threads));
  const cudaError_t last = cudaGetLastError();
  if (last != cudaSuccess) check(last, fmt::format("after the launch of {}", name_));
}


PinnedBuffer::PinnedBuffer(size_t bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {
  const cudaError_t e = cudaMallocHost(&ptr_, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    check(e, fmt::format("cudaMallocHost of {} bytes ({:.1f} MiB) of pinned host memory for {}", bytes,
                         bytes / 1048576.0, what_));
  }
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    what_ = std::move(o.what_);
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void PinnedBuffer::reset() noexcept {
  if (ptr_) cudaFreeHost(ptr_);
  cudaGetLastError();
  ptr_ = nullptr;
}

int device_attribute(int device, cudaDeviceAttr attr, const std::string& what) {
  int v = 0;
  check(cudaDeviceGetAttribute(&v, attr, device), fmt::format("{} of CUDA device {}", what, device));
  return v;
}

void memory_info(int device, size_t* free_bytes, size_t* total_bytes) {
  DeviceGuard g(device);
  check(cudaMemGetInfo(free_bytes, total_bytes), fmt::format("free memory of CUDA device {}", device));
}

bool can_access_peer(int device, int peer) {
  int can = 0;
  check(cudaDeviceCanAccessPeer(&can, device, peer), fmt::format("whether device {} can access device {}", device, peer));
  return can != 0;
}

bool enable_peer_access(int device, int peer) {
  DeviceGuard g(device);
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return false;
  }
  check(e, fmt::format("enabling access of device {} to device {}'s memory", device, peer));
  return true;
}

void disable_peer_access(int device, int peer) noexcept {
  int prev = 0;
  if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
    cudaDeviceDisablePeerAccess(peer);
    cudaSetDevice(prev);
  }
  cudaGetLastError();
}

void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes, cudaStream_t stream,
                     const std::string& what) {
  check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream),
        fmt::format("{} (device {} -> {}, {} bytes)", what, src_device, dst_device, bytes));
}

}  // namespace qrig::cuda
