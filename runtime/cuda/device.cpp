// Checked CUDA driver calls (see device.h).
#include "runtime/cuda/device.h"

#include <cstring>
#include <mutex>

#include <fmt/format.h>

namespace qrig::cuda {

using namespace drv;

namespace {

drv::CUdeviceptr dptr(const void* p) { return reinterpret_cast<drv::CUdeviceptr>(p); }

// Calls that take no device run in the thread's context; a thread that never chose one gets device 0's (what
// cudart does implicitly).
void ensure_context() {
  const DriverApi& a = driver();
  CUcontext c = nullptr;
  if (a.cuCtxGetCurrent(&c) == CUDA_SUCCESS && c) return;
  check(a.cuCtxSetCurrent(primary_context(0)), "making CUDA device 0 current");
}

}  // namespace

void check(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return;
  throw CudaError(fmt::format("{}: {}", what, error_text(r)));
}

int device_count(std::string* why) {
  const DriverApi* a = driver_status(why);
  if (!a) return 0;
  int n = 0;
  const CUresult r = a->cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS) {
    if (why) *why = "cuDeviceGetCount: " + error_text(r);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

namespace {

CUdevice device_handle(int device) {
  CUdevice d = 0;
  check(driver().cuDeviceGet(&d, device), fmt::format("CUDA device {}", device));
  return d;
}

}  // namespace

int device_attribute(int device, DeviceAttr attr, const std::string& what) {
  int v = 0;
  check(driver().cuDeviceGetAttribute(&v, attr, device_handle(device)), fmt::format("{} of CUDA device {}", what, device));
  return v;
}

DeviceInfo device_info(int device) {
  const DriverApi& a = driver();
  const CUdevice h = device_handle(device);
  DeviceInfo d;
  d.index = device;
  char name[256] = {};
  check(a.cuDeviceGetName(name, (int)sizeof name - 1, h), fmt::format("name of CUDA device {}", device));
  d.name = name;
  size_t total = 0;
  check(a.cuDeviceTotalMem(&total, h), fmt::format("memory size of CUDA device {}", device));
  d.total_bytes = (int64_t)total;
  auto attr = [&](DeviceAttr at, const char* what) { return device_attribute(device, at, what); };
  d.sm = attr(kComputeCapabilityMajor, "compute capability") * 10 + attr(kComputeCapabilityMinor, "compute capability");
  d.sms = attr(kMultiprocessorCount, "SM count");
  d.max_threads_per_block = attr(kMaxThreadsPerBlock, "threads per block");
  d.smem_per_block = attr(kMaxSharedMemoryPerBlock, "shared memory per block");
  d.smem_per_block_optin = attr(kMaxSharedMemoryPerBlockOptin, "opt-in shared memory per block");
  d.smem_per_sm = attr(kMaxSharedMemoryPerMultiprocessor, "shared memory per SM");
  d.l2_bytes = attr(kL2CacheSize, "L2 size");
  d.max_grid_x = attr(kMaxGridDimX, "grid size");
  d.max_grid_y = attr(kMaxGridDimY, "grid size");
  d.max_grid_z = attr(kMaxGridDimZ, "grid size");
  return d;
}

CUcontext primary_context(int device) {
  static std::mutex mu;
  static std::vector<CUcontext> contexts;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) throw CudaError(fmt::format("CUDA device {} does not exist", device));
  if ((size_t)device < contexts.size() && contexts[device]) return contexts[device];
  const int n = device_count();
  if (device >= n) throw CudaError(fmt::format("CUDA device {} does not exist ({} devices)", device, n));
  if (contexts.size() < (size_t)n) contexts.resize(n, nullptr);
  CUcontext c = nullptr;
  check(driver().cuDevicePrimaryCtxRetain(&c, device_handle(device)),
        fmt::format("creating the context of CUDA device {}", device));
  contexts[device] = c;
  return c;
}

std::vector<DeviceInfo> init_devices() {
  std::vector<DeviceInfo> out;
  const int n = device_count();
  for (int i = 0; i < n; ++i) {
    primary_context(i);
    out.push_back(device_info(i));
  }
  return out;
}

DeviceGuard::DeviceGuard(int device) {
  const DriverApi& a = driver();
  check(a.cuCtxGetCurrent(&prev_), "cuCtxGetCurrent");
  check(a.cuCtxSetCurrent(primary_context(device)), fmt::format("making CUDA device {} current", device));
}

DeviceGuard::~DeviceGuard() { driver().cuCtxSetCurrent(prev_); }

void* device_alloc(int device, size_t bytes, const std::string& what) {
  DeviceGuard g(device);
  const DriverApi& a = driver();
  CUdeviceptr p = 0;
  const CUresult r = a.cuMemAlloc(&p, bytes == 0 ? 1 : bytes);
  if (r != CUDA_SUCCESS) {
    size_t free_b = 0, total_b = 0;
    a.cuMemGetInfo(&free_b, &total_b);
    throw CudaError(fmt::format("cuMemAlloc of {} bytes ({:.1f} MiB) for {} on device {} failed: {}; {:.1f} of "
                                "{:.1f} MiB free",
                                bytes, bytes / 1048576.0, what, device, error_text(r), free_b / 1048576.0,
                                total_b / 1048576.0));
  }
  return reinterpret_cast<void*>(p);
}

void device_free(int device, void* p) noexcept {
  const DriverApi* a = driver_status();
  if (!a || !p) return;
  try {
    DeviceGuard g(device);
    a->cuMemFree(dptr(p));
  } catch (const CudaError&) {
  }
}

// A synchronous copy from pageable memory may return before its DMA has landed, and cuMemsetD8 does not wait
// at all; both run on the legacy stream, which the non-blocking streams here do not wait for. So wait for it:
// after these calls the data is in place for any stream.
void copy_to_device(void* dst, const void* src, size_t bytes, const std::string& what) {
  ensure_context();
  const DriverApi& a = driver();
  check(a.cuMemcpyHtoD(dptr(dst), src, bytes), fmt::format("{} ({} bytes)", what, bytes));
  check(a.cuStreamSynchronize(legacy_stream()), fmt::format("{} ({} bytes): completion", what, bytes));
}

void copy_to_host(void* dst, const void* src, size_t bytes, const std::string& what) {
  ensure_context();
  check(driver().cuMemcpyDtoH(dst, dptr(src), bytes), fmt::format("{} ({} bytes)", what, bytes));
}

// The async calls run in the stream's own context (the caller's is current: DeviceGuard); their messages are
// formatted on failure only (a decode step makes many).
void copy_on_device(void* dst, const void* src, size_t bytes, StreamHandle stream, const std::string& what) {
  const CUresult r = driver().cuMemcpyDtoDAsync(dptr(dst), dptr(src), bytes, stream);
  if (r != CUDA_SUCCESS) check(r, fmt::format("{} ({} bytes)", what, bytes));
}

void copy_to_device_async(void* dst, const void* src, size_t bytes, StreamHandle stream, const std::string& what) {
  const CUresult r = driver().cuMemcpyHtoDAsync(dptr(dst), src, bytes, stream);
  if (r != CUDA_SUCCESS) check(r, fmt::format("{} ({} bytes)", what, bytes));
}

void copy_to_host_async(void* dst, const void* src, size_t bytes, StreamHandle stream, const std::string& what) {
  const CUresult r = driver().cuMemcpyDtoHAsync(dst, dptr(src), bytes, stream);
  if (r != CUDA_SUCCESS) check(r, fmt::format("{} ({} bytes)", what, bytes));
}

void fill_device_bytes_async(void* dst, int byte, size_t bytes, StreamHandle stream, const std::string& what) {
  const CUresult r = driver().cuMemsetD8Async(dptr(dst), (unsigned char)byte, bytes, stream);
  if (r != CUDA_SUCCESS) check(r, fmt::format("{} ({} bytes)", what, bytes));
}

void fill_device_bytes(void* dst, int byte, size_t bytes, const std::string& what) {
  ensure_context();
  const DriverApi& a = driver();
  check(a.cuMemsetD8(dptr(dst), (unsigned char)byte, bytes), fmt::format("{} ({} bytes)", what, bytes));
  check(a.cuStreamSynchronize(legacy_stream()), fmt::format("{} ({} bytes): completion", what, bytes));
}

void synchronize(int device, const std::string& what) {
  DeviceGuard g(device);
  check(driver().cuCtxSynchronize(), fmt::format("{} (device {})", what, device));
}

Stream::Stream(int device) : device_(device) {
  DeviceGuard g(device);
  check(driver().cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), fmt::format("creating a stream on device {}", device));
}

Stream::~Stream() {
  if (s_) driver().cuStreamDestroy(s_);
}

void Stream::sync(const std::string& what) const {
  check(driver().cuStreamSynchronize(s_), fmt::format("{} (stream on device {})", what, device_));
}

Event::Event(int device) {
  DeviceGuard g(device);
  check(driver().cuEventCreate(&e_, CU_EVENT_DEFAULT), fmt::format("creating an event on device {}", device));
}

Event::~Event() {
  if (e_) driver().cuEventDestroy(e_);
}

void Event::record(StreamHandle s) { check(driver().cuEventRecord(e_, s), "cuEventRecord"); }

void Event::sync() const { check(driver().cuEventSynchronize(e_), "cuEventSynchronize"); }

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  check(driver().cuEventElapsedTime(&ms, start.e_, end.e_), "cuEventElapsedTime");
  return ms;
}

bool Library::is_cubin(const std::vector<char>& code) {
  return code.size() >= 4 && std::memcmp(code.data(), "\x7f" "ELF", 4) == 0;
}

Library::Library(const std::vector<char>& code, const std::string& what) : what_(what) {
  if (code.empty()) throw CudaError(fmt::format("loading {}: no code", what));
  const DriverApi& a = driver();
  CUlibrary lib = nullptr;
  if (is_cubin(code)) {
    check(a.cuLibraryLoadData(&lib, code.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
          fmt::format("loading the cubin of {} (cuLibraryLoadData; was it compiled for this GPU's architecture?)", what));
  } else {
    // PTX: NUL-terminated text for the JIT, whose error log goes into the message.
    std::string ptx(code.begin(), code.end());
    while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
    std::vector<char> log(16384, '\0');
    int opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* vals[] = {log.data(), reinterpret_cast<void*>(uintptr_t{log.size() - 1})};
    const CUresult r = a.cuLibraryLoadData(&lib, ptx.c_str(), opts, vals, 2, nullptr, nullptr, 0);
    if (r != CUDA_SUCCESS)
      throw CudaError(fmt::format("JIT-compiling the PTX of {} (cuLibraryLoadData): {}{}{}", what, error_text(r),
                                  log[0] ? "\n" : "", log.data()));
  }
  lib_ = std::shared_ptr<void>(lib, [](void* l) {
    if (const DriverApi* d = driver_status()) d->cuLibraryUnload(static_cast<CUlibrary>(l));
  });
}

Kernel Library::kernel(const std::string& entry, int max_threads) const {
  Kernel k;
  check(driver().cuLibraryGetKernel(&k.handle_, static_cast<CUlibrary>(lib_.get()), entry.c_str()),
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
  const DriverApi& a = driver();
  for (int d = 0; d < n; ++d) {
    const DeviceInfo info = device_info(d);
    int static_bytes = 0;
    check(a.cuKernelGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, handle_, device_handle(d)),
          fmt::format("attributes of {} on device {}", name_, d));
    if ((int64_t)bytes + static_bytes > info.smem_per_block_optin)
      throw CudaError(fmt::format("{}: {} bytes of dynamic + {} of static shared memory exceed the {} bytes device {} "
                                  "({}) allows a block",
                                  name_, bytes, static_bytes, info.smem_per_block_optin, d, info.name));
    check(a.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes, handle_, device_handle(d)),
          fmt::format("shared-memory opt-in of {} bytes for {} on device {}", bytes, name_, d));
  }
  *smem_opt_in_ = bytes;
}

int Kernel::max_active_blocks_per_sm(int device, int block_threads, size_t smem) const {
  DeviceGuard g(device);
  const DriverApi& a = driver();
  CUfunction f = nullptr;
  check(a.cuKernelGetFunction(&f, handle_), fmt::format("{} in the context of device {}", name_, device));
  int n = 0;
  check(a.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, block_threads, smem),
        fmt::format("occupancy of {} ({} threads, {} bytes of shared memory)", name_, block_threads, smem));
  return n;
}

namespace {
thread_local LaunchHook* t_launch_hook = nullptr;
}  // namespace

ScopedLaunchHook::ScopedLaunchHook(LaunchHook* hook) : previous_(t_launch_hook) { t_launch_hook = hook; }
ScopedLaunchHook::~ScopedLaunchHook() { t_launch_hook = previous_; }

void Kernel::launch_raw(Dim3 grid, Dim3 block, size_t smem, StreamHandle stream, void** args) const {
  const int64_t threads = (int64_t)block.x * block.y * block.z;
  if (threads == 0 || threads > max_threads_)
    throw CudaError(fmt::format("launch of {}: a block of {}x{}x{} threads (its launch bounds allow {})", name_, block.x,
                                block.y, block.z, max_threads_));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    throw CudaError(fmt::format("launch of {}: grid {}x{}x{} is empty or over the limits (x < 2^31, y and z <= 65535)",
                                name_, grid.x, grid.y, grid.z));
  if (smem > 48 * 1024 && smem > *smem_opt_in_)
    throw CudaError(fmt::format("launch of {}: {} bytes of dynamic shared memory without opt_in_shared()", name_, smem));
  if (t_launch_hook) return t_launch_hook->launch(handle_, name_, grid, block, smem, stream, args, programmatic_);
  // A CUkernel launches as a CUfunction (12.0+), loaded into the current context on first use. The message is
  // formatted only on failure: a decode step launches hundreds of kernels.
  const CUresult r =
      launch_function(reinterpret_cast<CUfunction>(handle_), grid, block, smem, stream, args, programmatic_);
  if (r != CUDA_SUCCESS)
    check(r, fmt::format("launch of {} (grid {}x{}x{}, block {}{})", name_, grid.x, grid.y, grid.z, threads,
                         programmatic_ ? ", programmatic" : ""));
}

CUresult launch_function(CUfunction f, Dim3 grid, Dim3 block, size_t smem, StreamHandle stream, void** args,
                         bool programmatic) {
  const DriverApi& a = driver();
  if (!programmatic)
    return a.cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)smem, stream, args, nullptr);
  LaunchAttribute attr;
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmatic_stream_serialization_allowed = 1;
  LaunchConfig c;
  c.gridDimX = grid.x;
  c.gridDimY = grid.y;
  c.gridDimZ = grid.z;
  c.blockDimX = block.x;
  c.blockDimY = block.y;
  c.blockDimZ = block.z;
  c.sharedMemBytes = (unsigned)smem;
  c.hStream = stream;
  c.attrs = &attr;
  c.numAttrs = 1;
  return a.cuLaunchKernelEx(&c, f, args, nullptr);
}

PinnedBuffer::PinnedBuffer(size_t bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {
  ensure_context();
  constexpr unsigned kPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE: pinned for every context, not only this one
  const CUresult r = driver().cuMemHostAlloc(&ptr_, bytes == 0 ? 1 : bytes, kPortable);
  if (r != CUDA_SUCCESS) {
    ptr_ = nullptr;
    check(r, fmt::format("cuMemHostAlloc of {} bytes ({:.1f} MiB) of pinned host memory for {}", bytes,
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
  if (ptr_)
    if (const DriverApi* a = driver_status()) a->cuMemFreeHost(ptr_);
  ptr_ = nullptr;
}

void memory_info(int device, size_t* free_bytes, size_t* total_bytes) {
  DeviceGuard g(device);
  check(driver().cuMemGetInfo(free_bytes, total_bytes), fmt::format("free memory of CUDA device {}", device));
}

bool can_access_peer(int device, int peer) {
  int can = 0;
  check(driver().cuDeviceCanAccessPeer(&can, device_handle(device), device_handle(peer)),
        fmt::format("whether device {} can access device {}", device, peer));
  return can != 0;
}

bool enable_peer_access(int device, int peer) {
  DeviceGuard g(device);
  const CUresult r = driver().cuCtxEnablePeerAccess(primary_context(peer), 0);
  if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return false;
  check(r, fmt::format("enabling access of device {} to device {}'s memory", device, peer));
  return true;
}

void disable_peer_access(int device, int peer) noexcept {
  try {
    DeviceGuard g(device);
    driver().cuCtxDisablePeerAccess(primary_context(peer));
  } catch (const CudaError&) {
  }
}

void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, size_t bytes, StreamHandle stream,
                     const std::string& what) {
  check(driver().cuMemcpyPeerAsync(dptr(dst), primary_context(dst_device), dptr(src), primary_context(src_device), bytes,
                                   stream),
        fmt::format("{} (device {} -> {}, {} bytes)", what, src_device, dst_device, bytes));
}

}  // namespace qrig::cuda
