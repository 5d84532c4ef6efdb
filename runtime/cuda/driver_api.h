// The CUDA driver API (libcuda.so.1), loaded at run time (dlopen), never linked; declared here, so building the
// CUDA backend needs nothing of the CUDA toolkit. This is what lets one binary run on CUDA 12.x and 13.x
// drivers: a statically linked cudart 13 would require a CUDA 13 driver, the driver API of 12.0 does not.
//
// The oldest driver that works is CUDA 12.0's (R525): every entry point below exists there (the newest ones,
// cuLibraryLoadData, cuKernelGetFunction, cuKernelSetAttribute and CUDA_KERNEL_NODE_PARAMS_v2, came with 12.0).
// Versioned entry points are called by their exported names (cuMemAlloc_v2, ...), the same names a program
// compiled against cuda.h calls; the types and constants below are the ABI's, with the same values as cuda.h.
//
// Nothing is loaded until a function here is called: on a machine without a driver, driver() throws CudaError
// saying so, and driver_status() / driver_major_version() report it without throwing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace qrig::cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace drv {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
struct CUlib_st;
struct CUkern_st;
struct CUfunc_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;
using CUgraphNode = CUgraphNode_st*;
using CUlibrary = CUlib_st*;
using CUkernel = CUkern_st*;
using CUfunction = CUfunc_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;

// CUdevice_attribute values.
enum DeviceAttr : int {
  kMaxThreadsPerBlock = 1,
  kMaxGridDimX = 5,
  kMaxGridDimY = 6,
  kMaxGridDimZ = 7,
  kMaxSharedMemoryPerBlock = 8,
  kClockRate = 13,  // kHz
  kMultiprocessorCount = 16,
  kMemoryClockRate = 36,  // kHz
  kGlobalMemoryBusWidth = 37,
  kL2CacheSize = 38,
  kComputeCapabilityMajor = 75,
  kComputeCapabilityMinor = 76,
  kMaxSharedMemoryPerMultiprocessor = 81,
  kMaxSharedMemoryPerBlockOptin = 97,
};
// CUfunction_attribute values.
constexpr int CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
// CUjit_option values (the error log of a PTX JIT).
constexpr int CU_JIT_ERROR_LOG_BUFFER = 5;
constexpr int CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned CU_EVENT_DEFAULT = 0;
constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
inline CUstream legacy_stream() { return reinterpret_cast<CUstream>(uintptr_t{1}); }  // CU_STREAM_LEGACY

// CUDA_KERNEL_NODE_PARAMS_v2 (12.0+).
struct KernelNodeParams {
  CUfunction func = nullptr;
  unsigned gridDimX = 1, gridDimY = 1, gridDimZ = 1;
  unsigned blockDimX = 1, blockDimY = 1, blockDimZ = 1;
  unsigned sharedMemBytes = 0;
  void** kernelParams = nullptr;
  void** extra = nullptr;
  CUkernel kern = nullptr;
  CUcontext ctx = nullptr;
};

// CUlaunchAttribute and CUlaunchConfig (11.8+) for cuLaunchKernelEx: only the programmatic-stream-serialization
// attribute is used (programmatic dependent launch, sm_90+: Kernel::set_programmatic).
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
struct LaunchAttribute {
  int id = 0;
  char pad[4] = {};
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
  } value = {};
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
struct LaunchConfig {
  unsigned gridDimX = 1, gridDimY = 1, gridDimZ = 1;
  unsigned blockDimX = 1, blockDimY = 1, blockDimZ = 1;
  unsigned sharedMemBytes = 0;
  CUstream hStream = nullptr;
  LaunchAttribute* attrs = nullptr;
  unsigned numAttrs = 0;
};
struct GraphEdgeData {  // CUgraphEdgeData (12.3+): only returned, never read
  unsigned char from_port, to_port, type, reserved[5];
};

// The entry points qrig calls, resolved from libcuda.so.1 (by their exported, versioned names).
struct DriverApi {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice) = nullptr;                // _v2
  CUresult (*cuDeviceCanAccessPeer)(int*, CUdevice, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned) = nullptr;
  CUresult (*cuCtxDisablePeerAccess)(CUcontext) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;                    // _v2
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;                              // _v2
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;                      // _v2
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;      // _v2
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;            // _v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;        // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;  // _v2
  CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = nullptr;     // _v2
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;                           // _v2
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;                             // _v2
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;                 // _v2
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*cuStreamGetCaptureInfo)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                     size_t*) = nullptr;                     // _v2
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode, const KernelNodeParams*) = nullptr;  // _v2
  CUresult (*cuLibraryLoadData)(CUlibrary*, const void*, int*, void**, unsigned, int*, void**, unsigned) = nullptr;
  CUresult (*cuLibraryUnload)(CUlibrary) = nullptr;
  CUresult (*cuLibraryGetKernel)(CUkernel*, CUlibrary, const char*) = nullptr;
  CUresult (*cuKernelGetFunction)(CUfunction*, CUkernel) = nullptr;
  CUresult (*cuKernelGetAttribute)(int*, int, CUkernel, CUdevice) = nullptr;
  CUresult (*cuKernelSetAttribute)(int, int, CUkernel, CUdevice) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**) = nullptr;
  // 12.3+, optional (null on older drivers): the capture query that also returns edge data, which a stream
  // holding programmatic launches may carry (the _v2 query then answers CUDA_ERROR_LOSSY_QUERY).
  CUresult (*cuStreamGetCaptureInfo_v3)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                        const GraphEdgeData**, size_t*) = nullptr;
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t) = nullptr;
};

// The loaded, initialised (cuInit) driver, or CudaError saying why there is none: no libcuda.so.1, a driver
// older than CUDA 12.0 (naming the missing entry point), or cuInit's error (e.g. no device).
const DriverApi& driver();
// The same without throwing: null and *why set when there is no usable driver.
const DriverApi* driver_status(std::string* why = nullptr);
// The CUDA version the driver supports as 12040 for 12.4 (cuDriverGetVersion); 0 without a driver.
int driver_version();
// Its major version (12, 13); 0 without a driver.
int driver_major_version();

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a result.
std::string error_text(CUresult r);

}  // namespace drv

// The handles the rest of the CUDA runtime passes around.
using StreamHandle = drv::CUstream;
using KernelHandle = drv::CUkernel;

// A launch's grid or block (what cudart calls dim3).
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

}  // namespace qrig::cuda
