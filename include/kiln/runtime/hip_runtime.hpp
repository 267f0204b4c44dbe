// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The hip backend's runtime, below code generation: AMD GPUs under ROCm. Takes
// in nothing at build time (no HIP header, nothing linked); at run time dlopens
// libamdhip64 and gives out, mirroring the CUDA layer (cuda_driver.hpp and
// cuda_runtime.hpp) name for name so that everything above can be shared:
//   * the API table (HipApi), hip_available() (never throws: a binary built once
//     runs where there is no AMD GPU), check(), each device's properties (the
//     gcnArchName target such as "gfx90a:sramecc+:xnack-", the warp size: 64 on
//     CDNA, 32 on RDNA);
//   * per device one stream, the shared caching allocator (caching_allocator.hpp)
//     with DeviceBuffer handles, host<->device copies and fills, modules compiled
//     and loaded once (memory map -> jit/hiprtc.hpp's disk cache -> hipRTC),
//     HipFunction::launch with every call checked, and an event timer.
//
// HIP has one library where CUDA has two (driver and runtime), and no contexts:
// the current device is per thread (hipSetDevice), so make_current() sets it.
//
// The types and constants below are HIP's ABI as hip_runtime_api.h declares it
// in ROCm 5 and 6 (the attribute numbers kiln uses did not move between them).
// NOTE: hipDeviceProp_t changed layout in ROCm 6 (hipGetDevicePropertiesR0600);
// only gcnArchName is read from it, at the offset of whichever entry point the
// library exports, and checked (see read_arch_name).
//
// Streams, errors, lifetime: as in cuda_runtime.hpp. One stream per device orders
// launches, copies and fills, which is what makes reuse of released blocks safe;
// a faulting kernel is reported at the next synchronisation naming the last
// kernel launched (KILN_HIP_SYNC=1 synchronises after every launch); devices,
// allocators and modules are never destroyed. kiln::Storage on a hip device
// reaches this layer through hooks the hip backend registers, as
// runtime/cuda_backend.hpp does for cuda.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/jit/hiprtc.hpp"
#include "kiln/runtime/caching_allocator.hpp"
#include "kiln/runtime/counters.hpp"

// Opaque handle types, declared with HIP's own tags so that a program which also
// includes <hip/hip_runtime.h> can pass its handles to kiln unchanged.
struct ihipStream_t;
struct ihipModule_t;
struct ihipModuleSymbol_t;
struct ihipEvent_t;

// NOTE: `kiln::rocm`, not `kiln::hip`: core/device.hpp declares the function
// kiln::hip(int) (a device), and a namespace may not share its name.
namespace kiln::rocm {

using hipError_t = int;  // hip_runtime_api.h: enum hipError_t; passed and returned as int
using hipDevice_t = int;
using hipDeviceptr_t = void*;
using hipStream_t = ::ihipStream_t*;
using hipModule_t = ::ihipModule_t*;
using hipFunction_t = ::ihipModuleSymbol_t*;
using hipEvent_t = ::ihipEvent_t*;

// hipError_t values kiln tests for by name.
inline constexpr hipError_t kSuccess = 0;
inline constexpr hipError_t kErrorInvalidValue = 1;
inline constexpr hipError_t kErrorOutOfMemory = 2;
inline constexpr hipError_t kErrorNotInitialized = 3;
inline constexpr hipError_t kErrorNoDevice = 100;
inline constexpr hipError_t kErrorInvalidDevice = 101;
inline constexpr hipError_t kErrorNotReady = 600;

// hipDeviceAttribute_t values (the same in ROCm 5 and 6).
inline constexpr int kAttrL2CacheSize = 19;
inline constexpr int kAttrComputeCapabilityMajor = 23;
inline constexpr int kAttrMaxBlockDimX = 26;
inline constexpr int kAttrMaxBlockDimY = 27;
inline constexpr int kAttrMaxBlockDimZ = 28;
inline constexpr int kAttrMaxGridDimX = 29;
inline constexpr int kAttrMaxGridDimY = 30;
inline constexpr int kAttrMaxGridDimZ = 31;
inline constexpr int kAttrMaxThreadsPerBlock = 56;
inline constexpr int kAttrMaxThreadsPerMultiprocessor = 57;
inline constexpr int kAttrComputeCapabilityMinor = 61;
inline constexpr int kAttrMultiprocessorCount = 63;
inline constexpr int kAttrMaxRegistersPerBlock = 71;
inline constexpr int kAttrMaxSharedMemoryPerBlock = 74;
inline constexpr int kAttrWarpSize = 87;
inline constexpr int kAttrMaxSharedMemoryPerMultiprocessor = 10002;  // AMD-specific range

// hipFunction_attribute values (as CUDA's).
inline constexpr int kFuncAttrMaxThreadsPerBlock = 0;
inline constexpr int kFuncAttrSharedSizeBytes = 1;
inline constexpr int kFuncAttrLocalSizeBytes = 3;
inline constexpr int kFuncAttrNumRegs = 4;

// hipMemcpyKind values.
inline constexpr int kMemcpyHostToDevice = 1;
inline constexpr int kMemcpyDeviceToHost = 2;
inline constexpr int kMemcpyDeviceToDevice = 3;

// Stream and event creation flags.
inline constexpr unsigned kStreamDefault = 0x0;  // synchronises with the NULL stream
inline constexpr unsigned kStreamNonBlocking = 0x1;
inline constexpr unsigned kEventDefault = 0x0;
inline constexpr unsigned kEventDisableTiming = 0x2;

// Where gcnArchName sits in the two hipDeviceProp_t layouts (computed from the
// ROCm 5.2 and ROCm 6 headers with offsetof, x86-64).
inline constexpr size_t kGcnArchNameOffsetR0000 = 396;
inline constexpr size_t kGcnArchNameOffsetR0600 = 1160;

// The entry points kiln calls, named as hip_runtime_api.h names them.
struct HipApi {
  void* library = nullptr;  // dlopen handle; never closed (see hip_state())
  std::string path;         // what was dlopened

  const char* (*hipGetErrorName)(hipError_t) = nullptr;
  const char* (*hipGetErrorString)(hipError_t) = nullptr;
  hipError_t (*hipInit)(unsigned) = nullptr;
  hipError_t (*hipRuntimeGetVersion)(int*) = nullptr;
  hipError_t (*hipGetDeviceCount)(int*) = nullptr;
  hipError_t (*hipGetDevice)(int*) = nullptr;
  hipError_t (*hipSetDevice)(int) = nullptr;
  hipError_t (*hipDeviceGet)(hipDevice_t*, int) = nullptr;
  hipError_t (*hipDeviceGetName)(char*, int, hipDevice_t) = nullptr;
  hipError_t (*hipDeviceGetAttribute)(int*, int, int) = nullptr;
  hipError_t (*hipDeviceTotalMem)(size_t*, hipDevice_t) = nullptr;
  hipError_t (*hipGetDeviceProperties)(void*, int) = nullptr;       // ROCm 5 layout (R0000)
  hipError_t (*hipGetDevicePropertiesR0600)(void*, int) = nullptr;  // ROCm 6+ only; optional
  hipError_t (*hipDeviceSynchronize)() = nullptr;
  hipError_t (*hipMemGetInfo)(size_t*, size_t*) = nullptr;
  hipError_t (*hipMalloc)(void**, size_t) = nullptr;
  hipError_t (*hipFree)(void*) = nullptr;
  hipError_t (*hipMemcpyAsync)(void*, const void*, size_t, int, hipStream_t) = nullptr;
  hipError_t (*hipMemcpyPeerAsync)(void*, int, const void*, int, size_t, hipStream_t) = nullptr;
  hipError_t (*hipMemsetD8Async)(hipDeviceptr_t, unsigned char, size_t, hipStream_t) = nullptr;
  hipError_t (*hipMemsetD32Async)(hipDeviceptr_t, int, size_t, hipStream_t) = nullptr;
  hipError_t (*hipModuleLoadData)(hipModule_t*, const void*) = nullptr;
  hipError_t (*hipModuleGetFunction)(hipFunction_t*, hipModule_t, const char*) = nullptr;
  hipError_t (*hipModuleUnload)(hipModule_t) = nullptr;
  hipError_t (*hipModuleLaunchKernel)(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, hipStream_t, void**, void**) = nullptr;
  hipError_t (*hipFuncGetAttribute)(int*, int, hipFunction_t) = nullptr;
  hipError_t (*hipModuleOccupancyMaxActiveBlocksPerMultiprocessor)(int*, hipFunction_t, int, size_t) = nullptr;
  hipError_t (*hipStreamCreateWithFlags)(hipStream_t*, unsigned) = nullptr;
  hipError_t (*hipStreamDestroy)(hipStream_t) = nullptr;
  hipError_t (*hipStreamSynchronize)(hipStream_t) = nullptr;
  hipError_t (*hipStreamQuery)(hipStream_t) = nullptr;
  hipError_t (*hipEventCreateWithFlags)(hipEvent_t*, unsigned) = nullptr;
  hipError_t (*hipEventRecord)(hipEvent_t, hipStream_t) = nullptr;
  hipError_t (*hipStreamWaitEvent)(hipStream_t, hipEvent_t, unsigned) = nullptr;
  hipError_t (*hipEventSynchronize)(hipEvent_t) = nullptr;
  hipError_t (*hipEventElapsedTime)(float*, hipEvent_t, hipEvent_t) = nullptr;
  hipError_t (*hipEventDestroy)(hipEvent_t) = nullptr;
};

namespace detail {

template <class Fn>
bool bind_hip(void* library, Fn& slot, const char* name) {
  slot = reinterpret_cast<Fn>(::dlsym(library, name));
  return slot != nullptr;
}

// Names of the codes most often seen, for when the library cannot name them.
inline const char* builtin_error_name(hipError_t r) {
  switch (r) {
    case 0: return "hipSuccess";
    case 1: return "hipErrorInvalidValue";
    case 2: return "hipErrorOutOfMemory";
    case 3: return "hipErrorNotInitialized";
    case 100: return "hipErrorNoDevice";
    case 101: return "hipErrorInvalidDevice";
    case 200: return "hipErrorInvalidImage";
    case 209: return "hipErrorNoBinaryForGpu";
    case 400: return "hipErrorInvalidHandle";
    case 500: return "hipErrorNotFound";
    case 600: return "hipErrorNotReady";
    case 700: return "hipErrorIllegalAddress";
    case 701: return "hipErrorLaunchOutOfResources";
    case 719: return "hipErrorLaunchFailure";
    case 999: return "hipErrorUnknown";
    default: return nullptr;
  }
}

}  // namespace detail

// dlopens `path` and binds every entry point. Returns false with the reason in
// `why` (nothing thrown); `api.library` is then null. Calls nothing in HIP.
inline bool load_hip_library(const char* path, HipApi& api, std::string& why) {
  api = HipApi{};
  void* lib = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    why = err ? err : (std::string("cannot dlopen ") + path);
    return false;
  }
  const char* missing = nullptr;
  auto need = [&](auto& slot, const char* name) {
    if (missing == nullptr && !detail::bind_hip(lib, slot, name)) missing = name;
  };
  need(api.hipGetErrorName, "hipGetErrorName");
  need(api.hipGetErrorString, "hipGetErrorString");
  need(api.hipInit, "hipInit");
  need(api.hipRuntimeGetVersion, "hipRuntimeGetVersion");
  need(api.hipGetDeviceCount, "hipGetDeviceCount");
  need(api.hipGetDevice, "hipGetDevice");
  need(api.hipSetDevice, "hipSetDevice");
  need(api.hipDeviceGet, "hipDeviceGet");
  need(api.hipDeviceGetName, "hipDeviceGetName");
  need(api.hipDeviceGetAttribute, "hipDeviceGetAttribute");
  need(api.hipDeviceTotalMem, "hipDeviceTotalMem");
  need(api.hipGetDeviceProperties, "hipGetDeviceProperties");
  need(api.hipDeviceSynchronize, "hipDeviceSynchronize");
  need(api.hipMemGetInfo, "hipMemGetInfo");
  need(api.hipMalloc, "hipMalloc");
  need(api.hipFree, "hipFree");
  need(api.hipMemcpyAsync, "hipMemcpyAsync");
  need(api.hipMemcpyPeerAsync, "hipMemcpyPeerAsync");
  need(api.hipMemsetD8Async, "hipMemsetD8Async");
  need(api.hipMemsetD32Async, "hipMemsetD32Async");
  need(api.hipModuleLoadData, "hipModuleLoadData");
  need(api.hipModuleGetFunction, "hipModuleGetFunction");
  need(api.hipModuleUnload, "hipModuleUnload");
  need(api.hipModuleLaunchKernel, "hipModuleLaunchKernel");
  need(api.hipFuncGetAttribute, "hipFuncGetAttribute");
  need(api.hipModuleOccupancyMaxActiveBlocksPerMultiprocessor, "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor");
  need(api.hipStreamCreateWithFlags, "hipStreamCreateWithFlags");
  need(api.hipStreamDestroy, "hipStreamDestroy");
  need(api.hipStreamSynchronize, "hipStreamSynchronize");
  need(api.hipStreamQuery, "hipStreamQuery");
  need(api.hipEventCreateWithFlags, "hipEventCreateWithFlags");
  need(api.hipEventRecord, "hipEventRecord");
  need(api.hipStreamWaitEvent, "hipStreamWaitEvent");
  need(api.hipEventSynchronize, "hipEventSynchronize");
  need(api.hipEventElapsedTime, "hipEventElapsedTime");
  need(api.hipEventDestroy, "hipEventDestroy");
  if (missing != nullptr) {
    why = std::string(path) + ": it does not export " + missing + " (HIP too old?)";
    api = HipApi{};
    ::dlclose(lib);
    return false;
  }
  detail::bind_hip(lib, api.hipGetDevicePropertiesR0600, "hipGetDevicePropertiesR0600");
  api.library = lib;
  api.path = path;
  return true;
}

// What the process found when it first looked for HIP.
struct HipState {
  HipApi api;
  bool loaded = false;      // library opened, every symbol bound, hipInit succeeded
  int device_count = 0;     // 0 unless loaded
  int runtime_version = 0;  // e.g. 50221153 for HIP 5.2.21153; 0 unless loaded
  std::string why;          // why not usable, when !loaded or device_count == 0
};

namespace detail {

inline std::string hip_error_text(const HipApi& api, hipError_t r) {
  const char* name = api.hipGetErrorName ? api.hipGetErrorName(r) : nullptr;
  const char* text = api.hipGetErrorString ? api.hipGetErrorString(r) : nullptr;
  // NOTE: HIP names unknown codes "hipErrorUnknown"; prefer our table then.
  if (name == nullptr || (r != 999 && std::strcmp(name, "hipErrorUnknown") == 0)) name = builtin_error_name(r);
  std::string out = name ? name : "HIP error " + std::to_string(r);
  if (text != nullptr && *text != '\0' && (name == nullptr || std::strcmp(text, name) != 0)) {
    out += std::string(" (") + text + ")";
  }
  return out;
}

inline HipState probe_hip() noexcept {
  HipState s;
  try {
    std::string why_all;
    for (const char* candidate : {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
                                  "/opt/rocm/lib/libamdhip64.so"}) {
      std::string why;
      if (load_hip_library(candidate, s.api, why)) break;
      why_all += (why_all.empty() ? "" : "; ") + why;
    }
    if (s.api.library == nullptr) {
      s.why = "the HIP runtime library was not found (" + why_all + ")";
      return s;
    }
    // NOTE: the handle is never dlclosed: unloading HIP while any module or
    // allocation may still exist is undefined behaviour.
    // NOTE: without a GPU (no /dev/kfd) hipInit answers hipErrorInvalidDevice or
    // hipErrorNoDevice: an ordinary "no AMD GPU here", not a failure.
    if (hipError_t r = s.api.hipInit(0); r != kSuccess) {
      s.why = "hipInit failed: " + hip_error_text(s.api, r) + " [" + s.api.path + "]";
      return s;
    }
    if (hipError_t r = s.api.hipGetDeviceCount(&s.device_count); r != kSuccess) {
      s.why = "hipGetDeviceCount failed: " + hip_error_text(s.api, r);
      s.device_count = 0;
      return s;
    }
    if (s.api.hipRuntimeGetVersion(&s.runtime_version) != kSuccess) s.runtime_version = 0;
    s.loaded = true;
    if (s.device_count == 0) s.why = "the HIP runtime reports no device";
  } catch (...) {  // std::bad_alloc from the strings: report, never escape
    s.loaded = false;
    s.why = "probing the HIP runtime failed";
  }
  return s;
}

}  // namespace detail

// Looked up once per process (thread-safe); never throws.
inline const HipState& hip_state() noexcept {
  static const HipState state = detail::probe_hip();
  return state;
}

// True when HIP is loaded, initialised and has at least one device.
inline bool hip_available() noexcept {
  const HipState& s = hip_state();
  return s.loaded && s.device_count > 0;
}

// 0 when HIP is not available.
inline int hip_device_count() noexcept { return hip_available() ? hip_state().device_count : 0; }

// Why hip_available() is false ("" when it is true).
inline std::string hip_unavailable_reason() { return hip_available() ? std::string() : hip_state().why; }

// The loaded HIP runtime. Throws kiln::Error saying why when there is none.
inline const HipApi& hip_api() {
  const HipState& s = hip_state();
  if (!s.loaded || s.device_count == 0) throw Error("kiln: HIP is not available: " + s.why);
  return s.api;
}

// "hipErrorX (text)" for a code; works before and without HIP.
inline std::string error_text(hipError_t r) { return detail::hip_error_text(hip_state().api, r); }

// Throws kiln::Error naming the code, its description and `what` (the call and
// whatever the caller knows: the kernel, the size) unless r is hipSuccess.
inline void check(hipError_t r, std::string_view what) {
  if (r == kSuccess) [[likely]]
    return;
  throw Error("kiln: HIP error " + error_text(r) + " in " + std::string(what));
}

// Facts about one device that kernels are generated and launched against. The
// field names are cuda_driver.hpp's; an AMD compute unit is an "sm", a
// wavefront a "warp".
struct DeviceProperties {
  int ordinal = 0;
  std::string name;
  std::string arch;  // gcnArchName, the hipRTC target: "gfx90a:sramecc+:xnack-", "gfx1030"
  int cc_major = 0, cc_minor = 0;  // HIP's emulated compute capability (9.0 on gfx90a)
  int sm_count = 0;
  int warp_size = 64;  // 64 on CDNA (gfx9), 32 on RDNA (gfx10+)
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int max_block_dim[3] = {0, 0, 0};
  int max_grid_dim[3] = {0, 0, 0};
  int max_shared_per_block = 0;        // LDS per workgroup (64 KiB)
  int max_shared_per_block_optin = 0;  // the same: AMD has no opt-in
  int max_shared_per_sm = 0;
  int max_registers_per_block = 0;
  int l2_bytes = 0;
  size_t total_memory = 0;

  // "gfx90a" for "gfx90a:sramecc+:xnack-".
  std::string arch_base() const { return arch.substr(0, arch.find(':')); }
};

namespace detail {

// gcnArchName from hipGetDeviceProperties. The struct's layout depends on the
// HIP release, so read it at the offset the exported entry point implies, and
// accept it only if it looks like a target; else scan past `name` for one.
inline std::string read_arch_name(const HipApi& api, int ordinal) {
  std::vector<unsigned char> buffer(8192, 0);  // larger than any hipDeviceProp_t
  unsigned char* props = buffer.data();
  size_t offset = kGcnArchNameOffsetR0000;
  std::string where = " (device " + std::to_string(ordinal) + ")";
  if (api.hipGetDevicePropertiesR0600 != nullptr) {
    check(api.hipGetDevicePropertiesR0600(props, ordinal), "hipGetDevicePropertiesR0600" + where);
    offset = kGcnArchNameOffsetR0600;
  } else {
    check(api.hipGetDeviceProperties(props, ordinal), "hipGetDeviceProperties" + where);
  }
  auto target_at = [&](size_t at) -> std::string {
    const char* s = reinterpret_cast<const char*>(props + at);
    size_t n = ::strnlen(s, std::min<size_t>(256, buffer.size() - at));
    std::string out(s, n);
    return jit::detail::valid_hip_arch(out) && out.size() > 3 && out[3] >= '0' && out[3] <= '9' ? out : "";
  };
  if (std::string arch = target_at(offset); !arch.empty()) return arch;
  for (size_t at = 256; at + 4 < buffer.size(); ++at) {
    if (props[at] == 'g' && props[at - 1] == '\0' && std::memcmp(props + at, "gfx", 3) == 0) {
      if (std::string arch = target_at(at); !arch.empty()) return arch;
    }
  }
  throw Error("kiln: cannot read the gcnArchName of HIP device " + std::to_string(ordinal) +
              " from hipGetDeviceProperties (" + hip_state().api.path + ")");
}

inline DeviceProperties read_device_properties(int ordinal) {
  const HipApi& api = hip_api();
  std::string where = " (device " + std::to_string(ordinal) + ")";
  hipDevice_t dev = 0;
  check(api.hipDeviceGet(&dev, ordinal), "hipDeviceGet" + where);
  DeviceProperties p;
  p.ordinal = ordinal;
  char name[256] = {};
  check(api.hipDeviceGetName(name, sizeof name - 1, dev), "hipDeviceGetName" + where);
  p.name = name;
  p.arch = read_arch_name(api, ordinal);
  auto attr = [&](int attribute, int& out) {
    check(api.hipDeviceGetAttribute(&out, attribute, ordinal),
          "hipDeviceGetAttribute(" + std::to_string(attribute) + ")" + where);
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
  p.max_shared_per_block_optin = p.max_shared_per_block;
  attr(kAttrMaxSharedMemoryPerMultiprocessor, p.max_shared_per_sm);
  attr(kAttrMaxRegistersPerBlock, p.max_registers_per_block);
  attr(kAttrL2CacheSize, p.l2_bytes);
  check(api.hipDeviceTotalMem(&p.total_memory, dev), "hipDeviceTotalMem" + where);
  // This HIP enumerated the device, so its release knows the target: tell
  // hipRTC, rather than have it probe in a forked child of a process that now
  // holds an initialised GPU runtime (HSA state does not survive fork).
  jit::hiprtc_mark_target_supported(p.arch);
  return p;
}

}  // namespace detail

// Read once per device, then served from memory; the reference stays valid for
// the life of the process. Throws kiln::Error for a bad ordinal or no HIP.
inline const DeviceProperties& device_properties(int ordinal) {
  int count = hip_device_count();
  if (ordinal < 0 || ordinal >= count) {
    if (!hip_available()) hip_api();  // throws with the reason
    throw Error("kiln: no HIP device " + std::to_string(ordinal) + " (this machine has " + std::to_string(count) +
                ")");
  }
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceProperties>> cache(static_cast<size_t>(count));
  std::lock_guard lock(mutex);
  auto& slot = cache[static_cast<size_t>(ordinal)];
  if (!slot) slot = std::make_unique<DeviceProperties>(detail::read_device_properties(ordinal));
  return *slot;
}

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// ---- sync mode ------------------------------------------------------------------

namespace detail {
inline std::atomic<bool>& sync_mode_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("KILN_HIP_SYNC");
    return env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0;
  }();
  return flag;
}
}  // namespace detail

// Synchronise after every launch and check (KILN_HIP_SYNC=1 at start-up). Slow;
// for finding which kernel faults.
inline bool sync_mode() { return detail::sync_mode_flag().load(std::memory_order_relaxed); }
inline void set_sync_mode(bool on) { detail::sync_mode_flag().store(on, std::memory_order_relaxed); }

// ---- devices, allocator, kernels and modules ----------------------------------

class HipDevice;

namespace detail {

// The thin part of the caching allocator (runtime/caching_allocator.hpp).
struct HipAllocatorBackend {
  using Pointer = void*;
  HipDevice* device = nullptr;

  inline bool try_allocate(size_t bytes, void*& out);
  inline void free(void* p);
  inline void wait_idle();
  inline int ordinal() const;
  inline std::string memory_report() const;
};

// One kernel of a loaded module; its address is stable for the process.
struct KernelState {
  hipFunction_t function = nullptr;
  std::string name;
  HipDevice* device = nullptr;
  int max_threads_per_block = 0;
  int static_shared_bytes = 0;
  std::atomic<int> dynamic_shared_limit{0};  // LDS per block minus the static part
};

}  // namespace detail

using CachingAllocator = ::kiln::CachingAllocator<detail::HipAllocatorBackend>;
using AllocatorStats = CachingAllocatorStats;

// A kernel ready to launch: a cheap handle, copy it freely.
class HipFunction {
 public:
  HipFunction() = default;
  explicit HipFunction(detail::KernelState* state) : state_(state) {}

  // Launches on `stream` (nullptr: the device's stream). `args` points at each
  // kernel argument, as hipModuleLaunchKernel takes them. `describe` (shapes,
  // sizes) is put into any error. Counts kernels_launched. In sync mode, waits
  // and checks.
  // `programmatic` (CUDA's early start of a dependent kernel) and `priority` (a launch's own
  // priority) have no HIP counterpart: a plain launch.
  inline void launch(Dim3 grid, Dim3 block, unsigned shared_bytes, void** args, const LazyText& describe = {},
                     hipStream_t stream = nullptr, bool programmatic = false, int priority = 0) const;

  // Checks that launches may ask for `bytes` of dynamic shared memory (LDS). AMD
  // has no opt-in: the limit is the device's LDS per block minus the kernel's
  // static LDS; asking for more throws.
  inline void set_max_dynamic_shared_memory(int bytes) const;
  // hipFuncGetAttribute, e.g. kFuncAttrNumRegs.
  inline int attribute(int which) const;
  // Resident blocks per CU for this block size and dynamic shared memory.
  inline int max_active_blocks_per_sm(int block_threads, size_t dynamic_shared_bytes) const;

  const std::string& name() const { return state().name; }
  hipFunction_t handle() const { return state().function; }
  int max_threads_per_block() const { return state().max_threads_per_block; }
  explicit operator bool() const { return state_ != nullptr; }

 private:
  const detail::KernelState& state() const {
    if (state_ == nullptr) throw Error("kiln: use of an empty HipFunction");
    return *state_;
  }
  detail::KernelState* state_ = nullptr;
};

// A loaded hipModule_t (all kernels of one hipRTC program). Lives for the process.
class HipModule {
 public:
  HipModule(HipDevice& device, hipModule_t module, std::string name)
      : device_(device), module_(module), name_(std::move(name)) {}
  HipModule(const HipModule&) = delete;
  HipModule& operator=(const HipModule&) = delete;

  // The kernel `name` (an extern "C" __global__ function of the source). Throws
  // kiln::Error naming the kernel and the module when there is no such kernel.
  inline HipFunction function(std::string_view name);

  hipModule_t handle() const { return module_; }
  const std::string& name() const { return name_; }

 private:
  HipDevice& device_;
  hipModule_t module_;
  std::string name_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<detail::KernelState>> kernels_;
};

class HipEvent;

class HipDevice {
 public:
  // Selects the device and creates its stream.
  explicit HipDevice(int ordinal)
      : ordinal_(ordinal), properties_(device_properties(ordinal)), allocator_(detail::HipAllocatorBackend{this}) {
    const HipApi& api = hip_api();
    std::string where = " (device " + std::to_string(ordinal) + ")";
    check(api.hipSetDevice(ordinal), "hipSetDevice" + where);
    check(api.hipStreamCreateWithFlags(&stream_, kStreamDefault), "hipStreamCreateWithFlags" + where);
  }
  HipDevice(const HipDevice&) = delete;
  HipDevice& operator=(const HipDevice&) = delete;

  int ordinal() const { return ordinal_; }
  const DeviceProperties& properties() const { return properties_; }
  hipStream_t stream() const { return stream_; }
  // The second stream of a call whose kernels overlap (runtime::StreamSchedule), made on first use.
  hipStream_t side_stream() {
    std::call_once(side_once_, [&] {
      make_current();
      check(hip_api().hipStreamCreateWithFlags(&side_stream_, kStreamDefault), "hipStreamCreateWithFlags (device " + std::to_string(ordinal_) + ")");
    });
    return side_stream_;
  }
  // The third stream of such a call: its leaf kernels (kiln::idle_fill).
  hipStream_t fill_stream() {
    std::call_once(fill_once_, [&] {
      make_current();
      check(hip_api().hipStreamCreateWithFlags(&fill_stream_, kStreamDefault), "hipStreamCreateWithFlags (device " + std::to_string(ordinal_) + ")");
    });
    return fill_stream_;
  }
  // No launch has a priority of its own in HIP: the leaves share their streams' priority.
  int raised_priority() const { return 0; }
  // Work queued on `stream` after this waits for what `event` last recorded.
  inline void wait(hipStream_t stream, const HipEvent& event) const;
  CachingAllocator& allocator() { return allocator_; }

  // Makes this device current on the calling thread. Asks HIP rather than
  // trusting a thread_local, because other code may switch devices behind kiln.
  void make_current() const {
    const HipApi& api = hip_api();
    int current = -1;
    if (api.hipGetDevice(&current) == kSuccess && current == ordinal_) return;
    check(api.hipSetDevice(ordinal_), "hipSetDevice (device " + std::to_string(ordinal_) + ")");
  }

  // Waits for the device's stream. A fault of an earlier kernel surfaces here;
  // the error then names the last kernel launched on this device.
  void synchronize() const {
    make_current();
    check_async(hip_api().hipStreamSynchronize(stream_), "hipStreamSynchronize");
  }

  // check() for calls that report earlier asynchronous failures: adds the last
  // kernel launched here and how to find the culprit.
  void check_async(hipError_t r, std::string_view what) const {
    if (r == kSuccess) [[likely]]
      return;
    std::string msg = std::string(what) + " (device " + std::to_string(ordinal_) + ")";
    if (const std::string* last = last_kernel_.load(std::memory_order_relaxed)) {
      msg += "; the last kernel launched on this device was '" + *last + "'";
      if (!sync_mode()) msg += "; set KILN_HIP_SYNC=1 to check each launch";
    }
    check(r, msg);
  }

  void note_launch(const std::string* kernel_name) { last_kernel_.store(kernel_name, std::memory_order_relaxed); }

  // memory map -> disk cache -> hipRTC, then hipModuleLoadData. See load_hip_module.
  inline HipModule& load_module(const std::string& source, const std::vector<std::string>& extra_options,
                                const std::string& name_hint);

 private:
  struct ModuleSlot {
    std::promise<HipModule*> promise;
    std::shared_future<HipModule*> future = promise.get_future().share();
    std::unique_ptr<HipModule> module;
  };

  int ordinal_;
  const DeviceProperties& properties_;
  hipStream_t stream_ = nullptr;
  hipStream_t side_stream_ = nullptr, fill_stream_ = nullptr;
  std::once_flag side_once_, fill_once_;
  CachingAllocator allocator_;
  std::atomic<const std::string*> last_kernel_{nullptr};
  std::mutex modules_mutex_;
  std::unordered_map<Hash128, std::shared_ptr<ModuleSlot>, Hash128Hasher> modules_;
};

// The device `ordinal`, set up on first use (thread-safe). Throws kiln::Error
// when HIP is unavailable or there is no such device.
inline HipDevice& hip_device(int ordinal = 0) {
  struct Table {
    std::mutex mutex;
    std::vector<std::atomic<HipDevice*>> devices;  // NOTE: atomic, so a set-up device is found without the lock
  };
  // NOTE: the table and its devices are never deleted (see the top of this file);
  // a buffer released during static destruction still finds its device here.
  static Table* table = new Table{{}, std::vector<std::atomic<HipDevice*>>(static_cast<size_t>(hip_device_count()))};
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= table->devices.size()) {
    device_properties(ordinal);  // throws saying why: no HIP, or no such device
  }
  std::atomic<HipDevice*>& slot = table->devices[static_cast<size_t>(ordinal)];
  if (HipDevice* dev = slot.load(std::memory_order_acquire)) return *dev;
  std::lock_guard lock(table->mutex);
  HipDevice* dev = slot.load(std::memory_order_relaxed);
  if (dev == nullptr) slot.store(dev = new HipDevice(ordinal), std::memory_order_release);
  return *dev;
}

// ---- allocator backend ---------------------------------------------------------

namespace detail {

inline bool HipAllocatorBackend::try_allocate(size_t bytes, void*& out) {
  device->make_current();
  hipError_t r = hip_api().hipMalloc(&out, bytes);
  if (r == kErrorOutOfMemory) return false;
  check(r, "hipMalloc of " + std::to_string(bytes) + " bytes on device " + std::to_string(device->ordinal()) +
               memory_report());
  return true;
}

inline void HipAllocatorBackend::free(void* p) {
  device->make_current();
  check(hip_api().hipFree(p), "hipFree (device " + std::to_string(device->ordinal()) + ")");
}

inline void HipAllocatorBackend::wait_idle() {
  device->make_current();
  device->check_async(hip_api().hipDeviceSynchronize(), "hipDeviceSynchronize before returning cached memory");
}

inline int HipAllocatorBackend::ordinal() const { return device->ordinal(); }

inline std::string HipAllocatorBackend::memory_report() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (hip_api().hipMemGetInfo(&free_bytes, &total_bytes) != kSuccess) return {};
  return "; " + std::to_string(free_bytes) + " of " + std::to_string(total_bytes) + " bytes free";
}

}  // namespace detail

// Returns every device's cached blocks to HIP (devices not yet used are set up
// first). Never needed for correctness: allocation does it on running out.
inline void empty_cache() {
  for (int i = 0; i < hip_device_count(); ++i) hip_device(i).allocator().empty_cache();
}

// ---- buffers ------------------------------------------------------------------

// Device memory from the caching allocator; copies share the block, which goes
// back to the cache when the last copy is destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, int device) {
    HipDevice& dev = hip_device(device);
    block_ = std::make_shared<Block>();
    block_->device = &dev;
    block_->size = bytes;
    block_->ptr = dev.allocator().allocate(bytes);
  }

  void* ptr() const { return block_ ? block_->ptr : nullptr; }
  void* data() const { return ptr(); }
  size_t size() const { return block_ ? block_->size : 0; }
  int device() const { return block_ ? block_->device->ordinal() : -1; }
  HipDevice& device_ref() const {
    if (!block_) throw Error("kiln: use of an empty DeviceBuffer");
    return *block_->device;
  }
  explicit operator bool() const { return block_ != nullptr; }

 private:
  struct Block {
    HipDevice* device = nullptr;
    void* ptr = nullptr;
    size_t size = 0;
    ~Block() {
      if (ptr == nullptr) return;
      try {
        device->allocator().release(ptr);
      } catch (...) {  // a destructor must not throw; release only fails on a kiln bug
      }
    }
  };
  std::shared_ptr<Block> block_;
};

inline DeviceBuffer device_alloc(size_t bytes, int device = 0) { return DeviceBuffer(bytes, device); }

namespace detail {

inline void check_range(const DeviceBuffer& b, size_t offset, size_t bytes, const char* what) {
  if (!b && bytes != 0) throw Error(std::string("kiln: ") + what + " on an empty DeviceBuffer");
  if (offset > b.size() || bytes > b.size() - offset) {
    throw Error(std::string("kiln: ") + what + " of " + std::to_string(bytes) + " bytes at offset " +
                std::to_string(offset) + " overruns a device buffer of " + std::to_string(b.size()) + " bytes");
  }
}

inline void* offset_ptr(const DeviceBuffer& b, size_t offset) { return static_cast<char*>(b.ptr()) + offset; }

}  // namespace detail

// Host -> device at dst + offset. Returns when the copy is done (the host
// memory may be reused at once).
inline void copy_to_device(const DeviceBuffer& dst, const void* src, size_t bytes, size_t dst_offset = 0) {
  detail::check_range(dst, dst_offset, bytes, "copy to device");
  if (bytes == 0) return;
  HipDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(
      hip_api().hipMemcpyAsync(detail::offset_ptr(dst, dst_offset), src, bytes, kMemcpyHostToDevice, dev.stream()),
      "hipMemcpyAsync (host to device) of " + std::to_string(bytes) + " bytes");
  dev.synchronize();
}

// Device -> host after the device's queued work. Returns when the data is there.
inline void copy_to_host(void* dst, const DeviceBuffer& src, size_t bytes, size_t src_offset = 0) {
  detail::check_range(src, src_offset, bytes, "copy to host");
  if (bytes == 0) return;
  HipDevice& dev = src.device_ref();
  dev.make_current();
  dev.check_async(
      hip_api().hipMemcpyAsync(dst, detail::offset_ptr(src, src_offset), bytes, kMemcpyDeviceToHost, dev.stream()),
      "hipMemcpyAsync (device to host) of " + std::to_string(bytes) + " bytes");
  dev.synchronize();
}

// Device -> device on one device, queued in stream order (does not wait).
inline void copy_on_device(const DeviceBuffer& dst, const DeviceBuffer& src, size_t bytes, size_t dst_offset = 0,
                           size_t src_offset = 0) {
  detail::check_range(dst, dst_offset, bytes, "device copy (destination)");
  detail::check_range(src, src_offset, bytes, "device copy (source)");
  if (bytes == 0) return;
  if (dst.device() != src.device()) {
    throw Error("kiln: copy_on_device between devices " + std::to_string(src.device()) + " and " +
                std::to_string(dst.device()) + "; use copy_bytes with both devices");
  }
  HipDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(hip_api().hipMemcpyAsync(detail::offset_ptr(dst, dst_offset), detail::offset_ptr(src, src_offset),
                                           bytes, kMemcpyDeviceToDevice, dev.stream()),
                  "hipMemcpyAsync (device to device) of " + std::to_string(bytes) + " bytes");
}

// Sets every byte (queued, does not wait).
inline void fill_bytes(const DeviceBuffer& dst, unsigned char value) {
  if (dst.size() == 0) return;
  HipDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(hip_api().hipMemsetD8Async(dst.ptr(), value, dst.size(), dev.stream()), "hipMemsetD8Async");
}

// Sets every 32-bit word (queued, does not wait); e.g. 0xFFFFFFFF poisons float
// output with NaN so a kernel that skips an element is caught. The size must be
// a multiple of 4.
inline void fill_words(const DeviceBuffer& dst, uint32_t value) {
  if (dst.size() % 4 != 0) {
    throw Error("kiln: fill_words on a buffer of " + std::to_string(dst.size()) + " bytes (not a multiple of 4)");
  }
  if (dst.size() == 0) return;
  HipDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(hip_api().hipMemsetD32Async(dst.ptr(), static_cast<int>(value), dst.size() / 4, dev.stream()),
                  "hipMemsetD32Async");
}

template <class T>
DeviceBuffer to_device(const std::vector<T>& host, int device = 0) {
  static_assert(std::is_trivially_copyable_v<T>);
  DeviceBuffer b(host.size() * sizeof(T), device);
  copy_to_device(b, host.data(), host.size() * sizeof(T));
  return b;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& b) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<T> out(b.size() / sizeof(T));
  copy_to_host(out.data(), b, out.size() * sizeof(T));
  return out;
}

// ---- kernel and module bodies --------------------------------------------------

namespace detail {

inline std::string dim_text(Dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

inline std::string launch_text(const KernelState& k, Dim3 grid, Dim3 block, unsigned shared_bytes,
                               const LazyText& describe) {
  std::string out = "kernel '" + k.name + "'";
  if (!describe.empty()) out += " [" + describe.str() + "]";
  out += " grid " + dim_text(grid) + " block " + dim_text(block) + " dynamic shared " + std::to_string(shared_bytes) +
         " bytes on device " + std::to_string(k.device->ordinal());
  uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (k.max_threads_per_block > 0 && threads > static_cast<uint64_t>(k.max_threads_per_block)) {
    out += " (block has " + std::to_string(threads) + " threads; this kernel allows at most " +
           std::to_string(k.max_threads_per_block) + ")";
  }
  return out;
}

}  // namespace detail

inline void HipFunction::set_max_dynamic_shared_memory(int bytes) const {
  const detail::KernelState& k = state();
  if (bytes <= k.dynamic_shared_limit.load(std::memory_order_relaxed)) return;
  const DeviceProperties& p = k.device->properties();
  throw Error("kiln: kernel '" + k.name + "' asks for " + std::to_string(bytes) + " bytes of dynamic shared memory; " +
              p.name + " (" + p.arch + ") allows " + std::to_string(k.dynamic_shared_limit.load()) + " (" +
              std::to_string(p.max_shared_per_block) + " bytes of LDS per block minus " +
              std::to_string(k.static_shared_bytes) + " static)");
}

inline void HipFunction::launch(Dim3 grid, Dim3 block, unsigned shared_bytes, void** args, const LazyText& describe,
                                hipStream_t stream, bool, int) const {
  const detail::KernelState& k = state();
  if (static_cast<int>(shared_bytes) > k.dynamic_shared_limit.load(std::memory_order_relaxed)) {
    set_max_dynamic_shared_memory(static_cast<int>(shared_bytes));
  }
  HipDevice& dev = *k.device;
  dev.make_current();
  hipStream_t s = stream != nullptr ? stream : dev.stream();
  const HipApi& api = hip_api();
  hipError_t r = api.hipModuleLaunchKernel(k.function, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                           shared_bytes, s, args, nullptr);
  if (r != kSuccess) check(r, "hipModuleLaunchKernel of " + detail::launch_text(k, grid, block, shared_bytes, describe));
  ::kiln::detail::counters_state().kernels_launched.fetch_add(1, std::memory_order_relaxed);
  dev.note_launch(&k.name);
  if (sync_mode()) {
    r = api.hipStreamSynchronize(s);
    if (r != kSuccess) {
      check(r, "execution of " + detail::launch_text(k, grid, block, shared_bytes, describe) + " (KILN_HIP_SYNC)");
    }
  }
}

inline int HipFunction::attribute(int which) const {
  const detail::KernelState& k = state();
  int value = 0;
  check(hip_api().hipFuncGetAttribute(&value, which, k.function),
        "hipFuncGetAttribute(" + std::to_string(which) + ") of kernel '" + k.name + "'");
  return value;
}

inline int HipFunction::max_active_blocks_per_sm(int block_threads, size_t dynamic_shared_bytes) const {
  const detail::KernelState& k = state();
  k.device->make_current();
  int blocks = 0;
  check(hip_api().hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.function, block_threads,
                                                                     dynamic_shared_bytes),
        "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor of kernel '" + k.name + "'");
  return blocks;
}

inline HipFunction HipModule::function(std::string_view name) {
  std::lock_guard lock(mutex_);
  auto it = kernels_.find(std::string(name));
  if (it != kernels_.end()) return HipFunction(it->second.get());
  const HipApi& api = hip_api();
  device_.make_current();
  auto k = std::make_unique<detail::KernelState>();
  k->name = std::string(name);
  k->device = &device_;
  hipError_t r = api.hipModuleGetFunction(&k->function, module_, k->name.c_str());
  if (r != kSuccess) {
    check(r, "hipModuleGetFunction: no kernel '" + k->name + "' in module '" + name_ +
                 "' (is it declared extern \"C\" __global__?)");
  }
  check(api.hipFuncGetAttribute(&k->max_threads_per_block, kFuncAttrMaxThreadsPerBlock, k->function),
        "hipFuncGetAttribute(MAX_THREADS_PER_BLOCK) of kernel '" + k->name + "'");
  check(api.hipFuncGetAttribute(&k->static_shared_bytes, kFuncAttrSharedSizeBytes, k->function),
        "hipFuncGetAttribute(SHARED_SIZE_BYTES) of kernel '" + k->name + "'");
  k->dynamic_shared_limit.store(std::max(0, device_.properties().max_shared_per_block - k->static_shared_bytes),
                                std::memory_order_relaxed);
  detail::KernelState* raw = k.get();
  kernels_.emplace(k->name, std::move(k));
  return HipFunction(raw);
}

inline HipModule& HipDevice::load_module(const std::string& source, const std::vector<std::string>& extra_options,
                                         const std::string& name_hint) {
  Hasher h;
  h.add(std::string_view("kiln-hip-module")).add(std::string_view(source)).add(uint64_t{extra_options.size()});
  for (const auto& o : extra_options) h.add(std::string_view(o));
  Hash128 key = h.digest();

  std::shared_ptr<ModuleSlot> slot;
  bool owner = false;
  {
    std::lock_guard lock(modules_mutex_);
    auto [it, inserted] = modules_.try_emplace(key);
    if (inserted) it->second = std::make_shared<ModuleSlot>();
    slot = it->second;
    owner = inserted;
  }
  if (!owner) {
    ::kiln::detail::counters_state().memory_hits.fetch_add(1, std::memory_order_relaxed);
    return *slot->future.get();  // rethrows the owner's error if its build failed
  }
  try {
    std::string code = jit::hiprtc_compile(source, name_hint, properties_.arch, extra_options);
    make_current();
    hipModule_t module = nullptr;
    hipError_t r = hip_api().hipModuleLoadData(&module, code.data());
    if (r != kSuccess) {
      check(r, "hipModuleLoadData of module '" + name_hint + "' (code object for " + properties_.arch +
                   ") on device " + std::to_string(ordinal_) + " (" + properties_.name + ")");
    }
    slot->module = std::make_unique<HipModule>(*this, module, name_hint);
    slot->promise.set_value(slot->module.get());
    return *slot->module;
  } catch (...) {
    {
      // A failed build is not remembered: the next call tries again.
      std::lock_guard lock(modules_mutex_);
      auto it = modules_.find(key);
      if (it != modules_.end() && it->second == slot) modules_.erase(it);
    }
    slot->promise.set_exception(std::current_exception());
    throw;
  }
}

// The module compiled from `source` for `device`'s target, loaded once per
// process and device: memory map (counts memory_hits) -> disk cache -> hipRTC.
// The source may hold many kernels; fetch each with HipModule::function.
// Thread-safe: different sources compile in parallel, one source once. Throws
// kiln::CompileError when the source does not compile, kiln::Error when HIP or
// hipRTC is missing.
inline HipModule& load_hip_module(const std::string& source, int device = 0,
                                  const std::vector<std::string>& extra_options = {},
                                  const std::string& name_hint = "kernels") {
  return hip_device(device).load_module(source, extra_options, name_hint);
}

// ---- events ---------------------------------------------------------------------

// A point in a stream that another stream waits for (no timing: cheaper to record). Made on
// its first record; movable, so that a call keeps a vector of them.
class HipEvent {
 public:
  HipEvent() = default;
  HipEvent(HipEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  HipEvent& operator=(HipEvent&& o) noexcept {
    std::swap(event_, o.event_);
    return *this;
  }
  ~HipEvent() {
    if (event_) hip_api().hipEventDestroy(event_);  // NOTE: result ignored: a destructor cannot report it
  }
  void record(HipDevice& dev, hipStream_t stream) {
    dev.make_current();
    if (!event_) check(hip_api().hipEventCreateWithFlags(&event_, kEventDisableTiming), "hipEventCreateWithFlags");
    dev.check_async(hip_api().hipEventRecord(event_, stream), "hipEventRecord");
  }
  hipEvent_t handle() const { return event_; }

 private:
  hipEvent_t event_ = nullptr;
};

inline void HipDevice::wait(hipStream_t stream, const HipEvent& event) const {
  check_async(hip_api().hipStreamWaitEvent(stream, event.handle(), 0), "hipStreamWaitEvent");
}

// ---- timing -------------------------------------------------------------------

// HIP events around work on a stream: the GPU's own clock, free of host launch
// overhead. start(); ...launches...; stop(); elapsed_ms().
class EventTimer {
 public:
  explicit EventTimer(int device = 0) : device_(&hip_device(device)) {
    device_->make_current();
    check(hip_api().hipEventCreateWithFlags(&start_, kEventDefault), "hipEventCreateWithFlags");
    hipError_t r = hip_api().hipEventCreateWithFlags(&stop_, kEventDefault);
    if (r != kSuccess) {
      hip_api().hipEventDestroy(start_);
      check(r, "hipEventCreateWithFlags");
    }
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer() {
    hip_api().hipEventDestroy(start_);  // NOTE: results ignored: a destructor cannot report them
    hip_api().hipEventDestroy(stop_);
  }

  void start(hipStream_t stream = nullptr) { record(start_, stream); }
  void stop(hipStream_t stream = nullptr) { record(stop_, stream); }

  // Milliseconds between start() and stop(); waits for stop().
  float elapsed_ms() const {
    device_->make_current();
    device_->check_async(hip_api().hipEventSynchronize(stop_), "hipEventSynchronize");
    float ms = 0;
    check(hip_api().hipEventElapsedTime(&ms, start_, stop_), "hipEventElapsedTime");
    return ms;
  }

 private:
  void record(hipEvent_t e, hipStream_t stream) {
    device_->make_current();
    check(hip_api().hipEventRecord(e, stream != nullptr ? stream : device_->stream()), "hipEventRecord");
  }

  HipDevice* device_;
  hipEvent_t start_ = nullptr, stop_ = nullptr;
};

// Evicts the L2 cache by writing twice its size on the device's stream (queued),
// so a timed kernel reads from HBM as it would in a real model.
inline void flush_l2(int device = 0) {
  HipDevice& dev = hip_device(device);
  static std::mutex mutex;
  static std::unordered_map<int, DeviceBuffer> scratch;
  std::lock_guard lock(mutex);
  DeviceBuffer& b = scratch[device];
  size_t bytes = std::max<size_t>(size_t(2) * static_cast<size_t>(dev.properties().l2_bytes), 1 << 20);
  if (b.size() < bytes) b = DeviceBuffer(bytes, device);
  fill_words(b, 0);
}

}  // namespace kiln::rocm
