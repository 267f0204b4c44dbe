// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CUDA driver API, loaded at run time. Takes in nothing at build time (no
// <cuda.h>, nothing linked); at run time dlopens libcuda.so.1 and gives out a
// table of driver entry points (DriverApi), cuda_available() (never throws: a
// binary built once runs on a machine without a GPU and picks the CPU),
// check() turning a CUresult into a kiln::Error, and each device's properties
// read once.
//
// The types and constants below are the driver's ABI as cuda.h (CUDA 12/13)
// declares it; only what kiln calls is declared. Where cuda.h #defines a name to
// a versioned symbol (cuMemAlloc -> cuMemAlloc_v2) the table loads the versioned
// symbol, which is what a program compiled against cuda.h would call.
// NOTE: the per-thread-default-stream variants (_ptds/_ptsz) are not used: kiln
// launches on streams it creates, never on the implicit NULL stream.
//
// Guidelines: every driver call goes through check() (or is compared against a
// named code); nothing here allocates device memory or creates contexts.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"

// Opaque handle types, declared with cuda.h's own tags so that a program which
// also includes <cuda.h> can pass its handles to kiln unchanged.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphNode_st;
struct CUgraphExec_st;

// NOTE: `kiln::cu`, not `kiln::cuda`: core/device.hpp declares the function
// kiln::cuda(int) (a device, as in torch.device("cuda", 0)), and a namespace may
// not share its name. `cu` is the driver API's own prefix.
namespace kiln::cu {

using CUresult = int;  // cuda.h: enum cudaError_enum; passed and returned as int
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // 64-bit hosts only (cuda.h: CUdeviceptr_v2)
using CUcontext = ::CUctx_st*;
using CUmodule = ::CUmod_st*;
using CUfunction = ::CUfunc_st*;
using CUstream = ::CUstream_st*;
using CUevent = ::CUevent_st*;
using CUgraph = ::CUgraph_st*;
using CUgraphNode = ::CUgraphNode_st*;
using CUgraphExec = ::CUgraphExec_st*;

// CUDA_KERNEL_NODE_PARAMS (cuda.h's _v2, what cuGraphAddKernelNode_v2 takes): `kern` and
// `ctx` stay null, so the node launches `func` in the current context.
struct KernelNodeParams {
  CUfunction func = nullptr;
  unsigned grid_x = 1, grid_y = 1, grid_z = 1, block_x = 1, block_y = 1, block_z = 1, shared_bytes = 0;
  void** params = nullptr;
  void** extra = nullptr;
  void* kern = nullptr;
  CUcontext ctx = nullptr;
};

// CUlaunchConfig and one CUlaunchAttribute (cuda.h's layouts), what cuLaunchKernelEx takes.
// kiln sets two attributes: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (the kernel
// may start before the kernel before it on its stream has finished; kiln::programmatic_launch)
// and CU_LAUNCH_ATTRIBUTE_PRIORITY (the launch's priority instead of its stream's: lower
// numbers first; kiln::idle_fill), which is also a graph kernel node's attribute of that id.
inline constexpr int kLaunchAttributeProgrammaticStreamSerialization = 6;
inline constexpr int kLaunchAttributePriority = 8;
struct LaunchAttribute {
  int id = 0;
  char pad[4] = {};
  union Value {
    char bytes[64];
    int i;
    void* align;  // the union holds pointers (events): 8-byte aligned
  } value{};
};
struct LaunchConfig {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1, block_x = 1, block_y = 1, block_z = 1, shared_bytes = 0;
  CUstream stream = nullptr;
  LaunchAttribute* attrs = nullptr;
  unsigned attr_count = 0;
};
static_assert(sizeof(void*) != 8 || (sizeof(LaunchAttribute) == 72 && sizeof(LaunchConfig) == 56),
              "kiln: LaunchAttribute / LaunchConfig must match cuda.h's CUlaunchAttribute / CUlaunchConfig");
// CUgraphEdgeData: a graph's programmatic edge (the downstream kernel may start once every
// block of the upstream one has run griddepcontrol.launch_dependents, or ended; it waits for
// the upstream kernel's memory with griddepcontrol.wait) is from port 1
// (CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC), type 1 (CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC).
struct GraphEdgeData {
  unsigned char from_port = 0, to_port = 0, type = 0, reserved[5] = {};
};
inline constexpr GraphEdgeData kProgrammaticEdge{1, 0, 1, {}};

// CUresult values kiln tests for by name.
inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorInvalidValue = 1;
inline constexpr CUresult kErrorOutOfMemory = 2;
inline constexpr CUresult kErrorNotInitialized = 3;
inline constexpr CUresult kErrorDeinitialized = 4;
inline constexpr CUresult kErrorStubLibrary = 34;
inline constexpr CUresult kErrorNoDevice = 100;
inline constexpr CUresult kErrorNotReady = 600;

// CUdevice_attribute values (cuda.h).
inline constexpr int kAttrMaxThreadsPerBlock = 1;
inline constexpr int kAttrMaxBlockDimX = 2;
inline constexpr int kAttrMaxBlockDimY = 3;
inline constexpr int kAttrMaxBlockDimZ = 4;
inline constexpr int kAttrMaxGridDimX = 5;
inline constexpr int kAttrMaxGridDimY = 6;
inline constexpr int kAttrMaxGridDimZ = 7;
inline constexpr int kAttrMaxSharedMemoryPerBlock = 8;
inline constexpr int kAttrWarpSize = 10;
inline constexpr int kAttrMaxRegistersPerBlock = 12;
inline constexpr int kAttrMultiprocessorCount = 16;
inline constexpr int kAttrL2CacheSize = 38;
inline constexpr int kAttrMaxThreadsPerMultiprocessor = 39;
inline constexpr int kAttrComputeCapabilityMajor = 75;
inline constexpr int kAttrComputeCapabilityMinor = 76;
inline constexpr int kAttrMaxSharedMemoryPerMultiprocessor = 81;
inline constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;

// CUfunction_attribute values (cuda.h).
inline constexpr int kFuncAttrMaxThreadsPerBlock = 0;
inline constexpr int kFuncAttrSharedSizeBytes = 1;
inline constexpr int kFuncAttrLocalSizeBytes = 3;
inline constexpr int kFuncAttrNumRegs = 4;
inline constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;

// Stream and event creation flags (cuda.h).
inline constexpr unsigned kStreamDefault = 0x0;  // synchronises with the legacy NULL stream
inline constexpr unsigned kStreamNonBlocking = 0x1;
inline constexpr unsigned kEventDefault = 0x0;
inline constexpr unsigned kEventDisableTiming = 0x2;

// The entry points kiln calls. Field names are the names cuda.h exposes; the
// comment gives the symbol actually loaded where it differs.
struct DriverApi {
  void* library = nullptr;  // dlopen handle; never closed (see driver_state())
  std::string path;         // what was dlopened

  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice) = nullptr;              // _v2
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;              // _v2
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;                   // _v2
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;                 // _v2
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;                           // _v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t) = nullptr;   // _v2
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;         // _v2
  CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t) = nullptr;   // _v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;        // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;  // _v2
  CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = nullptr;   // _v2
  CUresult (*cuMemsetD32)(CUdeviceptr, unsigned, size_t) = nullptr;       // _v2
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  // Optional (CUDA 12+ drivers; null where missing: every launch is a plain one).
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;                        // _v2
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamQuery)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;     // _v2 (CUDA 12.8+), else the original
  CUresult (*cuEventDestroy)(CUevent) = nullptr;                          // _v2
  // Optional (CUDA 12+ drivers; null where missing: no wgmma GEMM then). The map is
  // CUtensorMap (128 bytes); the enums are passed as int.
  CUresult (*cuTensorMapEncodeTiled)(void* map, int dtype, unsigned rank, void* address, const uint64_t* dims,
                                     const uint64_t* strides, const unsigned* box, const unsigned* element_strides,
                                     int interleave, int swizzle, int l2_promotion, int oob_fill) = nullptr;
  // Optional (CUDA 12+ drivers; null where missing: Mode::reduce_overhead launches kernel by kernel).
  CUresult (*cuGraphCreate)(CUgraph*, unsigned) = nullptr;
  CUresult (*cuGraphAddKernelNode)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const KernelNodeParams*) = nullptr;  // _v2
  // Optional (CUDA 12.3+ drivers; null where missing: a graph's edges wait for whole kernels).
  CUresult (*cuGraphAddDependencies)(CUgraph, const CUgraphNode*, const CUgraphNode*, const GraphEdgeData*, size_t) = nullptr;  // _v2
  CUresult (*cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;  // cuGraphInstantiateWithFlags
  CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode, const KernelNodeParams*) = nullptr;  // _v2
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  // Optional (null where missing: kiln::idle_fill's launches keep their streams' priority).
  CUresult (*cuCtxGetStreamPriorityRange)(int* least, int* greatest) = nullptr;
  CUresult (*cuGraphKernelNodeSetAttribute)(CUgraphNode, int, const void* value) = nullptr;
  bool has_graphs() const {
    return cuGraphCreate && cuGraphAddKernelNode && cuGraphInstantiate && cuGraphExecKernelNodeSetParams && cuGraphLaunch &&
           cuGraphExecDestroy && cuGraphDestroy;
  }
};

// CUtensorMap enum values (cuda.h).
inline constexpr int kTensorMapUint16 = 1;
inline constexpr int kTensorMapFloat32 = 7;  // CU_TENSOR_MAP_DATA_TYPE_FLOAT32
inline constexpr int kTensorMapSwizzle64B = 2, kTensorMapSwizzle128B = 3;
inline constexpr int kTensorMapL2Promotion128B = 2;

namespace detail {

// Binds `slot` to the first of `names` the library exports. Returns false (and
// names the missing symbol in `why`) when none is.
template <class Fn>
bool bind_symbol(void* library, Fn& slot, std::initializer_list<const char*> names, std::string& why) {
  for (const char* name : names) {
    if (void* sym = ::dlsym(library, name)) {
      slot = reinterpret_cast<Fn>(sym);
      return true;
    }
  }
  why = std::string("it does not export ") + *names.begin() + " (driver too old?)";
  return false;
}

// Names of the codes most often seen, for when the driver cannot name them
// itself (the toolkit's stub library, a failed cuInit).
inline const char* builtin_error_name(CUresult r) {
  switch (r) {
    case 0: return "CUDA_SUCCESS";
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 4: return "CUDA_ERROR_DEINITIALIZED";
    case 34: return "CUDA_ERROR_STUB_LIBRARY";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 200: return "CUDA_ERROR_INVALID_IMAGE";
    case 201: return "CUDA_ERROR_INVALID_CONTEXT";
    case 209: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case 400: return "CUDA_ERROR_INVALID_HANDLE";
    case 500: return "CUDA_ERROR_NOT_FOUND";
    case 600: return "CUDA_ERROR_NOT_READY";
    case 700: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case 701: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    case 719: return "CUDA_ERROR_LAUNCH_FAILED";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}

}  // namespace detail

// dlopens `path` and binds every entry point. Returns false with the reason in
// `why` (nothing thrown); `api.library` is then null. Calls nothing in the
// driver: initialisation is the caller's decision.
inline bool load_driver_library(const char* path, DriverApi& api, std::string& why) {
  api = DriverApi{};
  void* lib = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    why = err ? err : (std::string("cannot dlopen ") + path);
    return false;
  }
  std::string missing;
  bool ok = detail::bind_symbol(lib, api.cuGetErrorName, {"cuGetErrorName"}, missing) &&
            detail::bind_symbol(lib, api.cuGetErrorString, {"cuGetErrorString"}, missing) &&
            detail::bind_symbol(lib, api.cuInit, {"cuInit"}, missing) &&
            detail::bind_symbol(lib, api.cuDriverGetVersion, {"cuDriverGetVersion"}, missing) &&
            detail::bind_symbol(lib, api.cuDeviceGet, {"cuDeviceGet"}, missing) &&
            detail::bind_symbol(lib, api.cuDeviceGetCount, {"cuDeviceGetCount"}, missing) &&
            detail::bind_symbol(lib, api.cuDeviceGetName, {"cuDeviceGetName"}, missing) &&
            detail::bind_symbol(lib, api.cuDeviceGetAttribute, {"cuDeviceGetAttribute"}, missing) &&
            detail::bind_symbol(lib, api.cuDeviceTotalMem, {"cuDeviceTotalMem_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}, missing) &&
            detail::bind_symbol(lib, api.cuDevicePrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuCtxGetCurrent, {"cuCtxGetCurrent"}, missing) &&
            detail::bind_symbol(lib, api.cuCtxSetCurrent, {"cuCtxSetCurrent"}, missing) &&
            detail::bind_symbol(lib, api.cuCtxSynchronize, {"cuCtxSynchronize"}, missing) &&
            detail::bind_symbol(lib, api.cuMemGetInfo, {"cuMemGetInfo_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemAlloc, {"cuMemAlloc_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemFree, {"cuMemFree_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemcpyHtoD, {"cuMemcpyHtoD_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemcpyDtoH, {"cuMemcpyDtoH_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemcpyDtoD, {"cuMemcpyDtoD_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemcpyPeerAsync, {"cuMemcpyPeerAsync"}, missing) &&
            detail::bind_symbol(lib, api.cuMemsetD8, {"cuMemsetD8_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemsetD32, {"cuMemsetD32_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuMemsetD8Async, {"cuMemsetD8Async"}, missing) &&
            detail::bind_symbol(lib, api.cuMemsetD32Async, {"cuMemsetD32Async"}, missing) &&
            detail::bind_symbol(lib, api.cuModuleLoadData, {"cuModuleLoadData"}, missing) &&
            detail::bind_symbol(lib, api.cuModuleGetFunction, {"cuModuleGetFunction"}, missing) &&
            detail::bind_symbol(lib, api.cuModuleUnload, {"cuModuleUnload"}, missing) &&
            detail::bind_symbol(lib, api.cuLaunchKernel, {"cuLaunchKernel"}, missing) &&
            detail::bind_symbol(lib, api.cuFuncGetAttribute, {"cuFuncGetAttribute"}, missing) &&
            detail::bind_symbol(lib, api.cuFuncSetAttribute, {"cuFuncSetAttribute"}, missing) &&
            detail::bind_symbol(lib, api.cuOccupancyMaxActiveBlocksPerMultiprocessor,
                                {"cuOccupancyMaxActiveBlocksPerMultiprocessor"}, missing) &&
            detail::bind_symbol(lib, api.cuStreamCreate, {"cuStreamCreate"}, missing) &&
            detail::bind_symbol(lib, api.cuStreamDestroy, {"cuStreamDestroy_v2"}, missing) &&
            detail::bind_symbol(lib, api.cuStreamSynchronize, {"cuStreamSynchronize"}, missing) &&
            detail::bind_symbol(lib, api.cuStreamQuery, {"cuStreamQuery"}, missing) &&
            detail::bind_symbol(lib, api.cuEventCreate, {"cuEventCreate"}, missing) &&
            detail::bind_symbol(lib, api.cuEventRecord, {"cuEventRecord"}, missing) &&
            detail::bind_symbol(lib, api.cuStreamWaitEvent, {"cuStreamWaitEvent"}, missing) &&
            detail::bind_symbol(lib, api.cuEventSynchronize, {"cuEventSynchronize"}, missing) &&
            detail::bind_symbol(lib, api.cuEventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"},
                                missing) &&
            detail::bind_symbol(lib, api.cuEventDestroy, {"cuEventDestroy_v2"}, missing);
  if (!ok) {
    why = std::string(path) + ": " + missing;
    api = DriverApi{};
    ::dlclose(lib);
    return false;
  }
  std::string optional;
  detail::bind_symbol(lib, api.cuTensorMapEncodeTiled, {"cuTensorMapEncodeTiled"}, optional);
  detail::bind_symbol(lib, api.cuLaunchKernelEx, {"cuLaunchKernelEx"}, optional);
  detail::bind_symbol(lib, api.cuGraphCreate, {"cuGraphCreate"}, optional);
  detail::bind_symbol(lib, api.cuGraphAddKernelNode, {"cuGraphAddKernelNode_v2"}, optional);
  detail::bind_symbol(lib, api.cuGraphAddDependencies, {"cuGraphAddDependencies_v2"}, optional);
  detail::bind_symbol(lib, api.cuGraphInstantiate, {"cuGraphInstantiateWithFlags"}, optional);
  detail::bind_symbol(lib, api.cuGraphExecKernelNodeSetParams, {"cuGraphExecKernelNodeSetParams_v2"}, optional);
  detail::bind_symbol(lib, api.cuGraphLaunch, {"cuGraphLaunch"}, optional);
  detail::bind_symbol(lib, api.cuGraphExecDestroy, {"cuGraphExecDestroy"}, optional);
  detail::bind_symbol(lib, api.cuGraphDestroy, {"cuGraphDestroy"}, optional);
  detail::bind_symbol(lib, api.cuCtxGetStreamPriorityRange, {"cuCtxGetStreamPriorityRange"}, optional);
  detail::bind_symbol(lib, api.cuGraphKernelNodeSetAttribute, {"cuGraphKernelNodeSetAttribute"}, optional);
  api.library = lib;
  api.path = path;
  return true;
}

// What the process found when it first looked for the driver.
struct DriverState {
  DriverApi api;
  bool loaded = false;     // library opened, every symbol bound, cuInit succeeded
  int device_count = 0;    // 0 unless loaded
  int driver_version = 0;  // e.g. 13000 for CUDA 13.0; 0 unless loaded
  std::string why;         // why not usable, when !loaded or device_count == 0
};

namespace detail {

inline std::string driver_error_text(const DriverApi& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(r, &name) != kSuccess) name = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(r, &text) != kSuccess) text = nullptr;
  if (name == nullptr) name = builtin_error_name(r);
  std::string out = name ? name : "CUDA error " + std::to_string(r);
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

inline DriverState probe_driver() noexcept {
  DriverState s;
  try {
    std::string why_all;
    for (const char* candidate : {"libcuda.so.1", "libcuda.so"}) {
      std::string why;
      if (load_driver_library(candidate, s.api, why)) break;
      why_all += (why_all.empty() ? "" : "; ") + why;
    }
    if (s.api.library == nullptr) {
      s.why = "the CUDA driver library was not found (" + why_all + ")";
      return s;
    }
    // NOTE: the handle is never dlclosed: unloading the driver while any
    // context, module or allocation may still exist is undefined behaviour.
    if (CUresult r = s.api.cuInit(0); r != kSuccess) {
      s.why = "cuInit failed: " + driver_error_text(s.api, r) + " [" + s.api.path + "]";
      return s;
    }
    if (CUresult r = s.api.cuDeviceGetCount(&s.device_count); r != kSuccess) {
      s.why = "cuDeviceGetCount failed: " + driver_error_text(s.api, r);
      s.device_count = 0;
      return s;
    }
    if (s.api.cuDriverGetVersion(&s.driver_version) != kSuccess) s.driver_version = 0;
    s.loaded = true;
    if (s.device_count == 0) s.why = "the CUDA driver reports no device";
  } catch (...) {  // std::bad_alloc from the strings: report, never escape
    s.loaded = false;
    s.why = "probing the CUDA driver failed";
  }
  return s;
}

}  // namespace detail

// Looked up once per process (thread-safe); never throws.
inline const DriverState& driver_state() noexcept {
  static const DriverState state = detail::probe_driver();
  return state;
}

// True when the driver is loaded, initialised and has at least one device.
inline bool cuda_available() noexcept {
  const DriverState& s = driver_state();
  return s.loaded && s.device_count > 0;
}

// 0 when CUDA is not available.
inline int cuda_device_count() noexcept { return cuda_available() ? driver_state().device_count : 0; }

// Why cuda_available() is false ("" when it is true).
inline std::string cuda_unavailable_reason() {
  return cuda_available() ? std::string() : driver_state().why;
}

// The loaded driver. Throws kiln::Error saying why when there is none.
inline const DriverApi& driver() {
  const DriverState& s = driver_state();
  if (!s.loaded || s.device_count == 0) throw Error("kiln: CUDA is not available: " + s.why);
  return s.api;
}

// "CUDA_ERROR_X (text)" for a code; works before and without the driver.
inline std::string error_text(CUresult r) { return detail::driver_error_text(driver_state().api, r); }

// Throws kiln::Error naming the code, its description and `what` (the call and
// whatever the caller knows: the kernel, the size) unless r is CUDA_SUCCESS.
inline void check(CUresult r, std::string_view what) {
  if (r == kSuccess) [[likely]]
    return;
  throw Error("kiln: CUDA error " + error_text(r) + " in " + std::string(what));
}

// Facts about one device that kernels are generated and launched against.
struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int warp_size = 32;
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int max_block_dim[3] = {0, 0, 0};
  int max_grid_dim[3] = {0, 0, 0};
  int max_shared_per_block = 0;        // without opt-in (48 KiB)
  int max_shared_per_block_optin = 0;  // with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
  int max_shared_per_sm = 0;
  int max_registers_per_block = 0;
  int l2_bytes = 0;
  size_t total_memory = 0;

  int cc() const { return cc_major * 10 + cc_minor; }  // 90 for sm_90
};

namespace detail {

inline DeviceProperties read_device_properties(int ordinal) {
  const DriverApi& api = driver();
  std::string where = " (device " + std::to_string(ordinal) + ")";
  CUdevice dev = 0;
  check(api.cuDeviceGet(&dev, ordinal), "cuDeviceGet" + where);
  DeviceProperties p;
  p.ordinal = ordinal;
  char name[256] = {};
  check(api.cuDeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName" + where);
  p.name = name;
  auto attr = [&](int attribute, int& out) {
    check(api.cuDeviceGetAttribute(&out, attribute, dev),
          "cuDeviceGetAttribute(" + std::to_string(attribute) + ")" + where);
  };
  attr(kAttrComputeCapabilityMajor, p.cc_major);
  attr(kAttrComputeCapabilityMinor, p.cc_minor);
  attr(kAttrMultiprocessorCount, p.sm_count);
  attr(kAttrWarpSize, p.warp_size);
  attr(kAttrMaxThreadsPerBlock, p.max_threads_per_block);
  attr(kAttrMaxThreadsPerMultiprocessor, p.max_threads_per_sm);
  attr(kAttrMaxBlockDimX, p.max_block_dim[0]);
  attr(kAttrMaxBlockDimY, p.max_block_dim[1]);
  attr(kAttrMaxBlockDimZ, p.max_block_dim[2]);
  attr(kAttrMaxGridDimX, p.max_grid_dim[0]);
  attr(kAttrMaxGridDimY, p.max_grid_dim[1]);
  attr(kAttrMaxGridDimZ, p.max_grid_dim[2]);
  attr(kAttrMaxSharedMemoryPerBlock, p.max_shared_per_block);
  attr(kAttrMaxSharedMemoryPerBlockOptin, p.max_shared_per_block_optin);
  attr(kAttrMaxSharedMemoryPerMultiprocessor, p.max_shared_per_sm);
  attr(kAttrMaxRegistersPerBlock, p.max_registers_per_block);
  attr(kAttrL2CacheSize, p.l2_bytes);
  check(api.cuDeviceTotalMem(&p.total_memory, dev), "cuDeviceTotalMem" + where);
  return p;
}

}  // namespace detail

// Read once per device, then served from memory; the reference stays valid for
// the life of the process. Throws kiln::Error for a bad ordinal or no CUDA.
inline const DeviceProperties& device_properties(int ordinal) {
  int count = cuda_device_count();
  if (ordinal < 0 || ordinal >= count) {
    if (!cuda_available()) driver();  // throws with the reason
    throw Error("kiln: no CUDA device " + std::to_string(ordinal) + " (this machine has " + std::to_string(count) +
                ")");
  }
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceProperties>> cache(static_cast<size_t>(count));
  std::lock_guard lock(mutex);
  auto& slot = cache[static_cast<size_t>(ordinal)];
  if (!slot) slot = std::make_unique<DeviceProperties>(detail::read_device_properties(ordinal));
  return *slot;
}

}  // namespace kiln::cu
