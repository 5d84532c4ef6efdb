// Loading the CUDA driver API at run time (driver_api.h).
#include "runtime/cuda/driver_api.h"

#include <dlfcn.h>

#include <mutex>

#include <fmt/format.h>

namespace qrig::cuda::drv {

namespace {

struct Loaded {
  DriverApi api;
  bool usable = false;
  int version = 0;
  std::string why;  // when not usable
};

template <class F>
bool resolve(void* h, const char* name, F& f, std::string& missing) {
  f = reinterpret_cast<F>(dlsym(h, name));
  if (!f && missing.empty()) missing = name;
  return f != nullptr;
}

Loaded load() {
  Loaded L;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* err = dlerror();
    L.why = fmt::format("no CUDA driver: libcuda.so.1 did not load ({})", err ? err : "not found");
    return L;
  }
  DriverApi& a = L.api;
  std::string missing;
  resolve(h, "cuDriverGetVersion", a.cuDriverGetVersion, missing);
  if (a.cuDriverGetVersion) {
    if (const CUresult r = a.cuDriverGetVersion(&L.version); r != CUDA_SUCCESS) {
      L.version = 0;
      L.why = fmt::format("libcuda.so.1 is not a usable driver: cuDriverGetVersion returned {}{}", r,
                          r == 34 ? " (CUDA_ERROR_STUB_LIBRARY: the toolkit's stub, not a driver)" : "");
      return L;
    }
  }
  resolve(h, "cuInit", a.cuInit, missing);
  resolve(h, "cuGetErrorName", a.cuGetErrorName, missing);
  resolve(h, "cuGetErrorString", a.cuGetErrorString, missing);
  resolve(h, "cuDeviceGetCount", a.cuDeviceGetCount, missing);
  resolve(h, "cuDeviceGet", a.cuDeviceGet, missing);
  resolve(h, "cuDeviceGetName", a.cuDeviceGetName, missing);
  resolve(h, "cuDeviceGetAttribute", a.cuDeviceGetAttribute, missing);
  resolve(h, "cuDeviceTotalMem_v2", a.cuDeviceTotalMem, missing);
  resolve(h, "cuDeviceCanAccessPeer", a.cuDeviceCanAccessPeer, missing);
  resolve(h, "cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain, missing);
  resolve(h, "cuCtxSetCurrent", a.cuCtxSetCurrent, missing);
  resolve(h, "cuCtxGetCurrent", a.cuCtxGetCurrent, missing);
  resolve(h, "cuCtxSynchronize", a.cuCtxSynchronize, missing);
  resolve(h, "cuCtxEnablePeerAccess", a.cuCtxEnablePeerAccess, missing);
  resolve(h, "cuCtxDisablePeerAccess", a.cuCtxDisablePeerAccess, missing);
  resolve(h, "cuMemAlloc_v2", a.cuMemAlloc, missing);
  resolve(h, "cuMemFree_v2", a.cuMemFree, missing);
  resolve(h, "cuMemGetInfo_v2", a.cuMemGetInfo, missing);
  resolve(h, "cuMemHostAlloc", a.cuMemHostAlloc, missing);
  resolve(h, "cuMemFreeHost", a.cuMemFreeHost, missing);
  resolve(h, "cuMemcpyHtoD_v2", a.cuMemcpyHtoD, missing);
  resolve(h, "cuMemcpyDtoH_v2", a.cuMemcpyDtoH, missing);
  resolve(h, "cuMemcpyHtoDAsync_v2", a.cuMemcpyHtoDAsync, missing);
  resolve(h, "cuMemcpyDtoHAsync_v2", a.cuMemcpyDtoHAsync, missing);
  resolve(h, "cuMemcpyDtoDAsync_v2", a.cuMemcpyDtoDAsync, missing);
  resolve(h, "cuMemcpyPeerAsync", a.cuMemcpyPeerAsync, missing);
  resolve(h, "cuMemsetD8_v2", a.cuMemsetD8, missing);
  resolve(h, "cuMemsetD8Async", a.cuMemsetD8Async, missing);
  resolve(h, "cuStreamCreate", a.cuStreamCreate, missing);
  resolve(h, "cuStreamDestroy_v2", a.cuStreamDestroy, missing);
  resolve(h, "cuStreamSynchronize", a.cuStreamSynchronize, missing);
  resolve(h, "cuEventCreate", a.cuEventCreate, missing);
  resolve(h, "cuEventDestroy_v2", a.cuEventDestroy, missing);
  resolve(h, "cuEventRecord", a.cuEventRecord, missing);
  resolve(h, "cuEventSynchronize", a.cuEventSynchronize, missing);
  resolve(h, "cuEventElapsedTime", a.cuEventElapsedTime, missing);
  resolve(h, "cuStreamBeginCapture_v2", a.cuStreamBeginCapture, missing);
  resolve(h, "cuStreamEndCapture", a.cuStreamEndCapture, missing);
  resolve(h, "cuStreamGetCaptureInfo_v2", a.cuStreamGetCaptureInfo, missing);
  resolve(h, "cuGraphInstantiateWithFlags", a.cuGraphInstantiateWithFlags, missing);
  resolve(h, "cuGraphLaunch", a.cuGraphLaunch, missing);
  resolve(h, "cuGraphExecDestroy", a.cuGraphExecDestroy, missing);
  resolve(h, "cuGraphDestroy", a.cuGraphDestroy, missing);
  resolve(h, "cuGraphExecKernelNodeSetParams_v2", a.cuGraphExecKernelNodeSetParams, missing);
  resolve(h, "cuLibraryLoadData", a.cuLibraryLoadData, missing);
  resolve(h, "cuLibraryUnload", a.cuLibraryUnload, missing);
  resolve(h, "cuLibraryGetKernel", a.cuLibraryGetKernel, missing);
  resolve(h, "cuKernelGetFunction", a.cuKernelGetFunction, missing);
  resolve(h, "cuKernelGetAttribute", a.cuKernelGetAttribute, missing);
  resolve(h, "cuKernelSetAttribute", a.cuKernelSetAttribute, missing);
  resolve(h, "cuLaunchKernel", a.cuLaunchKernel, missing);
  resolve(h, "cuLaunchKernelEx", a.cuLaunchKernelEx, missing);
  a.cuStreamGetCaptureInfo_v3 =
      reinterpret_cast<decltype(a.cuStreamGetCaptureInfo_v3)>(dlsym(h, "cuStreamGetCaptureInfo_v3"));  // optional
  resolve(h, "cuOccupancyMaxActiveBlocksPerMultiprocessor", a.cuOccupancyMaxActiveBlocksPerMultiprocessor, missing);
  const std::string version = fmt::format("{}.{}", L.version / 1000, L.version % 1000 / 10);
  if (!missing.empty() || L.version < 12000) {
    L.why = fmt::format("the CUDA driver (for CUDA {}) is too old: qrig needs a CUDA 12.0 (R525) or newer driver{}",
                        version, missing.empty() ? "" : fmt::format(" ({} is missing)", missing));
    return L;  // the library stays loaded: cheap, and the version is still reported
  }
  const CUresult r = a.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    const char* text = nullptr;
    a.cuGetErrorName(r, &name);
    a.cuGetErrorString(r, &text);
    L.why = fmt::format("cuInit: {} ({}); driver for CUDA {}", name ? name : fmt::format("error {}", r),
                        text ? text : "no message", version);
    return L;
  }
  L.usable = true;
  return L;
}

const Loaded& loaded() {
  static const Loaded L = load();  // thread-safe, once
  return L;
}

}  // namespace

const DriverApi* driver_status(std::string* why) {
  const Loaded& L = loaded();
  if (!L.usable) {
    if (why) *why = L.why;
    return nullptr;
  }
  return &L.api;
}

const DriverApi& driver() {
  const Loaded& L = loaded();
  if (!L.usable) throw CudaError(L.why);
  return L.api;
}

int driver_version() { return loaded().version; }

int driver_major_version() { return loaded().version / 1000; }

std::string error_text(CUresult r) {
  const Loaded& L = loaded();
  const char* name = nullptr;
  const char* text = nullptr;
  if (L.api.cuGetErrorName) L.api.cuGetErrorName(r, &name);
  if (L.api.cuGetErrorString) L.api.cuGetErrorString(r, &text);
  return fmt::format("{} ({})", name ? std::string(name) : fmt::format("CUDA error {}", r), text ? text : "no message");
}

}  // namespace qrig::cuda::drv
